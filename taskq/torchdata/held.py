"""What one loader iteration holds: one table of held tasks, keyed by (task, token), each
with its state.

A task leased by the iteration's trainer is entered here when the lease reply grants it
and leaves when the server's reply ends its lease (acked, failed, released) or a
heartbeat's answer says the server took it back. Its entry (``HeldTask``) is the one
place every thread of the process looks for what it knows of the task:

- where it is: ``RESERVED`` (leased reserved, kept back for the readers: an idle trainer
  may still take it), ``LEASED`` (started, not sent yet), ``READING`` (on the readers'
  queue or being read), ``TAIL`` (read in the main process after the readers stopped),
  ``READ`` (the loop took its last sample or dropped the rest: its ack is asked), or
  ``FAILING`` (its reader failed: its fail is asked);
- what the loop did with it: how far it took (``taken``), where its reading ended
  (``read_to``), the end its reader honours (``reader_end``), a split point learnt and
  not cut yet (``point``), the end it was cut at here (``cut``, cut.py), and whether its
  reader said its own end (``said``);
- what the readers were sent: its end cell (``slot``) and the end written there.

The main thread (iteration.py) records what the loop did; the feeder thread (feeder.py),
the only one that calls the trainer, performs what that asks: acks (``MAX_BATCH`` per
call, or carried by the next lease call), fails, progress handed to the trainer,
releases, and with ``acks="commit"`` the commit of what the loop took since the last
one. An ack, a fail or an end honoured wakes the feeder thread. The trainer's own
``HeldLeases`` (trainer/leases.py) keeps the leases by the task's id in its shard, for
the server's calls; this table names a task by its job-wide id (``Trainer.global_id``).

Data flow: loader iterator (main thread) -> held.py -> feeder.py (its thread) ->
trainer/core.py -> Redis; feeder.py -> readahead.py (the readers' queue) -> readers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from taskq.engine.contract import MAX_BATCH

from .. import errors
from ..data import count_task, task_size
from ..models import Task

if TYPE_CHECKING:
    from taskq.trainer.core import Trainer

log = logging.getLogger("taskq.torch")

Pair = tuple[int, int]

#: how often progress is sent at a pass's tail (at most: the heartbeat interval)
TAIL_FLUSH_S = 0.1

# A held task's states (``HeldTask.state``)
RESERVED = "reserved"
LEASED = "leased"
READING = "reading"
TAIL = "tail"
READ = "read"
FAILING = "failing"


def own_id(task: Task) -> int:
    """A plain job's task's name in an iteration: its id."""
    return task.id


class HeldTask:
    """One task the iteration holds and what every part knows of it (see the module)."""

    __slots__ = (
        "task",
        "key",
        "state",
        "error",
        "taken",
        "progressed",
        "reported",
        "read_to",
        "reader_end",
        "end_unsent",
        "point",
        "cut",
        "said",
        "slot",
        "slot_end",
    )

    def __init__(self, task: Task, key: int, state: str) -> None:
        self.task = task
        self.key = key
        self.state = state
        #: the reader's error text (state FAILING)
        self.error = ""
        #: samples the loop took, ``[0, n)`` (-1: it took the last one; None: none yet)
        self.taken: int | None = None
        #: samples the loop took in steps that are over, ``[0, n)``: progress to report
        #: (with acks="commit": once committed); and the last reported
        self.progressed = 0
        self.reported = 0
        #: where its reading ended (its ack says so: ``Task.read_to``)
        self.read_to: int | None = None
        #: the end its reader honours (named by every progress report about it)
        self.reader_end: int | None = None
        #: ``reader_end`` not reported yet (sent at once: it may confirm a split)
        self.end_unsent = False
        #: a split point learnt while it was read, not cut yet (iteration.py)
        self.point: int | None = None
        #: the end honoured where the loop cut it (cut.py): its later entries are ignored
        self.cut: int | None = None
        #: its reader said the end it honours: no cut of it follows
        self.said = False
        #: the readers' end cell it was sent with (-1: none) and the end written there
        self.slot = -1
        self.slot_end = 0

    @property
    def pair(self) -> Pair:
        """(task, token): the name the readers' messages carry."""
        return self.key, self.task.token


class HeldTasks:
    """The table of what one iteration holds (see the module).

    Args:
        job: the job name (for messages).
        wake: wakes the feeder thread (an ack, a fail or an end honoured is asked).
    """

    def __init__(self, job: str, wake: Callable[[], None]) -> None:
        self.job = job
        self._wake = wake
        #: set by the feeder thread once it made the iteration's trainer
        self.trainer: Trainer | None = None
        #: a task's name here (its id; a sharded job's: the job-wide id), set by the feeder
        self.key: Callable[[Task], int] = own_id
        self.acked = 0
        self.failed = 0
        self.splits = False  # the job splits tails (from its config: the feeder sets it)
        self._lock = threading.Lock()
        #: by task name, in lease order
        self._held: dict[int, HeldTask] = {}
        #: end cells of entries that left, for the read-ahead to use again
        self.freed_slots: list[int] = []
        self._n_reserved = 0
        #: the main thread asked an ack or a fail / recorded progress or an end honoured
        #: (each set after the entry changed, cleared by the feeder before it looks)
        self._ends_asked = False
        self._progress_asked = False
        self._progress_sent = time.monotonic()
        #: at a pass's tail (set by the feeder): progress goes out every ``TAIL_FLUSH_S``,
        #: so a task of ours split by an idle trainer is learned (and confirmed) soon
        self.at_tail = False

    # -- reads (any thread; a dict read needs no lock) ------------------------------
    def entry(self, task_id: int, token: int) -> HeldTask | None:
        """The entry of (task, token) while this iteration holds it, else None."""
        e = self._held.get(task_id)
        return e if e is not None and e.task.token == token else None

    def holds(self, task_id: int, token: int) -> bool:
        """True while (task, token) was leased by this iteration and not ended."""
        return self.entry(task_id, token) is not None

    def pass_of(self, task_id: int, token: int) -> int | None:
        """The pass of (task, token) while this iteration holds it, else None."""
        e = self.entry(task_id, token)
        return e.task.pass_no if e is not None else None

    def entries(self) -> list[HeldTask]:
        """The entries, in lease order (a copy of the list)."""
        with self._lock:
            return list(self._held.values())

    def count(self) -> int:
        """Tasks held (leased and not acked, failed or released by this iteration)."""
        return len(self._held)

    def unread(self) -> int:
        """Held tasks whose reading has not ended (the loop has not taken or dropped
        their last sample, nor has their reader failed): work this iteration still has
        to read. At a pass's tail the feeder leases nothing while there is any."""
        with self._lock:
            return sum(
                1
                for e in self._held.values()
                if e.read_to is None and e.state not in (READ, FAILING)
            )

    @property
    def n_reserved(self) -> int:
        """Tasks held reserved (read-ahead not started)."""
        return self._n_reserved

    # -- the main thread's side ---------------------------------------------------
    def ack(self, pairs: list[Pair]) -> None:
        """Ack these (task, token) pairs (the feeder thread does, soon)."""
        for t, tok in pairs:
            e = self.entry(t, tok)
            if e is not None and e.state != FAILING:
                e.state = READ
        self._ends_asked = True
        self._wake()

    def fail(self, task_id: int, token: int, text: str) -> None:
        """Fail one task with the reader's error text (the feeder thread does, soon)."""
        e = self.entry(task_id, token)
        if e is not None and e.state != READ:
            e.state, e.error = FAILING, text
        self._ends_asked = True
        self._wake()

    def progress(self, reached: dict[Pair, int]) -> None:
        """Record that the loop took samples ``[0, n)`` of these (task, token) -> n."""
        for (t, tok), n in reached.items():
            e = self.entry(t, tok)
            if e is not None and n > e.progressed:
                e.progressed = n
        self._progress_asked = True

    def took(self, pair: Pair, n: int) -> None:
        """The loop took samples ``[0, n)`` of (task, token) (-1: its last one); not
        progress to report (``progress`` is, once the step is over)."""
        e = self.entry(*pair)
        if e is not None and (n == -1 or e.taken != -1 and n > (e.taken or 0)):
            e.taken = n

    def honour(self, task_id: int, token: int, end: int) -> None:
        """The task's reader honours ``end`` from now on (it read below it at most): the
        progress reports name it (one is sent at once: it may confirm a split)."""
        e = self.entry(task_id, token)
        if e is not None:
            e.reader_end, e.end_unsent = end, True
        self._progress_asked = True
        self._wake()  # reported at once: it may confirm a split of the task

    def read_to(self, task_id: int, token: int, end: int) -> None:
        """The task's reading ended at ``end`` (the loop took or dropped all below it):
        its ack says so (``Task.read_to``)."""
        e = self.entry(task_id, token)
        if e is not None:
            e.read_to = end
        if self.at_tail:
            self._wake()  # at a pass's tail the feeder leases more once nothing is unread

    # -- the feeder thread's side -------------------------------------------------
    def add(self, task: Task, state: str) -> HeldTask:
        """A task leased by this iteration, in ``state`` (RESERVED or LEASED)."""
        e = HeldTask(task, self.key(task), state)
        with self._lock:
            old = self._held.pop(e.key, None)
            if old is not None:
                self._left(old)
            self._held[e.key] = e
            if state == RESERVED:
                self._n_reserved += 1
        return e

    def set_state(self, e: HeldTask, state: str) -> None:
        """Move a held entry to ``state`` (RESERVED -> LEASED, LEASED -> READING ...)."""
        with self._lock:
            if e.state == RESERVED and self._held.get(e.key) is e:
                self._n_reserved -= 1
            e.state = state

    def take_reserved(self, n: int) -> list[Task]:
        """Up to ``n`` reserved tasks, oldest first, moved to LEASED (to start now)."""
        out: list[Task] = []
        if n <= 0 or not self._n_reserved:
            return out
        with self._lock:
            for e in self._held.values():
                if len(out) >= n:
                    break
                if e.state == RESERVED:
                    e.state = LEASED
                    self._n_reserved -= 1
                    out.append(e.task)
        return out

    def _left(self, e: HeldTask) -> None:
        """(Under the lock) ``e`` left the table: its cell is free again."""
        if e.state == RESERVED:
            self._n_reserved -= 1
        if e.slot >= 0:
            self.freed_slots.append(e.slot)
            e.slot = -1

    def _pop(self, e: HeldTask) -> None:
        """(Under the lock) remove ``e`` if it is still the entry of its task."""
        if self._held.get(e.key) is e:
            del self._held[e.key]
            self._left(e)

    def drop_revoked(self) -> bool:
        """Forget held tasks the server took back (a heartbeat's answer, a reserved one
        stolen): their acks would be stale. True if there were any."""
        with self._lock:
            gone = [e for e in self._held.values() if e.task.revoked.is_set()]
            for e in gone:
                self._pop(e)
        return bool(gone)

    def collect(self) -> list[Task]:
        """Take the main thread's asks: hand the progress to the trainer, perform the
        fails; return the tasks to ack (no longer held)."""
        acks: list[Task] = []
        if self.trainer is None:
            return acks
        self._record_progress(self.trainer)
        if not self._ends_asked:
            return acks
        self._ends_asked = False
        fails: list[HeldTask] = []
        with self._lock:
            for e in [e for e in self._held.values() if e.state in (READ, FAILING)]:
                self._pop(e)
                if e.state == READ:
                    e.task.read_to = e.read_to
                    acks.append(e.task)
                else:
                    fails.append(e)
        for e in fails:
            log.warning("job %s task %s: %s; failing the task", self.job, e.key, e.error)
            try:
                self.trainer.fail(e.task, e.error)
            except errors.LeaseLost as err:
                log.warning("%s", err)
            self.failed += 1
        return acks

    def ack_now(self, acks: list[Task]) -> None:
        """Ack these tasks, ``MAX_BATCH`` per call."""
        if acks and self.trainer is not None:
            for start in range(0, len(acks), MAX_BATCH):
                try:
                    self.trainer.ack(acks[start : start + MAX_BATCH])
                except errors.LeaseLost as e:
                    log.warning("%s", e)  # the others in the call were counted
            self.acked += len(acks)

    def commit(self, acks: list[Pair], reached: dict[Pair, int]) -> None:
        """Ack these (task, token) pairs and send how far the loop got into the held
        tasks of ``reached``, now (acks="commit")."""
        assert self.trainer is not None
        done: list[Task] = []
        with self._lock:
            for pair in acks:
                e = self.entry(*pair)
                if e is not None:
                    self._pop(e)
                    e.task.read_to = e.read_to
                    done.append(e.task)
            partial = [
                (e.task, n, e.reader_end)
                for pair, n in reached.items()
                if (e := self.entry(*pair)) is not None
            ]
        self.ack_now(done)
        for task, n, known in partial:
            if not task.revoked.is_set():
                self.trainer.progress(task, n, known)
        self.trainer.flush_progress()

    def give_back(self, tasks: list[Task]) -> None:
        """Release these held tasks (the progress recorded is sent first)."""
        with self._lock:
            for task in tasks:
                e = self._held.get(self.key(task))
                if e is not None and e.task is task:
                    self._pop(e)
        self._release(tasks)

    def keep_only(self, keep: list[Pair]) -> None:
        """Release every held task but these (task, token) pairs."""
        kept = set(keep)
        with self._lock:
            others = [e for e in self._held.values() if e.pair not in kept]
            for e in others:
                self._pop(e)
        self._release([e.task for e in others])

    def release_all(self) -> None:
        """Give back what is still held, ``MAX_BATCH`` per call (a leave ends a bounded
        number of leases and leaves the rest to expire; with acks="commit" up to
        MAX_HELD are held)."""
        with self._lock:
            held = list(self._held.values())
            for e in held:
                self._pop(e)
        self._release([e.task for e in held])

    def _release(self, tasks: list[Task]) -> None:
        if self.trainer is None:
            return
        tasks = [t for t in tasks if not t.revoked.is_set()]
        for start in range(0, len(tasks), MAX_BATCH):
            try:
                self.trainer.release(tasks[start : start + MAX_BATCH])
            except (errors.JobCancelled, errors.JobCompleted):
                return  # nothing to give back
            except errors.TaskqError as e:
                log.warning("release: %s (the leases expire instead)", e)
                return

    def sizes(self, tasks: list[Task]) -> None:
        """Tasks just started: their size goes to the server now, with their start (what
        lets an idle trainer split one before the loop took from it: its reader is
        told the end before it reads that far)."""
        if self.trainer is None:
            return
        for task in tasks:
            # (a byte range of a local JSONL file is counted here, once: count_task)
            if task.started and not task.revoked.is_set() and self._size(task) is not None:
                self.trainer.progress(task, task.start, None)

    def _size(self, task: Task) -> int | None:
        """The task's size; when the job splits tails, measured where that is cheap (one
        more scan of a local range: ``count_task``), a size its chunks declare checked
        against the data (a split is made from the data's size, never a declared one)."""
        if not self.splits:
            return task_size(task.chunks)
        try:
            return count_task(task.chunks)
        except errors.TaskqError as e:  # its reader says so when it reads it: never split
            log.debug("task %s: not counted: %s", task.id, e)
            return None

    def _record_progress(self, trainer: Trainer) -> None:
        """Hand the loop's progress to the trainer: it only buffers it, the heartbeat
        sends it (one call per interval for all held tasks), with a report about every
        held started task of known size (the replies are how a task split by an idle
        trainer learns its end, before its reader began it too). At a pass's tail it is
        sent every ``TAIL_FLUSH_S``."""
        now = time.monotonic()
        every = min(TAIL_FLUSH_S, trainer.heartbeat_interval) if self.at_tail else None
        due = now - self._progress_sent >= (every or trainer.heartbeat_interval)
        if not self._progress_asked and not due:
            return
        self._progress_asked = False
        reports: list[tuple[Task, int, int | None]] = []
        honoured = False
        with self._lock:
            for e in self._held.values():
                task = e.task
                n = e.progressed if e.progressed > e.reported else 0
                if n:
                    e.reported = n
                elif not e.end_unsent and not (due and task.started):
                    continue
                honoured = honoured or e.end_unsent
                e.end_unsent = False
                if task.revoked.is_set() or (not n and task_size(task.chunks) is None):
                    continue  # nothing to say about it
                # a report names the end the task's reader honours (None: none yet), never
                # the task's end as the trainer learned it: the reader may be past that
                reports.append((task, n or task.start, e.reader_end))
        for task, n, end in reports:
            trainer.progress(task, n, end)
        # the trainer's heartbeat sends it too; sending it from here as well, once per
        # interval, does not depend on how the trainer beats (a trainer made with
        # client= was seen not to send it); an end newly honoured goes at once (the
        # report that confirms a split: the idle trainer with its tail waits for it)
        if honoured or due:
            self._progress_sent = now
            try:
                trainer.flush_progress()
            except errors.ConnectionLost as e:
                log.warning("progress not sent yet: %s", e)  # kept, sent next time
