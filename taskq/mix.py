"""The mixed job's schedule: which source each slot of a pass takes (docs/mixing.md).

A mixed job is a plain job whose tasks are its sources' tasks, copied at create in the
sources' order (source ``i`` owns the task ids ``offset[i] .. offset[i] + n[i] - 1``), and
whose pass order is this schedule: position ``k`` of pass ``p`` is *slot* ``p * N + k``
(``N`` the mixed job's tasks). The schedule is a pure function of the sources' sizes and
the weight log (a list of ``(slot, weights)``); the engine runs the same rule in
``engine/lua/lib/mix.lua`` and stores what it charged, so ``pass_schedule`` here is the
reference the tests hold the server to, and the bound the docs state is ``bound(k)``.

The rule (Tijdeman's chairman assignment, earliest deadline first). A *segment* starts
at a pass's first slot, at every logged weight change, and (``drop``) at every slot after
a source ran out (the others' weights renormalise). In a segment with ``k`` sources of
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

When a source runs out (``plan_pass``, docs/mixing.md "A source runs out"): ``drop`` as
above; ``cycle`` (no source runs out: source ``i``'s ``j``-th slot over the job's life
takes task ``j mod n_i`` of its source pass ``j div n_i``); ``stop`` (the pass ends after
the first source of positive weight takes its last task). A stream source with nothing in
its store (the feed log, ``Feed``) owes the slot its pick would have taken, up to
``max_debt``, and is repaid first when its store grows; beyond, the slot waits. The engine
takes ``drop``, ``cycle`` and ``stop``; the stream sources' choices are pure functions of
lib/mixrule.lua, held to this reference by tests/engine/test_mix.py.

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
from typing import NamedTuple

from taskq import errors
from taskq.keys import valid_job_name

#: What a mixed job does when a source runs out in a pass, as the engine takes it at create
#: (every rule of ``plan_pass``).
ON_EXHAUSTED = ("drop", "cycle", "stop")
#: The rules the reference knows (``plan_pass``): ``drop``, ``cycle`` and ``stop``.
RULES = ("drop", "cycle", "stop")
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


#: The most slots a stream source may owe (``JobConfig.max_debt``): a slot's charge asks the
#: rule at most ``sources * MAX_DEBT`` times (lib/mixfeed.lua).
MAX_DEBT = 1024

#: A mixed job's copy id is ``source * STRIDE + task`` (lib/mix.lua), and with a stream
#: source open at create, pass ``p`` starts at slot ``p * STRIDE`` (``MixSpec.stride``).
STRIDE = 2**32


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
    #: per source, whether its store grows (an open stream: ``Feed``; a stream sealed at
    #: create is a source of fixed size); empty: none does
    streams: tuple[bool, ...] = ()
    #: the slots a stream source may owe before the slot waits on it (0: ``wait``)
    max_debt: int = 0

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

    @property
    def stride(self) -> int:
        """``N`` of slot ``p * N + k``, fixed at create: the sources' tasks, or with a stream
        source open at create ``STRIDE`` (its store grows; the pass's length is what its
        charge reached, docs/mixing.md)."""
        return STRIDE if any(self.streams) else self.total

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
                **(
                    {"streams": list(self.streams), "max_debt": self.max_debt}
                    if any(self.streams)
                    else {}
                ),
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
            tuple(d.get("streams", ())),
            d.get("max_debt", 0),
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


class Feed(NamedTuple):
    """A stream source's store as a charge saw it: from ``slot`` on, source ``source`` has
    ``tasks`` tasks in all, ``sealed`` when no more will come. The engine logs one when what
    a charge reads differs from the source's last entry (docs/mixing.md, "A stream source
    starves"); before a source's first entry it has its ``MixSpec.sizes`` tasks, open."""

    slot: int
    source: int
    tasks: int
    sealed: bool


class Slot(NamedTuple):
    """One slot of the reference schedule: which source it goes to and which of that
    source's tasks it takes."""

    slot: int
    source: int
    #: the task's index within its source (``cycle``: within its source pass)
    task: int
    #: the source pass the task is of: the mixed pass (``drop``, ``stop``), or for ``cycle``
    #: the source's ``j div n`` (its ``j``-th slot over the job's life)
    source_pass: int
    #: a stream source's slot owed from a deferral and repaid (no rule asked)
    repaid: bool = False


@dataclass
class PassPlan:
    """What the rule makes of a pass (``plan_pass``): its slots, why they end, and each
    source's counts at their end."""

    slots: list[Slot]
    #: why the slots end: ``done`` (every source's tasks taken: ``drop``; ``N`` slots:
    #: ``cycle``), ``stop`` (a source of positive weight ran out), ``wait`` (a stream
    #: source with nothing to give owes ``max_debt`` slots already: the slot is not
    #: charged until its store grows), ``length`` (the slots asked for)
    end: str
    #: the stream source a ``wait`` waits on (the rule's pick with nothing, owing
    #: ``max_debt``), else None
    waits_on: int | None
    #: ``(slot, source)`` per deferral: the rule gave the slot to the source, which had
    #: nothing; the source owes it (its debt) and the rule asked again (none at a slot
    #: that waits: it commits nothing)
    deferred: list[tuple[int, int]]
    #: per source, its tasks taken in the pass (given and repaid)
    taken: list[int]
    #: per source, the slots it owes at the end (stream sources)
    debt: list[int]
    #: per source, its slots over the job's life at the end (``cycle``: the next pass's
    #: ``life``; else the tasks taken in the pass)
    life: list[int]


def _source_rule_checks(
    spec: MixSpec, task_sizes: Sequence[Sequence[int]] | None, feed: Sequence[Feed]
) -> None:
    if spec.on_exhausted not in RULES:
        raise errors.InvalidInput(
            f"on_exhausted must be one of {', '.join(RULES)}, got {spec.on_exhausted!r}"
        )
    k = len(spec.sizes)
    if spec.by == "samples" and (
        task_sizes is None
        or [len(s) for s in task_sizes] != list(spec.sizes)
        or any(not isinstance(x, int) or x < 0 for s in task_sizes for x in s)
    ):
        raise errors.InvalidInput("mix by samples: give every task's size (samples >= 0)")
    streams = spec.streams or (False,) * k
    if len(streams) != k or spec.max_debt < 0:
        raise errors.InvalidInput("mix: one stream flag a source, max_debt >= 0")
    if any(streams) and spec.on_exhausted == "cycle":
        raise errors.InvalidInput("mix: on_exhausted=cycle needs sources of fixed size")
    if any(streams) and spec.by == "samples":
        raise errors.InvalidInput("mix: a stream source's slots count tasks (mix_by=tasks)")
    if spec.on_exhausted == "cycle" and min(spec.sizes) < 1:
        raise errors.InvalidInput("mix: on_exhausted=cycle needs a task in every source")
    for f in feed:
        if not (0 <= f.source < k and streams[f.source] and f.tasks >= 0):
            raise errors.InvalidInput(f"mix: {f!r} is not a stream source's store")


def plan_pass(
    spec: MixSpec,
    log: Sequence[tuple[int, Sequence[str]]],
    pass_no: int,
    *,
    length: int | None = None,
    task_sizes: Sequence[Sequence[int]] | None = None,
    life: Sequence[int] | None = None,
    feed: Sequence[Feed] = (),
    first_slot: int | None = None,
) -> PassPlan:
    """The reference schedule of pass ``pass_no`` under ``spec.on_exhausted``: a pure
    function of the sources' sizes, the weight log and (stream sources) the feed log.

    Slots are handed out in order. A *segment* of the rule starts at the pass's first slot,
    at a logged weight change, and (``drop``) at the slot after a source runs out; in it
    the deadline rule (or, weights counting samples, ``_choose_by_samples``) picks each
    slot's source among those not run out. ``drop``: the pass ends when every source's
    tasks are taken. ``cycle``: no source runs out; the pass is ``spec.total`` slots and
    source ``i``'s ``j``-th slot over the job's life takes task ``j mod n_i`` of its source
    pass ``j div n_i``. ``stop``: the pass ends at the slot after the first source of
    positive weight takes its last task.

    Stream sources (``spec.streams``): the rule's pick is a *token*; a stream source with
    nothing in its store (``feed``) when its token comes owes the slot (a deferral, its
    debt + 1) and the rule picks again, the token counted as the source's; with
    ``spec.max_debt`` owed already the slot waits (``wait``: ``max_debt=0``). Before the
    rule is asked, a slot repays the lowest-index source that owes and has a task.

    Args:
        spec: the job's sources (``spec.weights`` hold before the log's first entry).
        log: ``(slot, weights)`` in the order logged (a later entry of a slot wins).
        pass_no: the pass.
        length: the most slots to make (default: the whole pass).
        task_sizes: per source its tasks' sizes (``spec.by == "samples"``).
        life: ``cycle``: per source, its slots over the job's life before this pass
            (default: made from pass 0 by ``log``, ``life_before``).
        feed: the stream sources' stores as the charges saw them.
        first_slot: the pass's first slot (default ``pass_no * spec.total``).

    Returns:
        The pass's slots, why they end, the deferrals, and each source's counts.

    Raises:
        InvalidInput: an unknown rule; weights counting samples without every task's size;
            a stream source under ``cycle`` or counting samples; a feed entry of a source
            that is not a stream.
    """
    _source_rule_checks(spec, task_sizes, feed)
    rule, sizes, k = spec.on_exhausted, spec.sizes, len(spec.sizes)
    streams = spec.streams or (False,) * k
    if rule == "cycle" and life is None:
        life = life_before(spec, log, pass_no, task_sizes=task_sizes)
    base = [0] * k if life is None or rule != "cycle" else list(life)
    ordered = [log[i] for i in sorted(range(len(log)), key=lambda i: (log[i][0], i))]
    feeds = sorted(feed, key=lambda f: f.slot)
    n_total = spec.total
    start = pass_no * n_total if first_slot is None else first_slot
    limit = n_total if rule == "cycle" else None
    if length is not None:
        limit = length if limit is None else min(limit, length)
    by_samples = spec.by == "samples" and task_sizes is not None
    weights = _weights_at(ordered, start, spec.weights)
    nxt = _next_change(ordered, start)
    avail, sealed = list(sizes), [not s for s in streams]
    taken, debt, ran = [0] * k, [0] * k, [False] * k
    seg_count, m_seg, seg_samples, restart = [0] * k, 0, 0, True
    slots: list[Slot] = []
    deferred: list[tuple[int, int]] = []
    fi = 0

    def plan(end: str, waits_on: int | None = None) -> PassPlan:
        ends = [base[i] + taken[i] for i in range(k)]
        return PassPlan(slots, end, waits_on, deferred, taken, debt, ends)

    while True:
        if limit is not None and len(slots) >= limit:
            return plan("done" if rule == "cycle" and limit == n_total else "length")
        slot = start + len(slots)
        while fi < len(feeds) and feeds[fi].slot <= slot:
            f = feeds[fi]
            avail[f.source], sealed[f.source] = f.tasks, f.sealed
            fi += 1
        if rule != "cycle":
            stops = False  # (every source run out at this slot drops its debt first)
            for i in range(k):
                if not ran[i] and sealed[i] and taken[i] >= avail[i]:
                    ran[i], debt[i], restart = True, 0, True  # (its debt: nothing to repay)
                    stops = stops or (rule == "stop" and float(weights[i]) > 0)
            if stops:
                return plan("stop")
            if all(ran):
                return plan("done")
        if nxt >= 0 and slot >= nxt:
            weights = _weights_at(ordered, slot, spec.weights)
            nxt = _next_change(ordered, slot)
            restart = True
        if restart:
            seg_count, m_seg, seg_samples, restart = [0] * k, 0, 0, False
        owed = [i for i in range(k) if debt[i] > 0 and taken[i] < avail[i]]
        if owed:
            i = owed[0]
            slots.append(Slot(slot, i, taken[i], pass_no, True))
            taken[i] += 1
            debt[i] -= 1
            continue
        undo = len(deferred), list(debt)
        while True:
            ahead = _next_sizes(spec, task_sizes, base, taken) if by_samples else None
            best = _rule_choice(weights, ran, seg_count, m_seg, seg_samples, ahead)
            if rule == "cycle" or taken[best] < avail[best]:
                break
            if debt[best] >= spec.max_debt:
                # a slot that waits commits nothing: charged again once a store changes
                # (a feed entry at this slot), its picks are made again from the start
                del deferred[undo[0] :]
                debt[:] = undo[1]
                return plan("wait", best)
            debt[best] += 1
            deferred.append((slot, best))
            seg_count[best] += 1
            m_seg += 1
        j = base[best] + taken[best]
        if rule == "cycle":
            slots.append(Slot(slot, best, j % sizes[best], j // sizes[best]))
        else:
            slots.append(Slot(slot, best, j, pass_no))
        step = 1
        if by_samples and task_sizes is not None:
            step = task_sizes[best][j % sizes[best]]
            seg_samples += step
        seg_count[best] += step
        taken[best] += 1
        m_seg += 1


def _next_sizes(
    spec: MixSpec,
    task_sizes: Sequence[Sequence[int]] | None,
    base: Sequence[int],
    taken: Sequence[int],
) -> list[int]:
    """Per source, the size of the task it would take next (0 when it has none left)."""
    assert task_sizes is not None
    out = []
    for i, n in enumerate(spec.sizes):
        j = base[i] + taken[i]
        out.append(task_sizes[i][j % n] if spec.on_exhausted == "cycle" or j < n else 0)
    return out


def _rule_choice(
    weights: Sequence[str],
    ran: Sequence[bool],
    seg_count: Sequence[int],
    m_seg: int,
    seg_samples: int,
    ahead: Sequence[int] | None,
) -> int:
    """The rule's pick for the segment's next slot among the sources not run out: the
    logged weights renormalised over them (equal shares when all left weigh 0), then the
    deadline rule on slots or, with ``ahead`` (each source's next task's size),
    ``_choose_by_samples``. The same operations in the same order as lib/mixrule.lua."""
    k = len(weights)
    total, left = 0.0, 0
    for i in range(k):
        if not ran[i]:
            left += 1
            wi = float(weights[i])
            if wi > 0:
                total = total + wi
    w = [0.0] * k
    positive = 0
    for i in range(k):
        if not ran[i]:
            wi = float(weights[i])
            if total > 0:
                if wi > 0:
                    w[i] = wi / total
                    positive += 1
            else:
                w[i] = 1 / left
                positive += 1
    if ahead is not None:
        return _choose_by_samples(w, seg_count, ahead, seg_samples)
    d = bound(positive)
    m = m_seg + 1
    best = anyone = -1
    best_dl = any_dl = 0.0
    for i in range(k):
        if w[i] > 0:
            dl = (seg_count[i] + d) / w[i]
            if seg_count[i] + 1 - d <= w[i] * m and (best < 0 or dl < best_dl):
                best, best_dl = i, dl
            if anyone < 0 or dl < any_dl:
                anyone, any_dl = i, dl
    return best if best >= 0 else anyone


def life_before(
    spec: MixSpec,
    log: Sequence[tuple[int, Sequence[str]]],
    pass_no: int,
    task_sizes: Sequence[Sequence[int]] | None = None,
) -> list[int]:
    """``cycle``: per source, its slots over the job's life before pass ``pass_no``, made
    from pass 0 by ``log`` (which must then hold every change since slot 0: the engine
    keeps the counts at each kept pass's start instead, docs/mixing.md)."""
    life = [0] * len(spec.sizes)
    for p in range(pass_no):
        life = plan_pass(spec, log, p, task_sizes=task_sizes, life=life).life
    return life


def slot_at(
    spec: MixSpec,
    log: Sequence[tuple[int, Sequence[str]]],
    slot: int,
    *,
    task_sizes: Sequence[Sequence[int]] | None = None,
    life: Sequence[int] | None = None,
) -> Slot | None:
    """Slot ``slot`` of a mix of fixed-size sources (pass ``slot div N``, position
    ``slot mod N``): its source, the source's task and source pass (``plan_pass``).

    Args:
        spec: the job's sources.
        log: the weight log, as ``plan_pass``'s.
        slot: the slot, >= 0.
        task_sizes: per source its tasks' sizes (``spec.by == "samples"``).
        life: ``cycle``: each source's slots over the job's life before the slot's pass.

    Returns:
        The slot, or None when it is never charged (``stop``: past the pass's end).

    Raises:
        InvalidInput: as ``plan_pass``; a slot < 0.
    """
    if slot < 0:
        raise errors.InvalidInput(f"slot: an integer >= 0, got {slot!r}")
    pass_no, position = divmod(slot, spec.total)
    plan = plan_pass(spec, log, pass_no, length=position + 1, task_sizes=task_sizes, life=life)
    return plan.slots[position] if len(plan.slots) > position else None


def pass_schedule(
    spec: MixSpec,
    log: Sequence[tuple[int, Sequence[str]]],
    pass_no: int,
    length: int | None = None,
    task_sizes: Sequence[Sequence[int]] | None = None,
    *,
    life: Sequence[int] | None = None,
    feed: Sequence[Feed] = (),
    first_slot: int | None = None,
) -> Iterator[tuple[int, int]]:
    """The reference schedule of pass ``pass_no`` (``plan_pass``'s slots): for each slot,
    ``(source index, index of the task within the source)``; what a mixed job's handed-out
    sequence (``mix_sequence``: source, source task) is held to after every step.

    Args:
        spec: the job's sources (``spec.weights`` hold before the log's first entry).
        log: ``(slot, weights)`` in the order they were logged (a later entry of the same
            slot wins); weights as the engine's strings (``MixSpec.weight_list``).
        pass_no: the pass.
        length: positions to make (default: the whole pass).
        task_sizes: per source, its tasks' sizes in samples; needed when ``spec.by`` is
            ``samples`` (the rule then counts samples: ``_choose_by_samples``).
        life: ``cycle``: each source's slots over the job's life before the pass (default:
            made from pass 0 by ``log``, which then must not be trimmed).
        feed: the stream sources' stores as the charges saw them (``Feed``).
        first_slot: the pass's first slot (default ``pass_no * spec.total``).

    Yields:
        ``(source index, task index within that source)`` per slot (``cycle``: the task
        within its source pass).

    Raises:
        InvalidInput: as ``plan_pass``.
    """
    plan = plan_pass(
        spec,
        log,
        pass_no,
        length=length,
        task_sizes=task_sizes,
        life=life,
        feed=feed,
        first_slot=first_slot,
    )
    for s in plan.slots:
        yield s.source, s.task
