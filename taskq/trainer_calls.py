"""A trainer's calls: registering, the ack/start/lease step, writes, progress.

``TrainerCalls`` is the part of ``Trainer`` (trainer.py) that talks to the server: one
ack/start/lease call (``_step``) and what its reply does to what the trainer holds, the
retry loop around a call (backoff, ``reconnect_timeout``), the writes that end leases
(``ack``, ``fail``, ``release``) and the buffered progress. The iteration modes
(trainer_iter.py) and the heartbeat's view (trainer_beats.py) are built on it.

Data flow: trainer.py / trainer_iter.py -> trainer_calls.py -> protocol.py -> scripts.py
(lua) -> Redis.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from . import errors, protocol
from .client import Client
from .heartbeat import HelperHeartbeat
from .keys import JobKeys
from .models import Task
from .progress import ProgressBuffer
from .protocol import JobInfo, Step, Wire
from .scripts import Code, Scripts

log = logging.getLogger("taskq.trainer")

_MAX_BLOCK_S = 5.0
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


class TrainerCalls:
    """The calls of a ``Trainer`` (see the module docstring); not used on its own."""

    # set by Trainer.__init__ (trainer.py); declared here for the type checker
    client: Client
    job: str
    _wire: Wire
    keys: JobKeys
    worker_id: str
    prefetch: int
    reconnect_timeout: float
    _own_ttl_ms: int
    _lock: threading.RLock
    _rejoin_lock: threading.Lock
    _held: dict[int, Task]
    _reserved: deque[Task]
    _call_no: int
    _last_reply_no: int
    _replied: int
    _in_flight: set[int]
    _info_lock: threading.Lock
    _gen: int
    _pass: int
    _state: str
    _skipped_gen: int
    _draining: bool
    _ended: type[errors.TaskqError] | None
    _closed: bool
    _last_contact: float
    _stop: threading.Event
    job_incarnation: str
    incarnation: str
    _secret: str
    ttl_s: float
    heartbeat_interval: float
    heartbeats_sent: int
    stolen_from_me: int
    _progress: ProgressBuffer
    _progress_inline: bool
    _progress_sent: float
    _helper: HelperHeartbeat | None
    _hb_scripts: Scripts | None

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
        pass_no, gen, state = info[0], info[1], info[2]  # typed already (decode_info)
        if gen == self._gen and state == self._state and pass_no <= self._pass:
            return  # what is noted already (most replies): applying it would change nothing
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
            # the call itself, not through _contact: its *args would cost a tuple per task
            r = self._wire.step(
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
        except BaseException as e:
            if isinstance(e, errors.JobNotFound):  # what _contact notes
                self._last_contact = time.monotonic()
                self._ended = errors.JobNotFound
            with self._lock:  # its reply is lost: later replies may count
                self._in_flight.discard(call_no)
                self._note_replied()
            raise
        self._last_contact = time.monotonic()
        self._progress.discard(acks)  # a done task's progress is spent
        with self._lock:
            self._in_flight.discard(call_no)
            if acks:
                self._forget_locked(acks)
            for i, res in enumerate(r.start_res):  # one per start sent (none: a bare code)
                t = starts[i]
                if res == STOLEN:
                    self._forget_locked((t,))
                    t.revoked.set()
                    self.stolen_from_me += 1
                elif res == OK:
                    t.started = True
            if r.info is not None:
                for t in r.granted:
                    self._held[t.id] = t
                for t, _ in r.corrupt:
                    self._held[t.id] = t
                self._replied = max(self._replied, call_no)
            self._note_replied()
        if r.code == REREGISTER:
            self._rejoin(incarnation)
        if r.info is not None:
            self._note_info(r.info)
            if self._helper is not None:
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
            self._forget_locked(tasks)

    def _forget_locked(self, tasks: Sequence[Task]) -> None:
        """``_forget`` with the lock already held."""
        held, reserved = self._held, self._reserved
        for task in tasks:
            if held.get(task.id) is task:
                del held[task.id]
            if reserved and task in reserved:
                reserved.remove(task)

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
        if code == JOB_COMPLETED:
            raise errors.JobCompleted(f"job {self.job!r} is completed")
        if code == JOB_CANCELLED:
            self._mark_all_revoked()
            raise errors.JobCancelled(f"job {self.job!r} was cancelled")

    def _check_acks(self, acks: list[Task], results: list[int], raise_stale: bool) -> None:
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
