"""Leaving on a signal: the ``with`` block of ``Trainer`` and ``ShardedTrainer``.

Inside ``with trainer:`` (main thread only) SIGTERM becomes ``SystemExit(128 + N)`` and
SIGINT ``KeyboardInterrupt``, so the training loop unwinds and everything held is
released by ``close()``; a body that raised anything else first fails what it was
working on. A forked child (a DataLoader worker) that inherited the handlers behaves as
if they had never been installed.

``SignalLeave`` is the one helper: a trainer owns one and calls ``enter()`` and
``exit(...)`` from its ``__enter__`` / ``__exit__`` (trainer/core.py). ``LeaveOnSignal`` is
the same helper as a mixin, for ``ShardedTrainer`` until it composes it too.

Data flow: trainer code -> trainer/core.py / trainer/sharded.py (``with``) -> signals.py ->
the owner's ``fail_current`` and ``close``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, TypeVar

from taskq import errors

log = logging.getLogger("taskq.trainer")

_S = TypeVar("_S", bound="LeaveOnSignal")

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


class LeaveOnSignal:
    """Mixin over ``SignalLeave``: ``__enter__`` / ``__exit__`` for a class providing
    ``job``, ``handle_signals``, ``close()`` and ``_fail_current(exc_type, exc)``."""

    job: str
    handle_signals: bool

    def close(self) -> None:  # pragma: no cover - provided by the class
        raise NotImplementedError

    def _fail_current(self, exc_type: type[BaseException] | None, exc: BaseException) -> None:
        raise NotImplementedError  # pragma: no cover - provided by the class

    def __enter__(self: _S) -> _S:
        signals = self.__dict__.get("_signals")
        if signals is None:
            signals = self.__dict__["_signals"] = SignalLeave(self.job)
        signals.enter(self.handle_signals)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        signals = self.__dict__.get("_signals") or SignalLeave(self.job)
        signals.exit(exc, self._fail_current, self.close)
