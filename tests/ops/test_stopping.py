"""taskq/ops/stopping.py: SIGTERM / SIGINT stop the reaper, the exporter and the CLI's
long-running commands without the handler waiting for a lock its own thread holds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import wait_until

from taskq.ops.stopping import StopOnSignals

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

# The main thread holds the event's own lock (as it does for a moment inside every
# Event.wait / Event.is_set) when SIGTERM arrives: the handler runs right there.
HELD_LOCK_PROC = """
import os, signal, sys, threading, time
from taskq.ops.stopping import StopOnSignals
stop = threading.Event()
if sys.argv[1] == "naive":
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    guard = None
else:
    guard = StopOnSignals(stop)
    guard.install()
with stop._cond:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # the lock held while the handler runs
assert stop.wait(10), "not stopped"
print("stopped")
"""


def run_held_lock(mode: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", HELD_LOCK_PROC, mode],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_handler_that_sets_the_event_itself_hangs_when_the_signal_lands_inside_its_lock():
    # the pattern the reaper used: why it hung in CI (and why the next test can fail)
    with pytest.raises(subprocess.TimeoutExpired):
        run_held_lock("naive", timeout=3)


def test_a_signal_landing_while_the_main_thread_holds_the_events_lock_still_stops():
    done = run_held_lock("taskq", timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"


def test_the_signal_is_told_and_the_previous_handlers_and_threads_are_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    threads = set(threading.enumerate())
    stop, told = threading.Event(), []
    with StopOnSignals(stop, on_signal=told.append) as guard:
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_until(stop.is_set, 10)
    assert told == [signal.SIGTERM] and guard.signum == signal.SIGTERM
    assert {s: signal.getsignal(s) for s in before} == before
    assert set(threading.enumerate()) == threads, "the relay thread ended"


def test_only_the_signals_asked_for_are_taken():
    stop = threading.Event()
    before = signal.getsignal(signal.SIGTERM)
    with StopOnSignals(stop, signals=(signal.SIGINT,)):
        assert signal.getsignal(signal.SIGTERM) is before
        signal.raise_signal(signal.SIGINT)  # Ctrl-C: a stop, not a KeyboardInterrupt
        assert wait_until(stop.is_set, 10)


def test_off_the_main_thread_nothing_is_installed():
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def body() -> None:
        with StopOnSignals(threading.Event()):
            seen.append(signal.getsignal(signal.SIGTERM))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [before]


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_dies_of_sigterm_as_if_no_handler_were_installed():
    stop = threading.Event()
    with StopOnSignals(stop):
        pid = os.fork()
        if pid == 0:  # the child: wait to be signalled; exit 3 if the handler swallowed it
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the signal kills it before this ends
            finally:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
    assert not stop.is_set(), "the child's signal did not stop the parent"
