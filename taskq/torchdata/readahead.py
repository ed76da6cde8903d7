"""The read-ahead of one loader iteration: what its readers have, and what waits for them.

Only what the readers need now is on their task queue, started: each reader's open tasks
and its next one. The rest of the read-ahead is leased *reserved* and kept here: an idle
trainer may still take it (the server's steal) until a reader needs it, when it is
started (``Trainer.lease_many(starts=...)``) and put on the queue. This part owns that
state (the queue, the reserve, the counts the pace is set by) and decides what the next
lease call starts and asks for; the feeder (feeder.py) makes the call.

Data flow: feeder.py -> readahead.py -> task queue -> readers (dataset.py).
"""

from __future__ import annotations

import queue
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from taskq.engine.contract import MAX_BATCH

from ..models import Task
from .dataset import END_SLOTS, NO_END, InProcess, TaskMsg, stop_msg
from .ledger import own_id

if TYPE_CHECKING:
    from .ledger import Ledger

#: how long a reserve found with nothing left to lease is only started, not refilled
DRY_S = 2.0


class ReadAhead:
    """The readers' queue and the reserve of one iteration.

    Args:
        tasks: the readers' queue (workers' multiprocessing queue, or an in-process one).
        readers: how many readers take from ``tasks`` (one stop message each).
        finished: the number of tasks the readers finished reading so far.
        iteration: the loader's iteration number, carried by every message.
        tasks_ahead: tasks leased and not yet read to their end, at most.
        interleave: tasks a reader reads from at once.
        spare: tasks queued per reader beyond its open ones (1 for worker processes,
            whose progress the feeder polls; 0 in-process, where a finished task wakes
            the feeder at once and a slow loop should hold no more started work).
        ends: the readers' shared cells of each sent task's current end (``Feed.ends``;
            None: none, a task is read to the end it had when sent).
        opened: the readers' marks of the cells whose task they took (``Feed.opened``;
            None: not known).
        here: the in-process reader (``Feed.here``; None: worker processes).
    """

    def __init__(
        self,
        tasks: Any,
        readers: int,
        finished: Callable[[], int],
        iteration: int,
        tasks_ahead: int,
        interleave: int,
        spare: int = 1,
        ends: Any = None,
        opened: Any = None,
        here: InProcess | None = None,
    ) -> None:
        self.tasks = tasks
        self.here = here
        self.readers = readers
        self.finished = finished
        self.iteration = iteration
        self.tasks_ahead = max(1, tasks_ahead)
        #: refill by half the read-ahead at a time: several tasks per lease call
        self.refill = max(1, self.tasks_ahead // 2)
        #: tasks to keep on the queue or being read: each reader's open ones (and its next)
        self.read_target = min(self.tasks_ahead, readers * (interleave + spare))
        #: leased reserved, not on the readers' queue yet (stealable until started)
        self.reserved: deque[Task] = deque()
        #: tasks leased after the readers stopped (global pass end), read in-process
        self.tail: queue.Queue[TaskMsg] = queue.Queue()
        self._tail_ids: set[int] = set()
        #: a task's name in the messages (its id; a sharded job's: the job-wide id)
        self.key: Callable[[Task], int] = own_id
        self._dispatched = 0
        self._stopped = False
        #: the end cells: the readers' array, each sent task's cell, the free ones
        self._ends = ends
        self._opened = opened
        self._slots: dict[int, tuple[int, int, int]] = {}  # key -> (slot, token, end written)
        self._free = list(range(END_SLOTS - 1, -1, -1)) if ends is not None else []
        self._dry_at = 0.0
        #: (key, token, end) of sent tasks whose end moved, for the loop's process to cut
        #: what their readers read ahead (cut.py); appended here, taken by the main thread
        self.moved: deque[tuple[int, int, int]] = deque()

    def reading(self) -> int:
        """Tasks on the readers' queue or being read."""
        return self._dispatched - self.finished()

    def plan(self) -> tuple[list[Task], int, bool]:
        """What the next call does while the readers take tasks.

        Returns:
            (reserved tasks to start now, tasks to lease, lease them reserved): the
            readers' needs come first, from the reserve, else leased started; the rest of
            the read-ahead is leased reserved.
        """
        reading = self.reading()
        need = max(0, self.read_target - reading)
        starts = [self.reserved.popleft() for _ in range(min(need, len(self.reserved)))]
        need -= len(starts)
        if self.reserved and time.monotonic() - self._dry_at < DRY_S:
            return starts, 0, False  # nothing left to lease: the reserve is started first
        if need > 0:
            return starts, min(MAX_BATCH, need), False
        room = self.tasks_ahead - (reading + len(starts) + len(self.reserved))
        if room >= self.refill:
            return starts, min(MAX_BATCH, room), True
        return starts, 0, False

    def forget_revoked(self) -> None:
        """Drop reserved tasks the server took back (stolen, revoked)."""
        if self.reserved:
            self.reserved = deque(t for t in self.reserved if not t.revoked.is_set())

    def started(self, starts: list[Task]) -> None:
        """Put the tasks just started on the readers' queue (one taken by an idle
        trainer first is no longer held: it is left out)."""
        for task in starts:
            if task.started and not task.revoked.is_set():
                self.send(task, int(getattr(task, "start", 0)))

    def took(self, got: list[Task], reserve: bool, ledger: Ledger, to_tail: bool) -> None:
        """Tasks a lease granted: kept in the reserve, or sent to the readers (or the
        tail, read in the main process)."""
        for task in got:
            ledger.add(task)
            if reserve:
                self.reserved.append(task)
            else:
                self.send(task, int(getattr(task, "start", 0)), to_tail)

    def note_dry(self) -> None:
        """A lease found nothing left while the reserve was not empty."""
        self._dry_at = time.monotonic()

    def send(self, task: Task, start: int, to_tail: bool = False, end: int | None = None) -> None:
        """Put one task on the readers' queue (or the tail), reading from ``start`` to
        ``end`` (None: the task's current end)."""
        key = self.key(task)
        end = task.end if end is None else end
        slot = self._slot(key, task.token, end)
        # the task's sample order, the job's (Task.order: '' the chunks')
        msg = (self.iteration, key, task.token, task.order or "", task.chunks, start, end, slot)
        if to_tail:
            self._tail_ids.add(key)
            self.tail.put(msg)
        else:
            self.tasks.put(msg)
            self._dispatched += 1

    def _slot(self, key: int, token: int, end: int | None) -> int:
        """The end cell of a task about to be sent, its current end written (-1: none
        free; its reader then reads to the end the message says)."""
        old = self._slots.pop(key, None)
        if old is not None:
            self._free.append(old[0])
        if not self._free:
            return -1
        slot = self._free.pop()
        cell = NO_END if end is None else end
        self._ends[slot] = cell
        if self._opened is not None:
            self._opened[slot] = 0  # (before the message is put: not opened)
        self._slots[key] = (slot, token, cell)
        return slot

    def sync_ends(self, held: dict[int, Task]) -> list[tuple[int, int, int]]:
        """Write the held tasks' ends that moved (a split while they are read) to their
        readers' cells; free the cells of tasks no longer held. Returns the (task, token,
        end) their readers will honour exactly (``honours``): their reports go out now
        (each confirms a split, lib/split.lua); the other moved ends go to ``moved``."""
        honoured: list[tuple[int, int, int]] = []
        if not self._slots:
            return honoured
        for key, (slot, token, written) in list(self._slots.items()):
            task = held.get(key)
            if task is None or task.token != token:
                del self._slots[key]
                self._free.append(slot)
                continue
            end = NO_END if task.end is None else task.end
            if end != written:
                self._ends[slot] = end
                self._slots[key] = (slot, token, end)
                # (a task's first end, never below its start: a split point is past the
                # progress the task was leased from)
                first = written == NO_END and end >= int(task.start)
                at = self.honours(slot, key, token, end) if first else None
                if at is None:
                    self.moved.append((key, token, end))
                else:
                    honoured.append((key, token, at))
        return honoured

    def honours(self, slot: int, key: int, token: int, end: int) -> int | None:
        """The end a sent task's reader will honour exactly, its cell just told its first
        end ``end`` (a split point), or None: not known (its reader sees the end itself
        and says so; the loop cuts what it read ahead, cut.py). A task whose reader has
        not opened it is read to the cell's end (the reader reads the cell after marking
        it opened, the feeder after writing the end): ``end``, exactly, said now rather
        than when the reader comes to it (a read-ahead task behind a slow loop's open
        one waited a batch of that loop or more: the idle trainer with its tail too). An
        in-process reader between batches honours max(end, its next check)
        (``InProcess``): said now too; the loop holds nothing of the task past that."""
        if end == NO_END:
            return None
        if self._opened is not None and key not in self._tail_ids and not self._opened[slot]:
            return end
        here = self.here
        at = here.next_check(slot, key, token) if here is not None else None
        return None if at is None else max(end, at)

    def stop_readers(self) -> None:
        """Tell every reader that no more tasks come (once)."""
        if not self._stopped:
            self._stopped = True
            for _ in range(self.readers):
                self.tasks.put(stop_msg(self.iteration))

    def end(self) -> None:
        """The iteration is over: the readers and the tail stop; the reserve is dropped
        (it is held, released with the rest)."""
        self.stop_readers()
        self.tail.put(stop_msg(self.iteration))
        self.reserved.clear()

    def restart(
        self,
        tasks: Any,
        ends: Any,
        finished: Callable[[], int],
        held: list[Task],
        dead_held: set[int],
        taken: dict[tuple[int, int], int],
        cut: dict[tuple[int, int], int],
    ) -> list[Task]:
        """New readers replace the old ones (one died), on a new queue: every held task
        they were reading, or had queued, is sent to them again from where the loop got
        (``taken``: (task, token) -> samples taken, -1 for a task whose last sample the
        loop took) up to the end the loop honours for a task it cut (``cut``), but those
        the dead reader was reading (``dead_held``), returned for the caller to give
        back. Tasks in the reserve or the tail stay where they are.

        Returns:
            The tasks to give back.
        """
        self.tasks, self.finished, self._dispatched = tasks, finished, 0
        # the new readers mark cells of their own: none is taken as not opened any more
        self._opened = None
        tail_slots = {k: v for k, v in self._slots.items() if k in self._tail_ids}
        if self._ends is not None and ends is not None:
            # the new readers' cells; the tail's tasks (read here, through the
            # iteration's current feed: the new one) keep their cell numbers
            self._ends = ends
            for slot, _, written in tail_slots.values():
                ends[slot] = written
            used = {v[0] for v in tail_slots.values()}
            self._slots = tail_slots
            self._free = [k for k in range(END_SLOTS - 1, -1, -1) if k not in used]
        key = self.key
        elsewhere = {key(task) for task in self.reserved} | self._tail_ids
        back: list[Task] = []
        for task in held:
            n = taken.get((key(task), task.token))
            if n == -1 or key(task) in elsewhere:
                continue  # taken to its end (acked or waiting for a commit); not begun
            if key(task) in dead_held:
                back.append(task)
            else:
                start = task.start if n is None else max(n, task.start)
                self.send(task, start, end=cut.get((key(task), task.token)))
        if self._stopped:  # the old readers were told to stop: so are the new ones
            self._stopped = False
            self.stop_readers()
        return back
