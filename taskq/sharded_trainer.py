"""The trainer of a sharded job: a home shard first, the other shards' tails after.

A ``ShardedTrainer`` holds one ordinary ``Trainer`` per shard it works on: its home shard
(spread evenly: the n-th trainer to join gets shard ``n mod S``) for as long as it runs,
another shard only while it takes tasks from there (registered and heartbeating there
only then). It takes from home first; when home has nothing leasable it looks at the
other shards' statuses (reads, no registration) and leases from one with work left, so
the tail of a pass is shared rather than stuck on one shard. When every shard has
finished pass ``p`` it runs the barrier step (``sharded.advance``), which any trainer or
the reaper may repeat, and the pass iterator ends: ``passes()`` means the whole job's
pass, as ``Trainer.passes()`` does for one shard.

Built on the public ``Trainer`` calls: a task costs a lease call and an ack call (one
combined call with a plain ``Trainer`` iterator; the public API has no non-blocking
ack-and-lease step with an expected pass).

Data flow: trainer code -> sharded_trainer.py -> trainer.py (one per shard) -> Redis;
-> sharded.py (status reads, the barrier step).
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Any, TypeVar

import redis

from . import errors, sharded
from .client import Client
from .keys import shard_set_key
from .models import JobStatus, Task
from .trainer import Trainer, default_worker_id

log = logging.getLogger("taskq.sharded")

T = TypeVar("T")

#: Idle trainers reaping another shard per idle round, expected, however many there are.
REAPERS_PER_ROUND = 4


def _finished(s: JobStatus, pass_no: int) -> bool:
    """True when shard ``s`` has nothing more to do for ``pass_no``."""
    return (
        s.state in ("completed", "cancelled")
        or s.pass_no > pass_no
        or (s.state == "waiting" and s.reason == "manual_advance")
    )


class ShardedTrainer:
    """A worker of one sharded job (see the module docstring).

    Args:
        job: the sharded job's name.
        url: Redis URL (or ``TASKQ_REDIS_URL``); ignored when ``client`` is given.
        client: a configured ``taskq.Client`` to share.
        worker_id: this worker's id on every shard (``host:pid:random`` by default).
        home: the home shard's index; the next in turn when None.
        idle_wait: seconds the first idle round waits for work before looking at the
            other shards again; it doubles while nothing comes, up to ``max_idle_wait``
            (the polls of a crowd of idle trainers at a pass's tail stay bounded).
        max_idle_wait: the longest wait between two looks at the other shards.
        heartbeat, worker_ttl, reconnect_timeout: as ``Trainer`` (per shard trainer).
        handle_signals: in the ``with`` block, SIGTERM -> ``SystemExit``, SIGINT ->
            ``KeyboardInterrupt``, so everything held is released.

    Raises:
        JobNotFound: no such sharded job.
        InvalidInput: a bad ``home``.
    """

    def __init__(
        self,
        job: str,
        url: str | None = None,
        client: Client | None = None,
        worker_id: str | None = None,
        *,
        home: int | None = None,
        idle_wait: float = 0.5,
        max_idle_wait: float = 5.0,
        heartbeat: bool | str = True,
        worker_ttl: float | None = None,
        handle_signals: bool = True,
        reconnect_timeout: float = 60.0,
    ) -> None:
        self.reconnect_timeout = reconnect_timeout
        self.client = client or self._retrying(self._connect, url)
        self.job = job
        self._url = url
        self.sset = self._retrying(sharded.require, self.client, job)
        self.shards = self.sset.shards
        if home is None:
            seq = self._retrying(
                self.client.redis.hincrby, shard_set_key(job, self.client.prefix), "seq", 1
            )
            home = (int(seq) - 1) % len(self.shards)
        if not 0 <= home < len(self.shards):
            raise errors.InvalidInput(f"home must be 0..{len(self.shards) - 1}, got {home}")
        self.home = home
        self.worker_id = worker_id or default_worker_id()
        self.idle_wait = idle_wait
        self.max_idle_wait = max(idle_wait, max_idle_wait)
        self._idle = idle_wait
        self._carry: Task | None = None  # a task of the next pass, got while waiting
        self.handle_signals = handle_signals
        self._trainer_kw: dict[str, Any] = {
            "heartbeat": heartbeat,
            "worker_ttl": worker_ttl,
            "handle_signals": False,
            "reconnect_timeout": reconnect_timeout,
        }
        self._trainers: dict[int, Trainer] = {}
        self._state = "running"
        self._pass = 0
        self._closed = False
        self._draining = False
        self._old_handlers: dict[int, Any] = {}
        self._current: Task | None = None
        #: tasks taken from shards other than home (the shared tail)
        self.taken_elsewhere = 0
        self._open(home)

    # -- plumbing -----------------------------------------------------------------
    @staticmethod
    def _connect(url: str | None) -> Client:
        try:
            return Client(url, retries=1)
        except redis.exceptions.RedisClusterException as e:
            # redis-py cannot read the slot map while the cluster is down (a master
            # paused or failing over): as transient as any other lost connection
            raise errors.ConnectionLost(f"cannot reach the cluster: {e}") from e

    def _retrying(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, retrying ``ConnectionLost`` (a master paused or failing over)
        with backoff for up to ``reconnect_timeout`` seconds."""
        deadline = time.monotonic() + self.reconnect_timeout
        delay = 0.05
        while True:
            try:
                return fn(*args)
            except errors.ConnectionLost as e:
                if time.monotonic() > deadline:
                    raise
                log.warning("%s; retrying in %.2fs", e, delay)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)

    def _open(self, k: int) -> Trainer:
        if k not in self._trainers:
            self._trainers[k] = self._retrying(self._new_trainer, k)
        return self._trainers[k]

    def _new_trainer(self, k: int) -> Trainer:
        try:
            return Trainer(
                self.shards[k],
                url=self._url,
                client=self.client,
                worker_id=self.worker_id,
                **self._trainer_kw,
            )
        except redis.exceptions.RedisClusterException as e:
            # the heartbeat's own connection reads the slot map when it starts: as in
            # _connect, a cluster that is down is transient
            raise errors.ConnectionLost(f"cannot reach the cluster: {e}") from e

    def _close_idle(self, k: int) -> None:
        """Leave shard ``k`` (not home) once nothing is held there."""
        tr = self._trainers.get(k)
        if k != self.home and tr is not None and not tr.held:
            del self._trainers[k]
            tr.close()

    def _statuses(self) -> list[JobStatus]:
        return [self._retrying(self.client.status, s, 0) for s in self.shards]

    def _shard_of(self, task: Task) -> int:
        return self.shards.index(task.job)

    def global_id(self, task: Task) -> int:
        """The task's id in the whole job (``task.id`` is its id in its shard)."""
        return self.sset.global_id(task.job, task.id)

    @property
    def state(self) -> str:
        """The whole job's state as last seen: running, waiting, completed, cancelled."""
        return self._state

    @property
    def pass_no(self) -> int:
        """The whole job's pass this trainer works on (never goes back)."""
        return self._pass

    @property
    def draining(self) -> bool:
        """True once an operator drained this worker on one of its shards."""
        return self._draining

    @property
    def registered_shards(self) -> list[str]:
        """The shards this trainer is registered on now (home and those it leases from)."""
        return [self.shards[k] for k in sorted(self._trainers)]

    # -- taking work ----------------------------------------------------------------
    def _lease(self, k: int, pass_no: int, timeout: float) -> Task | None:
        try:
            task = self._open(k).lease(timeout=timeout, expect_pass=pass_no)
        except errors.JobCompleted:
            return None
        except errors.JobCancelled:
            self._state = "cancelled"
            return None
        except errors.Draining:
            self._draining = True
            return None
        if task is not None and k != self.home:
            self.taken_elsewhere += 1
        return task

    def _take(self, pass_no: int) -> Task | None:
        """A task of ``pass_no``: home, then shards already open, then any shard whose
        status shows work left; None when nothing is leasable now."""
        task = self._lease(self.home, pass_no, 0)
        if task is not None or self._draining or self._state == "cancelled":
            return task
        for k in sorted(self._trainers):
            if k != self.home:
                task = self._lease(k, pass_no, 0)
                if task is not None:
                    return task
                self._close_idle(k)
        return None

    def _idle_round(self, pass_no: int) -> Task | None | bool:
        """Nothing leasable: read every shard; steal from one with work left, end the
        pass (True) when all have finished it (running the barrier step), else wait."""
        sts = self._statuses()
        state, _, _ = sharded.combine(self.sset, sts)
        if state in ("completed", "cancelled"):
            if state == "cancelled":
                self._retrying(sharded.advance, self.client, self.job, False, self.sset)
            self._state = state
            return True
        if all(_finished(s, pass_no) for s in sts):
            self._retrying(sharded.advance, self.client, self.job, False, self.sset)
            return True
        if any(
            s.pass_no < max(x.pass_no for x in sts) and s.state == "waiting" for s in sts
        ):  # a barrier step died half-way: finish it
            self._retrying(sharded.advance, self.client, self.job, False, self.sset)
        # leases of a vanished trainer come back only through a script call on their
        # shard; with no trainer left there, somebody must reap (bounded, locked per
        # shard). A crowd of idle trainers shares that duty: each reaps with a chance
        # of REAPERS_PER_ROUND / (registered workers), a few reaps per round in all.
        crowd = max(1, sum(s.workers for s in sts))
        for s in sts:
            if (
                s.state == "running"
                and s.todo == 0
                and s.leased > 0
                and random.random() < REAPERS_PER_ROUND / crowd
            ):
                self._retrying(self.client.reap, s.job, 100, 1000, self.worker_id)
        order = [(self.home + i) % len(self.shards) for i in range(1, len(self.shards))]
        for k in sorted(order, key=lambda k: -sts[k].todo):
            s = sts[k]
            if s.todo > 0 and s.state == "running" and s.pass_no == pass_no:
                task = self._lease(k, pass_no, 0)
                if task is not None:
                    return task
                self._close_idle(k)
        # a shard that hears nothing for ttl - heartbeat interval freezes its liveness
        # clock (the silence rule, docs/design.md): the looks (and reaps) of the idle
        # must come faster than that, or a vanished trainer's leases never expire
        quiet = min(
            float(s.config.get("worker_ttl", 5.0)) - float(s.config.get("heartbeat_interval", 1.0))
            for s in sts
        )
        limit = max(0.05, min(self.max_idle_wait, quiet / 2))
        wait, self._idle = min(self._idle, limit), min(self._idle * 2, limit)
        if not _finished(sts[self.home], pass_no):
            return self._lease(self.home, pass_no, wait)
        # home waits at the barrier: block on its wake-ups for the next pass; home
        # advances only once every shard finished this one, so a task of the next pass
        # ends this pass (no polling needed to see the barrier lift)
        if self.sset.passes is None or pass_no + 1 < self.sset.passes:
            nxt = self._lease(self.home, pass_no + 1, wait)
            if nxt is not None:
                self._carry = nxt
                return True
            return None
        time.sleep(wait * (0.5 + random.random()))
        return None

    def _ack(self, task: Task) -> None:
        k = self._shard_of(task)
        tr = self._trainers.get(k)
        if tr is None or task.revoked.is_set():
            log.warning(
                "job %s: lease of task %s of %s was revoked; its result is not counted",
                self.job,
                task.id,
                task.job,
            )
            return
        try:
            tr.ack(task)
        except errors.LeaseLost as e:
            log.warning("%s", e)

    def _iterate(self, pass_no: int) -> Iterator[Task]:
        while True:
            if self._current is not None:
                done, self._current = self._current, None
                self._ack(done)
            if self._closed or self._draining or self._state == "cancelled":
                return
            task, self._carry = self._carry, None
            if task is None or task.pass_no != pass_no:
                if task is not None:  # not this pass's (a rewind): give it back
                    self._release(task)
                task = self._take(pass_no)
            while task is None and not (self._draining or self._state == "cancelled"):
                got = self._idle_round(pass_no)
                if got is True:
                    return
                task = got if isinstance(got, Task) else None
            if task is None:
                return
            self._idle = self.idle_wait
            self._current = task
            yield task

    def _release(self, task: Task) -> None:
        try:
            self._open(self._shard_of(task)).release(task)
        except errors.LeaseLost:
            pass

    def passes(self) -> Iterator[Iterator[Task]]:
        """One iterator per pass of the whole job; each ends when every shard has
        finished that pass (a barrier). Ends after the last pass, on cancel or drain;
        tell them apart by ``state`` and ``draining`` as with ``Trainer.passes()``.

        Returns:
            Iterators of tasks (``global_id(task)`` names a task in the whole job).

        Raises:
            JobNotFound: a shard was deleted or replaced.
        """
        pass_no = sharded.combine(self.sset, self._statuses())[2]
        while self._state not in ("completed", "cancelled") and not self._closed:
            self._pass = max(self._pass, pass_no)
            yield self._iterate(pass_no)
            if self._draining:
                return
            pass_no += 1

    def __iter__(self) -> Iterator[Task]:
        for one_pass in self.passes():
            yield from one_pass

    def ack(self, task: Task) -> None:
        """Ack ``task`` now (iteration would ack it when the next task is asked for).

        Raises:
            LeaseLost: the lease was no longer this trainer's; nothing was counted.
        """
        if self._current is task:
            self._current = None
        self._open(self._shard_of(task)).ack(task)

    def fail(self, task: Task, error: str = "") -> None:
        """Report a failed task (as ``Trainer.fail``); iteration moves on without it."""
        if self._current is task:
            self._current = None
        self._open(self._shard_of(task)).fail(task, error)

    # -- leaving ------------------------------------------------------------------
    def close(self) -> None:
        """Release everything held on every shard and leave them. Idempotent."""
        if self._closed:
            return
        self._closed = True
        trainers, self._trainers = list(self._trainers.values()), {}
        for tr in trainers:
            tr.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("job %s: signal %d; leaving", self.job, signum)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def __enter__(self) -> ShardedTrainer:
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._old_handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            current = self._current
            if (
                current is not None
                and exc is not None
                and not isinstance(
                    exc, (SystemExit, KeyboardInterrupt, GeneratorExit, errors.TaskqError)
                )
            ):
                try:
                    self.fail(current, f"{type(exc).__name__}: {exc}")
                except errors.TaskqError as e:
                    log.warning("could not fail task %s: %s", current.id, e)
        finally:
            try:
                self.close()
            finally:
                for signum, handler in self._old_handlers.items():
                    signal.signal(signum, handler)
                self._old_handlers.clear()
