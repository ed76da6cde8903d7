"""The thin trainer client: lease, ack, fail, release, heartbeats, graceful leave.

A ``Trainer`` registers a worker incarnation, heartbeats from a daemon thread (it dies
with the process, so a SIGKILLed trainer keeps nothing alive), and iterates tasks:
acking the previous task, starting a reserved one and leasing the next is one script
call. Every write carries the lease token; the server decides what is current.

The verbs' ARGV and replies are ``protocol.py``'s; the heartbeat thread and helper
process (``heartbeat.py``) see a trainer only as a ``HeartbeatHost``.

Data flow: trainer code -> trainer.py -> protocol.py -> scripts.py (lua) -> Redis <- reaper.py.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from . import errors, protocol
from .client import Client
from .connection import resolve_url
from .heartbeat import HelperHeartbeat, start_thread, stop_dropped
from .keys import JobKeys
from .models import Task
from .progress import ProgressBuffer
from .protocol import HeartbeatReply, JobInfo, Step, Wire
from .scripts import MAX_PREFETCH, Code, Scripts
from .signals import LeaveOnSignal

log = logging.getLogger("taskq.trainer")

_MAX_BLOCK_S = 5.0
_END_STATES: dict[int, str] = {Code.JOB_COMPLETED: "completed", Code.JOB_CANCELLED: "cancelled"}


def default_worker_id() -> str:
    """``host:pid:random``, unique per process."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Trainer(LeaveOnSignal):
    """A worker of one job.

    Args:
        job: the job name.
        url: Redis URL (or ``TASKQ_REDIS_URL``); ignored when ``client`` is given.
        client: a configured ``taskq.Client`` to share (cluster, Sentinel, TLS).
        worker_id: defaults to ``host:pid:random``; ``|`` is not allowed.
        prefetch: reserved tasks kept ahead of the current one (others may steal them).
        worker_ttl: this worker's own liveness ttl in seconds (e.g. for long GIL-bound
            steps); the job's ``worker_ttl`` when None.
        heartbeat: ``"thread"`` (or True, the default): a daemon thread of this process;
            ``"process"``: a helper process that keeps heartbeating while this process
            holds the GIL for long steps, and exits when this process dies (needs ``url``,
            not a ``client`` built on a given redis-py client); False: none (tests that
            drive ``heartbeat()`` by hand).
        handle_signals: in the ``with`` block, turn SIGTERM into ``SystemExit`` and SIGINT
            into ``KeyboardInterrupt`` (main thread only; forked children get the default
            behaviour back) so the loop ends and everything held is released.
        reconnect_timeout: seconds a call keeps retrying while Redis is unreachable
            (backoff with jitter); then ``ConnectionLost`` is raised.

    Attributes:
        state: the job's state as this trainer last heard it (see the property).
        pass_no: the newest pass this trainer heard of (see the property).

    Raises:
        JobNotFound: no such job.
        ConnectionLost: Redis unreachable (``RedisOutOfMemory``: full) for longer than
            ``reconnect_timeout``.
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
        heartbeat: bool | str = True,
        handle_signals: bool = True,
        reconnect_timeout: float = 60.0,
    ) -> None:
        # one redis-py retry per command: the trainer's own loop (backoff with jitter,
        # bounded by reconnect_timeout) does the rest, so the bound is what it says
        self.client = client or Client(url, retries=1)
        self.job = job
        self._wire = Wire(self.client, job)
        self.keys: JobKeys = self._wire.keys
        self.worker_id = worker_id or default_worker_id()
        if "|" in self.worker_id or not self.worker_id:
            raise errors.InvalidInput(f"bad worker id {self.worker_id!r}: '|' not allowed")
        if not 0 <= prefetch <= MAX_PREFETCH:
            raise errors.InvalidInput(f"prefetch must be in [0, {MAX_PREFETCH}], got {prefetch}")
        if worker_ttl is not None and worker_ttl <= 0:
            raise errors.InvalidInput(f"worker_ttl must be positive, got {worker_ttl}")
        if heartbeat is True:
            heartbeat = "thread"
        if heartbeat not in (False, "thread", "process"):
            raise errors.InvalidInput(
                f"heartbeat must be 'thread', 'process' or False, not {heartbeat!r}"
            )
        # the raw URL (with any password) for connections of our own; None with a given client
        self._raw_url = resolve_url(url) if client is None else url
        if heartbeat == "process" and self._raw_url is None:
            raise errors.InvalidInput(
                "heartbeat='process' needs url= (the helper process opens its own connection)"
            )
        if reconnect_timeout < 0:
            raise errors.InvalidInput(f"reconnect_timeout must be >= 0, got {reconnect_timeout}")
        self.prefetch = prefetch
        self.handle_signals = handle_signals
        self.reconnect_timeout = reconnect_timeout
        self._own_ttl_ms = int(worker_ttl * 1000) if worker_ttl else 0
        self._lock = threading.RLock()
        self._rejoin_lock = threading.Lock()
        self._held: dict[int, Task] = {}
        self._reserved: deque[Task] = deque()
        self._call_no = 0
        # the heartbeat's last_reply_call_no: the server revokes unlisted leases granted by
        # calls up to it, so it stays below every call still in flight (another thread's
        # lease may be granted but not yet applied when this thread's ack reply lands)
        self._last_reply_no = 0
        self._replied = 0
        self._in_flight: set[int] = set()
        self._info_lock = threading.Lock()
        self._gen = 0
        self._pass = 0
        self._state = "running"
        self._skipped_gen = -1
        self._draining = False
        self._ended: type[errors.TaskqError] | None = None
        self._closed = False
        self._last_contact = time.monotonic()
        self._stop = threading.Event()
        self._pid = os.getpid()
        self._old_handlers: dict[int, Any] = {}
        self.job_incarnation = ""
        self.incarnation = ""
        # this incarnation's lease secret: sent with every write, kept in this process
        # alone (Redis keeps a digest); never logged, never given to a child process
        self._secret = ""
        self.heartbeats_sent = 0
        self.stolen_from_me = 0
        # progress inside tasks: buffered, sent with the heartbeat (docs/resume.md); with
        # the helper process, from the loop's own thread at most once per interval
        self._progress = ProgressBuffer()
        self._progress_inline = heartbeat == "process"
        self._progress_sent = time.monotonic()
        self._helper: HelperHeartbeat | None = None
        self._hb_scripts: Scripts | None = None
        self._hb_thread: threading.Thread | None = None
        # a trainer started while Redis is away (a pod scheduled during a restart) waits
        # for it like every other call, up to reconnect_timeout
        self._retrying(self._register)
        if heartbeat == "thread":
            self._hb_thread, self._hb_scripts = start_thread(
                self, self._stop, self._raw_url, self.heartbeat_interval, self.ttl_s
            )
        elif heartbeat == "process":
            assert self._raw_url is not None
            self._helper = HelperHeartbeat(
                self,
                self._raw_url,
                self.client.prefix,
                self.heartbeat_interval,
                self.ttl_s,
                self._beat_args(),
            )
        # nothing started here holds the trainer strongly: dropped, it is collected and
        # this stops its heartbeats
        self._finalizer = weakref.finalize(self, stop_dropped, job, self._stop, self._helper)

    # -- registration and plumbing ------------------------------------------------
    def _register(self) -> None:
        # a new incarnation and its lease secret, swapped in together: a call never sends
        # one incarnation with another's secret (it would be counted forged)
        incarnation, secret = secrets.token_hex(6), secrets.token_hex(16)
        with self._lock:
            self.incarnation, self._secret = incarnation, secret
        reg = self._contact(
            self._wire.register,
            self.job_incarnation,
            self.worker_id,
            incarnation,
            secret,
            self._own_ttl_ms,
            socket.gethostname(),
            os.getpid(),
        )
        self.job_incarnation = reg.job_incarnation
        self.ttl_s = reg.ttl_s
        self.heartbeat_interval = reg.heartbeat_interval_s
        self._note_info(reg.info)
        log.debug("registered %s/%s on job %s", self.worker_id, self.incarnation, self.job)
        self._changed()

    def _changed(self) -> None:
        """Tell the helper heartbeat process what this trainer holds now."""
        if self._helper is not None:
            self._helper.push(self._beat_args())

    def _contact(self, call: Any, *args: Any) -> Any:
        """``call(*args)`` (a ``Wire`` verb), noting the contact with the server."""
        try:
            reply = call(*args)
        except errors.JobNotFound:
            self._last_contact = time.monotonic()
            self._ended = errors.JobNotFound
            raise
        self._last_contact = time.monotonic()
        return reply

    def _note_info(self, info: JobInfo | Sequence[Any]) -> None:
        """Apply a reply's (pass, gen, state, reason).

        Answers arrive out of order: the heartbeat thread (or the helper's reader) may apply
        one computed before a lease reply this thread applied since. Pass and generation
        only move forward; a state is taken only from an answer of the newest generation
        seen (every state change bumps the generation).
        """
        pass_no, gen, state = int(info[0]), int(info[1]), str(info[2])
        with self._info_lock:
            if gen >= self._gen:
                self._state = state
            self._gen = max(self._gen, gen)
            self._pass = max(self._pass, pass_no)

    def _mark_all_revoked(self) -> None:
        with self._lock:
            for task in self._held.values():
                task.revoked.set()
            self._held.clear()
            self._reserved.clear()
        self._changed()

    def _rejoin(self, incarnation: str) -> None:
        """Join again under a new incarnation, once for all threads that saw ``incarnation``
        declared lost; never after ``close()``."""
        with self._rejoin_lock:
            if self._closed or self.incarnation != incarnation:
                return
            log.warning("worker %s was declared lost; re-registering", self.worker_id)
            self._mark_all_revoked()
            self._register()

    def _fail_corrupt(
        self, corrupt: list[tuple[Task, errors.CorruptData]]
    ) -> list[errors.CorruptData]:
        """Fail each task whose chunks cannot be read, alone (one failure charged per
        lease, so it is dead after max_failures instead of circulating), with the error
        as the failure text; returns the errors, naming the job, the task and the key."""
        out = []
        for task, err in corrupt:
            msg = f"job {self.job!r} task {task.id}: {err}"
            log.error("%s; failing the task", msg)
            try:
                self._write("fail", [task], msg)
            except errors.LeaseLost:
                pass  # it was taken or expired meanwhile: its new holder fails it
            out.append(errors.CorruptData(msg))
            out[-1].__cause__ = err
        return out

    def _step(
        self, acks: list[Task], starts: list[Task], want: int, mode: str, expect_pass: int
    ) -> Step:
        """One ack/start/lease call; the tasks it grants are held (those with corrupt
        chunks too, apart, until ``_fail_corrupt`` fails them)."""
        with self._lock:
            self._call_no += 1
            call_no = self._call_no
            incarnation, secret = self.incarnation, self._secret
            self._in_flight.add(call_no)
        try:
            r = self._contact(
                self._wire.step,
                self.job_incarnation,
                self.worker_id,
                incarnation,
                secret,
                call_no,
                acks,
                starts,
                want,
                mode,
                expect_pass,
            )
        except BaseException:
            with self._lock:  # its reply is lost: later replies may count
                self._in_flight.discard(call_no)
                self._note_replied()
            raise
        self._progress.discard(acks)  # a done task's progress is spent
        with self._lock:
            self._in_flight.discard(call_no)
            self._forget(*acks)
            for t, res in zip(starts, r.start_res, strict=False):
                if res == Code.STOLEN:
                    self._forget(t)
                    t.revoked.set()
                    self.stolen_from_me += 1
                elif res == Code.OK:
                    t.started = True
            if r.info is not None:
                for t in r.granted:
                    self._held[t.id] = t
                for t, _ in r.corrupt:
                    self._held[t.id] = t
                self._replied = max(self._replied, call_no)
            self._note_replied()
        if r.code == Code.REREGISTER:
            self._rejoin(incarnation)
        if r.info is not None:
            self._note_info(r.info)
            self._changed()
        if r.code in _END_STATES:
            with self._info_lock:
                self._state = _END_STATES[r.code]
        return r

    def _note_replied(self) -> None:
        """(Under the lock.) The heartbeat may claim the replies up to the newest one
        applied, but not up to a call still in flight."""
        self._last_reply_no = (
            min(self._replied, min(self._in_flight) - 1) if self._in_flight else self._replied
        )

    def _forget(self, *tasks: Task) -> None:
        """Drop ``tasks`` from what this trainer holds (only those leases, not newer ones of
        the same task ids)."""
        with self._lock:
            for task in tasks:
                if self._held.get(task.id) is task:
                    del self._held[task.id]
                if task in self._reserved:
                    self._reserved.remove(task)

    def _wait(self, bound_s: float, gen: int) -> None:
        """Block until work may exist: a wake token, a broadcast, or the bound.

        ``gen`` is the generation the lease reply saw: the next broadcast goes to the list
        of the next one's parity. A newer generation seen since (a heartbeat answer) means
        that broadcast already happened: return to lease again, once per generation (a
        failover that lost writes can leave the server's generation behind for a while).
        """
        with self._info_lock:
            seen = self._gen
        gen = seen if gen < 0 else gen
        if seen > gen and seen != self._skipped_gen:
            self._skipped_gen = seen
            return
        timeout = min(bound_s, _MAX_BLOCK_S) if bound_s > 0 else _MAX_BLOCK_S
        if timeout <= 0:
            return
        self._wire.wait(gen, timeout)

    def _retrying(self, fn: Any, *args: Any, bound_s: float | None = None) -> Any:
        """Call ``fn`` until it succeeds, retrying ConnectionLost (``RedisOutOfMemory``
        too) with backoff and jitter for up to ``reconnect_timeout`` seconds (``bound_s``
        if given; else not once closed); the held-pairs heartbeat makes blind retries
        safe."""
        deadline = time.monotonic() + (self.reconnect_timeout if bound_s is None else bound_s)
        delay = 0.05
        while True:
            try:
                return fn(*args)
            except errors.ConnectionLost as e:
                if time.monotonic() > deadline or (bound_s is None and self._stop.is_set()):
                    raise
                log.warning("%s; retrying in %.2fs", e, delay)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)

    def _end_code(self, code: int) -> None:
        if code == Code.JOB_COMPLETED:
            raise errors.JobCompleted(f"job {self.job!r} is completed")
        if code == Code.JOB_CANCELLED:
            self._mark_all_revoked()
            raise errors.JobCancelled(f"job {self.job!r} was cancelled")

    # -- the public calls ---------------------------------------------------------
    def lease(
        self,
        timeout: float = 2.0,
        expect_pass: int | None = None,
        acks: Sequence[Task] = (),
    ) -> Task | None:
        """Lease one task, started; with ``acks``, ack those in the same call.

        Args:
            timeout: seconds to wait for work (0: do not wait).
            expect_pass: never return work of another pass (``PASS_DONE`` -> None).
            acks: finished tasks to ack in the same call. A lost lease among them is
                logged, not raised: its ``revoked`` event is set and nothing was counted.

        Returns:
            A task, or None when ``timeout`` passed with nothing to give.

        Raises:
            JobCompleted: the job's last pass is done; there will never be work again.
            JobCancelled: the job was cancelled; there will never be work again.
            JobNotFound: the job was deleted or replaced; there will never be work again.
            Draining: an operator asked this worker to leave.
            CorruptData: the task granted has unreadable chunks (the message names the
                job, the task and the key); it was already failed, not left leased.
            ConnectionLost: Redis unreachable (``RedisOutOfMemory``: full) for longer than
                ``reconnect_timeout``.
        """
        tasks = self._lease_n(
            1, timeout, expect_pass, acks=self._still_held(acks), raise_corrupt=True
        )
        return tasks[0] if tasks else None

    def lease_many(
        self,
        n: int,
        timeout: float = 2.0,
        expect_pass: int | None = None,
        acks: Sequence[Task] = (),
    ) -> list[Task]:
        """Lease up to ``n`` tasks, started, in one call; with ``acks``, ack those in it.

        Args:
            n: the most tasks to lease (1 to the job's per-call bound).
            timeout: seconds to wait for work (0: do not wait).
            expect_pass: never return work of another pass (``PASS_DONE`` -> []).
            acks: finished tasks to ack in the same call (a lost lease is logged and its
                ``revoked`` event set, not raised).

        Returns:
            The tasks leased (those with unreadable chunks are failed and left out);
            empty when ``timeout`` passed with nothing to give.

        Raises:
            InvalidInput: ``n < 1``.
            JobCompleted, JobCancelled, JobNotFound, Draining, ConnectionLost: as ``lease``.
        """
        if n < 1:
            raise errors.InvalidInput(f"n must be >= 1, got {n}")
        return self._lease_n(n, timeout, expect_pass, acks=self._still_held(acks))

    def _still_held(self, acks: Sequence[Task]) -> list[Task]:
        with self._lock:
            return [t for t in acks if self._held.get(t.id) is t]

    def _lease_n(
        self,
        n: int,
        timeout: float,
        expect_pass: int | None,
        acks: list[Task] | None = None,
        raise_corrupt: bool = False,
    ) -> list[Task]:
        deadline = time.monotonic() + timeout
        acks = list(acks or [])
        while True:
            r = self._retrying(
                self._step, acks, [], n, "S", -1 if expect_pass is None else expect_pass
            )
            self._check_acks(acks, r.ack_res, raise_stale=False)
            acks = []
            bad = self._fail_corrupt(r.corrupt)
            if r.code == Code.REREGISTER:
                continue
            if r.code == Code.DRAINING:
                self._draining = True
                raise errors.Draining(f"worker {self.worker_id} is draining")
            self._end_code(r.code)
            if bad and raise_corrupt:
                raise bad[0]
            if r.granted or r.code == Code.PASS_DONE:
                return r.granted
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            if not bad:
                self._retrying(
                    self._wait, min(remaining, r.wait_s) if r.wait_s > 0 else remaining, r.gen
                )

    def _check_acks(self, acks: list[Task], results: list[int], raise_stale: bool) -> None:
        if Code.STALE not in results:
            return
        stale = [t.id for t, r in zip(acks, results, strict=False) if r == Code.STALE]
        for t in acks:
            if t.id in stale:
                t.revoked.set()
        if stale:
            msg = f"job {self.job!r}: lease lost for task(s) {stale}; result not counted"
            if raise_stale:
                raise errors.LeaseLost(msg, stale)
            log.warning("%s", msg)

    def _write(self, verb: str, tasks: list[Task], *extra: Any) -> None:
        self._flush_quietly()  # the next holder starts where this one got
        with self._lock:
            incarnation, secret = self.incarnation, self._secret
        results = self._retrying(
            self._contact,
            self._wire.write,
            verb,
            self.job_incarnation,
            self.worker_id,
            incarnation,
            secret,
            tasks,
            extra,
        )
        self._forget(*tasks)
        self._changed()
        self._check_acks(tasks, results, raise_stale=True)

    def ack(self, task: Task | list[Task]) -> None:
        """Ack a finished task (or a batch). Repeating an ack that landed is a no-op.

        Args:
            task: a task or a list of tasks this trainer holds.

        Raises:
            LeaseLost: the lease was no longer this trainer's; nothing was counted.
        """
        tasks = task if isinstance(task, list) else [task]
        r = self._retrying(self._step, tasks, [], 0, "S", -1)
        self._check_acks(tasks, r.ack_res, raise_stale=True)

    def fail(self, task: Task | list[Task], error: str = "") -> None:
        """Report a failed task (counts a failure; dead at the caps). A failed batch goes
        back uncharged, to be retried one task at a time.

        Args:
            task: a task or a list.
            error: the reason, kept in the event (500 chars).

        Raises:
            LeaseLost: the lease was no longer this trainer's.
        """
        self._write("fail", task if isinstance(task, list) else [task], str(error)[:500])

    def release(self, task: Task | list[Task]) -> None:
        """Give a task back unfinished (leasable by others at once).

        Args:
            task: a task or a list of tasks this trainer holds.

        Raises:
            LeaseLost: the lease was no longer this trainer's.
        """
        self._write("release", task if isinstance(task, list) else [task])

    def heartbeat(self) -> list[int]:
        """Send one heartbeat now (what the heartbeat thread does every interval).

        Returns:
            The ids of held tasks the server revoked (their ``revoked`` is set).

        Raises:
            ConnectionLost: Redis could not be reached (``RedisOutOfMemory``: it is full).
        """
        args = self._beat_args()
        reply = self._wire.heartbeat(self._hb_scripts or self.client.scripts, args)
        revoked = self.apply_heartbeat(reply, args)
        self.flush_progress()
        return revoked

    def progress(self, task: Task, n: int) -> None:
        """Record that the loop took samples ``[0, n)`` of ``task`` (``n`` counts from the
        task's sample 0: a resumed task reports ``task.start`` + what it took). Cheap: kept
        here and sent with the next heartbeat (and before ``release``, ``fail``,
        ``close``), so a re-dispatched task's next holder starts there (``task.start``).
        Only moves forward. See docs/resume.md.

        Args:
            task: a task this trainer holds.
            n: samples taken so far, an integer >= 0.

        Raises:
            InvalidInput: ``n`` is not an integer >= 0.
        """
        self._progress.record(task, n)
        if (
            self._progress_inline
            and time.monotonic() - self._progress_sent >= self.heartbeat_interval
        ):
            self._flush_quietly()

    def flush_progress(self) -> list[int]:
        """Send the recorded progress now (the heartbeat does it every interval).

        Returns:
            The ids of tasks whose report was refused: their lease is no longer this
            trainer's (nothing recorded; what they claimed is counted as re-read).

        Raises:
            ConnectionLost: Redis could not be reached (the progress stays buffered).
        """
        self._progress_sent = time.monotonic()
        items = self._progress.take()
        if not items:
            return []
        with self._lock:
            incarnation, secret = self.incarnation, self._secret
        try:
            results = self._contact(
                self._wire.progress,
                self.job_incarnation,
                self.worker_id,
                incarnation,
                secret,
                items,
            )
        except errors.ConnectionLost:
            self._progress.restore(items)
            raise
        return [t.id for (t, _), r in zip(items, results, strict=False) if r == Code.STALE]

    def _flush_quietly(self) -> None:
        """``flush_progress`` where a failure must not stop what follows (logged)."""
        try:
            self.flush_progress()
        except errors.TaskqError as e:
            log.warning("job %s: progress not sent: %s", self.job, e)

    @property
    def held(self) -> list[Task]:
        """The tasks this trainer believes it holds (current and reserved)."""
        with self._lock:
            return list(self._held.values())

    @property
    def draining(self) -> bool:
        """True once an operator asked this worker to finish its task and leave."""
        return self._draining

    @property
    def state(self) -> str:
        """The job's state as this trainer last heard it (read-only): ``"running"``,
        ``"waiting"`` (at a pass boundary for ``taskq pass next``), ``"completed"`` (its
        last pass is done) or ``"cancelled"``. Every reply and heartbeat answer updates
        it; after ``passes()`` or iteration ends it says why (see ``passes``)."""
        return self._state

    @property
    def pass_no(self) -> int:
        """The newest pass of the job this trainer heard of (read-only; never goes back)."""
        return self._pass

    # -- the heartbeat's view of the trainer (heartbeat.HeartbeatHost) -------------------
    def _beat_args(self) -> list[Any]:
        """The next heartbeat's ARGV: the held (task, token) pairs, the last reply's call
        number and the incarnation's secret, taken together under the lock."""
        with self._lock:
            return protocol.heartbeat_args(
                self.job_incarnation,
                self.worker_id,
                self.incarnation,
                self._secret,
                self._last_reply_no,
                [(task.id, task.token) for task in self._held.values()],
            )

    def apply_heartbeat(self, reply: HeartbeatReply, args: Sequence[Any]) -> list[int]:
        """Act on the answer to a heartbeat sent with ARGV ``args`` (by ``heartbeat()`` or
        the helper process); for ``taskq.heartbeat``, not needed by trainer code.

        Answers may land after newer lease replies (see ``_note_info``): only the leases
        ``args`` listed are revoked, and pass, generation and state never move backwards.

        Args:
            reply: the decoded answer.
            args: the heartbeat's ARGV (``protocol.heartbeat_args``).

        Returns:
            The ids of held tasks now marked revoked.
        """
        self.heartbeats_sent += 1
        self._last_contact = time.monotonic()
        pairs = protocol.heartbeat_pairs(args)
        if reply.code == Code.JOB_NOT_FOUND:
            self._ended = errors.JobNotFound
            self._mark_all_revoked()
            return [tid for tid, _ in pairs]
        if reply.code == Code.REREGISTER:
            self._rejoin(protocol.heartbeat_incarnation(args))
            return [tid for tid, _ in pairs]
        if reply.code < 0:
            return []
        if reply.info is not None:
            self._note_info(reply.info)
        tokens = dict(pairs)
        out = []
        with self._lock:
            for tid in reply.revoked:
                task = self._held.get(tid)
                # only the lease that was listed: the id may be held again under a new token
                if task is not None and task.token == tokens.get(tid):
                    task.revoked.set()
                    self._forget(task)
                    out.append(tid)
            for task in self._held.values():
                if task._at_risk is not None:  # never set if never made
                    task._at_risk.clear()
        if out:
            log.info("job %s: lease(s) revoked by the server: %s", self.job, out)
            self._changed()
        if reply.code == Code.DRAINING:
            self._draining = True
        if self._state == "cancelled":
            self._mark_all_revoked()
        return out

    def keep_beating(self) -> bool:
        """After each beat, answered or not: set ``at_risk`` on everything held while out
        of contact for longer than the ttl (this process's monotonic clock; the server's
        answer on reconnect decides); for ``taskq.heartbeat``.

        Returns:
            False once there is nothing to beat for (closed, or the job is gone).
        """
        if time.monotonic() - self._last_contact > self.ttl_s:
            with self._lock:
                held = list(self._held.values())
            for task in held:
                if not task.at_risk.is_set():
                    log.warning(
                        "job %s: out of contact with Redis for > %.1fs; task %s at risk",
                        self.job,
                        self.ttl_s,
                        task.id,
                    )
                    task.at_risk.set()
        return self._ended is None and not self._closed

    # -- iteration ----------------------------------------------------------------
    def __iter__(self) -> Iterator[Task]:
        return self._iterate(None)

    def _iterate(self, expect_pass: int | None) -> Iterator[Task]:
        current: Task | None = None
        ep = -1 if expect_pass is None else expect_pass
        while True:
            acks: list[Task] = []
            starts: list[Task] = []
            with self._lock:
                if current is not None and self._held.get(current.id) is current:
                    acks = [current]
                if self._reserved:
                    starts = [self._reserved.popleft()]
            if current is not None and current._revoked is not None and current._revoked.is_set():
                log.warning(
                    "job %s: lease of task %s was revoked; its result is not counted",
                    self.job,
                    current.id,
                )
                acks = []
            current = None
            if self._draining:
                if acks:
                    self._retrying(self._step, acks, [], 0, "S", ep)
                return
            if starts:
                want, mode = self.prefetch - len(self._reserved), "R"
            else:
                want, mode = 1 + self.prefetch, "F"
            try:
                r = self._retrying(self._step, acks, starts, want, mode, ep)
            except (errors.JobNotFound, errors.JobCancelled):
                self._mark_all_revoked()
                raise
            self._check_acks(acks, r.ack_res, raise_stale=False)
            bad = self._fail_corrupt(r.corrupt)  # logged; the loop goes on with other work
            code, got = r.code, r.granted
            if code == Code.REREGISTER:
                continue
            if code == Code.DRAINING:
                self._draining = True
                return
            if code in (Code.JOB_COMPLETED, Code.JOB_CANCELLED):
                self._mark_all_revoked()
                return
            if starts and r.start_res and r.start_res[0] == Code.OK:
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
            if not got and not starts and not bad:
                self._retrying(self._wait, r.wait_s if r.wait_s > 0 else _MAX_BLOCK_S, r.gen)

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
        barrier: the next one blocks while the job waits at a manual boundary).

        A pass's iterator ends the same way whether its pass is complete, the job is
        completed or cancelled, or this worker drains; tell them apart after it ends by
        ``state`` (``"completed"``, ``"cancelled"``; else the pass is done and the job
        goes on) and ``draining``. ``passes()`` itself ends after the job's last pass,
        on cancel or drain. For example::

            for epoch in trainer.passes():
                for task in epoch:
                    train(task)
                if trainer.state == "cancelled":
                    break              # no checkpoint of a cancelled run
                checkpoint()

        Returns:
            Iterators of tasks, one per pass, until the job is completed or cancelled.

        Raises:
            JobNotFound: the job was deleted or replaced meanwhile.
        """
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
        batch); ends when the job is completed or cancelled, or this worker drains.

        Args:
            k: the most tasks in one batch.

        Returns:
            An iterator of batches (tasks with unreadable chunks are failed and left out).

        Raises:
            InvalidInput: ``k < 1``.
            JobNotFound: the job was deleted or replaced.
        """
        if k < 1:
            raise errors.InvalidInput(f"batch size must be >= 1, got {k}")
        batch: list[Task] = []
        while True:
            try:
                batch = self._lease_n(k, _MAX_BLOCK_S, None, acks=self._still_held(batch))
            except (errors.JobCompleted, errors.JobCancelled, errors.Draining):
                return
            if batch:
                yield batch

    # -- leaving ------------------------------------------------------------------
    def close(self) -> None:
        """Release everything held in one call and deregister (leasable by others at once),
        then stop the heartbeat thread or helper process (even if the leave is interrupted).
        Idempotent. Retries an unreachable Redis for at most ``min(reconnect_timeout, 5)``
        seconds; past that the server reclaims the leases after the worker's ttl.

        Raises:
            SystemExit: a SIGTERM during the leave (nothing from Redis: that is logged).
            KeyboardInterrupt: a SIGINT during the leave.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        try:
            self._leave()
        finally:
            with self._lock:
                for task in self._held.values():
                    task.revoked.set()
                self._held.clear()
                self._reserved.clear()
            self._stop_heartbeats()

    def _leave(self) -> None:
        self._flush_quietly()
        try:
            with self._lock:
                incarnation, secret = self.incarnation, self._secret
            self._retrying(
                self._contact,
                self._wire.leave,
                self.job_incarnation,
                self.worker_id,
                incarnation,
                secret,
                bound_s=min(self.reconnect_timeout, 5.0),
            )
        except errors.ConnectionLost as e:
            log.warning("leave: %s (the server reclaims after the ttl)", e)
        except errors.TaskqError as e:
            log.warning("leave: %s", e)

    def _stop_heartbeats(self) -> None:
        """End the heartbeat thread (a beat in flight is bounded by its socket timeout) or
        the helper process."""
        self._finalizer.detach()
        thread = self._hb_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.5, min(self.ttl_s / 2, 5.0)) + 0.5)
        if self._helper is not None:
            self._helper.stop()

    def _fail_current(self, exc_type: type[BaseException] | None, exc: BaseException) -> None:
        """The body raised: the task(s) it was working on failed (a batch goes back to be
        retried one task at a time); reserved ones are released by close()."""
        current = [t for t in self.held if t.started and not t.revoked.is_set()]
        if current:
            name = exc_type.__name__ if exc_type else "error"
            try:
                self.fail(current, error=f"{name}: {exc}")
            except errors.TaskqError as e:
                log.warning("could not fail task(s) %s: %s", [t.id for t in current], e)
