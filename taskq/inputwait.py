"""The training loop's data wait, measured in the process: how long each ``next()`` of the
loop waited for its batch or task, and how long the loop ran between two of them (the
step).

``InputMeter`` is driven by the loop's own thread at near-zero cost: ``enter()`` at the top
of a ``next()``, ``leave()`` when it returns (one ``perf_counter`` each, sums and a bucket
count kept in plain attributes, no lock). The trainer marks the time it blocks with
nothing to lease and nothing held (``idle_begin`` / ``idle_end``: an open stream waiting
for appends, or a pass's last tasks held by others); the part of a ``next()`` spent then
is counted apart (``idle_s``), not as a wait for data: a loader cannot shorten it. The heartbeat thread reads it (``InputBeat``)
and sends what changed since its last answered beat as one more argument of the
heartbeat it makes anyway; the heartbeat script adds it to the job's bounded record
(lua/heartbeat.lua; read back by inputwait_view.py).

Data flow: training loop -> trainer/iteration.py / torchdata/iteration.py (``next``) ->
inputwait.py -> trainer/heartbeat.py (``Beats``: the heartbeat ARGV) -> heartbeat script -> Redis.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque

#: Upper bounds (seconds) of the data-wait histogram's buckets; one more bucket is +Inf.
#: The heartbeat script and the readers take the bucket count from here.
WAIT_BOUNDS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
N_BUCKETS = len(WAIT_BOUNDS_S) + 1
#: The window a trainer's own fraction is taken over (the worst trainers of a job are
#: ranked by it); the job's recent figures are the heartbeat script's 60 s windows.
RECENT_S = 60.0
#: The heartbeat argument's first byte, which tells it from the connection id after it.
ARG_TAG = "i"
#: Seconds between two heartbeats that carry the wait (the first as soon as the loop ran):
#: the heartbeat script's bookkeeping of it costs about as much as the rest of a beat
#: (docs/operations.md, "Is training waiting for data?"), and what a skipped beat would
#: have carried goes with the next one.
SEND_EVERY_S = 5.0

_perf = time.perf_counter
#: ``InputMeter.totals()``: count, wait_s, step_s, counts, idle_s.
Totals = tuple[int, float, float, list[int], float]


class InputMeter:
    """Sums of one training loop's data waits and steps, cumulative (never reset: the
    reader takes differences, so the loop's thread needs no lock).

    A ``next()`` calls ``enter()`` first and ``leave()`` when it has its batch; a ``next()``
    that ends the iteration (``StopIteration``, an error) calls ``stop()`` instead, and a
    new iteration ``restart()``: the time between two iterations (a checkpoint, an
    evaluation) is neither wait nor step.
    """

    __slots__ = (
        "beat",
        "count",
        "counts",
        "idle_s",
        "step_s",
        "wait_s",
        "_idle_at_in",
        "_idle_from",
        "_idle_sum",
        "_in",
        "_out",
    )

    def __init__(self) -> None:
        self.count = 0  # next() calls that returned
        self.wait_s = 0.0  # time inside them, waiting for data (idle_s apart)
        self.idle_s = 0.0  # time inside them while the trainer had nothing to lease
        self.step_s = 0.0  # time between one's return and the next one's call
        self.counts = [0] * N_BUCKETS  # the returned calls' waits by WAIT_BOUNDS_S bucket
        self._in = 0.0  # perf_counter at the last enter(); 0: none
        self._out = 0.0  # perf_counter at the last leave(); 0: none since the (re)start
        # the trainer's time blocked with nothing to lease: closed spells summed, the
        # open one's start (0: none), and the sum as the current next() began
        self._idle_sum = 0.0
        self._idle_from = 0.0
        self._idle_at_in = 0.0
        #: what the heartbeats sent of it (``InputBeat.of``): kept with the meter, so the
        #: next trainer given it (the torch loader's, one per pass) goes on from there
        self.beat: InputBeat | None = None

    def enter(self) -> None:
        """The loop asks for its next batch or task (the step before it ended)."""
        now = _perf()
        if self._out:
            self.step_s += now - self._out
            self._out = 0.0
        self._in = now
        start = self._idle_from
        self._idle_at_in = self._idle_sum + (now - start if start else 0.0)

    def leave(self) -> None:
        """The loop has its batch or task (its wait ended, the step begins)."""
        now = _perf()
        if self._in:
            wait = now - self._in
            if self._idle_from or self._idle_sum != self._idle_at_in:
                idle = min(wait, max(0.0, self._idle(now) - self._idle_at_in))
                self.idle_s += idle
                wait -= idle
            self.wait_s += wait
            self.count += 1
            self.counts[bisect_left(WAIT_BOUNDS_S, wait)] += 1
            self._in = 0.0
        self._out = now

    def idle_begin(self) -> None:
        """The trainer blocks with nothing to lease and nothing held (any thread)."""
        if not self._idle_from:
            self._idle_from = _perf()

    def idle_end(self) -> None:
        """The trainer's block with nothing to lease ended."""
        start = self._idle_from
        if start:
            self._idle_sum += _perf() - start
            self._idle_from = 0.0

    def _idle(self, now: float) -> float:
        start = self._idle_from
        return self._idle_sum + (max(0.0, now - start) if start else 0.0)

    def stop(self) -> None:
        """The ``next()`` under way ended without a batch: its time is not counted."""
        self._in = 0.0
        self._out = 0.0

    restart = stop

    def totals(self) -> Totals:
        """(count, wait_s, step_s, counts, idle_s) now, a wait or step under way included
        in its sum (so a loop stuck in one ``next()`` shows at once); read from another
        thread."""
        now = _perf()
        started, ended = self._in, self._out
        count, wait_s, step_s, idle_s = self.count, self.wait_s, self.step_s, self.idle_s
        counts = list(self.counts)
        if started and not ended:
            wait = max(0.0, now - started)
            idle = min(wait, max(0.0, self._idle(now) - self._idle_at_in))
            wait_s += wait - idle
            idle_s += idle
        elif ended and not started:
            step_s += max(0.0, now - ended)
        return count, wait_s, step_s, counts, idle_s


class InputBeat:
    """The heartbeat's side of a meter: what to send since the last beat that was
    answered, and the trainer's own fraction over its last ``RECENT_S``.

    Args:
        meter: the loop's meter.
        every_s: seconds between two beats that carry it (``SEND_EVERY_S`` when None).
    """

    @classmethod
    def of(cls, meter: InputMeter) -> InputBeat:
        """The heartbeats' side of ``meter``, made on first use and kept with it.

        Args:
            meter: the loop's meter.

        Returns:
            Its ``InputBeat`` (every trainer given the meter shares it).
        """
        if meter.beat is None:
            meter.beat = cls(meter)
        return meter.beat

    def __init__(self, meter: InputMeter, every_s: float | None = None) -> None:
        self.meter = meter
        self.every_s = SEND_EVERY_S if every_s is None else every_s
        self._sent: Totals = (0, 0.0, 0.0, [0] * N_BUCKETS, 0.0)
        self._sent_at = float("-inf")
        self._recent: deque[tuple[float, float, float]] = deque()  # (at, wait_s, step_s)
        self._recent_wait_s = 0.0  # the sums of _recent
        self._recent_step_s = 0.0

    def arg(self) -> tuple[str, Totals] | None:
        """The heartbeat argument for what changed, and the totals it covers (give them
        to ``sent`` once the beat was answered); None when the loop never ran or the last
        one went less than ``every_s`` ago.

        Returns:
            ``"i<n>,<wait_us>,<step_us>,<recent_wait_us>,<recent_step_us>,<count>...,
            <idle_us>"`` (one count per bucket; the idle time last), and the totals.
        """
        now = time.monotonic()
        if now - self._sent_at < self.every_s:
            return None
        totals = self.meter.totals()
        count, wait_s, step_s, counts, idle_s = totals
        s_count, s_wait, s_step, s_counts, s_idle = self._sent
        if count == 0 and wait_s == 0.0 and step_s == 0.0 and idle_s == 0.0:
            return None
        d_counts = [max(0, a - b) for a, b in zip(counts, s_counts, strict=True)]
        d_wait, d_step = max(0.0, wait_s - s_wait), max(0.0, step_s - s_step)
        recent = self._recent
        while recent and recent[0][0] < now - RECENT_S:
            _, old_wait, old_step = recent.popleft()
            self._recent_wait_s -= old_wait
            self._recent_step_s -= old_step
        r_wait = d_wait + max(0.0, self._recent_wait_s)
        d_idle = max(0.0, idle_s - s_idle)
        # the trainer's own fraction is wait / all its loop time: the rest is its steps
        # and its waits with nothing to lease
        r_step = d_step + d_idle + max(0.0, self._recent_step_s)
        fields = [
            sum(d_counts),
            _us(d_wait),
            _us(d_step),
            _us(r_wait),
            _us(r_step),
            *d_counts,
            _us(d_idle),
        ]
        return ARG_TAG + ",".join(str(x) for x in fields), totals

    def sent(self, totals: Totals) -> None:
        """The beat that carried ``arg()``'s totals was answered: the next one starts there.

        Args:
            totals: the second item ``arg()`` returned.
        """
        count, wait_s, step_s, counts, idle_s = totals
        s_count, s_wait, s_step, s_counts, s_idle = self._sent
        self._sent_at = now = time.monotonic()
        d_wait, d_step = max(0.0, wait_s - s_wait), max(0.0, step_s - s_step)
        d_step += max(0.0, idle_s - s_idle)  # the rest of its loop time (arg())
        self._recent.append((now, d_wait, d_step))
        self._recent_wait_s += d_wait
        self._recent_step_s += d_step
        # never backwards: a read racing the loop's thread may see a sum a moment ahead
        self._sent = (
            max(count, s_count),
            max(wait_s, s_wait),
            max(step_s, s_step),
            [max(a, b) for a, b in zip(counts, s_counts, strict=True)],
            max(idle_s, s_idle),
        )


def _us(seconds: float) -> int:
    return int(seconds * 1_000_000)
