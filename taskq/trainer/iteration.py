"""A trainer's ways to take tasks: ``lease`` / ``lease_many``, iteration, ``passes()``,
``batches(k)``.

``Iteration`` is the part of ``Worker`` (trainer/worker.py) a training loop drives: each step
acks the previous task, starts a reserved one and leases the next in one call
(trainer/calls.py's ``step``), keeping the read-ahead in the lease leases
(trainer/leases.py), and waits on the wake-up lists when there is no work. It owns the
prefetch depth and the input meter it times ``next()`` with; the rest is the session's,
the leases's and the job view's.

Data flow: training loop -> trainer/iteration.py -> trainer/calls.py -> protocol.py -> Redis.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator, Sequence

from taskq import errors
from taskq.admin.jobs import PlainJob
from taskq.engine.connection import Connection
from taskq.engine.contract import MAX_PREFETCH
from taskq.inputwait import InputMeter
from taskq.models import Task
from taskq.trainer.alldead import AllDeadWatch
from taskq.trainer.calls import (
    DRAINING,
    JOB_CANCELLED,
    JOB_COMPLETED,
    OK,
    PASS_DONE,
    REREGISTER,
    STALE,
    Calls,
)
from taskq.trainer.heartbeat import Heartbeat
from taskq.trainer.leases import HeldLeases
from taskq.trainer.protocol import Wire
from taskq.trainer.session import JobView, Session

log = logging.getLogger("taskq.trainer")

_MAX_BLOCK_S = 5.0


class Iteration:
    """The iteration modes of a trainer (see the module docstring)."""

    def __init__(
        self,
        connection: Connection,
        wire: Wire,
        session: Session,
        leases: HeldLeases,
        view: JobView,
        calls: Calls,
        heartbeat: Heartbeat,
        prefetch: int,
        input_meter: InputMeter,
        on_all_dead: str = "wait",
    ) -> None:
        if not 0 <= prefetch <= MAX_PREFETCH:
            raise errors.InvalidInput(f"prefetch must be in [0, {MAX_PREFETCH}], got {prefetch}")
        self.job = session.job
        self._connection = connection
        self._wire = wire
        self._session = session
        self._leases = leases
        self._view = view
        self._calls = calls
        self._heartbeat = heartbeat
        self.prefetch = prefetch
        self.input_meter = input_meter
        #: a loop with nothing to lease because every live task is dead says so
        self.all_dead = AllDeadWatch(PlainJob(connection, self.job), on_all_dead)

    # -- lease / lease_many --------------------------------------------------------
    def lease(self, timeout: float, expect_pass: int | None, acks: Sequence[Task]) -> Task | None:
        """``Trainer.lease``."""
        tasks = self.lease_n(
            1, timeout, expect_pass, acks=self._leases.still_held(acks), raise_corrupt=True
        )
        return tasks[0] if tasks else None

    def lease_many(
        self,
        n: int,
        timeout: float,
        expect_pass: int | None,
        acks: Sequence[Task],
        starts: Sequence[Task],
        reserve: bool,
    ) -> list[Task]:
        """``Trainer.lease_many``."""
        if n < 0 or (n == 0 and not acks and not starts):
            raise errors.InvalidInput(f"n must be >= 1 (0 with acks or starts), got {n}")
        return self.lease_n(
            n,
            timeout,
            expect_pass,
            acks=self._leases.still_held(acks),
            starts=list(starts),
            mode="R" if reserve else "S",
        )

    def lease_n(
        self,
        n: int,
        timeout: float,
        expect_pass: int | None,
        acks: list[Task] | None = None,
        raise_corrupt: bool = False,
        starts: list[Task] | None = None,
        mode: str = "S",
    ) -> list[Task]:
        """Lease up to ``n`` tasks within ``timeout`` (the calls behind ``lease``,
        ``lease_many`` and ``batches``)."""
        calls, retrying = self._calls, self._session.retrying
        deadline = time.monotonic() + timeout
        acks = list(acks or [])
        starts = starts or []
        while True:
            # a pending piece of a split task is waited for within this call's timeout
            calls.split_wait_s = max(0.0, deadline - time.monotonic())
            try:
                r = retrying(
                    calls.step, acks, starts, n, mode, -1 if expect_pass is None else expect_pass
                )
            finally:
                calls.split_wait_s = None
            if acks and STALE in r.ack_res:
                calls.check_acks(acks, r.ack_res, raise_stale=False)
            acks, starts = [], []
            bad = calls.fail_corrupt(r.corrupt) if r.corrupt else []
            if r.code == REREGISTER:
                continue
            if r.code == DRAINING:
                self._view.drain()
                raise errors.Draining(f"worker {self._session.worker_id} is draining")
            if r.code == JOB_COMPLETED or r.code == JOB_CANCELLED:
                calls.end_code(r.code)
            if bad and raise_corrupt:
                raise bad[0]
            if r.granted or r.code == PASS_DONE or n == 0:
                return r.granted
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            if not bad:
                retrying(self.wait, min(remaining, r.wait_s) if r.wait_s > 0 else remaining, r.gen)

    def wait(self, bound_s: float, gen: int) -> None:
        """Block until work may exist: a wake token, a broadcast, or the bound.

        ``gen`` is the generation the lease reply saw: the next broadcast goes to the list
        of the next one's parity (``JobView.wait_gen``).
        """
        gen_ = self._view.wait_gen(gen)
        if gen_ is None:
            return
        timeout = min(bound_s, _MAX_BLOCK_S) if bound_s > 0 else _MAX_BLOCK_S
        if timeout <= 0:
            return
        # holding nothing, the loop waits for tasks, not for data: an open stream's
        # appends or a pass's last tasks held by others (inputwait.py counts it apart)
        idle = not self._leases.held()
        if idle:
            self.input_meter.idle_begin()
        try:
            self._wire.wait(gen_, timeout)
        finally:
            if idle:
                self.input_meter.idle_end()

    # -- iteration ----------------------------------------------------------------
    def iterate(self, expect_pass: int | None) -> Iterator[Task]:
        """``tasks`` with each ``next()`` timed by the input meter (its data wait; the
        time between two ``next()`` calls is the step)."""
        meter = self.input_meter
        tasks = self.tasks(expect_pass)
        meter.restart()
        try:
            while True:
                meter.enter()
                task = next(tasks, None)
                if task is None:
                    return
                meter.leave()
                yield task
        finally:
            meter.stop()
            tasks.close()

    def tasks(self, expect_pass: int | None) -> Generator[Task, None, None]:
        """The tasks one by one: each ``next()`` acks the previous one, starts a reserved
        one and leases read-ahead in one call."""
        leases, view, calls = self._leases, self._view, self._calls
        step, retrying = calls.step, self._session.retrying
        current: Task | None = None
        ep = -1 if expect_pass is None else expect_pass
        while True:
            acks, starts, n_reserved = leases.next_step(current)
            if current is not None and current._revoked is not None and current._revoked.is_set():
                log.warning(
                    "job %s: lease of task %s was revoked; its result is not counted",
                    self.job,
                    current.id,
                )
                acks = []
            current = None
            if view.draining:
                if acks:
                    retrying(step, acks, [], 0, "S", ep)
                return
            if starts:
                want, mode = self.prefetch - n_reserved, "R"
            else:
                want, mode = 1 + self.prefetch, "F"
            try:
                r = retrying(step, acks, starts, want, mode, ep)
            except (errors.JobNotFound, errors.JobCancelled):
                self._heartbeat.revoke_all()
                raise
            if acks and STALE in r.ack_res:
                calls.check_acks(acks, r.ack_res, raise_stale=False)
            # logged; the loop goes on with other work
            bad = calls.fail_corrupt(r.corrupt) if r.corrupt else []
            code, got = r.code, r.granted
            if code == REREGISTER:
                continue
            if code == DRAINING:
                view.drain()
                return
            if code == JOB_COMPLETED or code == JOB_CANCELLED:
                self._heartbeat.revoke_all()
                return
            if starts and r.start_res and r.start_res[0] == OK:
                current = starts[0]
            current = leases.place(got, current)
            if current is not None:
                yield current
                continue
            if code == PASS_DONE:
                self._release_reserved()
                return
            if not got and not starts and not bad:
                self._note_all_dead()
                retrying(self.wait, r.wait_s if r.wait_s > 0 else _MAX_BLOCK_S, r.gen)

    def _note_all_dead(self) -> None:
        """Nothing to lease: if every live task is dead, say so (or raise)."""
        view = self._view
        if view.state == "waiting" and view.reason == "all_dead":
            self.all_dead.seen(view.pass_no)
        else:
            self.all_dead.moved_on()

    def _release_reserved(self) -> None:
        reserved = self._leases.reserved()
        if reserved:
            try:
                self._calls.write("release", reserved)
            except errors.LeaseLost:
                pass

    def passes(self) -> Iterator[Iterator[Task]]:
        """``Trainer.passes``."""
        try:
            pass_no = PlainJob(self._connection, self.job).status(summaries=0).pass_no
        except errors.JobNotFound:
            return
        view, session = self._view, self._session
        while view.state not in ("completed", "cancelled") and not session.closed:
            yield self.iterate(pass_no)
            if view.draining:
                return
            pass_no = max(pass_no + 1, view.pass_no)

    def batches(self, k: int) -> Iterator[list[Task]]:
        """``Trainer.batches``."""
        if k < 1:
            raise errors.InvalidInput(f"batch size must be >= 1, got {k}")
        batch: list[Task] = []
        meter = self.input_meter
        meter.restart()
        try:
            while True:
                meter.enter()
                try:
                    batch = self.lease_n(k, _MAX_BLOCK_S, None, acks=self._leases.still_held(batch))
                except (errors.JobCompleted, errors.JobCancelled, errors.Draining):
                    return
                if batch:
                    meter.leave()
                    yield batch
                else:
                    self._note_all_dead()
        finally:
            meter.stop()
