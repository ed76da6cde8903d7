"""Leaving on a signal: the ``with`` block shared by ``Trainer`` and ``ShardedTrainer``.

Inside ``with trainer:`` (main thread only) SIGTERM becomes ``SystemExit(128 + N)`` and
SIGINT ``KeyboardInterrupt``, so the training loop unwinds and everything held is
released by ``close()``; a body that raised anything else first fails what it was
working on (``_fail_current``). A forked child (a DataLoader worker) that inherited the
handlers behaves as if they had never been installed.

Data flow: trainer code -> signals.py (the ``with`` block) -> trainer.py /
sharded_trainer.py (``_fail_current``, ``close``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType, TracebackType
from typing import Any, TypeVar

from . import errors

log = logging.getLogger("taskq.trainer")

_S = TypeVar("_S", bound="LeaveOnSignal")

#: What a body may raise without its current task being failed: leaving, not a task error.
_NOT_TASK_ERRORS = (SystemExit, KeyboardInterrupt, GeneratorExit, errors.TaskqError)


class LeaveOnSignal:
    """Mixin: ``__enter__`` installs the handlers, ``__exit__`` fails the current work on
    an error of the body, then ``close()``s and restores the handlers.

    The class using it provides ``job``, ``handle_signals``, ``close()`` and
    ``_fail_current(exc_type, exc)``.
    """

    job: str
    handle_signals: bool
    _old_handlers: dict[int, Any]

    def close(self) -> None:  # pragma: no cover - provided by the class
        raise NotImplementedError

    def _fail_current(self, exc_type: type[BaseException] | None, exc: BaseException) -> None:
        raise NotImplementedError  # pragma: no cover - provided by the class

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._signal_pid:  # a forked child: behave as if never installed
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

    def __enter__(self: _S) -> _S:
        if not hasattr(self, "_old_handlers"):
            self._old_handlers = {}
        self._signal_pid = os.getpid()
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._old_handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None and not isinstance(exc, _NOT_TASK_ERRORS):
                self._fail_current(exc_type, exc)
        finally:
            try:
                self.close()
            finally:
                self._restore_signals()

    def _restore_signals(self) -> None:
        for signum, handler in getattr(self, "_old_handlers", {}).items():
            signal.signal(signum, handler)
        self._old_handlers = {}
