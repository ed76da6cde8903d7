"""A trainer's calls that change leases: the ack/start/lease step and the writes.

``Calls`` is the part of ``Worker`` (trainer/worker.py) that talks to the server about
leases: one ack/start/lease call (``step``) and what its reply does (to the held leases,
the job view, a rejoin), the writes that end leases (``ack``, ``fail``, ``release``),
failing tasks whose chunks cannot be read, and the lost-lease checks. It owns no state
of its own: it applies replies to the parts that do. The iteration (trainer/iteration.py)
and the facade's ``ack`` / ``fail`` / ``release`` use it.

Data flow: trainer/worker.py / trainer/iteration.py -> trainer/calls.py -> protocol.py -> engine/transport.py
(lua) -> Redis; replies -> trainer/leases.py, trainer/session.py (JobView).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from taskq import errors
from taskq.engine.contract import Code
from taskq.models import Task
from taskq.trainer.heartbeat import Heartbeat
from taskq.trainer.leases import HeldLeases
from taskq.trainer.progress import ProgressSender
from taskq.trainer.protocol import Step, Wire
from taskq.trainer.session import JobView, Session

log = logging.getLogger("taskq.trainer")

_END_STATES: dict[int, str] = {Code.JOB_COMPLETED: "completed", Code.JOB_CANCELLED: "cancelled"}

# The codes a step's reply is compared with, as plain ints: reading a member of an IntEnum
# goes through EnumType.__getattr__ (~0.2 µs, ten times a task on the hot path).
OK, STALE, STOLEN, REREGISTER = (
    int(Code.OK),
    int(Code.STALE),
    int(Code.STOLEN),
    int(Code.REREGISTER),
)
DRAINING, PASS_DONE = int(Code.DRAINING), int(Code.PASS_DONE)
JOB_COMPLETED, JOB_CANCELLED = int(Code.JOB_COMPLETED), int(Code.JOB_CANCELLED)


class Calls:
    """The lease-changing calls of a trainer (see the module docstring)."""

    def __init__(
        self,
        wire: Wire,
        session: Session,
        leases: HeldLeases,
        view: JobView,
        progress: ProgressSender,
        heartbeat: Heartbeat,
        split_tails: bool = True,
    ) -> None:
        self.job = session.job
        self._wire = wire
        self._session = session
        self._leases = leases
        self._view = view
        self._progress = progress
        self._heartbeat = heartbeat
        #: how long a step waits for a pending piece of a split task (None: two ttls);
        #: ``lease(timeout=...)`` sets it to what its timeout leaves
        self.split_wait_s: float | None = None
        #: False: a piece of a split task granted to this trainer is released at once
        self.split_tails = split_tails

    def step(
        self, acks: list[Task], starts: list[Task], want: int, mode: str, expect_pass: int
    ) -> Step:
        """One ack/start/lease call; the tasks it grants are held (those with corrupt
        chunks too, apart, until ``fail_corrupt`` fails them)."""
        leases, session = self._leases, self._session
        for t in acks:  # (a loop, not any(): this is on every call's path)
            if t.end is not None:  # a piece of a split task among them
                self._confirm_ends(acks)
                break
        call_no = leases.begin()
        incarnation, secret = session.creds
        try:
            # the call itself, not through contact(): its *args would cost a tuple per task
            r = self._wire.step(
                session.job_incarnation,
                session.worker_id,
                incarnation,
                secret,
                call_no,
                acks,
                starts,
                want,
                mode,
                expect_pass,
            )
        except BaseException as e:
            if isinstance(e, errors.JobNotFound):  # what contact() notes
                session.gone()
            leases.lost(call_no)
            raise
        session.heard()
        self._progress.discard(acks)  # a done task's progress is spent
        leases.applied(call_no, acks, starts, r)
        if r.code == REREGISTER:
            self._heartbeat.rejoin(incarnation)
        if r.info is not None:
            self._view.note(r.info)
            if self._heartbeat.helper is not None:
                self._heartbeat.changed()
        if r.code in _END_STATES:
            self._view.end(_END_STATES[r.code])
        for t in r.granted:
            if t.split_pending:
                self._await_splits(r.granted)
                break
        return r

    # -- tail splitting (docs/design.md, "Tail splitting") ------------------------------
    def _confirm_ends(self, acks: list[Task]) -> None:
        """Before acking the head piece of a split task: report that it read up to the
        end it knows, which confirms the split (an ack of a head that never learned its
        end means it read the whole task, and the split is undone). A holder that read
        past that end (``task.read_to``: the progress the loop recorded, or where
        taskq.torch's readers, which learn the end late, stopped) says
        so: the report moves the split point up to it, a second one confirms it there."""
        items = []
        moved = []
        for t in acks:
            if t.end is None or t.split_pending:
                continue
            upto = t.end if t.read_to is None else max(t.end, t.read_to)
            items.append((t, upto, upto))
            if upto != t.end:
                moved.append((t, upto, upto))
        if not items:
            return
        for batch in (items, moved):
            if not batch:
                break
            try:
                self._progress.report(batch)
            except errors.TaskqError as e:
                log.warning("job %s: split end not confirmed: %s", self.job, e)
                return

    def _await_splits(self, granted: list[Task]) -> None:
        """A tail piece of a split task is read only once the split is confirmed (its
        first holder knows where to stop): ask until it is, within two ttls; a piece
        still pending then, or lost meanwhile, is released / dropped from ``granted``."""
        session = self._session
        wait = self.split_wait_s if self.split_tails else 0.0
        deadline = time.monotonic() + (max(2 * session.ttl_s, 1.0) if wait is None else wait)
        pending = [t for t in granted if t.split_pending]
        delay = 0.005
        first = True
        while pending and (first or time.monotonic() < deadline):
            first = False
            results = self._progress.report([(t, t.start, None) for t in pending])
            for t, res in zip(pending, results, strict=False):
                if res == STALE:
                    t.revoked.set()
                    self._leases.forget([t])
                    granted.remove(t)
            pending = [t for t in pending if t.split_pending and not t.revoked.is_set()]
            if pending:
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        if pending:
            for t in pending:
                granted.remove(t)
            try:
                self.write("release", pending)
            except errors.LeaseLost as e:
                # revoked meanwhile (its head was acked before it knew the split point:
                # the split was undone); nothing of it was read
                log.info("%s", e)

    def fail_corrupt(self, corrupt: Any) -> list[errors.CorruptData]:
        """Fail each task whose chunks cannot be read, alone (one failure charged per
        lease, so it is dead after max_failures instead of circulating), with the error
        as the failure text; returns the errors, naming the job, the task and the key."""
        out = []
        for task, err in corrupt:
            msg = f"job {self.job!r} task {task.id}: {err}"
            log.error("%s; failing the task", msg)
            try:
                self.write("fail", [task], msg)
            except errors.LeaseLost:
                pass  # it was taken or expired meanwhile: its new holder fails it
            out.append(errors.CorruptData(msg))
            out[-1].__cause__ = err
        return out

    def end_code(self, code: int) -> None:
        """Raise what an end code of a lease reply means."""
        if code == JOB_COMPLETED:
            raise errors.JobCompleted(f"job {self.job!r} is completed")
        if code == JOB_CANCELLED:
            self._heartbeat.revoke_all()
            raise errors.JobCancelled(f"job {self.job!r} was cancelled")

    def check_acks(self, acks: list[Task], results: list[int], raise_stale: bool) -> None:
        """Mark the acks the server refused (stale) revoked; raise or log them."""
        if STALE not in results:
            return
        stale = [t.id for t, r in zip(acks, results, strict=False) if r == STALE]
        for t in acks:
            if t.id in stale:
                t.revoked.set()
        if stale:
            msg = f"job {self.job!r}: lease lost for task(s) {stale}; result not counted"
            if raise_stale:
                raise errors.LeaseLost(msg, stale)
            log.warning("%s", msg)

    def write(self, verb: str, tasks: list[Task], *extra: Any) -> None:
        """``fail`` or ``release`` ``tasks`` (progress sent first: the next holder starts
        where this one got)."""
        self._progress.flush_quietly()
        session = self._session
        incarnation, secret = session.creds
        results = session.retrying(
            session.contact,
            self._wire.write,
            verb,
            session.job_incarnation,
            session.worker_id,
            incarnation,
            secret,
            tasks,
            extra,
        )
        self._leases.forget(tasks)
        self._heartbeat.changed()
        self.check_acks(tasks, results, raise_stale=True)

    def ack(self, tasks: list[Task]) -> None:
        """``Trainer.ack``."""
        r = self._session.retrying(self.step, tasks, [], 0, "S", -1)
        self.check_acks(tasks, r.ack_res, raise_stale=True)
