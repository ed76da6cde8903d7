"""Stopping a long-running command on SIGTERM / SIGINT without a deadlock.

The reaper, the exporter, ``taskq append --follow``, ``taskq dev cluster`` and the demo
loop until a ``threading.Event`` is set, and a signal sets it. A Python signal handler
runs on the main thread between two bytecodes — possibly while that same thread holds
the event's internal lock inside ``Event.wait`` or ``Event.is_set``. Calling
``event.set()`` from the handler then waits for a lock its own thread holds, for ever
(the reaper hung so under SIGTERM in CI; CPython issue 126434 describes the same for
``multiprocessing.Event``). So the handler here takes no lock: it writes the signal's
number to a pipe, and a relay thread reads it and sets the event.

Data flow: signal -> ``StopOnSignals`` handler -> pipe -> relay thread -> ``stop.set()``
-> the command's loop (ops/reaper.py, ops/exporter.py, cli/streams.py, cli/dev.py,
cli/demo.py) ends after its current step.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any

#: The byte that wakes the relay thread to end it (no signal has number 0).
_END = 0


class StopOnSignals:
    """``with StopOnSignals(stop):`` — while inside, each of ``signals`` sets ``stop``
    (and calls ``on_signal(signum)`` first, on the relay thread). Outside the main thread
    it does nothing: only the main thread may install handlers. On leaving, the previous
    handlers are back and the relay thread has ended.

    A process forked inside the block (a worker) that receives one of the signals
    behaves as if the handler had never been installed.
    """

    def __init__(
        self,
        stop: threading.Event,
        signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
        on_signal: Callable[[int], None] | None = None,
    ) -> None:
        self.stop = stop
        self.signals = tuple(signals)
        self.on_signal = on_signal
        #: the last signal received, or None
        self.signum: int | None = None
        self._old: dict[int, Any] = {}
        self._pipe: tuple[int, int] | None = None
        self._relay: threading.Thread | None = None
        self._pid = os.getpid()

    def __enter__(self) -> StopOnSignals:
        self.install()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()

    def install(self) -> None:
        """Install the handlers and start the relay (what ``with`` does first)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._pid = os.getpid()
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        self._pipe = (read_end, write_end)
        self._relay = threading.Thread(
            target=self._relay_signals, name="taskq-signals", daemon=True
        )
        self._relay.start()
        for sig in self.signals:
            self._old[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put the previous handlers back and end the relay (what ``with`` does last)."""
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old = {}
        if self._pipe is None or self._relay is None:
            return
        read_end, write_end = self._pipe
        os.write(write_end, bytes([_END]))
        self._relay.join()
        os.close(read_end)
        os.close(write_end)
        self._pipe = self._relay = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a forked child: as if never installed
            default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
            signal.signal(signum, default)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signum)
            return
        if self._pipe is not None:
            try:
                os.write(self._pipe[1], bytes([signum]))
            except BlockingIOError:  # the pipe is full of signals already: one is enough
                pass

    def _relay_signals(self) -> None:
        assert self._pipe is not None
        read_end = self._pipe[0]
        while True:
            data = os.read(read_end, 64)
            if not data:
                return
            for signum in data:
                if signum == _END:
                    return
                self.signum = signum
                if self.on_signal is not None:
                    self.on_signal(signum)
                self.stop.set()
