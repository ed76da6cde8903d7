"""A trainer subprocess that reads its task slowly, honouring a moved end, for the split
SIGKILL test.

Usage: split_proc.py URL JOB OUT
Leases one task, prints "LEASED <task>" (flushed), reads it with
``read_task(task.chunks, task.start, end=task.current_end)`` at ~5 ms a sample, records
``trainer.progress(task, n)`` after every sample and appends each sample's ``i`` to OUT;
at its end it sleeps until killed (it never acks).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import taskq  # noqa: E402
from taskq.data import read_task  # noqa: E402


def main() -> int:
    url, job, out = sys.argv[1:4]
    with taskq.Trainer(job, url=url, ranges=True) as trainer, open(out, "a", buffering=1) as log:
        task = trainer.lease(timeout=10)
        assert task is not None
        print(f"LEASED {task.id}", flush=True)
        n = task.start
        for row in read_task(task.chunks, task.start, end=task.current_end):
            log.write(f"{row['i']}\n")
            n += 1
            trainer.progress(task, n)
            time.sleep(0.005)  # a slow reader: the others split its task
        while True:
            time.sleep(1)  # holds until killed
    return 0


if __name__ == "__main__":
    sys.exit(main())
