"""The trainer's side of progress inside a task: buffered, sent a few times a ttl.

``Trainer.progress(task, n)`` only records ``n`` here (the loop may call it for every
batch); the heartbeat thread sends what changed once per heartbeat interval, in one
``progress`` call fenced by each lease's token, and ``release`` / ``fail`` / ``close``
send it first, so a graceful end loses nothing. An ack drops its tasks' entries (a done
task's progress is spent). Semantics: docs/resume.md.

``ProgressBuffer`` is the buffer (its own lock); ``ProgressSender``, the worker's part
(worker.py), owns one and sends it: every heartbeat (heartbeat.py's ``Heartbeat``), before a
write that ends a lease (iteration.py, so the next holder starts where this one got), at
``close``; with the helper heartbeat process, also from the loop's own thread at most
once per interval (``inline``).

Data flow: training loop / torch loader -> Trainer.progress -> progress.py (buffer, sender)
-> progress.lua (with the heartbeat) -> Redis; lease reply -> Task.start ->
the readers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from types import EllipsisType
from typing import Any

from taskq import errors
from taskq.data import task_size
from taskq.engine.contract import Code
from taskq.models import Task
from taskq.trainer.session import Session

log = logging.getLogger("taskq.trainer")


#: One report: the task, the samples taken, and the task's end when it was recorded (what
#: the loop honoured from then on: a split is confirmed by it, docs/design.md).
Report = tuple["Task", int, "int | None"]


class ProgressBuffer:
    """The latest unsent ``n`` per held task (thread-safe; one per trainer)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, Report] = {}

    def record(self, task: Task, n: int, end: int | None | EllipsisType = ...) -> None:
        """Remember that the loop took samples ``[0, n)`` of ``task`` (absolute: a resumed
        task's first report is ``task.start`` + taken), honouring ``end`` from then on
        (``...``: ``task.end`` now; a loader whose readers run elsewhere names the end
        they honour, which is what confirms a split, docs/design.md "Tail splitting").

        Raises:
            InvalidInput: ``n`` is not an integer >= 0, or above the task's size where
                its chunks say it (``taskq.data.task_size``); nothing is recorded.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise errors.InvalidInput(f"progress must be an integer >= 0, got {n!r}")
        size = task_size(task.chunks)
        if size is not None and n > size:
            raise errors.InvalidInput(
                f"progress {n} of task {task.id} is beyond its size ({size} samples)"
            )
        if end is ...:
            known = task.end
            # how far the loop got, which the ack of a split task's head reports: an end
            # learned after the loop read past it moves the split point up (iteration.py)
            if task.read_to is None or n > task.read_to:
                task.read_to = n
        else:  # the caller names the end its reading honours: the task can be split
            known, task.follows_end = end, True
        with self._lock:
            old = self._pending.get(task.id)
            if old is not None and old[0] is task and old[1] >= n and old[2] == known:
                return
            self._pending[task.id] = (
                task,
                max(n, old[1]) if old and old[0] is task else n,
                known,
            )

    def __len__(self) -> int:
        """How many tasks have progress recorded and not sent yet."""
        return len(self._pending)

    def discard(self, tasks: list[Task]) -> None:
        """Drop the entries of ``tasks`` (acked: their progress is spent)."""
        if not self._pending:
            return  # nothing recorded (most loops): no lock taken per ack
        with self._lock:
            for t in tasks:
                old = self._pending.get(t.id)
                if old is not None and old[0] is t:
                    del self._pending[t.id]

    def take(self) -> list[Report]:
        """Everything pending, now removed (``restore`` puts back what a failed send had)."""
        with self._lock:
            out = list(self._pending.values())
            self._pending.clear()
        return out

    def restore(self, items: list[Report]) -> None:
        """Put back entries whose send failed, unless newer ones were recorded since."""
        with self._lock:
            for task, n, end in items:
                cur = self._pending.get(task.id)
                if cur is None or (cur[0] is task and cur[1] < n):
                    self._pending[task.id] = (task, n, end)


class ProgressSender:
    """The progress buffer and its sending (see the module docstring)."""

    def __init__(self, session: Session, inline: bool, sizes: bool = True) -> None:
        #: send the tasks' sizes (and the ends honoured) with progress: what lets the
        #: server split this trainer's tasks (``Trainer(split_tails=False)``: never)
        self._sizes = sizes
        self._session = session
        self._buffer = ProgressBuffer()
        #: acked tasks: their progress is spent (the buffer's own method: one call fewer
        #: on every ack's path)
        self.discard: Callable[[list[Task]], None] = self._buffer.discard
        self._inline = inline
        self._sent = time.monotonic()
        #: held from taking the buffer until its send is answered: a flush returns only
        #: once everything recorded before it is on the server, even when another
        #: thread (the heartbeat's) took it a moment before (a checkpoint follows a flush)
        self._sending = threading.Lock()

    def record(self, task: Task, n: int, end: int | None | EllipsisType = ...) -> None:
        """``Trainer.progress``: keep it; send it now if inline and an interval passed."""
        self._buffer.record(task, n, end)
        if self._inline and time.monotonic() - self._sent >= self._session.heartbeat_interval:
            self.flush_quietly()

    def unsent(self) -> int:
        """How many tasks have progress recorded and not sent yet."""
        return len(self._buffer)

    def flush(self) -> list[int]:
        """``Trainer.flush_progress``: send what is recorded; the ids refused (stale)."""
        with self._sending:
            self._sent = time.monotonic()
            items = self._buffer.take()
            if not items:
                return []
            try:
                results = self.report(items)
            except errors.ConnectionLost:
                self._buffer.restore(items)
                raise
        return [t.id for (t, _, _), r in zip(items, results, strict=False) if r == Code.STALE]

    def report(self, items: Sequence[Report]) -> list[int]:
        """One ``progress`` call about ``(task, samples, end honoured)`` triples, outside
        the buffer (the trainer's own reports about split pieces go this way too), each
        with the task's size when its chunks say it (what tail splitting needs); one
        result code per triple (``Code.STALE``: not this worker's lease any more, nothing
        recorded). A task the server split gets its piece's end in ``task.end``.

        Raises:
            JobNotFound: the job was deleted or replaced.
            ConnectionLost: Redis could not be reached.
        """
        session = self._session
        incarnation, secret = session.creds
        args: list[Any] = [session.job_incarnation, session.worker_id, incarnation, len(items)]
        for task, n, known in items:
            # (a loop reading to the chunks' end whatever task.end says is never split)
            size = task_size(task.chunks) if self._sizes and task.follows_end else None
            if size is None:
                args += [task.id, task.token, n]
            elif known is None:
                args += [task.id, task.token, f"{n}:{size}"]
            else:  # the end this holder honoured: it confirms a split (lib/split.lua)
                args += [task.id, task.token, f"{n}:{size}:{known}"]
        args.append(secret)
        reply = session.run("progress", args)
        if len(reply) > 2:  # each task's end: -1 none (-2, a pending tail's, never held)
            for (task, _, _), end in zip(items, reply[2], strict=False):
                if int(end) >= 0:
                    task.end = int(end)
        return [int(x) for x in reply[1]] if len(reply) > 1 else []

    def flush_quietly(self) -> None:
        """``flush`` where a failure must not stop what follows (logged)."""
        try:
            self.flush()
        except errors.TaskqError as e:
            log.warning("job %s: progress not sent: %s", self._session.job, e)
