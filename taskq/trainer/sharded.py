"""The trainer of a sharded job: a home shard first, the other shards' tails after.

``taskq.Trainer(name)`` of a sharded job returns a ``ShardedTrainer`` (trainer/core.py asks
``client.job(name)``): the same surface as a plain ``Trainer`` (iteration, ``passes()``,
``batches(k)``, ``prefetch``, ``lease`` / ``lease_many``, ``progress``, ``ack`` / ``fail``
/ ``release``, the ``with`` block's SIGTERM release, ``close``), so code written for one
job works on both.

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

Data flow: trainer code -> trainer/sharded.py -> sharded_take.py (where tasks come from)
-> trainer/core.py (one per shard) -> Redis;
-> sharded.py (status reads, the barrier step); cli/work.py -> trainer/sharded.py.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator, Sequence
from types import EllipsisType
from typing import Any

from taskq import errors
from taskq.admin import sharded
from taskq.admin.client import Client
from taskq.engine.connection import translate
from taskq.engine.contract import MAX_PREFETCH
from taskq.inputwait import InputMeter
from taskq.keys import shard_set_key
from taskq.models import Task
from taskq.trainer import core as trainer_module
from taskq.trainer.core import Trainer, default_worker_id
from taskq.trainer.sharded_take import ShardTaker
from taskq.trainer.signals import LeaveOnSignal

log = logging.getLogger("taskq.sharded")


class ShardedTrainer(ShardTaker, LeaveOnSignal):
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
        input_meter: the loop's data-wait meter (``Trainer``'s), sent with the home
            shard's heartbeats (the other shards' trainers come and go).
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
        input_meter: InputMeter | None = None,
        split_tails: bool = True,
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
            seq = self._retrying(self._next_home_seq)
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
            "split_tails": split_tails,
        }
        #: sent by the home shard's trainer only
        self.input_meter = input_meter if input_meter is not None else InputMeter()
        self._trainers: dict[int, Trainer] = {}
        self._state = "running"
        self._pass = 0
        self._closed = False
        self._draining = False
        #: tasks taken from shards other than home (the shared tail)
        self.taken_elsewhere = 0
        self._open(home)

    def _next_home_seq(self) -> int:
        """The record's join counter, incremented: the n-th trainer's home is n mod S."""
        with translate(self.client.url):
            return int(
                self.client.redis.hincrby(shard_set_key(self.job, self.client.prefix), "seq", 1)
            )

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
                counted = self._counted(done)
                if counted:  # ack it and top the prefetch up, one call on its shard
                    want = self.prefetch - len(self._ahead)
                    if want > 0 and len(self._by_shard(counted)) == 1:
                        k = self._shard_of(counted[0])
                        self._ahead.extend(self._lease(k, pass_no, 0, want, counted))
                    else:
                        self._ack_now(counted)
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

    def lease_many(
        self,
        n: int,
        timeout: float | None = 2.0,
        expect_pass: int | None = None,
        acks: Sequence[Task] = (),
        *,
        starts: Sequence[Task] = (),
        reserve: bool = False,
    ) -> list[Task]:
        """Lease up to ``n`` tasks of the job's current pass, started, from one shard
        (home first, then the others' tails), as ``Trainer.lease_many``; when the pass
        is over everywhere the next one's come (not with ``expect_pass``).

        Each task carries its shard (``task.job``): its ack, start, fail or release goes
        to that shard's trainer. ``acks`` and ``starts`` of home ride on the lease call
        there; those of other shards take one call per shard (n 0) before it.

        Args:
            n: the most tasks (1 to the per-call bound; 0 with ``acks`` or ``starts``:
                none, only those).
            timeout: seconds to wait for work (0: do not wait; None: until there is).
            expect_pass: the whole job's pass wanted: never return work of another one;
                [] once that pass is over on every shard (the barrier step is run).
            acks: finished tasks to ack (a lost lease is logged, not raised).
            starts: tasks leased with ``reserve=True``, to start now (each comes back
                started, or revoked if an idle trainer took it meanwhile).
            reserve: lease the tasks reserved, not started (``Trainer.lease_many``).

        Returns:
            The tasks leased; empty when ``timeout`` passed with nothing to give, or
            (``expect_pass``) that pass is over.

        Raises:
            InvalidInput: ``n < 0``, or 0 with neither acks nor starts. JobCompleted,
            JobCancelled: no work will ever come. Draining: an operator drained this
            worker. JobNotFound, ConnectionLost.
        """
        if n < 0 or (n == 0 and not acks and not starts):
            raise errors.InvalidInput(f"n must be >= 1 (0 with acks or starts), got {n}")
        if self._closed:
            raise errors.TaskqError(f"job {self.job}: this trainer is closed")
        pass_no = self._pass if expect_pass is None else expect_pass
        self._forget(acks)
        by_ack = self._by_shard(self._counted(acks))
        by_start = self._by_shard(starts)
        home_acks: list[Task] = by_ack.pop(self.home, []) if n else []
        home_starts: list[Task] = by_start.pop(self.home, []) if n else []
        for k in sorted(set(by_ack) | set(by_start)):  # other shards': one call each
            self._lease(k, pass_no, 0, 0, by_ack.get(k, ()), by_start.get(k, ()))
        if n == 0:
            self._raise_if_over()
            return []
        if expect_pass is not None:
            self._pass = max(self._pass, expect_pass)
        deadline = None if timeout is None else time.monotonic() + timeout
        if home_acks or home_starts:  # home's ride on a lease there
            got = self._lease(self.home, pass_no, 0, n, home_acks, home_starts, reserve)
            if got:
                return got
        while True:
            self._raise_if_over()
            if expect_pass is None:
                carried, self._carry = self._carry, []
                if carried:
                    self._pass = max(self._pass, max(t.pass_no for t in carried))
                    return carried
                pass_no = self._pass
            got = self._take(pass_no, (), n, reserve)
            if got:
                return got
            self._raise_if_over()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None:  # one look at every shard even at timeout 0
                self._idle = min(self._idle, max(0.01, left))
            found = self._idle_round(pass_no, n, reserve, carry=expect_pass is None)
            if found is True:
                if expect_pass is not None:  # that pass is over on every shard
                    self._raise_if_over()
                    return []
                if self._state not in ("completed", "cancelled"):
                    self._pass += 1  # every shard finished it: the next pass
                continue
            if found:
                self._idle = self.idle_wait
                return found
            if deadline is not None and time.monotonic() >= deadline:
                return []

    def lease(self, timeout: float | None = 2.0) -> Task | None:
        """Lease one task (``lease_many(1, timeout)``); None when ``timeout`` passed."""
        got = self.lease_many(1, timeout)
        return got[0] if got else None

    def _raise_if_over(self) -> None:
        if self._closed:
            raise errors.TaskqError(f"job {self.job}: this trainer is closed")
        if self._draining:
            raise errors.Draining(f"worker {self.worker_id} is draining")
        if self._state == "cancelled":
            raise errors.JobCancelled(f"job {self.job!r} was cancelled")
        if self._state == "completed":
            raise errors.JobCompleted(f"job {self.job!r} is completed")

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between heartbeats (the home shard's, as the job's)."""
        return self._open(self.home).heartbeat_interval

    @property
    def held(self) -> list[Task]:
        """The tasks this trainer holds, on every shard (current and leased ahead)."""
        return [t for tr in list(self._trainers.values()) for t in tr.held]

    def progress(self, task: Task, n: int, end: int | None | EllipsisType = ...) -> None:
        """Record that the loop took samples ``[0, n)`` of ``task``: kept by its shard's
        trainer and sent with that shard's heartbeat (as ``Trainer.progress``, ``end``
        too).

        Raises:
            InvalidInput: ``n`` is not an integer >= 0.
        """
        self._open(self._shard_of(task)).progress(task, n, end)

    def flush_progress(self) -> list[int]:
        """Send the recorded progress of every shard now (as ``Trainer.flush_progress``).

        Returns:
            The ids (in their shard) of tasks whose report was refused.
        """
        return [i for tr in list(self._trainers.values()) for i in tr.flush_progress()]

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


# ``taskq.Trainer(name)`` of a sharded job is one of these (trainer/core.py)
trainer_module.SHARDED_TRAINER = ShardedTrainer
