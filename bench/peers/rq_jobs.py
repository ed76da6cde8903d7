"""Job functions the rq peer benchmark enqueues.

Where it sits: `rq_bench.py` enqueues these by dotted name; `rq_worker.py` subprocesses
import them as `peers.rq_jobs` (`bench/` is on their sys.path or PYTHONPATH).
"""

from __future__ import annotations

import time

from rq import get_current_job


def noop() -> None:
    """Does nothing: the throughput rows measure rq's own per-job cost."""


def record_start_and_sleep(starts_key: str, seconds: float) -> None:
    """RPUSHes the wall-clock start time to `starts_key`, then sleeps `seconds`.

    The recovery rows read the second entry to learn when a killed job ran again.
    """
    job = get_current_job()
    assert job is not None, "must run inside an rq worker"
    job.connection.rpush(starts_key, repr(time.time()))
    time.sleep(seconds)
