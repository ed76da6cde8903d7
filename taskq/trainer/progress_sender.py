"""A trainer's progress inside tasks: buffered, sent with the heartbeat (docs/resume.md).

``ProgressSender`` is the part of ``Trainer`` (trainer/core.py) that owns the buffer
(``progress.ProgressBuffer``, its own lock) and sends it: every heartbeat
(trainer/beats.py), before a write that ends a lease (trainer/calls.py, so the next
holder starts where this one got), at ``close``; with the helper heartbeat process,
also from the loop's own thread at most once per interval (``inline``).

Data flow: trainer.progress() -> trainer/progress_sender.py -> protocol.py (progress) -> Redis.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from types import EllipsisType

from taskq import errors
from taskq.engine.contract import Code
from taskq.models import Task
from taskq.trainer.progress import ProgressBuffer, Report
from taskq.trainer.protocol import Wire
from taskq.trainer.session import Session

log = logging.getLogger("taskq.trainer")


class ProgressSender:
    """The progress buffer and its sending (see the module docstring)."""

    def __init__(self, wire: Wire, session: Session, inline: bool, sizes: bool = True) -> None:
        self._wire = wire
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

    def record(self, task: Task, n: int, end: int | None | EllipsisType = ...) -> None:
        """``Trainer.progress``: keep it; send it now if inline and an interval passed."""
        self._buffer.record(task, n, end)
        if self._inline and time.monotonic() - self._sent >= self._session.heartbeat_interval:
            self.flush_quietly()

    def flush(self) -> list[int]:
        """``Trainer.flush_progress``: send what is recorded; the ids refused (stale)."""
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
        the buffer (the trainer's own reports about split pieces go this way too); one
        result code per triple. The replies move ``task.end`` (protocol.py)."""
        session = self._session
        incarnation, secret = session.creds
        return session.contact(
            self._wire.progress,
            session.job_incarnation,
            session.worker_id,
            incarnation,
            secret,
            items if self._sizes else [(t, n, None) for t, n, _ in items],
            self._sizes,
        )

    def flush_quietly(self) -> None:
        """``flush`` where a failure must not stop what follows (logged)."""
        try:
            self.flush()
        except errors.TaskqError as e:
            log.warning("job %s: progress not sent: %s", self._session.job, e)
