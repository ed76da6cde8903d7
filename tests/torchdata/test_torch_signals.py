"""SIGTERM in a process training through taskq.torch.DataLoader (real processes, real
DataLoader workers, a real redis-server): the loader releases everything at once, the
loop's progress sent first."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support import wait_until
from torch_helpers import make_job, write_jsonl

import taskq

PROC = str(Path(__file__).resolve().parents[1].joinpath("torch_sigterm_proc.py"))


@pytest.mark.parametrize("in_with", [True, False])
def test_sigterm_releases_everything_at_once_with_progress_sent_first(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, in_with: bool
) -> None:
    """8 tasks x 40 rows, 2 workers, batches of 4; SIGTERM to the main process (as the
    kubelet sends it) during its 10th step: within 1 s nothing is leased (released, not
    expired: worker_ttl is 30 s), the process exits 143, and what the loop took before
    that step (9 batches, 36 rows) is recorded as done or as progress: nothing taken is
    lost and the step in flight is not counted."""
    chunks = write_jsonl(tmp_path / "data", 8, 40)
    make_job(client, job_name, chunks, worker_ttl=30.0)
    args = [] if in_with else ["--no-with"]
    proc = subprocess.Popen(
        [sys.executable, PROC, url, job_name, "2", *args], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == ["STEPS", "10"]
        assert client.status(job_name).leased > 0
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        wait_until(lambda: client.status(job_name).leased == 0, 1.0)  # the goal: within 1 s
        released_after = time.monotonic() - sent
        assert client.status(job_name).leased == 0, f"still leased after {released_after:.2f}s"
        assert proc.wait(60) == 128 + signal.SIGTERM  # (the exit: no time goal; load 20 took >10 s)
    finally:
        proc.kill()
        proc.wait()
    st = client.status(job_name)
    progress = {
        int(k): int(v) for k, v in client.redis.hgetall(client.keys(job_name).progress).items()
    }
    assert st.done * 40 + sum(progress.values()) == 9 * 4, (st.done, progress)
    assert st.counters.get("expired_worker_lost", 0) == 0


def test_leave_on_sigterm_replaces_a_frameworks_handler_and_needs_the_main_thread() -> None:
    """``taskq.torch.leave_on_sigterm()`` puts the loader's handler in place of another
    one (what a Lightning callback does: docs/frameworks.md), so SIGTERM becomes
    ``SystemExit(143)``; off the main thread it refuses with one line."""
    import threading

    import taskq.torch

    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a framework's, say
    try:
        taskq.torch.leave_on_sigterm()
        with pytest.raises(SystemExit) as leaving:
            signal.raise_signal(signal.SIGTERM)
        assert leaving.value.code == 143
        errs: list[BaseException] = []

        def off_main() -> None:
            try:
                taskq.torch.leave_on_sigterm()
            except taskq.InvalidInput as e:
                errs.append(e)

        t = threading.Thread(target=off_main)
        t.start()
        t.join()
        assert [str(e) for e in errs] == ["leave_on_sigterm() must be called on the main thread"]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_sigterm_releases_before_it_waits_for_workers_that_do_not_stop(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """The loop's SIGTERM in a ``with loader:`` block while its DataLoader workers do not
    stop at once (SIGSTOPped here; slow on a loaded machine): the leases go back before
    torch's shutdown of the workers gives up on them (it waits
    ``MP_STATUS_CHECK_INTERVAL``, 5 s, a worker, one after the other); the release came
    after those waits before (10 s after the signal). The stopped workers' SIGCHLDs can
    have the kernel give the SIGTERM to another thread (the main one has a signal
    pending): released all the same (signals.py's wakeup pipe; before it, the release
    waited for the loop's 60 s step on a loaded machine)."""
    psutil = pytest.importorskip("psutil")
    from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL

    make_job(client, job_name, write_jsonl(tmp_path / "data", 8, 40), worker_ttl=30.0)
    proc = subprocess.Popen(
        [sys.executable, PROC, url, job_name, "2"], stdout=subprocess.PIPE, text=True
    )
    workers: list[Any] = []
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == ["STEPS", "10"]
        assert client.status(job_name).leased > 0
        workers = psutil.Process(proc.pid).children()
        assert len(workers) == 2, workers
        for w in workers:
            w.suspend()
        proc.send_signal(signal.SIGTERM)
        # torch gives each stopped worker MP_STATUS_CHECK_INTERVAL before it terminates it,
        # one after the other: a release after the shutdown comes 2 intervals (10 s) after
        # the signal; before it, at once (a loaded machine's delay stays well below 1.5)
        assert wait_until(
            lambda: client.status(job_name).leased == 0, 1.5 * MP_STATUS_CHECK_INTERVAL
        )
        for w in workers:
            w.resume()
        assert proc.wait(30) == 128 + signal.SIGTERM
    finally:
        for w in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                w.resume()
        proc.kill()
        proc.wait()
    st = client.status(job_name)
    assert st.counters["released"] > 0 and st.counters.get("expired_worker_lost", 0) == 0


def test_a_sigterm_that_lands_on_another_thread_releases_at_once(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """The process's SIGTERM delivered to a thread other than the main one (as the kernel
    does when the main thread has a signal pending) while the loop's step blocks: the
    leases go back at once all the same (the feeder sees it on the wakeup pipe,
    signals.py), not when the step's call returns (60 s: Python runs the handler on the
    main thread only)."""
    make_job(client, job_name, write_jsonl(tmp_path / "data", 8, 40), worker_ttl=30.0)
    proc = subprocess.Popen(
        [sys.executable, PROC, url, job_name, "2", "--on-a-thread"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == ["STEPS", "10"]
        assert client.status(job_name).leased > 0
        # the signal is sent 0.5 s after the line: released within 5 s of it
        assert wait_until(lambda: client.status(job_name).leased == 0, 5.0)
    finally:
        proc.kill()
        proc.wait()
