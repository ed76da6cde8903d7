"""The thin trainer client: lease, ack, fail, release, heartbeats, graceful leave.

A ``Trainer`` registers a worker incarnation, heartbeats from a daemon thread (it dies
with the process, so a SIGKILLed trainer keeps nothing alive), and iterates tasks:
acking the previous task, starting a reserved one and leasing the next is one script
call. Every write carries the lease token; the server decides what is current.

Data flow: trainer code -> trainer.py -> scripts.py (lua) -> Redis <- reaper.py.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any

from . import errors
from .client import Client
from .connection import translate
from .keys import JobKeys
from .models import Task
from .scripts import Code, raise_for

log = logging.getLogger("taskq.trainer")

_MAX_BLOCK_S = 5.0


def default_worker_id() -> str:
    """``host:pid:random``, unique per process."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Trainer:
    """A worker of one job.

    Args:
        job: the job name.
        url: Redis URL (or ``TASKQ_REDIS_URL``); ignored when ``client`` is given.
        client: a configured ``taskq.Client`` to share (cluster, Sentinel, TLS).
        worker_id: defaults to ``host:pid:random``; ``|`` is not allowed.
        prefetch: reserved tasks kept ahead of the current one (others may steal them).
        worker_ttl: this worker's own liveness ttl in seconds (e.g. for long GIL-bound
            steps); the job's ``worker_ttl`` when None.
        heartbeat: run the heartbeat thread (turn off only in tests that drive it).
        handle_signals: in the ``with`` block, turn SIGTERM into ``SystemExit`` (main
            thread only) so the loop ends and everything held is released.
        reconnect_timeout: seconds the iterator keeps retrying while Redis is unreachable.

    Raises:
        JobNotFound: no such job. ConnectionLost: Redis unreachable.
    """

    def __init__(
        self,
        job: str,
        url: str | None = None,
        client: Client | None = None,
        worker_id: str | None = None,
        *,
        prefetch: int = 0,
        worker_ttl: float | None = None,
        heartbeat: bool = True,
        handle_signals: bool = True,
        reconnect_timeout: float = 60.0,
    ) -> None:
        self.client = client or Client(url)
        self.job = job
        self.keys: JobKeys = self.client.keys(job)
        self.worker_id = worker_id or default_worker_id()
        if "|" in self.worker_id or not self.worker_id:
            raise errors.InvalidInput(f"bad worker id {self.worker_id!r}: '|' not allowed")
        if prefetch < 0:
            raise errors.InvalidInput(f"prefetch must be >= 0, got {prefetch}")
        if worker_ttl is not None and worker_ttl <= 0:
            raise errors.InvalidInput(f"worker_ttl must be positive, got {worker_ttl}")
        self.prefetch = prefetch
        self.handle_signals = handle_signals
        self.reconnect_timeout = reconnect_timeout
        self._own_ttl_ms = int(worker_ttl * 1000) if worker_ttl else 0
        self._lock = threading.RLock()
        self._held: dict[int, Task] = {}
        self._reserved: deque[Task] = deque()
        self._call_no = 0
        self._last_reply_no = 0
        self._gen = 0
        self._pass = 0
        self._state = "running"
        self._draining = False
        self._ended: type[errors.TaskqError] | None = None
        self._closed = False
        self._last_contact = time.monotonic()
        self._stop = threading.Event()
        self._pid = os.getpid()
        self._old_handlers: dict[int, Any] = {}
        self.job_incarnation = ""
        self.incarnation = ""
        self._register()
        self._hb_thread: threading.Thread | None = None
        if heartbeat:
            self._hb_thread = threading.Thread(
                target=self._heartbeat_loop, name=f"taskq-heartbeat-{job}", daemon=True
            )
            self._hb_thread.start()

    # -- registration and plumbing ------------------------------------------------
    def _register(self) -> None:
        self.incarnation = secrets.token_hex(6)
        reply = self._run("register", [
            self.job_incarnation, self.worker_id, self.incarnation, self._own_ttl_ms,
            socket.gethostname(), os.getpid(),
        ])
        self.job_incarnation = reply[1]
        self.ttl_s = int(reply[2]) / 1000.0
        self.heartbeat_interval = int(reply[3]) / 1000.0
        self._note_info(reply[4])
        log.debug("registered %s/%s on job %s", self.worker_id, self.incarnation, self.job)

    def _run(self, verb: str, args: list[Any]) -> Any:
        with translate(self.client.url):
            reply = self.client.scripts.call(verb, self.keys.all, args)
        self._last_contact = time.monotonic()
        code = int(reply[0])
        if code == Code.JOB_NOT_FOUND:
            self._ended = errors.JobNotFound
        if code not in (Code.REREGISTER, Code.JOB_COMPLETED, Code.JOB_CANCELLED):
            raise_for(code, self.job)
        return reply

    def _note_info(self, info: list[Any]) -> None:
        self._pass, self._gen, self._state = int(info[0]), int(info[1]), info[2]

    def _mark_all_revoked(self) -> None:
        with self._lock:
            for task in self._held.values():
                task.revoked.set()
            self._held.clear()
            self._reserved.clear()

    def _rejoin(self) -> None:
        log.warning("worker %s was declared lost; re-registering", self.worker_id)
        self._mark_all_revoked()
        self._register()

    def _tasks_from(self, rows: list[Any], call_no: int) -> list[Task]:
        tasks = []
        with self._lock:
            for task_id, token, attempt, chunks, started in rows:
                task = Task(id=int(task_id), pass_no=self._pass, chunks=json.loads(chunks),
                            token=int(token), attempt=int(attempt), job=self.job,
                            started=bool(int(started)))
                self._held[task.id] = task
                tasks.append(task)
            self._last_reply_no = max(self._last_reply_no, call_no)
        return tasks

    def _step(
        self, acks: list[Task], starts: list[Task], want: int, mode: str, expect_pass: int
    ) -> tuple[int, list[Task], float, list[int], list[int]]:
        """One ack/start/lease call; returns (code, granted, wait_s, ack_res, start_res)."""
        with self._lock:
            self._call_no += 1
            call_no = self._call_no
        args: list[Any] = [self.job_incarnation, self.worker_id, self.incarnation, call_no,
                           len(acks)]
        for t in acks:
            args += [t.id, t.token]
        args.append(len(starts))
        for t in starts:
            args += [t.id, t.token]
        args += [want, mode, expect_pass]
        reply = self._run("ack", args)
        code = int(reply[0])
        ack_res = [int(x) for x in reply[4]] if len(reply) > 4 else []
        start_res = [int(x) for x in reply[5]] if len(reply) > 5 else []
        with self._lock:
            for t in acks:
                self._held.pop(t.id, None)
            for t, res in zip(starts, start_res, strict=False):
                if res == Code.STOLEN:
                    self._held.pop(t.id, None)
                    t.revoked.set()
        if len(reply) > 3:
            self._note_info(reply[3])
        granted = self._tasks_from(reply[1], call_no) if len(reply) > 1 else []
        wait_s = int(reply[2]) / 1000.0 if len(reply) > 2 else 0.0
        return code, granted, wait_s, ack_res, start_res

    def _wait(self, bound_s: float) -> None:
        """Block until work may exist: a wake token, a broadcast, or the bound."""
        timeout = min(bound_s, _MAX_BLOCK_S) if bound_s > 0 else _MAX_BLOCK_S
        if timeout <= 0:
            return
        bcast = self.keys.bcast0 if (self._gen + 1) % 2 == 0 else self.keys.bcast1
        with translate(self.client.url):
            self.client.redis.blpop([self.keys.wake, bcast], timeout=max(timeout, 0.01))

    def _retrying(self, fn: Any, *args: Any) -> Any:
        """Call ``fn`` until it succeeds, retrying ConnectionLost with backoff and jitter
        for up to ``reconnect_timeout`` seconds (the held-pairs heartbeat makes blind
        retries safe)."""
        deadline = time.monotonic() + self.reconnect_timeout
        delay = 0.05
        while True:
            try:
                return fn(*args)
            except errors.ConnectionLost:
                if time.monotonic() > deadline or self._stop.is_set():
                    raise
                log.warning("Redis unreachable; retrying in %.2fs", delay)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)

    def _end_code(self, code: int) -> None:
        if code == Code.JOB_COMPLETED:
            raise errors.JobCompleted(f"job {self.job!r} is completed")
        if code == Code.JOB_CANCELLED:
            self._mark_all_revoked()
            raise errors.JobCancelled(f"job {self.job!r} was cancelled")

    # -- the public calls ---------------------------------------------------------
    def lease(self, timeout: float = 2.0, expect_pass: int | None = None) -> Task | None:
        """Lease one task, started.

        Args:
            timeout: seconds to wait for work (0: do not wait).
            expect_pass: never return work of another pass (``PASS_DONE`` -> None).

        Returns:
            A task, or None when ``timeout`` passed with nothing to give.

        Raises:
            JobCompleted, JobCancelled, JobNotFound: there will never be work again.
            Draining: an operator asked this worker to leave.
        """
        tasks = self._lease_n(1, timeout, expect_pass)
        return tasks[0] if tasks else None

    def _lease_n(self, n: int, timeout: float, expect_pass: int | None,
                 acks: list[Task] | None = None) -> list[Task]:
        deadline = time.monotonic() + timeout
        acks = list(acks or [])
        while True:
            code, got, wait_s, ack_res, _ = self._retrying(
                self._step, acks, [], n, "S", -1 if expect_pass is None else expect_pass)
            self._check_acks(acks, ack_res, raise_stale=False)
            acks = []
            if code == Code.REREGISTER:
                self._rejoin()
                continue
            if code == Code.DRAINING:
                self._draining = True
                raise errors.Draining(f"worker {self.worker_id} is draining")
            self._end_code(code)
            if got or code == Code.PASS_DONE:
                return got
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._retrying(self._wait, min(remaining, wait_s) if wait_s > 0 else remaining)

    def _check_acks(self, acks: list[Task], results: list[int], raise_stale: bool) -> None:
        stale = [t.id for t, r in zip(acks, results, strict=False) if r == Code.STALE]
        for t in acks:
            if t.id in stale:
                t.revoked.set()
        if stale:
            msg = f"job {self.job!r}: lease lost for task(s) {stale}; result not counted"
            if raise_stale:
                raise errors.LeaseLost(msg, stale)
            log.warning("%s", msg)

    def _write(self, verb: str, tasks: list[Task], extra: list[Any]) -> None:
        args: list[Any] = [self.job_incarnation, self.worker_id, self.incarnation, *extra,
                           len(tasks)]
        for t in tasks:
            args += [t.id, t.token]
        reply = self._retrying(self._run, verb, args)
        with self._lock:
            for t in tasks:
                self._held.pop(t.id, None)
                if t in self._reserved:
                    self._reserved.remove(t)
        self._check_acks(tasks, [int(x) for x in reply[1]], raise_stale=True)

    def ack(self, task: Task | list[Task]) -> None:
        """Ack a finished task (or a batch). Repeating an ack that landed is a no-op.

        Raises:
            LeaseLost: the lease was no longer this trainer's; nothing was counted.
        """
        tasks = task if isinstance(task, list) else [task]
        code, _, _, res, _ = self._retrying(self._step, tasks, [], 0, "S", -1)
        self._check_acks(tasks, res, raise_stale=True)

    def fail(self, task: Task | list[Task], error: str = "") -> None:
        """Report a failed task (counts a failure; dead at the caps). A failed batch goes
        back uncharged, to be retried one task at a time.

        Raises:
            LeaseLost: the lease was no longer this trainer's.
        """
        self._write("fail", task if isinstance(task, list) else [task], [str(error)[:500]])

    def release(self, task: Task | list[Task]) -> None:
        """Give a task back unfinished (leasable by others at once).

        Raises:
            LeaseLost: the lease was no longer this trainer's.
        """
        self._write("release", task if isinstance(task, list) else [task], [])

    def heartbeat(self) -> list[int]:
        """Send one heartbeat now. Returns the ids of held tasks the server revoked."""
        with self._lock:
            pairs = [(t.id, t.token) for t in self._held.values()]
            last_reply = self._last_reply_no
        args: list[Any] = [self.job_incarnation, self.worker_id, self.incarnation, last_reply,
                           len(pairs)]
        for tid, tok in pairs:
            args += [tid, tok]
        reply = self._run("heartbeat", args)
        code = int(reply[0])
        if code == Code.REREGISTER:
            self._rejoin()
            return [tid for tid, _ in pairs]
        self._note_info(reply[2])
        revoked = [int(x) for x in reply[1]]
        with self._lock:
            for tid in revoked:
                task = self._held.pop(tid, None)
                if task is not None:
                    task.revoked.set()
                    if task in self._reserved:
                        self._reserved.remove(task)
            for task in self._held.values():
                task.at_risk.clear()
        if code == Code.DRAINING:
            self._draining = True
        if self._state == "cancelled":
            self._mark_all_revoked()
        return revoked

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            try:
                self.heartbeat()
            except errors.ConnectionLost:
                if time.monotonic() - self._last_contact > self.ttl_s:
                    with self._lock:
                        for task in self._held.values():
                            task.at_risk.set()
            except (errors.JobNotFound, errors.JobCancelled):
                self._mark_all_revoked()
                return
            except Exception:  # the thread must survive anything transient
                log.exception("heartbeat failed")

    @property
    def held(self) -> list[Task]:
        """The tasks this trainer believes it holds (current and reserved)."""
        with self._lock:
            return list(self._held.values())

    @property
    def draining(self) -> bool:
        """True once an operator asked this worker to finish its task and leave."""
        return self._draining

    # -- iteration ----------------------------------------------------------------
    def __iter__(self) -> Iterator[Task]:
        return self._iterate(None)

    def _iterate(self, expect_pass: int | None) -> Iterator[Task]:
        current: Task | None = None
        ep = -1 if expect_pass is None else expect_pass
        while True:
            acks = [current] if current is not None and current.id in self._held else []
            if current is not None and acks and current.revoked.is_set():
                log.info("task %s was revoked; its result is not counted", current.id)
            current = None
            starts: list[Task] = []
            with self._lock:
                if self._reserved:
                    starts = [self._reserved.popleft()]
            if self._draining:
                if acks:
                    self._retrying(self._step, acks, [], 0, "S", ep)
                return
            if starts:
                want, mode = self.prefetch - len(self._reserved), "R"
            else:
                want, mode = 1 + self.prefetch, "F"
            try:
                code, got, wait_s, ack_res, start_res = self._retrying(
                    self._step, acks, starts, want, mode, ep)
            except (errors.JobNotFound, errors.JobCancelled):
                self._mark_all_revoked()
                raise
            self._check_acks(acks, ack_res, raise_stale=False)
            if code == Code.REREGISTER:
                self._rejoin()
                continue
            if code == Code.DRAINING:
                self._draining = True
                return
            if code in (Code.JOB_COMPLETED, Code.JOB_CANCELLED):
                self._mark_all_revoked()
                return
            if starts and start_res and start_res[0] == Code.OK:
                current = starts[0]
            with self._lock:
                for t in got:
                    if t.started and current is None:
                        current = t
                    else:
                        self._reserved.append(t)
            if current is not None:
                yield current
                continue
            if code == Code.PASS_DONE:
                self._release_reserved()
                return
            if not got and not starts:
                self._retrying(self._wait, wait_s if wait_s > 0 else _MAX_BLOCK_S)

    def _release_reserved(self) -> None:
        with self._lock:
            reserved = list(self._reserved)
        if reserved:
            try:
                self.release(reserved)
            except errors.LeaseLost:
                pass

    def passes(self) -> Iterator[Iterator[Task]]:
        """One iterator per pass; each ends when its pass is complete for everyone (a
        barrier: the next one blocks while the job waits at a manual boundary)."""
        try:
            pass_no = self.client.status(self.job, summaries=0).pass_no
        except errors.JobNotFound:
            return
        while self._state not in ("completed", "cancelled") and not self._closed:
            yield self._iterate(pass_no)
            if self._draining:
                return
            pass_no = max(pass_no + 1, self._pass)

    def batches(self, k: int) -> Iterator[list[Task]]:
        """Lists of up to ``k`` tasks started together and acked together (one call per
        batch); ends when the job is completed or cancelled."""
        if k < 1:
            raise errors.InvalidInput(f"batch size must be >= 1, got {k}")
        batch: list[Task] = []
        while True:
            acks = [t for t in batch if t.id in self._held]
            try:
                batch = self._lease_n(k, _MAX_BLOCK_S, None, acks=acks)
            except (errors.JobCompleted, errors.JobCancelled, errors.Draining):
                return
            if batch:
                yield batch

    # -- leaving ------------------------------------------------------------------
    def close(self) -> None:
        """Release everything held in one call and deregister. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        try:
            self._run("leave", [self.job_incarnation, self.worker_id, self.incarnation])
        except (errors.JobNotFound, errors.ConnectionLost) as e:
            log.warning("leave: %s", e)
        with self._lock:
            for task in self._held.values():
                task.revoked.set()
            self._held.clear()
            self._reserved.clear()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a forked child: behave as if never installed
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise SystemExit(128 + signum)

    def __enter__(self) -> Trainer:
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            self._old_handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None and not isinstance(exc, (SystemExit, KeyboardInterrupt,
                                                         GeneratorExit, errors.TaskqError)):
                current = [t for t in self.held if t.started]
                if current:
                    try:
                        self.fail(current[:1], error=f"{exc_type.__name__ if exc_type else ''}: "
                                  f"{exc}")
                    except errors.TaskqError as e:
                        log.warning("could not fail task: %s", e)
            self.close()
        finally:
            for signum, handler in self._old_handlers.items():
                signal.signal(signum, handler)
            self._old_handlers.clear()

    def __del__(self) -> None:
        self._stop.set()
