"""The ledger of one loader iteration: the tasks it holds and what to do with them.

The main thread records here what the loop did (a task taken to its end: ack it; a
reader failed: fail it; how far the loop got into a task); the feeder thread, the only
one that calls the trainer, performs it: acks (``MAX_BATCH`` per call, or carried by the
next lease call), fails, progress handed to the trainer, releases, and with
``acks="commit"`` the commit of what the loop took since the last one. The main thread
asks here directly (``TaskqIter.ledger``); an ack, a fail or an end honoured wakes the
feeder thread.

Who owns what a trainer process holds: the trainer's ``HeldLeases`` (trainer/leases.py)
its leases, by the task's id in its shard, until the server's reply ends them; this ledger
what the loop may still count, ack or fail, by the job-wide name, until the main thread
asks (the main thread reads it for every sample, without a call to the trainer); the
readers' queue and reserve (readahead.py) what was sent to the readers.

Data flow: loader iterator (main thread) -> ledger.py -> feeder.py (its thread) ->
trainer/core.py -> Redis.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
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


def own_id(task: Task) -> int:
    """A plain job's task's name in an iteration: its id."""
    return task.id


class Ledger:
    """What one iteration holds (by task id) and the main thread's commands about it.

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
        self._held: dict[int, Task] = {}
        self.splits = False  # the job splits tails (from its config: the feeder sets it)
        self._lock = threading.Lock()
        self._cmds: deque[tuple[str, int, int, str]] = deque()
        self._reached: dict[Pair, int] = {}
        self._progress_sent = time.monotonic()
        # tail splitting (docs/torch.md): the end each task's reader honours (it told the
        # loop), named by every progress report about the task; where a task's reading
        # ended, given to its ack; honoured ends not reported yet (sent at once)
        self._known: dict[Pair, int] = {}
        self._read_to: dict[Pair, int] = {}
        self._honoured: dict[Pair, int] = {}
        #: at a pass's tail (set by the feeder): progress goes out every ``TAIL_FLUSH_S``,
        #: so a task of ours split by an idle trainer is learned (and confirmed) soon
        self.at_tail = False

    # -- the main thread's side ---------------------------------------------------
    def holds(self, task_id: int, token: int) -> bool:
        """True while (task, token) was leased by this iteration and not ended."""
        with self._lock:
            return self._owns(task_id, token)

    def held(self, task_id: int, token: int) -> Task | None:
        """(task, token) while this iteration holds it (its pass, a mixed job's source),
        else None."""
        with self._lock:
            task = self._held.get(task_id)
            return task if task is not None and task.token == token else None

    def ack(self, pairs: list[Pair]) -> None:
        """Ack these (task, token) pairs (the feeder thread does, soon)."""
        self._cmds.extend(("ack", t, tok, "") for t, tok in pairs)
        self._wake()

    def fail(self, task_id: int, token: int, text: str) -> None:
        """Fail one task with the reader's error text (the feeder thread does, soon)."""
        self._cmds.append(("fail", task_id, token, text))
        self._wake()

    def progress(self, reached: dict[Pair, int]) -> None:
        """Record that the loop took samples ``[0, n)`` of these (task, token) -> n."""
        with self._lock:
            for key, n in reached.items():
                if n > self._reached.get(key, 0):
                    self._reached[key] = n

    def honour(self, task_id: int, token: int, end: int) -> None:
        """The task's reader honours ``end`` from now on (it read below it at most): the
        progress reports name it (one is sent at once: it may confirm a split)."""
        with self._lock:
            self._known[task_id, token] = end
            self._honoured[task_id, token] = end
        self._wake()  # reported at once: it may confirm a split of the task

    def read_to(self, task_id: int, token: int, end: int) -> None:
        """The task's reading ended at ``end`` (the loop took or dropped all below it):
        its ack says so (``Task.read_to``)."""
        with self._lock:
            self._read_to[task_id, token] = end

    # -- the feeder thread's side -------------------------------------------------
    def held_map(self) -> dict[int, Task]:
        """The held tasks by name (a copy)."""
        with self._lock:
            return dict(self._held)

    def add(self, task: Task) -> None:
        """A task leased by this iteration."""
        with self._lock:
            self._held[self.key(task)] = task

    def count(self) -> int:
        """Tasks held (leased and not acked, failed or released by this iteration)."""
        with self._lock:
            return len(self._held)

    def drop_revoked(self) -> bool:
        """Forget held tasks the server took back (a heartbeat's answer): their acks
        would be stale. True if there were any."""
        with self._lock:
            gone = [k for k, t in self._held.items() if t.revoked.is_set()]
            for task_id in gone:
                del self._held[task_id]
        return bool(gone)

    def collect(self) -> list[Task]:
        """Take the main thread's commands: hand the progress to the trainer, perform
        the fails; return the tasks to ack (no longer held)."""
        acks: list[Task] = []
        if self.trainer is None:
            return acks
        self._record_progress(self.trainer)
        fails: list[tuple[Task, str]] = []
        while self._cmds:
            kind, task_id, token, text = self._cmds.popleft()
            with self._lock:
                if not self._owns(task_id, token):
                    continue
                task = self._held.pop(task_id)
                self._known.pop((task_id, token), None)
                task.read_to = self._read_to.pop((task_id, token), None)
            if kind == "ack":
                acks.append(task)
            else:
                fails.append((task, text))
        for task, text in fails:
            log.warning("job %s task %s: %s; failing the task", self.job, self.key(task), text)
            try:
                self.trainer.fail(task, text)
            except errors.LeaseLost as e:
                log.warning("%s", e)
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
        with self._lock:
            done = [self._held.pop(t) for t, tok in acks if self._owns(t, tok)]
            for task in done:
                self._known.pop((self.key(task), task.token), None)
                task.read_to = self._read_to.pop((self.key(task), task.token), None)
            partial = [
                (self._held[t], n, self._known.get((t, tok)))
                for (t, tok), n in reached.items()
                if self._owns(t, tok)
            ]
        self.ack_now(done)
        for task, n, known in partial:
            if not task.revoked.is_set():
                self.trainer.progress(task, n, known)
        self.trainer.flush_progress()

    def held_tasks(self) -> list[Task]:
        """The tasks held, in the order they were leased."""
        with self._lock:
            return list(self._held.values())

    def give_back(self, tasks: list[Task]) -> None:
        """Release these held tasks (the progress recorded is sent first)."""
        with self._lock:
            for task in tasks:
                key = self.key(task)
                if self._held.get(key) is task:
                    del self._held[key]
        self._release(tasks)

    def keep_only(self, keep: list[Pair]) -> None:
        """Release every held task but these (task, token) pairs."""
        kept = set(keep)
        with self._lock:
            others = [k for k, t in self._held.items() if (k, t.token) not in kept]
            tasks = [self._held.pop(k) for k in others]
        self._release(tasks)

    def release_all(self) -> None:
        """Give back what is still held, ``MAX_BATCH`` per call (a leave ends a bounded
        number of leases and leaves the rest to expire; with acks="commit" up to
        MAX_HELD are held)."""
        with self._lock:
            held = list(self._held.values())
            self._held.clear()
        self._release(held)

    def _owns(self, task_id: int, token: int) -> bool:
        task = self._held.get(task_id)
        return task is not None and task.token == token

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
        with self._lock:
            if not self._reached and not self._honoured and not due:
                return
            reached, self._reached = self._reached, {}
            honoured, self._honoured = self._honoured, {}
            known = self._known
            tasks = [
                (self._held.get(task_id), token, n, known.get((task_id, token)))
                for (task_id, token), n in reached.items()
            ]
            tasks += [
                (self._held.get(task_id), token, -1, end)
                for (task_id, token), end in honoured.items()
                if (task_id, token) not in reached
            ]
            if due:
                tasks += [
                    (t, t.token, -1, known.get((k, t.token)))
                    for k, t in self._held.items()
                    if t.started and (k, t.token) not in reached and (k, t.token) not in honoured
                ]
        for task, token, n, end in tasks:
            if task is not None and task.token == token and not task.revoked.is_set():
                if n < 0 and task_size(task.chunks) is None:
                    continue  # nothing to say about it
                # a report names the end the task's reader honours (None: none yet), never
                # the task's end as the trainer learned it: the reader may be past that
                trainer.progress(task, task.start if n < 0 else n, end)
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
