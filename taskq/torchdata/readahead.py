"""The read-ahead of one loader iteration: what its readers are sent, and when.

Only what the readers need now is on their task queue, started: each reader's open tasks
and its next one. The rest of the read-ahead is leased *reserved* and kept back (state
``RESERVED`` in the iteration's table of held tasks, held.py): an idle trainer may still
take it (the server's steal) until a reader needs it, when it is started
(``Trainer.lease_many(starts=...)``) and put on the queue. This part owns the queue, the
readers' end cells and the counts the pace is set by, and decides what the next lease
call starts and asks for; the feeder (feeder.py) makes the call. What it knows of each
task (where it is, its cell) is written in the task's entry (held.py).

Data flow: feeder.py -> readahead.py -> task queue -> readers (dataset.py).
"""

from __future__ import annotations

import queue
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from taskq.engine.contract import MAX_BATCH

from ..models import Task
from .dataset import END_SLOTS, NO_END, InProcess, TaskMsg, stop_msg
from .held import LEASED, READING, RESERVED, TAIL, HeldTask, HeldTasks

#: how long a reserve found with nothing left to lease is only started, not refilled
DRY_S = 2.0


class ReadAhead:
    """The readers' queue and end cells of one iteration.

    Args:
        held: the iteration's table of held tasks (held.py).
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
        held: HeldTasks,
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
        self.held = held
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
        #: tasks leased after the readers stopped (global pass end), read in-process
        self.tail: queue.Queue[TaskMsg] = queue.Queue()
        self._dispatched = 0
        self._stopped = False
        #: the end cells: the readers' array and the free ones (a task's is in its entry)
        self._ends = ends
        self._opened = opened
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
        starts = self.held.take_reserved(need)
        need -= len(starts)
        reserved = self.held.n_reserved
        if reserved and time.monotonic() - self._dry_at < DRY_S:
            return starts, 0, False  # nothing left to lease: the reserve is started first
        if need > 0:
            return starts, min(MAX_BATCH, need), False
        room = self.tasks_ahead - (reading + len(starts) + reserved)
        if room >= self.refill:
            return starts, min(MAX_BATCH, room), True
        return starts, 0, False

    def started(self, starts: list[Task]) -> None:
        """Put the tasks just started on the readers' queue (one taken by an idle
        trainer first is no longer held: it is left out)."""
        held = self.held
        for task in starts:
            e = held.entry(held.key(task), task.token)
            if e is not None and task.started and not task.revoked.is_set():
                self.send(e, int(getattr(task, "start", 0)))

    def took(self, got: list[Task], reserve: bool, to_tail: bool) -> None:
        """Tasks a lease granted: entered held, kept reserved, or sent to the readers
        (or the tail, read in the main process)."""
        for task in got:
            e = self.held.add(task, RESERVED if reserve else LEASED)
            if not reserve:
                self.send(e, int(getattr(task, "start", 0)), to_tail)

    def note_dry(self) -> None:
        """A lease found nothing left while the reserve was not empty."""
        self._dry_at = time.monotonic()

    def send(self, e: HeldTask, start: int, to_tail: bool = False, end: int | None = None) -> None:
        """Put one held task on the readers' queue (or the tail), reading from ``start``
        to ``end`` (None: the task's current end)."""
        task = e.task
        end = task.end if end is None else end
        slot = self._slot(e, end)
        # the task's sample order, the job's (Task.order: '' the chunks')
        msg = (self.iteration, e.key, task.token, task.order or "", task.chunks, start, end, slot)
        self.held.set_state(e, TAIL if to_tail else READING)
        if to_tail:
            self.tail.put(msg)
        else:
            self.tasks.put(msg)
            self._dispatched += 1

    def _slot(self, e: HeldTask, end: int | None) -> int:
        """The end cell of a task about to be sent, its current end written (-1: none
        free; its reader then reads to the end the message says)."""
        freed = self.held.freed_slots
        while freed:
            self._free.append(freed.pop())
        if e.slot >= 0:
            self._free.append(e.slot)
            e.slot = -1
        if not self._free:
            return -1
        slot = self._free.pop()
        cell = NO_END if end is None else end
        self._ends[slot] = cell
        if self._opened is not None:
            self._opened[slot] = 0  # (before the message is put: not opened)
        e.slot, e.slot_end = slot, cell
        return slot

    def sync_ends(self) -> list[tuple[int, int, int]]:
        """Write the held tasks' ends that moved (a split while they are read) to their
        readers' cells. Returns the (task, token, end) their readers will honour exactly
        (``honours``): their reports go out now (each confirms a split, lib/split.lua);
        the other moved ends go to ``moved``."""
        honoured: list[tuple[int, int, int]] = []
        if self._ends is None:
            return honoured
        for e in self.held.entries():
            slot = e.slot
            if slot < 0:
                continue
            task, written = e.task, e.slot_end
            end = NO_END if task.end is None else task.end
            if end != written:
                self._ends[slot] = end
                e.slot_end = end
                # (a task's first end, never below its start: a split point is past the
                # progress the task was leased from)
                first = written == NO_END and end >= int(task.start)
                at = self.honours(e, end) if first else None
                if at is None:
                    self.moved.append((e.key, task.token, end))
                else:
                    honoured.append((e.key, task.token, at))
        return honoured

    def honours(self, e: HeldTask, end: int) -> int | None:
        """The end a sent task's reader will honour exactly, its cell just told its first
        end ``end`` (a split point), or None: not known (its reader sees the end itself
        and says so; the loop cuts what it read ahead, cut.py). A task whose reader has
        not opened it is read to the cell's end (the reader reads the cell after marking
        it opened, the feeder after writing the end): ``end``, exactly, said now rather
        than when the reader comes to it (a read-ahead task behind a slow loop's open
        one waited a batch of that loop or more: the idle trainer with its tail too). An
        in-process reader between batches honours ``end`` past the sample it looked
        ahead, else that sample's position, the sample not delivered
        (``InProcess.honour``): said now too; the loop holds nothing of the task past it."""
        if end == NO_END:
            return None
        if self._opened is not None and e.state != TAIL and not self._opened[e.slot]:
            return end
        here = self.here
        return None if here is None else here.honour(e.slot, e.key, e.task.token, end)

    def stop_readers(self) -> None:
        """Tell every reader that no more tasks come (once)."""
        if not self._stopped:
            self._stopped = True
            for _ in range(self.readers):
                self.tasks.put(stop_msg(self.iteration))

    def end(self) -> None:
        """The iteration is over: the readers and the tail stop (the reserve is held,
        released with the rest)."""
        self.stop_readers()
        self.tail.put(stop_msg(self.iteration))

    def restart(
        self, tasks: Any, ends: Any, finished: Callable[[], int], dead_held: set[int]
    ) -> list[Task]:
        """New readers replace the old ones (one died), on a new queue: every held task
        they were reading, or had queued, is sent to them again from where the loop got
        (its entry's ``taken``; none whose last sample the loop took) up to the end the
        loop honours for a task it cut (``cut``), but those the dead reader was reading
        (``dead_held``), returned for the caller to give back. Reserved tasks and the
        tail's stay where they are.

        Returns:
            The tasks to give back.
        """
        self.tasks, self.finished, self._dispatched = tasks, finished, 0
        # the new readers mark cells of their own: none is taken as not opened any more
        self._opened = None
        entries = self.held.entries()
        if self._ends is not None and ends is not None:
            # the new readers' cells; the tail's tasks (read here, through the
            # iteration's current feed: the new one) keep their cell numbers
            self._ends = ends
            used = set()
            for e in entries:
                if e.state == TAIL and e.slot >= 0:
                    ends[e.slot] = e.slot_end
                    used.add(e.slot)
                else:
                    e.slot = -1  # its old cell went with the old readers
            self.held.freed_slots.clear()
            self._free = [k for k in range(END_SLOTS - 1, -1, -1) if k not in used]
        back: list[Task] = []
        for e in entries:
            if e.taken == -1 or e.state not in (LEASED, READING):
                continue  # taken to its end (acked or waiting for a commit); not begun
            task = e.task
            if e.key in dead_held:
                back.append(task)
            else:
                start = task.start if e.taken is None else max(e.taken, task.start)
                self.send(e, start, end=e.cut)
        if self._stopped:  # the old readers were told to stop: so are the new ones
            self._stopped = False
            self.stop_readers()
        return back
