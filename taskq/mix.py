"""The mixed job's schedule: which source each slot of a pass takes (docs/mixing.md).

A mixed job is a plain job whose tasks are its sources' tasks, copied at create in the
sources' order (source ``i`` owns the task ids ``offset[i] .. offset[i] + n[i] - 1``), and
whose pass order is this schedule: position ``k`` of pass ``p`` is *slot* ``p * N + k``
(``N`` the mixed job's tasks). The schedule is a pure function of the sources' sizes and
the weight log (a list of ``(slot, weights)``); the engine runs the same rule in
``engine/lua/lib/mix.lua`` and stores what it charged, so ``pass_schedule`` here is the
reference the tests hold the server to, and the bound the docs state is ``bound(k)``.

The rule (Tijdeman's chairman assignment, earliest deadline first). A *segment* starts
at a pass's first slot, at every logged weight change, and at every slot after a source
ran out (``drop``: the others' weights renormalise). In a segment with ``k`` sources of
weight ``w_i > 0`` (normalised to sum 1) and ``d = bound(k) = 1 - 1 / (2k - 2)``, the
segment's ``m``-th slot goes, among the sources with ``c_i + 1 - d <= w_i * m`` (``c_i``
its slots in the segment so far), to the one whose next deadline ``(c_i + d) / w_i`` is
earliest (the lowest index on a tie). Every prefix of a segment then keeps
``|c_i - w_i * m| <= d``. Within a source, the tasks go in their order ``0 .. n - 1``.
The arithmetic is IEEE doubles in the same order of operations as the Lua, and weights are
kept as the decimal strings that were logged, so both sides compute the same schedule.

Weights counting samples (``MixSpec.by == "samples"``, the tasks' sizes given): the slot
goes, among the sources not ahead (``c_i <= w_i * M``, ``c_i`` its samples and ``M`` all
samples in the segment so far), to the one whose next task ends first in the fluid
schedule, ``(c_i + s_i) / w_i`` with ``s_i`` that task's size (WF2Q, Bennett and Zhang
1996, with every source backlogged). Every prefix of a segment then keeps
``|c_i - w_i * M| <= sample_bound`` (the largest task; checked by hypothesis in
tests/engine/test_mix.py). The engine runs the same comparisons (lib/mix.lua
``choose_by_samples``) on the sizes the create stored.

Data flow: shared ground (no imports from above): admin/mix.py writes the spec and reads
the sequence, trainer/protocol.py names a task's source, tests compare the engine to it.
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from taskq import errors
from taskq.keys import valid_job_name

#: What a mixed job does when a source runs out in a pass (only ``drop`` is built).
ON_EXHAUSTED = ("drop",)
#: What a mixed job's weights count: its sources' tasks, or their samples (every task's
#: size known at create: ``taskq.data.task_size``).
MIX_BY = ("tasks", "samples")
#: The most sources one mixed job draws from.
MAX_SOURCES = 64
_WEIGHT_RE = re.compile(r"^\d+\.?\d*([eE][-+]?\d+)?$")


def bound(k: int) -> float:
    """How far (in slots) a source's count in a segment's prefix may be from ``w * m``
    with ``k`` sources of positive weight: ``1 - 1 / (2k - 2)`` (0 for one source)."""
    return 1 - 1 / (2 * k - 2) if k >= 2 else 0.0


def weight_text(value: object, name: str = "weight") -> str:
    """A weight as the decimal string the engine logs (``repr`` of the float: it reads
    back as the same double in Python and Lua).

    Raises:
        InvalidInput: not a finite number >= 0.
    """
    if isinstance(value, bool):
        raise errors.InvalidInput(f"{name}: not a number, got {value!r}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise errors.InvalidInput(f"{name}: not a number, got {value!r}") from None
    if not math.isfinite(number) or number < 0 or number >= 1e300:
        raise errors.InvalidInput(f"{name}: must be a finite number >= 0, got {value!r}")
    text = repr(number)
    if not _WEIGHT_RE.match(text):  # e.g. 1e-05 is fine; anything else is a bug here
        raise errors.InvalidInput(f"{name}: cannot be written as a decimal, got {value!r}")
    return text


def parse_mix(text: str) -> dict[str, float]:
    """``web=0.5,code=0.3`` (the CLI's form) as a mapping, in its order.

    Raises:
        InvalidInput: a part without ``=``, a repeated source or a weight not a number.
    """
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or not name:
            raise errors.InvalidInput(f"mix: expected source=weight, got {part!r}")
        if name in out:
            raise errors.InvalidInput(f"mix: source {name!r} given twice")
        try:
            out[name] = float(value)
        except ValueError:
            raise errors.InvalidInput(
                f"mix: weight of {name!r} is not a number: {value!r}"
            ) from None
    return out


def check_mix(mix: object) -> list[str]:
    """A mix as given (``{source job: weight}``): its weights as the engine logs them, in
    the mapping's order.

    Raises:
        InvalidInput: not a mapping of 1 to ``MAX_SOURCES`` job names to weights >= 0
            with one above 0.
    """
    if not isinstance(mix, Mapping) or not 1 <= len(mix) <= MAX_SOURCES:
        raise errors.InvalidInput(f"mix: give 1 to {MAX_SOURCES} sources as {{job: weight}}")
    for source in mix:
        if not isinstance(source, str) or not valid_job_name(source):
            raise errors.InvalidInput(f"mix: {source!r} is not a job name")
    weights = [weight_text(mix[s], f"weight of {s}") for s in mix]
    if not any(float(w) > 0 for w in weights):
        raise errors.InvalidInput("mix: at least one weight must be above 0")
    return weights


@dataclass(frozen=True)
class MixSpec:
    """A mixed job's sources: their names, sizes (tasks) and first weights, as stored in
    its meta hash (field ``mix``)."""

    sources: tuple[str, ...]
    sizes: tuple[int, ...]
    weights: tuple[str, ...]
    on_exhausted: str = "drop"
    #: what the weights count: ``tasks`` or ``samples`` (``pass_schedule`` then needs
    #: ``task_sizes``; the engine keeps them in the job's ``mixsz``)
    by: str = "tasks"

    @property
    def offsets(self) -> list[int]:
        """Each source's first task id in the mixed job."""
        out, at = [], 0
        for n in self.sizes:
            out.append(at)
            at += n
        return out

    @property
    def total(self) -> int:
        """The mixed job's tasks (slots per pass)."""
        return sum(self.sizes)

    def source_of(self, task_id: int) -> str:
        """The source whose task ``task_id`` is (``task.source``)."""
        return self.sources[bisect_right(self.offsets, task_id) - 1]

    def weight_list(self, weights: Mapping[str, object]) -> list[str]:
        """``{source: weight}`` as the engine's list in the sources' order.

        Raises:
            InvalidInput: a source missing or unknown, a bad weight, or all weights 0.
        """
        unknown = sorted(set(weights) - set(self.sources))
        if unknown:
            raise errors.InvalidInput(
                f"weights: unknown source(s) {', '.join(unknown)}: the job mixes "
                f"{', '.join(self.sources)}"
            )
        missing = [s for s in self.sources if s not in weights]
        if missing:
            raise errors.InvalidInput(
                f"weights: give every source a weight: missing {', '.join(missing)}"
            )
        out = [weight_text(weights[s], f"weight of {s}") for s in self.sources]
        if not any(float(w) > 0 for w in out):
            raise errors.InvalidInput("weights: at least one must be above 0")
        return out

    def to_json(self) -> str:
        """The stored form (meta field ``mix``)."""
        return json.dumps(
            {
                "sources": list(self.sources),
                "n": list(self.sizes),
                "w": list(self.weights),
                "on_exhausted": self.on_exhausted,
                "by": self.by,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> MixSpec:
        """The spec from its stored form."""
        d = json.loads(raw)
        return cls(
            tuple(d["sources"]),
            tuple(d["n"]),
            tuple(d["w"]),
            d.get("on_exhausted", "drop"),
            d.get("by", "tasks"),
        )


def _weights_at(
    log: Sequence[tuple[int, Sequence[str]]], slot: int, first: Sequence[str]
) -> list[str]:
    """The weights in force at ``slot``: the last entry of ``log`` at or below it."""
    out = list(first)
    for at, ws in log:
        if at <= slot:
            out = list(ws)
    return out


def _next_change(log: Sequence[tuple[int, Sequence[str]]], slot: int) -> int:
    later = [at for at, _ in log if at > slot]
    return min(later) if later else -1


def sample_bound(task_sizes: Sequence[Sequence[int]]) -> int:
    """How far (in samples) a source's samples in a segment's prefix may be from ``w * M``
    (``M`` the segment's samples so far) when weights count samples: the largest task."""
    return max((max(s) for s in task_sizes if s), default=0)


def _choose_by_samples(
    w: Sequence[float], counts: Sequence[int], nxt: Sequence[int], samples: int
) -> int:
    """The source a slot goes to when weights count samples (WF2Q, every source backlogged):
    among the sources not ahead (``c_i <= w_i * M``), the one whose next task ends first in
    the fluid schedule (``(c_i + s_i) / w_i``, ``s_i`` its next task's size), the lowest
    index on a tie; none not ahead (rounding): the earliest end of all."""
    best = anyone = -1
    best_f = any_f = 0.0
    for i, wi in enumerate(w):
        if wi > 0:
            f = (counts[i] + nxt[i]) / wi
            if counts[i] <= wi * samples and (best < 0 or f < best_f):
                best, best_f = i, f
            if anyone < 0 or f < any_f:
                anyone, any_f = i, f
    return best if best >= 0 else anyone


def pass_schedule(
    spec: MixSpec,
    log: Sequence[tuple[int, Sequence[str]]],
    pass_no: int,
    length: int | None = None,
    task_sizes: Sequence[Sequence[int]] | None = None,
) -> Iterator[tuple[int, int]]:
    """The reference schedule of pass ``pass_no``: for each position, ``(source index,
    index of the task within the source)``.

    Args:
        spec: the job's sources (``spec.weights`` hold before the log's first entry).
        log: ``(slot, weights)`` in the order they were logged (a later entry of the same
            slot wins); weights as the engine's strings (``MixSpec.weight_list``).
        pass_no: the pass.
        length: positions to make (default: the whole pass, ``spec.total``).
        task_sizes: per source, its tasks' sizes in samples; needed when ``spec.by`` is
            ``samples`` (the rule then counts samples: ``_choose_by_samples``).

    Yields:
        ``(source index, task index within that source)`` per position.

    Raises:
        InvalidInput: weights count samples and ``task_sizes`` does not give every task's.
    """
    by_samples = spec.by == "samples"
    if by_samples and (
        task_sizes is None
        or [len(s) for s in task_sizes] != list(spec.sizes)
        or any(not isinstance(x, int) or x < 0 for s in task_sizes for x in s)
    ):
        raise errors.InvalidInput("mix by samples: give every task's size (samples >= 0)")
    order = sorted(range(len(log)), key=lambda i: (log[i][0], i))
    ordered = [log[i] for i in order]
    sizes, k = spec.sizes, len(spec.sizes)
    n_total = spec.total
    start = pass_no * n_total
    weights = _weights_at(ordered, start, spec.weights)
    nxt = _next_change(ordered, start)
    taken, seg_count = [0] * k, [0] * k
    seg, restart, seg_samples = 0, True, 0
    for h in range(n_total if length is None else min(length, n_total)):
        slot = start + h
        if nxt >= 0 and slot >= nxt:
            weights = _weights_at(ordered, slot, spec.weights)
            nxt = _next_change(ordered, slot)
            restart = True
        if restart:
            seg, restart, seg_samples = h, False, 0
            seg_count = [0] * k
        total, left = 0.0, 0
        for i in range(k):
            if taken[i] < sizes[i]:
                left += 1
                wi = float(weights[i])
                if wi > 0:
                    total = total + wi
        w = [0.0] * k
        positive = 0
        for i in range(k):
            if taken[i] < sizes[i]:
                wi = float(weights[i])
                if total > 0:
                    if wi > 0:
                        w[i] = wi / total
                        positive += 1
                else:
                    w[i] = 1 / left
                    positive += 1
        if by_samples and task_sizes is not None:
            ahead = [task_sizes[i][taken[i]] if taken[i] < sizes[i] else 0 for i in range(k)]
            best = _choose_by_samples(w, seg_count, ahead, seg_samples)
            yield best, taken[best]
            seg_count[best] += ahead[best]
            seg_samples += ahead[best]
            taken[best] += 1
            if taken[best] >= sizes[best]:
                restart = True
            continue
        d = bound(positive)
        m = h - seg + 1
        best = anyone = -1
        best_dl = any_dl = 0.0
        for i in range(k):
            if w[i] > 0:
                dl = (seg_count[i] + d) / w[i]
                if seg_count[i] + 1 - d <= w[i] * m and (best < 0 or dl < best_dl):
                    best, best_dl = i, dl
                if anyone < 0 or dl < any_dl:
                    anyone, any_dl = i, dl
        if best < 0:
            best = anyone
        yield best, taken[best]
        taken[best] += 1
        seg_count[best] += 1
        if taken[best] >= sizes[best]:
            restart = True
