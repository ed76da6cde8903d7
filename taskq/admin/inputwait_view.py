"""The training loops' data wait of one job, read back from its meta hash: the totals the
exporter turns into a histogram and a counter, the last one to two minutes that
``taskq job status`` shows, and the trainers that waited most.

The heartbeat script keeps them (lua/heartbeat.lua, fields ``iw``, ``iw_win``,
``iw_worst`` of keys.MetaField) from what each trainer's meter sent (inputwait.py).

Data flow: stats.py (the job's meta, read once) -> inputwait_view.py -> JobStatus.input
-> exporter_input.py / cli/job_view.py.
"""

from __future__ import annotations

from typing import Any

from taskq.inputwait import N_BUCKETS, WAIT_BOUNDS_S
from taskq.keys import MetaField as F

#: The heartbeat script's window (ms): the recent figures cover the current one and the
#: one before, so 60 to 120 s.
WINDOW_MS = 60_000


def _numbers(record: str, n: int) -> list[float] | None:
    """``n`` numbers of a record, or None; a record made before the idle time (one fewer)
    reads with an idle time of 0."""
    parts = record.split(",")
    if len(parts) == n - 1:
        parts.append("0")
    if len(parts) != n:
        return None
    try:
        return [float(p) for p in parts]
    except ValueError:
        return None


def _figures(values: list[float]) -> dict[str, Any]:
    """``n, wait_us, step_us, counts..., idle_us`` as seconds and counts."""
    return {
        "count": int(values[0]),
        "wait_s": values[1] / 1e6,
        "step_s": values[2] / 1e6,
        "counts": [int(c) for c in values[3 : 3 + N_BUCKETS]],
        "idle_s": values[3 + N_BUCKETS] / 1e6,
    }


def _empty() -> dict[str, Any]:
    return {"count": 0, "wait_s": 0.0, "step_s": 0.0, "counts": [0] * N_BUCKETS, "idle_s": 0.0}


def fraction(wait_s: float, step_s: float) -> float | None:
    """The input-bound fraction wait / (wait + step); None when there was no loop time."""
    total = wait_s + step_s
    return wait_s / total if total > 0 else None


def quantile(q: float, counts: list[int]) -> float | None:
    """The ``q`` quantile of a wait histogram, interpolated in its bucket as Prometheus's
    ``histogram_quantile`` does (the +Inf bucket answers the last finite bound).

    Args:
        q: in [0, 1].
        counts: per-bucket counts (``WAIT_BOUNDS_S`` and +Inf).

    Returns:
        Seconds, or None for an empty histogram.
    """
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    below = 0
    for i, count in enumerate(counts):
        if below + count >= rank and count > 0:
            if i >= len(WAIT_BOUNDS_S):
                return WAIT_BOUNDS_S[-1]
            lower = WAIT_BOUNDS_S[i - 1] if i > 0 else 0.0
            return lower + (WAIT_BOUNDS_S[i] - lower) * (rank - below) / count
        below += count
    return WAIT_BOUNDS_S[-1]


def summary(meta: dict[str, str], now_ms: int) -> dict[str, Any]:
    """The job's data wait as ``JobStatus.input`` holds it.

    Args:
        meta: the job's meta hash.
        now_ms: the job's clock now (the stats script's).

    Returns:
        ``bounds_s`` (the wait buckets' upper bounds), ``total`` (since the job was
        created: ``count``, ``wait_s``, ``step_s``, ``counts``, ``idle_s``: the wait
        while the trainers had nothing to lease, not in ``wait_s``), ``recent`` (the
        same over the last 60 to 120 s, plus ``window_s``, ``fraction`` = wait / (wait +
        step + idle), ``idle_fraction`` = idle / (wait + step + idle) and ``p95_s``, None
        without data) and ``worst`` (up to 3 trainers, most waiting first: ``worker``,
        ``fraction`` over their own last minute, ``age_s`` of their last report).
    """
    total_values = _numbers(meta.get(F.IW, ""), 4 + N_BUCKETS)
    total = _figures(total_values) if total_values else _empty()
    window_start = now_ms - now_ms % WINDOW_MS
    recent = _empty()
    oldest = window_start
    for record in meta.get(F.IW_WIN, "").split("|"):
        values = _numbers(record, 5 + N_BUCKETS)
        if values is None or not window_start - WINDOW_MS <= values[0] <= window_start:
            continue
        oldest = min(oldest, int(values[0]))
        part = _figures(values[1:])
        recent["count"] += part["count"]
        recent["wait_s"] += part["wait_s"]
        recent["step_s"] += part["step_s"]
        recent["idle_s"] += part["idle_s"]
        recent["counts"] = [a + b for a, b in zip(recent["counts"], part["counts"], strict=True)]
    recent["window_s"] = max(0, now_ms - oldest) / 1000.0
    recent["fraction"] = fraction(recent["wait_s"], recent["step_s"] + recent["idle_s"])
    recent["idle_fraction"] = fraction(recent["idle_s"], recent["wait_s"] + recent["step_s"])
    recent["p95_s"] = quantile(0.95, recent["counts"])
    worst = []
    fields = meta.get(F.IW_WORST, "").split("|")
    for k in range(0, len(fields) - 2, 3):
        try:
            ppm, seen_ms = int(fields[k + 1]), int(fields[k + 2])
        except ValueError:
            continue
        if seen_ms > now_ms - WINDOW_MS:
            worst.append(
                {
                    "worker": fields[k],
                    "fraction": ppm / 1e6,
                    "age_s": max(0, now_ms - seen_ms) / 1000.0,
                }
            )
    return {"bounds_s": list(WAIT_BOUNDS_S), "total": total, "recent": recent, "worst": worst}


def line(summary_: dict[str, Any], stream: str | None = None) -> str:
    """One line for ``taskq job status``: e.g. ``12 % of loop time waiting for data (p95 40
    ms); worst trainer host-3:88 35 %``; with time spent with nothing to lease first:
    ``90 % of loop time waiting for appends (nothing to lease), 2 % waiting for data``.

    Args:
        summary_: ``summary()``'s answer.
        stream: the job's stream state (``open``, ``sealed``, None: not a stream): says
            what the trainers waited for when they had nothing to lease.

    Returns:
        The line (without its ``input:`` label).
    """
    recent = summary_["recent"]
    idle = recent.get("idle_fraction")
    if recent["fraction"] is None and not idle:
        return "no training loop reported in the last minute or two"
    text = ""
    if idle is not None and idle >= 0.005:
        what = "appends" if stream else "tasks others hold"
        text = f"{idle * 100:.0f} % of loop time waiting for {what} (nothing to lease)"
        if recent["fraction"] is None:
            return text
        text += ", "
    text += f"{recent['fraction'] * 100:.0f} % {'' if text else 'of loop time '}waiting for data"
    if recent["p95_s"] is not None:
        text += f" (p95 {_ms(recent['p95_s'])})"
    if summary_["worst"]:
        top = summary_["worst"][0]
        text += f"; worst trainer {top['worker']} {top['fraction'] * 100:.0f} %"
    return text


def _ms(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.1f} s"
    if seconds >= 0.01:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds * 1000:.1f} ms"
