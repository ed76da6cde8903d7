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

A task costs one call: the finished task (or batch) is acked in the call that leases the
next ones (``Trainer.lease_many(acks=...)`` on the finished task's shard, with the pass
expected), as a plain ``Trainer``'s iterator does. ``prefetch`` leases tasks ahead;
``batches(k)`` hands out up to ``k`` tasks of one shard at a time.

Data flow: trainer code -> sharded_trainer.py -> trainer.py (one per shard) -> Redis;
-> sharded.py (status reads, the barrier step); cli/work.py -> sharded_trainer.py.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from . import errors, sharded
from .client import Client
from .keys import shard_set_key
from .models import JobStatus, Task
from .scripts import MAX_PREFETCH
from .signals import LeaveOnSignal
from .trainer import Trainer, default_worker_id

log = logging.getLogger("taskq.sharded")

T = TypeVar("T")

#: Idle trainers reaping another shard per idle round, expected, however many there are.
REAPERS_PER_ROUND = 4


def _finished(s: JobStatus, pass_no: int) -> bool:
    """True when shard ``s`` has nothing more to do for ``pass_no`` (its pass complete,
    or none of its tasks live: see ``sharded.advance``)."""
    return (
        s.state in ("completed", "cancelled")
        or s.pass_no > pass_no
        or (s.state == "waiting" and s.reason in ("manual_advance", "all_dead"))
    )


class ShardedTrainer(LeaveOnSignal):
    """A worker of one sharded job (see the module docstring).

    Args:
        job: the sharded job's name.
        url: Redis URL (or ``TASKQ_REDIS_URL``); ignored when ``client`` is given.
        client: a configured ``taskq.Client`` to share.
        worker_id: this worker's id on every shard (``host:pid:random`` by default).
        home: the home shard's index; the next in turn when None.
        prefetch: tasks leased ahead of the current one (on the shard the last ones came
            from; they are this trainer's until acked, released on close). 0: none.
        idle_wait: seconds the first idle round waits for work before looking at the
            other shards again; it doubles while nothing comes, up to ``max_idle_wait``
            (the polls of a crowd of idle trainers at a pass's tail stay bounded).
        max_idle_wait: the longest wait between two looks at the other shards.
        heartbeat, worker_ttl, reconnect_timeout: as ``Trainer`` (per shard trainer).
        handle_signals: in the ``with`` block, SIGTERM -> ``SystemExit``, SIGINT ->
            ``KeyboardInterrupt``, so everything held is released.

    Raises:
        JobNotFound: no such sharded job.
        InvalidInput: a bad ``home`` or ``prefetch``.
        ConnectionLost: the cluster unreachable for longer than ``reconnect_timeout``.
    """

    def __init__(
        self,
        job: str,
        url: str | None = None,
        client: Client | None = None,
        worker_id: str | None = None,
        *,
        home: int | None = None,
        prefetch: int = 0,
        idle_wait: float = 0.5,
        max_idle_wait: float = 5.0,
        heartbeat: bool | str = True,
        worker_ttl: float | None = None,
        handle_signals: bool = True,
        reconnect_timeout: float = 60.0,
    ) -> None:
        if not 0 <= prefetch <= MAX_PREFETCH:
            raise errors.InvalidInput(f"prefetch must be in [0, {MAX_PREFETCH}], got {prefetch}")
        self.reconnect_timeout = reconnect_timeout
        # one redis-py retry per command; this trainer's own loop does the rest
        self.client = client or self._retrying(lambda: Client(url, retries=1))
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
        self.prefetch = prefetch
        self.worker_id = worker_id or default_worker_id()
        self.idle_wait = idle_wait
        self.max_idle_wait = max(idle_wait, max_idle_wait)
        self._idle = idle_wait
        self._carry: list[Task] = []  # tasks of the next pass, got while waiting
        self._ahead: deque[Task] = deque()  # prefetched, leased, not yet handed out
        self._pending: list[Task] = []  # handed out: acked with the next step
        self.handle_signals = handle_signals
        self._old_handlers: dict[int, Any] = {}
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
        #: tasks taken from shards other than home (the shared tail)
        self.taken_elsewhere = 0
        self._open(home)

    # -- plumbing -----------------------------------------------------------------
    def _retrying(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, retrying ``ConnectionLost`` (a master paused or failing over, a
        cluster down at start-up) with backoff for up to ``reconnect_timeout`` seconds."""
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
        return Trainer(
            self.shards[k],
            url=self._url,
            client=self.client,
            worker_id=self.worker_id,
            **self._trainer_kw,
        )

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

    def _by_shard(self, tasks: Sequence[Task]) -> dict[int, list[Task]]:
        out: dict[int, list[Task]] = {}
        for t in tasks:
            out.setdefault(self._shard_of(t), []).append(t)
        return out

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
    def _lease(
        self, k: int, pass_no: int, timeout: float, n: int = 1, acks: Sequence[Task] = ()
    ) -> list[Task]:
        """Up to ``n`` tasks of ``pass_no`` from shard ``k``, acking ``acks`` (all of
        shard ``k``) in the same call; [] when none."""
        try:
            got = self._open(k).lease_many(n, timeout=timeout, expect_pass=pass_no, acks=acks)
        except errors.JobCompleted:
            return []
        except errors.JobCancelled:
            self._state = "cancelled"
            return []
        except errors.Draining:
            self._draining = True
            return []
        if k != self.home:
            self.taken_elsewhere += len(got)
        return got

    def _counted(self, done: Sequence[Task]) -> list[Task]:
        """``done`` without the tasks whose lease was revoked (logged: not counted)."""
        keep = []
        for t in done:
            if t.revoked.is_set() or self._shard_of(t) not in self._trainers:
                log.warning(
                    "job %s: lease of task %s of %s was revoked; its result is not counted",
                    self.job,
                    t.id,
                    t.job,
                )
            else:
                keep.append(t)
        return keep

    def _ack_now(self, done: Sequence[Task]) -> None:
        """Ack ``done`` in one call per shard (no lease with it); a lost lease is logged."""
        for k, tasks in self._by_shard(self._counted(done)).items():
            try:
                self._trainers[k].ack(tasks)
            except errors.LeaseLost as e:
                log.warning("%s", e)

    def _take(self, pass_no: int, done: Sequence[Task], n: int) -> list[Task]:
        """Ack ``done`` and lease up to ``n`` tasks of ``pass_no`` in the same call: on
        ``done``'s shard when that is not home (a shard's tail, while it lasts), else
        home; then shards already open. [] when nothing is leasable now."""
        done = self._counted(done)
        by_shard = self._by_shard(done)
        if len(by_shard) > 1:  # tasks acked by hand in between: not one shard's batch
            self._ack_now(done)
            by_shard = {}
        for k, acks in by_shard.items():
            if k != self.home:
                got = self._lease(k, pass_no, 0, n, acks)
                if got or self._draining or self._state == "cancelled":
                    return got
                self._close_idle(k)
                by_shard = {}
        got = self._lease(self.home, pass_no, 0, n, by_shard.get(self.home, ()))
        if got or self._draining or self._state == "cancelled":
            return got
        for k in sorted(self._trainers):
            if k != self.home:
                got = self._lease(k, pass_no, 0, n)
                if got:
                    return got
                self._close_idle(k)
        return []

    def _idle_round(self, pass_no: int, n: int) -> list[Task] | bool:
        """Nothing leasable: read every shard; steal from one with work left, end the
        pass (True) when all have finished it (running the barrier step), else wait."""
        sts = self._statuses()
        state, reason, _ = sharded.combine(self.sset, sts)
        if state in ("completed", "cancelled"):
            if state == "cancelled":
                self._retrying(sharded.advance, self.client, self.job, False, self.sset)
            self._state = state
            return True
        # a job with no live task at all waits for a retry, as a plain job does
        if reason != "all_dead" and all(_finished(s, pass_no) for s in sts):
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
                got = self._lease(k, pass_no, 0, n)
                if got:
                    return got
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
            return self._lease(self.home, pass_no, wait, n)
        # home waits at the barrier: block on its wake-ups for the next pass; home
        # advances only once every shard finished this one, so a task of the next pass
        # ends this pass (no polling needed to see the barrier lift)
        if self.sset.passes is None or pass_no + 1 < self.sset.passes:
            nxt = self._lease(self.home, pass_no + 1, wait, n)
            if nxt:
                self._carry = nxt
                return True
            return []
        time.sleep(wait * (0.5 + random.random()))
        return []

    def _stopped(self) -> bool:
        return self._closed or self._draining or self._state == "cancelled"

    def _fill(self, pass_no: int, done: list[Task], n: int) -> list[Task]:
        """Ack ``done`` and get up to ``n`` tasks of ``pass_no``, waiting (idle rounds)
        while none is leasable; [] when the pass is over, or the job or this worker."""
        got, self._carry = self._carry, []
        stale = [t for t in got if t.pass_no != pass_no]
        if stale:  # not this pass's (a rewind): give them back
            self._release_quietly(stale)
            got = [t for t in got if t.pass_no == pass_no]
        if got:
            self._ack_now(done)
        else:
            got = self._take(pass_no, done, n)
        while not got and not (self._draining or self._state == "cancelled"):
            found = self._idle_round(pass_no, n)
            if found is True:
                return []
            got = found or []
        if got:
            self._idle = self.idle_wait
        return got

    def _iterate(self, pass_no: int) -> Iterator[Task]:
        while True:
            done, self._pending = self._pending, []
            if self._stopped():
                self._ack_now(done)
                return
            while self._ahead and self._ahead[0].pass_no != pass_no:  # a pass left early
                self._release_quietly([self._ahead.popleft()])
            if self._ahead:
                task = self._ahead.popleft()
                if done:  # ack it and top the prefetch up, one call on its shard
                    k = self._shard_of(done[0])
                    want = self.prefetch - len(self._ahead)
                    if want > 0 and len(self._by_shard(done)) == 1 and self._counted(done):
                        self._ahead.extend(self._lease(k, pass_no, 0, want, self._counted(done)))
                    else:
                        self._ack_now(done)
            else:
                got = self._fill(pass_no, done, 1 + self.prefetch)
                if not got:
                    return
                task = got[0]
                self._ahead.extend(got[1:])
            if self._state == "cancelled" or task.revoked.is_set():
                continue
            self._pending = [task]
            yield task

    def _iterate_batches(self, pass_no: int, k: int) -> Iterator[list[Task]]:
        while True:
            done, self._pending = self._pending, []
            if self._stopped():
                self._ack_now(done)
                return
            got = self._fill(pass_no, done, k)
            if not got:
                return
            self._pending = list(got)
            yield got

    def _pass_numbers(self) -> Iterator[int]:
        pass_no = sharded.combine(self.sset, self._statuses())[2]
        while self._state not in ("completed", "cancelled") and not self._closed:
            self._pass = max(self._pass, pass_no)
            yield pass_no
            if self._draining:
                return
            pass_no += 1

    def passes(self) -> Iterator[Iterator[Task]]:
        """One iterator per pass of the whole job; each ends when every shard has
        finished that pass (a barrier). Ends after the last pass, on cancel or drain;
        tell them apart by ``state`` and ``draining`` as with ``Trainer.passes()``.

        Returns:
            Iterators of tasks (``global_id(task)`` names a task in the whole job); a
            task is acked in the call that leases the next one.

        Raises:
            JobNotFound: a shard was deleted or replaced.
        """
        for pass_no in self._pass_numbers():
            yield self._iterate(pass_no)

    def __iter__(self) -> Iterator[Task]:
        for one_pass in self.passes():
            yield from one_pass

    def batches(self, k: int) -> Iterator[list[Task]]:
        """Lists of up to ``k`` tasks of one shard, leased together and acked together in
        the call that leases the next batch; through every pass (a batch never mixes
        two passes), until the job is completed or cancelled, or this worker drains.

        Args:
            k: the most tasks in one batch (1 to the per-call bound).

        Returns:
            An iterator of batches.

        Raises:
            InvalidInput: ``k < 1``.
            JobNotFound: a shard was deleted or replaced.
        """
        if k < 1:
            raise errors.InvalidInput(f"batch size must be >= 1, got {k}")
        for pass_no in self._pass_numbers():
            yield from self._iterate_batches(pass_no, k)

    def _forget(self, tasks: Sequence[Task]) -> None:
        self._pending = [t for t in self._pending if all(t is not x for x in tasks)]

    def ack(self, task: Task | list[Task]) -> None:
        """Ack a task (or a batch) now; iteration would ack it with the next lease.

        Raises:
            LeaseLost: the lease was no longer this trainer's; nothing was counted.
        """
        tasks = task if isinstance(task, list) else [task]
        self._forget(tasks)
        for k, part in self._by_shard(tasks).items():
            self._open(k).ack(part)

    def fail(self, task: Task | list[Task], error: str = "") -> None:
        """Report a failed task or batch (as ``Trainer.fail``); iteration moves on.

        Raises:
            LeaseLost: the lease was no longer this trainer's.
        """
        tasks = task if isinstance(task, list) else [task]
        self._forget(tasks)
        for k, part in self._by_shard(tasks).items():
            self._open(k).fail(part, error)

    def release(self, task: Task | list[Task]) -> None:
        """Give a task (or a batch) back unfinished, leasable by others at once.

        Raises:
            LeaseLost: the lease was no longer this trainer's.
        """
        tasks = task if isinstance(task, list) else [task]
        self._forget(tasks)
        for k, part in self._by_shard(tasks).items():
            self._open(k).release(part)

    def _release_quietly(self, tasks: list[Task]) -> None:
        try:
            self.release(tasks)
        except errors.LeaseLost:
            pass

    # -- leaving ------------------------------------------------------------------
    def close(self) -> None:
        """Release everything held on every shard and leave them. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._ahead.clear()
        trainers, self._trainers = list(self._trainers.values()), {}
        for tr in trainers:
            tr.close()

    def _fail_current(self, exc_type: type[BaseException] | None, exc: BaseException) -> None:
        """The body raised: the task(s) it was working on failed; the rest (prefetched)
        are released by close()."""
        current = [t for t in self._pending if not t.revoked.is_set()]
        if current:
            name = exc_type.__name__ if exc_type else "error"
            try:
                self.fail(current, f"{name}: {exc}")
            except errors.TaskqError as e:
                log.warning("could not fail task(s) %s: %s", [t.id for t in current], e)
