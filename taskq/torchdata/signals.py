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

The kernel may give the process's SIGTERM to a thread other than the main one (it does
when the main thread has a signal pending and is off the CPU: a stopped worker's
SIGCHLD, on a loaded machine). Python then runs the handler only once the main thread's
blocking call returns (a long step, a fetch waiting on torch's queue), and nothing would
be released before it. So the handler's install also points Python's wakeup fd at a
pipe of ours (unless the process set one of its own), which the C-level handler writes
the signal's number to whatever thread it runs on: each loader's feeder thread looks
at it (``leaving``), and a SIGTERM the main thread has not handled within ``GRACE_S``
has the feeder release what it holds itself, the main thread's ``SystemExit`` coming
when its call returns. Forked children (DataLoader workers) drop the pipe.

Data flow: kernel -> signals.py (main thread) -> SystemExit -> iteration.py -> feeder.py;
kernel -> wakeup pipe -> feeder.py (``leaving``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from types import FrameType

from .. import errors

log = logging.getLogger("taskq.torch")

_lock = threading.Lock()
#: the pid that installed the handler (0: none installed)
_installed_by = 0
#: how long a SIGTERM seen on the wakeup pipe is left to the main thread's handler
GRACE_S = 0.2
#: the wakeup pipe (read end, write end; -1: none) and the pid it belongs to
_pipe = (-1, -1)
_pipe_pid = 0
#: when a SIGTERM was seen on the pipe (0: not), and whether the main thread handled one
_seen_at = 0.0
_handled = False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _handled
    if os.getpid() != _installed_by:  # a forked child (a DataLoader worker): the default
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _handled = True
    log.info("signal %d: leaving (the loader releases what it holds, progress first)", signum)
    raise SystemExit(128 + signum)


def _watch() -> None:
    """(Main thread, under ``_lock``) Point Python's wakeup fd at our pipe, unless the
    process has one of its own (an asyncio loop's, say): then a SIGTERM on another
    thread waits for the main thread as before."""
    global _pipe, _pipe_pid
    if _pipe_pid == os.getpid():
        return
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    if old != -1:
        signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
        return
    _pipe, _pipe_pid = (r, w), os.getpid()


def _drop_pipe() -> None:
    """In a forked child: the pipe is the parent's (its signals are not ours)."""
    global _pipe, _pipe_pid, _seen_at, _handled
    if _pipe_pid and _pipe_pid != os.getpid():
        with contextlib.suppress(ValueError):
            old = signal.set_wakeup_fd(-1)
            if old != _pipe[1]:  # one the child's code set since: not ours to drop
                signal.set_wakeup_fd(old)
        for fd in _pipe:
            with contextlib.suppress(OSError):
                os.close(fd)
        _pipe, _pipe_pid, _seen_at, _handled = (-1, -1), 0, 0.0, False


os.register_at_fork(after_in_child=_drop_pipe)


def leaving() -> bool:
    """True once this process got a SIGTERM (seen on the wakeup pipe) that our handler,
    still the process's, has not run on the main thread within ``GRACE_S``: the caller
    (a feeder thread) releases what it holds now rather than when the main thread's
    blocking call returns."""
    global _seen_at
    if _pipe_pid != os.getpid() or _handled:
        return False
    if not _seen_at:
        with _lock:
            seen = False
            while True:  # the other signals' numbers too (SIGCHLD ...): read them all
                try:
                    data = os.read(_pipe[0], 4096)
                except OSError:  # BlockingIOError: nothing more
                    break
                if not data:
                    break
                seen = seen or signal.SIGTERM in data
            if seen and not _seen_at:
                _seen_at = time.monotonic()
        if not _seen_at:
            return False
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        return False  # a handler put in place since ours decides what SIGTERM does
    return time.monotonic() - _seen_at >= GRACE_S


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
        _watch()
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
        _watch()
