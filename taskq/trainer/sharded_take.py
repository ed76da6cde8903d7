"""How a sharded trainer takes work: home first, the other shards' tails after, and the
barrier at a pass's end.

``ShardTaker`` is the part of ``ShardedTrainer`` (trainer/sharded.py) that decides where
the next tasks come from: the finished task's shard while its tail lasts, else home,
else a shard whose status shows work left; and, when nothing is leasable, an idle round
(read every shard, reap a shard whose trainers vanished, run the barrier step when every
shard has finished the pass, else wait on home). See docs/sharding.md, "Trainers".

Data flow: trainer/sharded.py -> sharded_take.py -> trainer/core.py (one per shard) -> Redis;
-> sharded.py (the barrier step), client.py (status reads, reaps).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from taskq import errors
from taskq.admin import sharded
from taskq.admin.caller import Caller
from taskq.admin.jobs import PlainJob
from taskq.admin.shardset import ShardSet, shard_status
from taskq.inputwait import InputMeter
from taskq.models import JobStatus, Task
from taskq.trainer.core import Trainer

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
        or (s.pass_no == pass_no and _at_rest(s))
    )


def _at_rest(s: JobStatus) -> bool:
    """Shard ``s`` waits at a pass boundary (its pass complete, or no live task)."""
    return s.state in ("completed", "cancelled") or (
        s.state == "waiting" and s.reason in ("manual_advance", "all_dead")
    )


class ShardTaker:
    """Taking work over the shards (see the module docstring); ``ShardedTrainer`` sets
    the attributes and provides ``release``."""

    client: Caller
    job: str
    sset: ShardSet
    shards: list[str]
    home: int
    worker_id: str
    reconnect_timeout: float
    idle_wait: float
    max_idle_wait: float
    taken_elsewhere: int
    input_meter: InputMeter
    _idle: float
    _carry: list[Task]
    _trainers: dict[int, Trainer]
    _state: str
    _closed: bool
    _draining: bool
    _url: str | None
    _trainer_kw: dict[str, Any]

    def release(self, task: Task | list[Task]) -> None:
        raise NotImplementedError  # pragma: no cover - ShardedTrainer's

    def _release_quietly(self, tasks: list[Task]) -> None:
        try:
            self.release(tasks)
        except errors.LeaseLost:
            pass

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
        return Trainer.of_shard(
            self.shards[k],
            url=self._url,
            client=self.client,
            worker_id=self.worker_id,
            input_meter=self.input_meter if k == self.home else None,
            **self._trainer_kw,
        )

    def _close_idle(self, k: int) -> None:
        """Leave shard ``k`` (not home) once nothing is held there."""
        tr = self._trainers.get(k)
        if k != self.home and tr is not None and not tr.held:
            del self._trainers[k]
            tr.close()

    def _statuses(self) -> list[JobStatus]:
        return [self._retrying(shard_status, self.client, s) for s in self.shards]

    def _shard_of(self, task: Task) -> int:
        return self.shards.index(task.job)

    def _by_shard(self, tasks: Sequence[Task]) -> dict[int, list[Task]]:
        out: dict[int, list[Task]] = {}
        for t in tasks:
            out.setdefault(self._shard_of(t), []).append(t)
        return out

    # -- taking work ----------------------------------------------------------------
    def _lease(
        self,
        k: int,
        pass_no: int,
        timeout: float,
        n: int = 1,
        acks: Sequence[Task] = (),
        starts: Sequence[Task] = (),
        reserve: bool = False,
    ) -> list[Task]:
        """Up to ``n`` tasks of ``pass_no`` from shard ``k`` (reserved with ``reserve``),
        acking ``acks`` and starting ``starts`` (all of shard ``k``) in the same call; []
        when none. ``n`` 0: only the acks and starts."""
        try:
            got = self._open(k).lease_many(
                n, timeout=timeout, expect_pass=pass_no, acks=acks, starts=starts, reserve=reserve
            )
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

    def _take(
        self, pass_no: int, done: Sequence[Task], n: int, reserve: bool = False
    ) -> list[Task]:
        """Ack ``done`` and lease up to ``n`` tasks of ``pass_no`` (reserved with
        ``reserve``) in the same call: on ``done``'s shard when that is not home (a
        shard's tail, while it lasts), else home; then shards already open. [] when
        nothing is leasable now."""
        done = self._counted(done)
        by_shard = self._by_shard(done)
        if len(by_shard) > 1:  # tasks acked by hand in between: not one shard's batch
            self._ack_now(done)
            by_shard = {}
        for k, acks in by_shard.items():
            if k != self.home:
                got = self._lease(k, pass_no, 0, n, acks, reserve=reserve)
                if got or self._draining or self._state == "cancelled":
                    return got
                self._close_idle(k)
                by_shard = {}
        got = self._lease(self.home, pass_no, 0, n, by_shard.get(self.home, ()), reserve=reserve)
        if got or self._draining or self._state == "cancelled":
            return got
        for k in sorted(self._trainers):
            if k != self.home:
                got = self._lease(k, pass_no, 0, n, reserve=reserve)
                if got:
                    return got
                self._close_idle(k)
        return []

    def _idle_round(
        self, pass_no: int, n: int, reserve: bool = False, carry: bool = True
    ) -> list[Task] | bool:
        """Nothing leasable: read every shard; steal from one with work left, end the
        pass (True) when all have finished it (running the barrier step), else wait.
        With ``carry`` False a home waiting at the barrier is not asked for the next
        pass's tasks (none are leased for a caller that expects this pass only)."""
        sts = self._statuses()
        state, reason, _ = sharded.combine(self.sset, sts)
        if state in ("completed", "cancelled"):
            if state == "cancelled":
                self._retrying(sharded.advance, self.client, self.job, False, self.sset)
            self._state = state
            return True
        # a job with no live task at all waits for a retry, as a plain job does
        if reason != "all_dead" and all(_at_rest(s) for s in sts):
            # every shard waits at a boundary: the barrier step (it does nothing while a
            # checkpoint's cut holds the barrier lock: the next round tries again)
            self._retrying(sharded.advance, self.client, self.job, False, self.sset)
            if all(_finished(s, pass_no) for s in sts):
                return True
        if any(
            s.pass_no < max(x.pass_no for x in sts) and s.state == "waiting" for s in sts
        ):  # a barrier step died half-way: finish it
            self._retrying(sharded.advance, self.client, self.job, False, self.sset)
        if reason != "all_dead" and all(_finished(s, pass_no) for s in sts):
            return True  # every shard is past it (a caller that expected it, late)
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
                self._retrying(PlainJob(self.client, s.job).reap, 100, 1000, self.worker_id)
        order = [(self.home + i) % len(self.shards) for i in range(1, len(self.shards))]
        # work left: tasks to do, or read-ahead another trainer leased reserved (a lease
        # there takes it: the server's steal, as on one job)
        for k in sorted(order, key=lambda k: -(sts[k].todo + sts[k].reserved)):
            s = sts[k]
            if s.todo + s.reserved > 0 and s.state == "running" and s.pass_no == pass_no:
                got = self._lease(k, pass_no, 0, n, reserve=reserve)
                if got:
                    return got
                self._close_idle(k)
        # a shard at its tail (nothing left to lease, tasks out): only a lease there lets
        # its engine give this idle trainer the unread end of a long-running task, or a
        # backup of one (docs/design.md, "Tail splitting"); the busiest such shard a round
        tails = [
            k
            for k in order
            if sts[k].state == "running"
            and sts[k].pass_no == pass_no
            and sts[k].todo + sts[k].reserved == 0
            and sts[k].leased > 0
            and (sts[k].config.get("split_tails") or sts[k].config.get("backup_leases"))
        ]
        if tails and not reserve:
            k = max(tails, key=lambda k: sts[k].leased)
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
            return self._lease(self.home, pass_no, wait, n, reserve=reserve)
        # home waits at the barrier: block on its wake-ups for the next pass; home
        # advances only once every shard finished this one, so a task of the next pass
        # ends this pass (no polling needed to see the barrier lift)
        if carry and (self.sset.passes is None or pass_no + 1 < self.sset.passes):
            nxt = self._lease(self.home, pass_no + 1, wait, n, reserve=reserve)
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
