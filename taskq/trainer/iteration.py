"""A trainer's calls that change leases, and where a plain job's leases come from.

``Calls`` talks to the server about leases: one ack/start/lease call (``step``) and what
its reply does (to the held leases, the job view, a rejoin), the writes that end leases
(``ack``, ``fail``, ``release``), failing tasks whose chunks cannot be read, and the
lost-lease checks. It owns no state of its own: it applies replies to the parts that do
(trainer/leases.py, trainer/session.py's ``JobView``).

``PlainSource`` is a plain job's lease source (a sharded job's is trainer/sharded.py):
``lease`` / ``lease_many``, iteration, ``passes()``, ``batches(k)``. Each step acks the
previous task, starts a reserved one and leases the next in one call (``Calls.step``),
keeping the read-ahead in the held leases, and waits on the wake-up lists when there is
no work. It owns the prefetch depth and the input meter it times ``next()`` with.

Both are parts of a ``Worker`` (trainer/worker.py); ``Trainer`` (trainer/core.py) calls
them.

Data flow: training loop -> trainer/core.py -> trainer/iteration.py -> protocol.py ->
engine/connection.py (lua) -> Redis; replies -> trainer/leases.py, trainer/session.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator, Sequence
from typing import Any

from taskq import errors
from taskq.admin.jobs import Job
from taskq.data import order_key
from taskq.engine.connection import translate
from taskq.engine.contract import MAX_PREFETCH, Code
from taskq.inputwait import InputMeter
from taskq.integrity import decode_chunks
from taskq.models import Task
from taskq.trainer.alldead import AllDeadWatch
from taskq.trainer.heartbeat import Heartbeat
from taskq.trainer.leases import HeldLeases
from taskq.trainer.progress import ProgressSender
from taskq.trainer.protocol import PASSTHROUGH, JobInfo, Step, decode_info
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
_NO_CORRUPT: tuple[tuple[Task, errors.CorruptData], ...] = ()
JOB_COMPLETED, JOB_CANCELLED = int(Code.JOB_COMPLETED), int(Code.JOB_CANCELLED)


class Calls:
    """The lease-changing calls of a trainer (see the module docstring)."""

    def __init__(
        self,
        session: Session,
        leases: HeldLeases,
        view: JobView,
        progress: ProgressSender,
        heartbeat: Heartbeat,
    ) -> None:
        self.job = session.job
        self._connection = session.connection
        self._chunks_key = session.keys.chunks
        # the last (raw info, JobInfo) a step decoded, one tuple so threads swap it whole:
        # the job's info changes a few times a pass, and a reply equal to the last one
        # reuses its JobInfo
        self._info: tuple[Any, JobInfo | None] = (None, None)
        self._session = session
        self._leases = leases
        self._view = view
        self._progress = progress
        self._heartbeat = heartbeat

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
        # ARGV (ack.lua): job_inc, worker, winc, call_no, n, (task, token) x n, m, (task,
        # token) x m, want, mode (S started, R reserved, F first started), expect_pass
        # (-1 any), secret
        args: list[Any] = [session.job_incarnation, session.worker_id, incarnation, call_no]
        args.append(len(acks))
        for t in acks:
            args += [t.id, t.token]
        args.append(len(starts))
        for t in starts:
            args += [t.id, t.token]
        args += [want, mode, expect_pass, secret]
        try:
            # the connection's run, not session.run: one frame less on every task's path
            r = self._decode(self._connection.run(self.job, "ack", args, passthrough=PASSTHROUGH))
        except BaseException as e:
            if isinstance(e, errors.JobNotFound):  # what session.run notes
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
        return r

    def _decode(self, reply: Sequence[Any]) -> Step:
        """Decode an ``ack`` reply, building its tasks (apart: those with unreadable
        chunks, each with its error naming the job, the task and the key)."""
        code = int(reply[0])
        if len(reply) < 6:
            return Step(code, [], 0.0, None, [], [], _NO_CORRUPT)
        raw_info = reply[3]
        last_raw, info = self._info
        if info is None or raw_info != last_raw:
            info = decode_info(raw_info)
            self._info = (raw_info, info)
        pass_no, job, chunks_key = info.pass_no, self.job, self._chunks_key
        seed, mix = self._session.seed, self._session.mix
        granted: list[Task] = []
        corrupt: Any = _NO_CORRUPT
        # one row per task: {id, token, attempt, chunks_json, started, start[, end[,
        # source]]}; start is where reading begins (the task's recorded progress,
        # docs/resume.md), end where it stops for a piece of a split task (-1: the task's
        # end), source a mixed job's source of the slot (its index in mix). Positional
        # arguments and no per-row unpacking: this loop is most of a reply's decoding.
        for row in reply[1]:
            n = len(row)  # (once: a builtin call per row and check is per task)
            task = Task(
                int(row[0]),
                pass_no,
                [],
                int(row[1]),
                int(row[2]),
                job,
                row[4] == 1 or row[4] == "1",
                int(row[5]) if n > 5 else 0,
            )
            if n > 6:  # a piece of a split task: its end (a piece is granted confirmed)
                end = int(row[6])
                task.end = end if end >= 0 else None
            if seed is not None:  # a job whose samples are shuffled: the task's order
                task.order = order_key(job, seed, pass_no, task.id)
            if mix is not None and n > 7:
                task.source = mix.sources[int(row[7])]
            try:
                task.chunks = decode_chunks(row[3], chunks_key, row[0])
                granted.append(task)
            except errors.CorruptData as e:
                corrupt = [*corrupt, (task, e)]
        # the per-write results are the script's integer codes, as the parser made them
        return Step(code, granted, int(reply[2]) / 1000.0, info, reply[4], reply[5], corrupt)

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
            if t.end is None:
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
        """``fail`` (``extra``: the error text) or ``release`` ``tasks`` (progress sent
        first: the next holder starts where this one got).

        Raises:
            LeaseLost: a lease was no longer this worker's (``Code.STALE``).
        """
        self._progress.flush_quietly()
        session = self._session
        incarnation, secret = session.creds
        # ARGV (fail.lua, release.lua): job_inc, worker, winc, [error,] n, (task, token)
        # x n, secret
        args: list[Any] = [session.job_incarnation, session.worker_id, incarnation, *extra]
        args.append(len(tasks))
        for t in tasks:
            args += [t.id, t.token]
        args.append(secret)
        reply = session.retrying(session.run, verb, args)
        results = [int(x) for x in reply[1]] if len(reply) > 1 else []
        self._leases.forget(tasks)
        self._heartbeat.changed()
        self.check_acks(tasks, results, raise_stale=True)

    def ack(self, tasks: list[Task]) -> None:
        """``Trainer.ack``."""
        r = self._session.retrying(self.step, tasks, [], 0, "S", -1)
        self.check_acks(tasks, r.ack_res, raise_stale=True)


_MAX_BLOCK_S = 5.0


class PlainSource:
    """Where a plain job's (or one shard's) leases come from (see the module docstring)."""

    def __init__(
        self,
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
        self._connection = connection = session.connection
        self._session = session
        self._leases = leases
        self._view = view
        self._calls = calls
        self._heartbeat = heartbeat
        self.prefetch = prefetch
        self.input_meter = input_meter
        #: a loop with nothing to lease because every live task is dead says so
        self.all_dead = AllDeadWatch(Job(connection, self.job), on_all_dead)

    # -- what the job is, as this worker last heard it (``Trainer.state`` ...) -----------
    @property
    def state(self) -> str:
        return self._view.state

    @property
    def pass_no(self) -> int:
        return self._view.pass_no

    @property
    def reason(self) -> str:
        return self._view.reason

    def pass_complete(self, pass_no: int) -> bool:
        """``Trainer.pass_complete``: what a lease expecting ``pass_no`` answers
        ``PASS_DONE`` for (lib/dispatch.lua ``lease_part``), as the last reply said."""
        view = self._view
        return view.pass_no > pass_no or (
            view.pass_no == pass_no and view.state == "waiting" and view.reason == "manual_advance"
        )

    @property
    def draining(self) -> bool:
        return self._view.draining

    def current(self) -> list[Task]:
        """The tasks the loop is working on (started, not revoked)."""
        return [t for t in self._leases.held() if t.started and not t.revoked.is_set()]

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
            r = retrying(
                calls.step, acks, starts, n, mode, -1 if expect_pass is None else expect_pass
            )
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
        keys, conn = self._session.keys, self._connection
        # the next broadcast after generation gen goes to the list of the next one's parity
        bcast = keys.bcast0 if (gen_ + 1) % 2 == 0 else keys.bcast1
        try:
            with translate(conn.url):
                conn.redis.blpop([keys.wake, bcast], timeout=max(timeout, 0.01))
        finally:
            if idle:
                self.input_meter.idle_end()

    # -- iteration ----------------------------------------------------------------
    def iterate(self, expect_pass: int | None = None) -> Iterator[Task]:
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
            pass_no = Job(self._connection, self.job).status(summaries=0).pass_no
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
