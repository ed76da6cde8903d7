"""Plumbing shared by the taskq bench modules: URLs, jobs, forked children, CPU readings.

Where it sits: used by `taskq_rows.py` (throughput, idle cost, scale), `taskq_recovery.py`
(re-dispatch latency) and `taskq_big.py` (big jobs and memory). Every child process is
started through `Children`, which SIGKILLs whatever is still alive when its block ends
(also on Ctrl-C), so a bench never leaves a trainer behind.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import common
import psutil
import redis

import taskq

CTX = mp.get_context("fork")


def url_of(port: int) -> str:
    """The taskq URL of a bench redis-server on 127.0.0.1:port."""
    return f"redis://{common.LOOPBACK}:{port}/0"


def empty_chunks(n: int) -> list[dict[str, int]]:
    """n small chunk descriptors (an "empty task body": the trainer does nothing with them)."""
    return [{"i": i} for i in range(n)]


def create_job(port: int, name: str, n_tasks: int, **config: Any) -> taskq.Client:
    """Creates job `name` with `n_tasks` one-chunk tasks; returns the client used."""
    client = taskq.connect(url_of(port))
    client.create_job(name, empty_chunks(n_tasks), **config)
    return client


class Children:
    """Forked child processes that are SIGKILLed (with their process group when they lead
    one) if still alive when the `with` block ends."""

    def __init__(self) -> None:
        self.procs: list[mp.process.BaseProcess] = []

    def start(self, target: Callable[..., None], *args: Any) -> mp.process.BaseProcess:
        """Forks a child running target(*args) and returns it."""
        proc = CTX.Process(target=_child_main, args=(target, args), daemon=True)
        proc.start()
        self.procs.append(proc)
        return proc

    def stop(self, grace_s: float = 0.0) -> None:
        """Waits up to grace_s for the children to end, then SIGKILLs the rest."""
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.join(timeout=5)
        self.procs.clear()

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


def _child_main(target: Callable[..., None], args: tuple) -> None:
    # The parent turns SIGTERM into KeyboardInterrupt; a child starts from the defaults
    # (a trainer under test installs its own handlers).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    target(*args)


def cpu_seconds(pids: list[int]) -> float:
    """user + system CPU seconds used so far by these processes (all their threads)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def redis_cpu_seconds(port: int) -> float:
    """used_cpu_sys + used_cpu_user of the server, from INFO cpu."""
    client = redis.Redis(host=common.LOOPBACK, port=port)
    try:
        info = client.info("cpu")
    finally:
        client.close()
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def fmt_ms(seconds: float) -> str:
    """Seconds as a short millisecond string."""
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.2f} ms"
