"""The demo's processes: a throw-away redis-server, the trainer and reaper processes
(their entry points, run in a fork server's children) and the ``Fleet`` that starts,
signals and stops them.

Data flow: cli/demo.py -> cli/demo_fleet.py (processes) -> taskq.Trainer / taskq.ops.reaper
-> Redis.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

import taskq
from taskq import devserver

DEMO_WORKER_TTL_S = 2.0
DEMO_HEARTBEAT_S = 0.5


def local_redis() -> devserver.RedisServer:
    """A throw-away redis-server on a free loopback port, in a temp dir (no persistence).

    In its own session: Ctrl-C is the demo's to handle, not redis-server's.
    """
    return devserver.RedisServer(binary="redis-server", new_session=True)


def _child_stdio(path: str) -> None:
    """Point a child's stdio at ``path`` (the parent's live display stays clean)."""
    out = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    sys.stdout = sys.stderr = out


def _trainer_main(
    url: str, prefix: str | None, job: str, index: int, run_dir: str, step_s: float
) -> None:
    """A demo trainer: lease, "train" (sleep), log ``pass task token``, ack by iterating."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us with SIGTERM
    _child_stdio(os.path.join(run_dir, f"trainer-{index}.err"))
    rng = random.Random(f"{index}:{os.getpid()}")
    client = taskq.Client(url, key_prefix=prefix)
    worker_id = f"demo-trainer-{index}:{os.getpid()}"
    try:
        with (
            open(os.path.join(run_dir, f"trainer-{index}.log"), "a", buffering=1) as log,
            taskq.Trainer(job, client=client, worker_id=worker_id) as trainer,
        ):
            for task in trainer:
                time.sleep(step_s * rng.uniform(0.5, 1.5))
                log.write(f"{task.pass_no} {task.id} {task.token}\n")
    except taskq.TaskqError as e:
        print(f"trainer {index}: {e}")
        sys.exit(1)


def _reaper_main(url: str, prefix: str | None, job: str, run_dir: str) -> None:
    """The demo's reaper: bounds recovery when nobody asks for work."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _child_stdio(os.path.join(run_dir, "reaper.err"))
    from taskq.ops.reaper import Reaper

    sys.exit(Reaper(taskq.Client(url, key_prefix=prefix), jobs=[job], interval=0.25).run())


@dataclass
class Fleet:
    """The processes the demo started, and what it did to them."""

    ctx: Any
    url: str
    prefix: str | None
    job: str
    run_dir: str
    step_s: float
    trainers: dict[int, BaseProcess] = field(default_factory=dict)
    reaper: BaseProcess | None = None
    started: int = 0
    terminated: int = 0
    killed: int = 0
    #: (worker id prefix, server time in ms) of every SIGKILL, to time the recovery
    kills: list[tuple[str, int]] = field(default_factory=list)
    #: set by Ctrl-C; checked between steps
    stop_flag: threading.Event = field(default_factory=threading.Event)

    def spawn(self, count: int) -> list[int]:
        new = []
        for _ in range(count):
            if self.stop_flag.is_set():
                raise KeyboardInterrupt
            index = self.started
            self.started += 1
            sys.stdout.flush()
            sys.stderr.flush()
            proc = self.ctx.Process(
                target=_trainer_main,
                name=f"taskq-demo-trainer-{index}",
                daemon=True,
                args=(self.url, self.prefix, self.job, index, self.run_dir, self.step_s),
            )
            proc.start()
            self.trainers[index] = proc
            new.append(index)
        return new

    def start_reaper(self) -> bool:
        if importlib.util.find_spec("taskq.ops.reaper") is None:
            return False
        sys.stdout.flush()
        sys.stderr.flush()
        self.reaper = self.ctx.Process(
            target=_reaper_main,
            name="taskq-demo-reaper",
            daemon=True,
            args=(self.url, self.prefix, self.job, self.run_dir),
        )
        self.reaper.start()
        return True

    def alive(self) -> list[int]:
        return [i for i, p in self.trainers.items() if p.is_alive()]

    def signal(self, index: int, signum: int) -> None:
        pid = self.trainers[index].pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        if signum == signal.SIGKILL:
            self.killed += 1
        else:
            self.terminated += 1

    def stop_all(self, grace_s: float = 5.0) -> None:
        """SIGTERM every process still running, then SIGKILL what outlives the grace."""
        procs = list(self.trainers.values()) + ([self.reaper] if self.reaper else [])
        for p in procs:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(2)
