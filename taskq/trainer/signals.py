"""Leaving on a signal: the ``with`` block of ``Trainer``.

Inside ``with trainer:`` (main thread only) SIGTERM becomes ``SystemExit(128 + N)`` and
SIGINT ``KeyboardInterrupt``, so the training loop unwinds and everything held is
released by ``close()``; a body that raised anything else first fails what it was
working on. A forked child (a DataLoader worker) that inherited the handlers behaves as
if they had never been installed.

``SignalLeave`` is the one helper: a trainer owns one and calls ``enter()`` and
``exit(...)`` from its ``__enter__`` / ``__exit__`` (trainer/core.py), for a plain job
and a sharded one alike.

Data flow: trainer code -> trainer/core.py (``with``) -> signals.py -> the trainer's
``fail_current`` and ``close``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from taskq import errors

log = logging.getLogger("taskq.trainer")

#: What a body may raise without its current task being failed: leaving, not a task error.
_NOT_TASK_ERRORS = (SystemExit, KeyboardInterrupt, GeneratorExit, errors.TaskqError)


class SignalLeave:
    """The signal handlers of one trainer's ``with`` block; owns the handlers it replaced
    and the pid that installed them."""

    def __init__(self, job: str) -> None:
        self.job = job
        self._old: dict[int, Any] = {}
        self._pid = os.getpid()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a forked child: behave as if never installed
            signal.signal(
                signum, signal.SIG_DFL if signum != signal.SIGINT else signal.default_int_handler
            )
            if signum != signal.SIGINT:
                os.kill(os.getpid(), signum)
                return
            raise KeyboardInterrupt
        log.info("job %s: signal %d; leaving (releasing what this trainer holds)", self.job, signum)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def enter(self, handle_signals: bool) -> None:
        """Install the handlers (when ``handle_signals``, in the main thread only)."""
        self._pid = os.getpid()
        if handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._old[signum] = signal.signal(signum, self._on_signal)

    def exit(
        self,
        exc: BaseException | None,
        fail_current: Callable[[type[BaseException] | None, BaseException], None],
        close: Callable[[], None],
    ) -> None:
        """Leave the block: fail the current work on an error of the body, then
        ``close()`` and restore the handlers (even if the close is interrupted)."""
        try:
            if exc is not None and not isinstance(exc, _NOT_TASK_ERRORS):
                fail_current(type(exc), exc)
        finally:
            try:
                close()
            finally:
                self.restore()

    def restore(self) -> None:
        """Put back the handlers ``enter`` replaced."""
        for signum, handler in self._old.items():
            signal.signal(signum, handler)
        self._old = {}
