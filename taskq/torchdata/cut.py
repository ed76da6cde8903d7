"""Cutting a split task at a batch in the loop's process: what its reader read ahead goes
to the trainer that took the task's tail, not to this loop.

A DataLoader worker reads ahead of the loop (``prefetch_factor`` batches per worker, on
torch's result queue). When the engine splits a task this loader is reading at point
``m`` (docs/design.md, "Tail splitting"), the worker may have read past ``m`` already;
those samples are collated into batches the loop has not taken. The loop's iterator
(iteration.py) then takes the next few units off torch's queue, up to where the task's
reading ends, and ``plan`` decides which of them are not handed to the loop: a unit whose
samples all belong to split tasks, each at or past its point. The task's honoured end is
the first position of its first unit dropped (``H >= m``), reported as the split's
confirmation; the other piece's holder reads ``[H, n)`` again, so the loop still takes
each sample once, and this loop no longer steps through the read-ahead at its own pace.

A collated batch cannot be taken apart, so a unit that mixes a kept sample with one past a
point is delivered whole, and so is everything before it of the same task (a task's
samples reach the loop in increasing position, without a gap). With ``interleave`` > 1
(``shuffle=True``) batches mix the open tasks: at a pass's tail a straggler's open tasks
are usually all split, and the points wait for each other (iteration.py keeps a split
task's point until it is cut or read), while a reader opens no task beside one whose
end moved (dataset.py), so its last batches hold split tasks' samples only. Where no cut
is found, the reader's own ``"end"`` entry applies: the loop keeps what was read.

Data flow: workers (dataset.py) -> torch's result queue -> iteration.py -> plan() ->
the loop; the honoured end -> feeder.py -> the engine.
"""

from __future__ import annotations

from .dataset import Unit

Pair = tuple[int, int]

#: past every position: a task with no point is never cut
_NEVER = 2**62


def ended(unit: Unit, pair: Pair, point: int) -> bool:
    """True if ``unit`` shows that ``pair``'s reading ended (its last sample, a "done"
    or "error" entry), or that its reader honours ``point`` itself (an "end" entry of
    ``point``: it had not read that far, so nothing of it is past the point)."""
    tags, ctrl, _ = unit
    for task_id, token, _, last in tags:
        if last and (task_id, token) == pair:
            return True
    for kind, task_id, token, text in ctrl:
        if (task_id, token) == pair and (kind != "end" or int(text) <= point):
            return True
    return False


def plan(units: list[Unit], points: dict[Pair, int]) -> tuple[list[Unit], dict[Pair, int]]:
    """Which of ``units`` (in delivery order) go to the loop, given split tasks' points.

    Args:
        units: what was taken off torch's queue, every one of the tasks of ``points``
            read to its end within them (``ended``).
        points: (task, token) -> the split point its trainer learned.

    Returns:
        (the units to deliver, in order: a dropped one keeps its control entries only;
        (task, token) -> honoured end, for each task cut). A task cut has its last kept
        sample tagged last, or, when none of it is kept, a "cut" entry (its reading
        ended there: ack it, as "done") in the first unit; its own "end" and "done"
        entries are dropped.
    """
    pairs = [{(t, tok) for t, tok, _, _ in tags} for tags, _, _ in units]
    drop = [
        bool(tags) and all(k >= points.get((t, tok), _NEVER) for t, tok, k, _ in tags)
        for tags, _, _ in units
    ]
    # a kept unit keeps every earlier unit of its tasks (no gap in what the loop takes)
    changed = True
    while changed:
        changed = False
        for j in range(len(units)):
            if drop[j]:
                continue
            for i in range(j):
                if drop[i] and pairs[i] & pairs[j]:
                    drop[i] = False
                    changed = True
    cut: dict[Pair, int] = {}
    for j, (tags, _, _) in enumerate(units):
        if drop[j]:
            for t, tok, k, _ in tags:
                if (t, tok) not in cut or k < cut[t, tok]:
                    cut[t, tok] = k
    if not cut:
        return units, {}
    out: list[Unit] = []
    kept_last: dict[Pair, tuple[int, int]] = {}  # pair -> (unit, tag) of its last kept
    for j, (tags, ctrl, batch) in enumerate(units):
        ctrl = [c for c in ctrl if not ((c[1], c[2]) in cut and c[0] in ("end", "done"))]
        if drop[j]:
            out.append(([], ctrl, None))
            continue
        for n, (t, tok, _, _) in enumerate(tags):
            if (t, tok) in cut:
                kept_last[t, tok] = (j, n)
        out.append((list(tags), ctrl, batch))
    head: list[tuple[str, int, int, str]] = []
    for pair, end in cut.items():
        where = kept_last.get(pair)
        if where is None:
            head.append(("cut", pair[0], pair[1], str(end)))
            continue
        j, n = where
        t, tok, k, _ = out[j][0][n]
        out[j][0][n] = (t, tok, k, True)
    if head:
        tags, ctrl, batch = out[0]
        out[0] = (tags, head + ctrl, batch)
    return out, cut
