"""Where a sharded job's ``Trainer`` takes leases: a home shard first, the other shards'
tails after, and the barrier at a pass's end.

``ShardedSource`` is the lease source ``Trainer`` (core.py) composes for a sharded job
(chosen once, from the job's shard-set record; a plain job's is iteration.py's
``PlainSource``). It decides only where leases come from; the trainer's other verbs (ack,
fail, release, progress, the heartbeat) go to the shard's ``Worker`` it names
(``route``, ``worker_of``). It holds one ``Worker`` (worker.py) per shard it works on:
its home shard (spread evenly: the n-th trainer to join gets shard ``n mod S``) for as
long as it runs, another shard only while it takes tasks from there (registered
and heartbeating there only then). It takes from home first: the finished task's shard
while its tail lasts, else home, else a shard whose status shows work left; when nothing
is leasable, an idle round reads every shard (reads, no registration), reaps a shard
whose trainers vanished, leases from one with work left, so the tail of a pass is shared
rather than stuck on one shard, and, when every shard has finished pass ``p``, runs the
barrier step (``Job.advance``, admin/jobs.py), which any trainer or the reaper
may repeat; the pass iterator then ends: ``passes()`` means the whole job's pass, as for
a plain job.

A task costs one call: the finished task (or batch) is acked in the call that leases the
next ones (``PlainSource.lease_many(acks=...)`` of the finished task's shard, with the
pass expected). ``prefetch`` leases tasks ahead; ``batches(k)`` hands out up to ``k``
tasks of one shard at a time. See docs/sharding.md, "Trainers".

Data flow: trainer/core.py -> trainer/sharded.py -> trainer/iteration.py (one worker per
shard) -> Redis; -> admin/jobs.py (status reads, the barrier step, reaps).
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from taskq import errors
from taskq.admin.jobs import Job
from taskq.admin.shardset import ShardSet, combine
from taskq.engine.connection import Connection, translate
from taskq.engine.contract import MAX_PREFETCH
from taskq.inputwait import InputMeter
from taskq.keys import shard_set_key
from taskq.models import JobStatus, Task
from taskq.trainer.alldead import AllDeadWatch
from taskq.trainer.session import default_worker_id, retrying
from taskq.trainer.worker import Worker

log = logging.getLogger("taskq.sharded")

T = TypeVar("T")

#: Idle trainers reaping another shard per idle round, expected, however many there are.
REAPERS_PER_ROUND = 4


def _finished(s: JobStatus, pass_no: int) -> bool:
    """True when shard ``s`` has nothing more to do for ``pass_no`` (its pass complete,
    or none of its tasks live: see ``Job.advance``)."""
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


class ShardedSource:
    """Where a sharded job's leases come from (its arguments are ``Trainer``'s). Its
    taking members are ``Trainer``'s of the same name, documented there.

    Args:
        connection: the engine's connection.
        sset: the job's shard-set record.
        raw_url: the URL with its password, for the heartbeats' own connections.
        home: the home shard's index; the next in turn when None.
        idle_wait: seconds the first idle round waits for work before looking at the
            other shards again; it doubles while nothing comes, up to ``max_idle_wait``.

    Raises:
        InvalidInput: a bad ``home`` or ``prefetch``.
    """

    def __init__(
        self,
        connection: Connection,
        sset: ShardSet,
        raw_url: str | None,
        worker_id: str | None = None,
        *,
        home: int | None = None,
        prefetch: int = 0,
        idle_wait: float = 0.5,
        max_idle_wait: float = 5.0,
        heartbeat: bool | str = True,
        worker_ttl: float | None = None,
        reconnect_timeout: float = 60.0,
        input_meter: InputMeter | None = None,
        split_tails: bool = True,
        on_all_dead: str = "wait",
        ranges: bool = False,
    ) -> None:
        if not 0 <= prefetch <= MAX_PREFETCH:
            raise errors.InvalidInput(f"prefetch must be in [0, {MAX_PREFETCH}], got {prefetch}")
        self.reconnect_timeout = reconnect_timeout
        self.connection = connection
        self.job = sset.name
        self._raw_url = raw_url
        self.sset = sset
        self._handle = Job(connection, sset)
        #: an idle round of a job whose every live task is dead says so (or raises)
        self._all_dead = AllDeadWatch(self._handle, on_all_dead)
        self.shards = sset.shards
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
        self._worker_kw: dict[str, Any] = {
            "heartbeat": heartbeat,
            "worker_ttl": worker_ttl,
            "reconnect_timeout": reconnect_timeout,
            "split_tails": split_tails,
            "ranges": ranges,
        }
        #: sent by the home shard's worker only
        self.input_meter = input_meter if input_meter is not None else InputMeter()
        self._workers: dict[int, Worker] = {}
        self._state = "running"
        self._pass = 0
        #: the whole job's waiting reason at the last idle round; the newest pass a lease
        #: expecting it found over on every shard
        self._reason = ""
        self._over = -1
        self._closed = False
        self._draining = False
        #: tasks taken from shards other than home (the shared tail)
        self.taken_elsewhere = 0
        self.shard_worker(home)

    def _next_home_seq(self) -> int:
        """The record's join counter, incremented: the n-th trainer's home is n mod S."""
        with translate(self.connection.url):
            return int(
                self.connection.redis.hincrby(
                    shard_set_key(self.job, self.connection.prefix), "seq", 1
                )
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
    def reason(self) -> str:
        """Why the whole job waits, as the last idle round combined it ("" if it does not)."""
        return self._reason

    def pass_complete(self, pass_no: int) -> bool:
        """True once ``pass_no`` is over on every shard, as this trainer saw it."""
        return self._pass > pass_no or self._over >= pass_no

    @property
    def draining(self) -> bool:
        """True once an operator drained this worker on one of its shards."""
        return self._draining

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
        pass_no = combine(self.sset, self._statuses())[2]
        while self._state not in ("completed", "cancelled") and not self._closed:
            self._pass = max(self._pass, pass_no)
            yield pass_no
            if self._draining:
                return
            pass_no += 1

    def passes(self) -> Iterator[Iterator[Task]]:
        """One iterator per pass of the whole job; each ends when every shard has
        finished that pass (a barrier); a task is acked in the call that leases the next."""
        for pass_no in self._pass_numbers():
            yield self._iterate(pass_no)

    def iterate(self) -> Iterator[Task]:
        """Every pass's tasks, one after the other (``for task in trainer``)."""
        for one_pass in self.passes():
            yield from one_pass

    def batches(self, k: int) -> Iterator[list[Task]]:
        """Lists of up to ``k`` tasks of one shard (a batch never mixes shards or
        passes), acked together in the call that leases the next batch."""
        for pass_no in self._pass_numbers():
            yield from self._iterate_batches(pass_no, k)

    def lease_many(
        self,
        n: int,
        timeout: float | None = 2.0,
        expect_pass: int | None = None,
        acks: Sequence[Task] = (),
        starts: Sequence[Task] = (),
        reserve: bool = False,
    ) -> list[Task]:
        """Lease up to ``n`` tasks of the job's current pass, started, from one shard
        (home first, then the others' tails), as ``Trainer.lease_many``; when the pass
        is over everywhere the next one's come (not with ``expect_pass``).

        Each task carries its shard (``task.job``): its ack, start, fail or release goes
        to that shard's worker. ``acks`` and ``starts`` of home ride on the lease call
        there; those of other shards take one call per shard (n 0) before it.
        ``expect_pass`` is the whole job's pass: [] once it is over on every shard (the
        barrier step is run).
        """
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
                    self._over = max(self._over, expect_pass)
                    return []
                if self._state not in ("completed", "cancelled"):
                    self._pass += 1  # every shard finished it: the next pass
                continue
            if found:
                self._idle = self.idle_wait
                return found
            if deadline is not None and time.monotonic() >= deadline:
                return []

    def lease(
        self, timeout: float | None, expect_pass: int | None, acks: Sequence[Task]
    ) -> Task | None:
        """One task (``lease_many(1, ...)``); None when ``timeout`` passed."""
        got = self.lease_many(1, timeout, expect_pass, acks)
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

    def _forget(self, tasks: Sequence[Task]) -> None:
        self._pending = [t for t in self._pending if all(t is not x for x in tasks)]

    def route(self, tasks: Sequence[Task]) -> list[tuple[Worker, list[Task]]]:
        """Tasks leaving the loop's hands (an ack, fail or release by hand): each shard's
        worker with its tasks (iteration would have acked them with the next lease)."""
        self._forget(tasks)
        return [(self.shard_worker(k), part) for k, part in self._by_shard(tasks).items()]

    def worker_of(self, task: Task) -> Worker:
        """The worker of ``task``'s shard (opened if need be)."""
        return self.shard_worker(self._shard_of(task))

    def workers(self) -> list[Worker]:
        """The workers open now, home's among them, in shard order."""
        return [self._workers[k] for k in sorted(self._workers)]

    # -- leaving ------------------------------------------------------------------
    def close(self) -> None:
        """Release everything held on every shard and leave them. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._ahead.clear()
        workers, self._workers = list(self._workers.values()), {}
        for worker in workers:
            worker.close()

    def current(self) -> list[Task]:
        """The tasks the loop is working on (handed out, not revoked)."""
        return [t for t in self._pending if not t.revoked.is_set()]

    def _release_quietly(self, tasks: list[Task]) -> None:
        for worker, part in self.route(tasks):
            try:
                worker.calls.write("release", part)
            except errors.LeaseLost:
                pass

    # -- plumbing -----------------------------------------------------------------
    def _retrying(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, retrying ``ConnectionLost`` (a master paused or failing over)
        for up to ``reconnect_timeout`` seconds (session.py's ``retrying``)."""
        return retrying(self.reconnect_timeout, fn, *args)

    def shard_worker(self, k: int) -> Worker:
        """Shard ``k``'s worker, registered there first if need be."""
        if k not in self._workers:
            self._workers[k] = self._retrying(self._new_worker, k)
        return self._workers[k]

    def _new_worker(self, k: int) -> Worker:
        return Worker(
            self.connection,
            self.shards[k],
            self._raw_url,
            self.worker_id,
            input_meter=self.input_meter if k == self.home else None,
            **self._worker_kw,
        )

    def _close_idle(self, k: int) -> None:
        """Leave shard ``k`` (not home) once nothing is held there."""
        worker = self._workers.get(k)
        if k != self.home and worker is not None and not worker.leases.held():
            del self._workers[k]
            worker.close()

    def _statuses(self) -> list[JobStatus]:
        return [self._retrying(s.status, 0) for s in self._handle.shards]

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
            got = self.shard_worker(k).plain.lease_many(n, timeout, pass_no, acks, starts, reserve)
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
            if t.revoked.is_set() or self._shard_of(t) not in self._workers:
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
                self._workers[k].calls.ack(tasks)
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
        for k in sorted(self._workers):
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
        state, reason, _ = combine(self.sset, sts)
        self._reason = reason if state == "waiting" else ""
        if state in ("completed", "cancelled"):
            if state == "cancelled":
                self._retrying(self._handle.advance)
            self._state = state
            return True
        # a job with no live task at all waits for a retry, as a plain job does
        if reason == "all_dead":
            self._all_dead.seen(pass_no)
        else:
            self._all_dead.moved_on()
        if reason != "all_dead" and all(_at_rest(s) for s in sts):
            # every shard waits at a boundary: the barrier step (it does nothing while a
            # checkpoint's cut holds the barrier lock: the next round tries again)
            self._retrying(self._handle.advance)
            if all(_finished(s, pass_no) for s in sts):
                return True
        if any(
            s.pass_no < max(x.pass_no for x in sts) and s.state == "waiting" for s in sts
        ):  # a barrier step died half-way: finish it
            self._retrying(self._handle.advance)
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
                self._retrying(
                    self._handle.shards[self.shards.index(s.job)].reap, 100, 1000, self.worker_id
                )
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
