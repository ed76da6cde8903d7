"""The training loop's data wait, measured in the process: how long each ``next()`` of the
loop waited for its batch or task, and how long the loop ran between two of them (the
step).

``InputMeter`` is driven by the loop's own thread at near-zero cost: ``enter()`` at the top
of a ``next()``, ``leave()`` when it returns (one ``perf_counter`` each, sums and a bucket
count kept in plain attributes, no lock). The heartbeat thread reads it (``InputBeat``)
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


class InputMeter:
    """Sums of one training loop's data waits and steps, cumulative (never reset: the
    reader takes differences, so the loop's thread needs no lock).

    A ``next()`` calls ``enter()`` first and ``leave()`` when it has its batch; a ``next()``
    that ends the iteration (``StopIteration``, an error) calls ``stop()`` instead, and a
    new iteration ``restart()``: the time between two iterations (a checkpoint, an
    evaluation) is neither wait nor step.
    """

    __slots__ = ("beat", "count", "counts", "step_s", "wait_s", "_in", "_out")

    def __init__(self) -> None:
        self.count = 0  # next() calls that returned
        self.wait_s = 0.0  # time inside them
        self.step_s = 0.0  # time between one's return and the next one's call
        self.counts = [0] * N_BUCKETS  # the returned calls' waits by WAIT_BOUNDS_S bucket
        self._in = 0.0  # perf_counter at the last enter(); 0: none
        self._out = 0.0  # perf_counter at the last leave(); 0: none since the (re)start
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

    def leave(self) -> None:
        """The loop has its batch or task (its wait ended, the step begins)."""
        now = _perf()
        if self._in:
            wait = now - self._in
            self.wait_s += wait
            self.count += 1
            self.counts[bisect_left(WAIT_BOUNDS_S, wait)] += 1
            self._in = 0.0
        self._out = now

    def stop(self) -> None:
        """The ``next()`` under way ended without a batch: its time is not counted."""
        self._in = 0.0
        self._out = 0.0

    restart = stop

    def totals(self) -> tuple[int, float, float, list[int]]:
        """(count, wait_s, step_s, counts) now, a wait or step under way included in its
        sum (so a loop stuck in one ``next()`` shows at once); read from another thread.
        """
        now = _perf()
        started, ended = self._in, self._out
        count, wait_s, step_s = self.count, self.wait_s, self.step_s
        counts = list(self.counts)
        if started and not ended:
            wait_s += max(0.0, now - started)
        elif ended and not started:
            step_s += max(0.0, now - ended)
        return count, wait_s, step_s, counts


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
        self._sent: tuple[int, float, float, list[int]] = (0, 0.0, 0.0, [0] * N_BUCKETS)
        self._sent_at = float("-inf")
        self._recent: deque[tuple[float, float, float]] = deque()  # (at, wait_s, step_s)
        self._recent_wait_s = 0.0  # the sums of _recent
        self._recent_step_s = 0.0

    def arg(self) -> tuple[str, tuple[int, float, float, list[int]]] | None:
        """The heartbeat argument for what changed, and the totals it covers (give them
        to ``sent`` once the beat was answered); None when the loop never ran or the last
        one went less than ``every_s`` ago.

        Returns:
            ``"i<n>,<wait_us>,<step_us>,<recent_wait_us>,<recent_step_us>,<count>..."``
            (one count per bucket), and the totals.
        """
        now = time.monotonic()
        if now - self._sent_at < self.every_s:
            return None
        totals = self.meter.totals()
        count, wait_s, step_s, counts = totals
        s_count, s_wait, s_step, s_counts = self._sent
        if count == 0 and wait_s == 0.0 and step_s == 0.0:
            return None
        d_counts = [max(0, a - b) for a, b in zip(counts, s_counts, strict=True)]
        d_wait, d_step = max(0.0, wait_s - s_wait), max(0.0, step_s - s_step)
        recent = self._recent
        while recent and recent[0][0] < now - RECENT_S:
            _, old_wait, old_step = recent.popleft()
            self._recent_wait_s -= old_wait
            self._recent_step_s -= old_step
        r_wait = d_wait + max(0.0, self._recent_wait_s)
        r_step = d_step + max(0.0, self._recent_step_s)
        fields = [sum(d_counts), _us(d_wait), _us(d_step), _us(r_wait), _us(r_step), *d_counts]
        return ARG_TAG + ",".join(str(x) for x in fields), totals

    def sent(self, totals: tuple[int, float, float, list[int]]) -> None:
        """The beat that carried ``arg()``'s totals was answered: the next one starts there.

        Args:
            totals: the second item ``arg()`` returned.
        """
        count, wait_s, step_s, counts = totals
        s_count, s_wait, s_step, s_counts = self._sent
        self._sent_at = now = time.monotonic()
        d_wait, d_step = max(0.0, wait_s - s_wait), max(0.0, step_s - s_step)
        self._recent.append((now, d_wait, d_step))
        self._recent_wait_s += d_wait
        self._recent_step_s += d_step
        # never backwards: a read racing the loop's thread may see a sum a moment ahead
        self._sent = (
            max(count, s_count),
            max(wait_s, s_wait),
            max(step_s, s_step),
            [max(a, b) for a, b in zip(counts, s_counts, strict=True)],
        )


def _us(seconds: float) -> int:
    return int(seconds * 1_000_000)
