"""SIGTERM in a training process that reads through ``taskq.torch.DataLoader``.

The loader's trainer lives in its feeder thread, which never sees a signal; Python's
default SIGTERM action would end the process without a word (its tasks coming back only
after ``worker_ttl``). So the first ``iter(loader)`` in the main thread, when SIGTERM has
Python's default action, installs a handler that raises ``SystemExit(143)`` there, as
``with taskq.Trainer(...)`` does: the loop unwinds, and the iteration (ended by the
exception in ``next()``, by ``with loader:``, or at the latest by the interpreter's exit)
sends the loop's progress and releases everything it holds in one call. A handler of the
user's own is left alone, unless ``leave_on_sigterm()`` is called: it replaces whatever
handler is there (a framework's: Lightning's DDP handler broadcasts from inside the
handler and can leave the ranks waiting on each other, docs/frameworks.md). Forked
DataLoader workers get the default action back.

Data flow: kernel -> signals.py (main thread) -> SystemExit -> iteration.py -> feeder.py.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType

from .. import errors

log = logging.getLogger("taskq.torch")

_lock = threading.Lock()
#: the pid that installed the handler (0: none installed)
_installed_by = 0


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if os.getpid() != _installed_by:  # a forked child (a DataLoader worker): the default
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    log.info("signal %d: leaving (the loader releases what it holds, progress first)", signum)
    raise SystemExit(128 + signum)


def install() -> bool:
    """Install the SIGTERM handler if this is the main thread and SIGTERM has its default
    action (no handler of the user's, nor of a ``with taskq.Trainer`` block).

    Returns:
        True when the handler is installed (now or before, by this process).
    """
    global _installed_by
    if threading.current_thread() is not threading.main_thread():
        return False
    with _lock:
        current = signal.getsignal(signal.SIGTERM)
        if current is _on_sigterm and _installed_by == os.getpid():
            return True
        if current not in (signal.SIG_DFL, None) and current is not _on_sigterm:
            return False  # the user's own: they decide what SIGTERM does
        _installed_by = os.getpid()
        signal.signal(signal.SIGTERM, _on_sigterm)
        return True


def leave_on_sigterm() -> None:
    """SIGTERM leaves through the loader from now on, whatever handled it before (a
    framework's handler, say Lightning's): ``SystemExit(143)`` in the main thread's loop,
    and every ``taskq.torch.DataLoader`` iteration of this process sends its progress and
    releases what it holds. Call it on the main thread (a Lightning callback's
    ``on_train_start``: docs/frameworks.md).

    Raises:
        InvalidInput: not on the main thread (only it may set a signal handler).
    """
    global _installed_by
    if threading.current_thread() is not threading.main_thread():
        raise errors.InvalidInput("leave_on_sigterm() must be called on the main thread")
    with _lock:
        _installed_by = os.getpid()
        signal.signal(signal.SIGTERM, _on_sigterm)
