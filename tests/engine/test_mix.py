"""Mixed jobs (docs/mixing.md): the schedule's bound and once-per-pass in the reference
(taskq/mix.py), and a real server's sequence held to that reference whatever the
trainers do (join, lease, ack, fail, release, die, revoke), with weight changes at stated
slots, checkpoints and rewinds, and the CLI. Trainer processes, ``taskq work`` and
taskq.torch over a mixed job: test_mix_blackbox.py."""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
from dataclasses import replace
from importlib import resources
from typing import Any

import pytest
import support
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from support import ENTRY_POINT, check_debt_readers, one_error_line

import taskq
from taskq.admin.jobs import Job
from taskq.admin.mix import (
    copy_field,
    feed_entries,
    feed_log,
    pass_life,
    spec_of,
    stores,
    weight_entries,
    weight_log,
)
from taskq.mix import (
    Feed,
    MixSpec,
    PassPlan,
    Slot,
    bound,
    life_before,
    pass_schedule,
    plan_pass,
    sample_bound,
    slot_at,
    weight_text,
)

_ids = itertools.count()

weights_st = st.floats(min_value=0.0, max_value=10.0, allow_nan=False).map(
    lambda w: weight_text(round(w, 3))
)


def _segment_weights(
    spec: MixSpec, log: list[tuple[int, list[str]]], pos: int, taken: list[int]
) -> list[float]:
    """The weights of a segment starting at ``pos``, re-derived here (not by the reference):
    the change of the highest slot at or below ``pos`` (of one slot, the last logged),
    normalised over the sources with tasks left and weight above 0; when none of those has
    weight, the sources left share equally."""
    weights = list(spec.weights)
    for _, (at, ws) in sorted(enumerate(log), key=lambda e: (e[1][0], e[0])):
        if at <= pos:
            weights = ws
    left = [i for i in range(len(spec.sizes)) if taken[i] < spec.sizes[i]]
    total = sum(float(weights[i]) for i in left if float(weights[i]) > 0)
    if total == 0:
        return [1 / len(left) if i in left else 0.0 for i in range(len(spec.sizes))]
    return [
        float(weights[i]) / total if i in left and float(weights[i]) > 0 else 0.0
        for i in range(len(spec.sizes))
    ]


def _segments_ok(spec: MixSpec, log: list[tuple[int, list[str]]], seq: list[tuple[int, int]]):
    """Every prefix of every segment of ``seq`` (pass 0) within the bound; each source's
    tasks once, in order. Segments re-derived here from the log and the run-outs."""
    k = len(spec.sizes)
    for i in range(k):
        assert [j for s, j in seq if s == i] == list(range(spec.sizes[i]))
    changes = sorted({at for at, _ in log})
    taken = [0] * k
    seg_start, counts, w = 0, [0] * k, None
    restart = True
    for pos, (src, _) in enumerate(seq):
        if pos in changes:
            restart = True
        if restart:
            w = _segment_weights(spec, log, pos, taken)
            seg_start, counts, restart = pos, [0] * k, False
        counts[src] += 1
        taken[src] += 1
        m = pos - seg_start + 1
        d = bound(sum(1 for x in w if x > 0))
        for i in range(k):
            assert abs(counts[i] - w[i] * m) <= d + 1e-9, (pos, i, counts, w, m)
        if taken[src] == spec.sizes[src]:
            restart = True


def _weights_and_log(data, k: int, slots: int, changes: int = 4) -> tuple[tuple, list]:
    """Drawn: a pass's first weights for ``k`` sources and up to ``changes`` changes at
    slots below ``slots`` (each with a weight above 0)."""
    some = st.lists(weights_st, min_size=k, max_size=k).filter(
        lambda ws: any(float(w) > 0 for w in ws)
    )
    first = data.draw(some)
    log = data.draw(st.lists(st.tuples(st.integers(0, slots - 1), some), max_size=changes))
    return tuple(first), [(at, ws) for at, ws in log]


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    data=st.data(),
)
def test_reference_schedule_keeps_every_prefix_within_the_bound(sizes, data):
    k = len(sizes)
    first, log = _weights_and_log(data, k, sum(sizes))
    spec = MixSpec(tuple(f"s{i}" for i in range(k)), tuple(sizes), first)
    seq = list(pass_schedule(spec, log, 0))
    assert len(seq) == sum(sizes)
    _segments_ok(spec, log, seq)


def _sample_segments_ok(
    spec: MixSpec,
    log: list[tuple[int, list[str]]],
    seq: list[tuple[int, int]],
    task_sizes: list[list[int]],
) -> None:
    """Weights counting samples: every prefix of every segment keeps each source's samples
    within the largest task of ``w * M`` (``M`` the segment's samples); each source's
    tasks once, in order. Segments re-derived from the log and the run-outs."""
    k = len(spec.sizes)
    for i in range(k):
        assert [j for s, j in seq if s == i] == list(range(spec.sizes[i]))
    most = sample_bound(task_sizes)
    changes = {at for at, _ in log}
    taken, counts, total, w = [0] * k, [0] * k, 0, [0.0] * k
    restart = True
    for pos, (src, j) in enumerate(seq):
        if pos in changes or restart:
            w = _segment_weights(spec, log, pos, taken)
            counts, total, restart = [0] * k, 0, False
        counts[src] += task_sizes[src][j]
        total += task_sizes[src][j]
        taken[src] += 1
        for i in range(k):
            assert abs(counts[i] - w[i] * total) <= most + 1e-9 * (1 + total), (pos, i)
        if taken[src] == spec.sizes[src]:
            restart = True


@settings(max_examples=300, deadline=None)
@given(
    task_sizes=st.lists(
        st.lists(st.integers(0, 50), min_size=1, max_size=30), min_size=1, max_size=6
    ),
    data=st.data(),
)
def test_reference_by_samples_keeps_every_prefix_within_the_largest_task(task_sizes, data):
    """Weights counting samples (``mix_by="samples"``): the rule is WF2Q with every source
    backlogged, and in every prefix of every segment a source's samples are within the
    largest task of ``w * M``."""
    k = len(task_sizes)
    sizes = tuple(len(s) for s in task_sizes)
    first, log = _weights_and_log(data, k, sum(sizes))
    spec = MixSpec(tuple(f"s{i}" for i in range(k)), sizes, first, by="samples")
    seq = list(pass_schedule(spec, log, 0, task_sizes=task_sizes))
    assert len(seq) == sum(sizes)
    _sample_segments_ok(spec, log, seq, task_sizes)


def test_reference_by_samples_needs_every_size():
    spec = MixSpec(("a", "b"), (2, 1), ("1.0", "1.0"), by="samples")
    with pytest.raises(taskq.InvalidInput, match="every task's size"):
        list(pass_schedule(spec, [], 0, task_sizes=[[3], [1]]))


def test_bound_values():
    assert bound(1) == 0.0
    assert bound(2) == 0.5
    assert bound(3) == 0.75


# -- a real server ---------------------------------------------------------------------
def _sources(client: taskq.Client, sizes: dict[str, int], tag: str) -> dict[str, str]:
    names = {}
    for src, n in sizes.items():
        name = f"{tag}-{src}"
        client.create_job(name, [{"src": src, "i": i} for i in range(n)])
        names[src] = name
    return names


def _reference(client: taskq.Client, name: str, pass_no: int = 0) -> list[tuple[str, int]]:
    spec = spec_of(client.connection, name)
    log = weight_log(client.connection, name)
    return [(spec.sources[s], j) for s, j in pass_schedule(spec, log, pass_no)]


def _engine(client: taskq.Client, name: str, pass_no: int = 0) -> list[tuple[str, int]]:
    return [(r["source"], r["source_task"]) for r in client.job(name).mix_sequence(pass_no)]


def _drain(client: taskq.Client, name: str) -> list[taskq.Task]:
    got = []
    with taskq.Trainer(name, client=client) as t:
        while True:
            try:
                task = t.lease(timeout=0.2)
            except taskq.JobCompleted:
                return got
            if task is None:
                return got
            got.append(task)
            t.ack(task)


def test_trainer_leases_slots_in_order_and_names_the_source(client):
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"web": 10, "code": 6, "books": 4}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["web"]: 0.5, names["code"]: 0.3, names["books"]: 0.2})
    tasks = _drain(client, mix)
    assert [(t.source, t.chunks[0]["i"]) for t in tasks] == _reference(client, mix)
    assert all(t.chunks[0]["src"] == t.source.rsplit("-", 1)[1] for t in tasks)
    assert _engine(client, mix) == _reference(client, mix)
    status = client.job(mix).mix_status()
    assert [(r["charged"], r["acked"], r["tasks"]) for r in status["sources"]] == [
        (10, 10, 10),
        (6, 6, 6),
        (4, 4, 4),
    ]
    assert client.status(mix).state == "completed"


def _sized_sources(client: taskq.Client, sizes: dict[str, list[int]], tag: str) -> dict[str, str]:
    """Source jobs whose tasks say their samples (a lines chunk's ``records``)."""
    names = {}
    for src, records in sizes.items():
        name = f"{tag}-{src}"
        client.create_job(
            name,
            [
                {
                    "format": "lines",
                    "path": f"/nonexistent/{src}/{i}",
                    "offset": 0,
                    "length": 1,
                    "records": r,
                }
                for i, r in enumerate(records)
            ],
        )
        names[src] = name
    return names


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_engine_equals_the_reference_by_samples(client, data):
    # Weights counting samples: the engine's choice (lib/mixrule.lua choose_by_samples) on the
    # sizes the create stored against the reference's on the sizes given, page after page,
    # with weights of 0 and changes logged inside a page and across pages.
    k = data.draw(st.integers(2, 12))
    sizes = data.draw(
        st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=40), min_size=k, max_size=k)
    )
    first, changes = _weights_and_log(data, k, sum(len(r) for r in sizes), changes=3)
    tag = f"mx{next(_ids)}"
    names = _sized_sources(client, {f"s{i}": r for i, r in enumerate(sizes)}, tag)
    mix = f"{tag}-mix"
    client.create_job(
        mix, mix={names[f"s{i}"]: float(w) for i, w in enumerate(first)}, mix_by="samples"
    )
    job = client.job(mix)
    for at, ws in changes:
        job.set_weights({names[f"s{i}"]: float(w) for i, w in enumerate(ws)}, at=at)
    tasks = _drain(client, mix)
    spec = spec_of(client.connection, mix)
    assert spec.by == "samples"
    log = weight_log(client.connection, mix)
    want = [(spec.sources[s], j) for s, j in pass_schedule(spec, log, 0, task_sizes=sizes)]
    # each task is its slot, in order, and its chunks are the source task's the slot names
    assert [t.id for t in tasks] == list(range(len(want)))
    assert [(t.source, int(t.chunks[0]["path"].rsplit("/", 1)[1])) for t in tasks] == want
    assert _engine(client, mix) == want
    _sample_segments_ok(spec, log, [(spec.sources.index(s), j) for s, j in want], sizes)


def test_a_mixed_jobs_tasks_are_its_slots_read_through_the_sequence(client):
    # The engine's task of a mixed job is the slot (its position in the pass): a lease,
    # `tasks list`, `tasks inspect`, the pass's samples and the audit read a slot's chunks
    # through the stored sequence; a dead slot's source task stays dead in the next pass
    # (the same weights charge it at the same slot) and a retry leases it there.
    tag = f"mx{next(_ids)}"
    sizes = {"web": [5, 6, 7, 8, 9], "code": [20, 30, 40]}
    names = _sized_sources(client, sizes, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["web"]: 0.6, names["code"]: 0.4}, max_failures=1, passes=2)
    job = client.job(mix)
    want = _reference(client, mix)

    def source_task(task: taskq.Task) -> tuple[str | None, int]:
        return task.source, int(task.chunks[0]["path"].rsplit("/", 1)[1])

    def size(slot: int) -> int:
        source, j = want[slot]
        return sizes[source.rsplit("-", 1)[1]][j]

    with taskq.Trainer(mix, client=client) as t:
        first = [t.lease(timeout=1) for _ in range(3)]
        assert [x.id for x in first] == [0, 1, 2]
        assert [source_task(x) for x in first] == want[:3]
        rows = {r["id"]: r["chunks"] for r in job.tasks("leased", details=True)}
        assert rows == {x.id: x.chunks for x in first}
        assert job.task(1)["chunks"] == first[1].chunks
        assert job.task(6)["chunks"] is None  # not handed out: its source task not fixed
        t.fail(first[0], "poison")  # max_failures 1: slot 0 is dead
        t.ack(first[1])
        assert job.samples() == (size(0) + size(1), sum(map(sum, sizes.values())))
        t.ack(first[2])
        rest = _drain(client, mix)
    assert [source_task(x) for x in rest] == want[3:] + want[1:]  # its copy dead in pass 1
    assert [x.pass_no for x in rest] == [0] * 5 + [1] * 7
    audit = job.audit()
    assert audit["ok"], audit["checks"]
    assert client.status(mix).state == "completed"
    assert _engine(client, mix, 1) == want  # slot 0 charged with the dead copy, dead at once
    assert job.retry([0]) == 1
    again = _drain(client, mix)
    assert [(x.id, x.pass_no, source_task(x)) for x in again] == [(0, 1, want[0])]
    assert job.audit()["ok"]


def test_a_dead_source_task_stays_dead_in_the_next_pass_wherever_it_is_charged(client):
    # What dies in a mixed job is the source task (its copy), not the slot: in the next
    # pass, whose weights put the copies at other positions, the slot charged with the dead
    # copy is dead at once (never leased, counted dead by the status, `tasks list` and the
    # audit) and every other source task is leased exactly once; a retry brings it back.
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"web": 6, "code": 4}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["web"]: 0.5, names["code"]: 0.5}, max_failures=1, passes=2)
    job = client.job(mix)
    bad = (names["web"], 2)
    with taskq.Trainer(mix, client=client) as t:
        for _ in range(10):
            task = t.lease(timeout=1)
            if (task.source, task.chunks[0]["i"]) == bad:
                t.fail(task, "poison")  # max_failures 1: dead
            else:
                t.ack(task)
    assert job.set_weights({names["web"]: 0.2, names["code"]: 0.8}) == 10  # pass 1 differs
    want = _reference(client, mix, 1)
    bad_slot = want.index(bad)
    assert bad_slot != _reference(client, mix, 0).index(bad)
    rest = _drain(client, mix)
    assert all(x.pass_no == 1 for x in rest)
    got = [(x.source, x.chunks[0]["i"]) for x in rest]
    assert sorted(got) == sorted(w for w in want if w != bad)  # each once, but the dead one
    assert [x.id for x in rest] == [k for k in range(10) if k != bad_slot]
    assert client.status(mix).state == "completed"
    assert client.status(mix).dead == 1
    assert [r["id"] for r in job.tasks("dead")] == [bad_slot]
    audit = job.audit()
    assert audit["ok"], audit["checks"]
    assert job.retry() == 1
    again = _drain(client, mix)
    assert [(x.id, x.pass_no, x.source, x.chunks[0]["i"]) for x in again] == [(bad_slot, 1, *bad)]
    assert client.status(mix).dead == 0
    assert job.audit()["ok"]


def _poisoned_mix(
    client: taskq.Client, sizes: dict[str, int], poison: tuple[int, ...], leases: int
) -> tuple[str, Job, dict[str, str]]:
    """A mixed job of ``sizes``' sources at equal weights, ``max_failures=1``, whose first
    ``leases`` tasks are leased and acked but those of ``poison``, failed once (their
    copies dead); its name, its Job and the sources' names."""
    tag = f"mx{next(_ids)}"
    names = _sources(client, sizes, tag)
    mix = f"{tag}-mix"
    weights = {names[s]: 1 / len(sizes) for s in sizes}
    client.create_job(mix, mix=weights, max_failures=1, passes=None)
    with taskq.Trainer(mix, client=client) as t:
        for _ in range(leases):
            task = t.lease(timeout=1)
            if task.id in poison:
                t.fail(task, "poison")
            else:
                t.ack(task)
    return mix, client.job(mix), names


def test_a_dead_copy_retried_before_its_pass_charged_it_is_leased_in_its_slot(client):
    # Dead copies retried in the next pass before its charge reached them: no slot holds
    # them yet, so a retry of all makes them live and the charge leases them in their slots.
    mix, job, _ = _poisoned_mix(client, {"web": 6, "code": 4}, (0, 7), 10)
    assert client.status(mix).pass_no == 1  # (pass 0 ended: its live tasks acked)
    assert job.retry() == 2  # the two dead copies, charged nowhere in pass 1 yet
    want = _reference(client, mix, 1)
    with taskq.Trainer(mix, client=client) as t:
        got = []
        for _ in range(10):
            task = t.lease(timeout=1)
            got.append((task.id, task.pass_no, task.source, task.chunks[0]["i"]))
            t.ack(task)
    assert got == [(k, 1, *want[k]) for k in range(10)]
    assert client.status(mix).dead == 0


def test_a_dead_slot_retried_ahead_of_the_cursor_counts_as_handed_out(client):
    # In the next pass the dead copies' slots are dead once charged (a page ahead of the
    # cursor); one retried ahead of the cursor is leased with its copy and counts as handed
    # out, so a weight change holds only from the slot after it and never moves it.
    mix, job, names = _poisoned_mix(client, {"web": 600, "code": 400}, (0, 300), 301)
    client.next_pass(mix, force=True)
    want = _reference(client, mix, 1)  # (the same weights: the same positions)
    with taskq.Trainer(mix, client=client) as t:
        got = {}
        while len(got) < 299:  # slots 1-299 (0 and 300 are dead)
            task = t.lease(timeout=1)
            got[task.id] = (task.pass_no, task.source, task.chunks[0]["i"])
            t.ack(task)
        assert got == {k: (1, *want[k]) for k in range(1, 300)}
        assert [r["id"] for r in job.tasks("dead")] == [0, 300]
        assert job.retry([300]) == 1  # charged (the page from 256), ahead of the cursor
        task = t.lease(timeout=1)
        assert (task.id, task.source, task.chunks[0]["i"]) == (300, *want[300])
        assert job.set_weights({names["web"]: 1, names["code"]: 0}) == 1000 + 301
    rows = job.mix_sequence()
    assert [(r["source"], r["source_task"]) for r in rows] == want[:301]


def test_a_dead_slot_retried_ahead_of_the_cursor_skips_no_task_of_a_cycle_pass(client):
    # on_exhausted=cycle: a pass left by a forced advance counts in the next pass's life
    # what it handed out, and only that. A dead slot retried ahead of the cursor and leased
    # from the front is handed out; the slots between the cursor and it, charged and never
    # handed out, are not: their source tasks come in the next pass.
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"web": 6, "code": 4}, tag)
    mix = f"{tag}-mix"
    client.create_job(
        mix,
        mix={names["web"]: 0.5, names["code"]: 0.5},
        on_exhausted="cycle",
        max_failures=1,
        passes=None,
    )
    job = client.job(mix)
    with taskq.Trainer(mix, client=client) as t:
        for _ in range(10):
            task = t.lease(timeout=1)
            if task.id == 7:
                t.fail(task, "poison")  # max_failures 1: its copy dead
            else:
                t.ack(task)
        assert client.status(mix).pass_no == 1
        first = t.lease(timeout=1)  # position 0; the charge makes slot 7 dead at once
        assert first.id == 0
        t.ack(first)
        (dead,) = [r["id"] for r in job.tasks("dead")]
        assert dead > 1  # (positions between the cursor and it: charged, not handed out)
        assert job.retry([dead]) == 1
        ahead = t.lease(timeout=1)  # from the front, ahead of the cursor
        assert (ahead.id, ahead.pass_no) == (dead, 1)
        t.ack(ahead)
    client.next_pass(mix, force=True)
    spec, log = spec_of(client.connection, mix), weight_log(client.connection, mix)
    life1 = pass_life(client.connection, mix, 1)
    assert life1 is not None
    slots = plan_pass(spec, log, 1, life=life1).slots
    handed = [0] * 2
    for pos in (0, dead):
        handed[slots[pos].source] += 1
    # pass 2 starts from that life and hands out the reference's sequence from it: the
    # source tasks of the positions pass 1 skipped come in it
    life2 = [a + b for a, b in zip(life1, handed, strict=True)]
    want = [(spec.sources[s], j) for s, j in pass_schedule(spec, log, 2, life=life2)]
    with taskq.Trainer(mix, client=client) as t:
        got = []
        for _ in range(10):
            task = t.lease(timeout=1)
            got.append((task.pass_no, task.source, task.chunks[0]["i"]))
            t.ack(task)
    assert pass_life(client.connection, mix, 2) == life2
    assert got == [(2, *w) for w in want]


def test_mix_by_samples_without_sizes_is_refused_with_nothing_written(client):
    tag = f"mx{next(_ids)}"
    names = _sized_sources(client, {"a": [3, 4]}, tag)
    names.update(_sources(client, {"b": 2}, tag))
    mix = f"{tag}-mix"
    keys = client.connection.keys(mix)
    with pytest.raises(taskq.InvalidInput, match=r"task 0 of source .*-b.* not say its size"):
        client.create_job(mix, mix={names["a"]: 1, names["b"]: 1}, mix_by="samples")
    assert client.connection.redis.keys(f"{keys.base}*") == []
    with pytest.raises(taskq.InvalidInput, match="mix_by must be one of tasks, samples"):
        client.create_job(mix, mix={names["a"]: 1}, mix_by="rows")
    client.create_job(mix, mix={names["a"]: 1}, mix_by="samples")  # sizes known: made
    # (the sizes by source and block of 256: source 0's two tasks, 4 bytes each)
    assert client.connection.redis.hgetall(keys.mixsz) == {
        "0:0": "\x00\x00\x00\x03\x00\x00\x00\x04"
    }


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
@pytest.mark.parametrize("band", [(2, 24), (25, 64)], ids=["scan", "heap"])
def test_engine_equals_the_reference_with_many_sources(client, data, band):
    # The engine picks a slot's source by a scan up to 24 sources, with a heap and buckets
    # above (lib/mixrule.lua choice, O(log k) a slot), the reference with a scan of every
    # source: the same sequence, page after page, with weights of 0, near ties and changes
    # logged inside a page and across pages.
    k = data.draw(st.integers(*band))
    sizes = data.draw(st.lists(st.integers(1, 6), min_size=k, max_size=k))
    first, changes = _weights_and_log(data, k, sum(sizes), changes=3)
    tag = f"mx{next(_ids)}"
    names = _sources(client, {f"s{i}": n for i, n in enumerate(sizes)}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names[f"s{i}"]: float(w) for i, w in enumerate(first)})
    job = client.job(mix)
    for at, ws in changes:
        job.set_weights({names[f"s{i}"]: float(w) for i, w in enumerate(ws)}, at=at)
    tasks = _drain(client, mix)
    assert [(t.source, t.chunks[0]["i"]) for t in tasks] == _reference(client, mix)


def test_weight_change_holds_from_the_stated_slot(client):
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 300, "b": 300}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["a"]: 0.5, names["b"]: 0.5})
    job = client.job(mix)
    assert job.set_weights({names["a"]: 0.9, names["b"]: 0.1}, at=200) == 200
    with taskq.Trainer(mix, client=client) as t:
        for _ in range(210):
            t.ack(t.lease(timeout=1))
        # slot 150 is charged: a change asked there holds from the first slot not charged
        assert job.set_weights({names["a"]: 0.5, names["b"]: 0.5}, at=150) == 210
    seq = _engine(client, mix)
    assert seq == _reference(client, mix)[: len(seq)]
    before = [s for s, _ in seq[:200]]
    assert before.count(names["a"]) == 100
    after = [s for s, _ in seq[200:210]]
    assert after.count(names["a"]) == 9  # 0.9 of the 10 slots 200..209, exactly
    # the engine charged a page ahead (to 256): status and export speak of what leases took
    status = job.mix_status()
    assert (len(seq), status["charged"], status["next_slot"]) == (210, 210, 210)
    assert [r["charged"] for r in status["sources"]] == [
        sum(1 for s, _ in seq if s == names[x]) for x in ("a", "b")
    ]
    assert [r["weight"] for r in status["sources"]] == [0.5, 0.5]


def test_bad_weights_are_refused_with_nothing_written(client):
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 3, "b": 3}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["a"]: 1, names["b"]: 1})
    job = client.job(mix)
    for bad in (
        {names["a"]: 1},
        {names["a"]: 0, names["b"]: 0},
        {names["a"]: -1, names["b"]: 1},
        {names["a"]: float("nan"), names["b"]: 1},
        {names["a"]: 1, names["b"]: 1, "zz": 1},
    ):
        with pytest.raises(taskq.InvalidInput):
            job.set_weights(bad)
    with pytest.raises(taskq.InvalidInput):
        job.set_weights({names["a"]: 1, names["b"]: 1}, at=-3)
    assert weight_log(client.connection, mix) == []
    with pytest.raises(taskq.InvalidInput, match="on_exhausted must be one of"):
        client.create_job(f"{tag}-m2", mix={names["a"]: 1}, on_exhausted="later")
    with pytest.raises(taskq.JobNotFound):
        client.create_job(f"{tag}-m3", mix={names["a"]: 1, f"{tag}-none": 1})
    with pytest.raises(taskq.InvalidInput, match="itself a mixed job"):
        client.create_job(f"{tag}-m4", mix={mix: 1})
    for name in (f"{tag}-m2", f"{tag}-m3", f"{tag}-m4"):
        assert not client.redis.exists(client.keys(name).meta)
    with pytest.raises(taskq.InvalidInput, match="not a mixed job"):
        client.job(names["a"]).set_weights({names["a"]: 1})
    with pytest.raises(taskq.InvalidInput, match="takes appends only to an open stream"):
        job.append([{"x": 1}])


def _lease_ack(t: taskq.Trainer, n: int) -> list[tuple[str | None, int]]:
    out = []
    for _ in range(n):
        task = t.lease(timeout=1)
        assert task is not None
        out.append((task.source, task.chunks[0]["i"]))
        t.ack(task)
    return out


def test_a_sealed_stream_source_and_appended_tasks_are_copied_whole(client):
    # A source's tasks are the create's and the appended (lib/meta.lua tasks_n): a sealed
    # stream is a source of fixed size, and a plain job appended to before the mix is made
    # gives its appended tasks too; the mix takes every one once, in the reference's order.
    tag = f"mx{next(_ids)}"
    stream, plain = f"{tag}-stream", f"{tag}-plain"
    client.create_job(stream, [{"src": "stream", "i": i} for i in range(3)], stream=True)
    client.job(stream).append([{"src": "stream", "i": i} for i in range(3, 7)])
    client.job(stream).seal()
    client.create_job(plain, [{"src": "plain", "i": i} for i in range(3)])
    client.job(plain).append([{"src": "plain", "i": i} for i in range(3, 5)])
    mix = f"{tag}-mix"
    client.create_job(mix, mix={stream: 0.6, plain: 0.4})
    spec = spec_of(client.connection, mix)
    assert spec.sizes == (7, 5)
    assert client.status(mix).tasks == 12
    tasks = _drain(client, mix)
    assert [(t.source, t.chunks[0]["i"]) for t in tasks] == _reference(client, mix)
    assert sorted((t.chunks[0]["src"], t.chunks[0]["i"]) for t in tasks) == sorted(
        [("stream", i) for i in range(7)] + [("plain", i) for i in range(5)]
    )
    assert client.status(mix).state == "completed"


def test_a_sealed_empty_stream_source_runs_out_at_once_or_is_refused(client):
    # A sealed stream of no task: under drop it runs out at the first slot (the others
    # share every slot, as the reference makes it); cycle and stop need a task in every
    # source, and a mix of no task at all is refused, each with nothing written.
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 3, "b": 2}, tag)
    empty = f"{tag}-empty"
    client.create_job(empty, [], stream=True)
    client.job(empty).seal()
    mix = f"{tag}-mix"
    client.create_job(mix, mix={empty: 0.5, names["a"]: 0.3, names["b"]: 0.2})
    assert spec_of(client.connection, mix).sizes == (0, 3, 2)
    tasks = _drain(client, mix)
    assert [(t.source, t.chunks[0]["i"]) for t in tasks] == _reference(client, mix)
    assert len(tasks) == 5
    status = client.job(mix).mix_status()
    assert [(r["charged"], r["acked"], r["tasks"]) for r in status["sources"]] == [
        (0, 0, 0),
        (3, 3, 3),
        (2, 2, 2),
    ]
    for on_exhausted in ("cycle", "stop"):
        with pytest.raises(taskq.InvalidInput, match=f"on_exhausted={on_exhausted} needs a task"):
            client.create_job(f"{tag}-m", mix={empty: 1, names["a"]: 1}, on_exhausted=on_exhausted)
    with pytest.raises(taskq.InvalidInput, match="have no task"):
        client.create_job(f"{tag}-m", mix={empty: 1})
    assert not client.redis.exists(client.keys(f"{tag}-m").meta)


def _fed_reference(client: taskq.Client, name: str, pass_no: int = 0) -> list[tuple[str, int]]:
    """The reference of a mixed job with a stream source: the weight log and the engine's
    feed log, pass ``p`` from slot ``p * N`` (``MixSpec.stride``)."""
    spec = spec_of(client.connection, name)
    log = weight_log(client.connection, name)
    feed = feed_log(client.connection, name)
    plan = plan_pass(spec, log, pass_no, feed=feed, first_slot=pass_no * spec.stride)
    return [(spec.sources[s.source], s.task) for s in plan.slots]


def test_an_open_stream_source_is_fed_through_its_mixed_job(client):
    # An open stream source: its tasks so far copied, then fed to the mixed job (--feed),
    # its own appends and seal refused with where to go; the charge defers, repays and
    # waits on it as the reference does from the feed log, and the pass ends once it is
    # sealed and drained.
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"web": 6}, tag)
    news = f"{tag}-news"
    client.create_job(news, [{"src": "news", "i": i} for i in range(2)], stream=True)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={news: 0.5, names["web"]: 0.5}, max_debt=1)
    spec = spec_of(client.connection, mix)
    assert spec.streams == (True, False) and spec.max_debt == 1
    assert spec.stride == 2**32
    assert client.status(mix).tasks == 0
    with pytest.raises(
        taskq.InvalidInput,
        match=f"{news} feeds mixed job '{mix}': append with --feed {news} to '{mix}'",
    ):
        client.job(news).append([{"i": 9}])
    with pytest.raises(taskq.InvalidInput, match=f"feeds mixed job '{mix}'"):
        client.job(news).seal()
    with pytest.raises(taskq.InvalidInput, match="feeds mixed job .* already"):
        client.create_job(f"{tag}-m2", mix={news: 1})
    with pytest.raises(taskq.InvalidInput, match="is not a source"):
        client.job(mix).append([{"i": 9}], feed=names["web"] + "x")
    with pytest.raises(taskq.InvalidInput, match="was not an open stream"):
        client.job(mix).append([{"i": 9}], feed=names["web"])
    with pytest.raises(taskq.InvalidInput, match="takes appends only to an open stream source"):
        client.job(mix).append([{"i": 9}])
    got: list[tuple[str | None, int]] = []
    with taskq.Trainer(mix, client=client) as t:
        while (task := t.lease(timeout=0.2)) is not None:
            got.append((task.source, task.chunks[0]["i"]))
            t.ack(task)
        assert got == _fed_reference(client, mix)
        assert len(got) < 8 and client.status(mix).state == "running"
        r = client.job(mix).append(
            [{"src": "news", "i": i} for i in range(2, 5)], ids=["a", "b", "c"], feed=news
        )
        assert (r.tasks, r.first_task) == (3, 2)
        again = client.job(mix).append([{"src": "news", "i": 2}], ids=["a"], feed=news)
        assert (again.tasks, again.skipped) == (0, 1)
        while (task := t.lease(timeout=0.2)) is not None:
            got.append((task.source, task.chunks[0]["i"]))
            t.ack(task)
        assert got == _fed_reference(client, mix)
        assert client.status(mix).state == "running"
        sealed = client.job(mix).seal(feed=news)
        assert (int(sealed), sealed.already_sealed) == (5, False)
        assert client.job(mix).seal(feed=news).already_sealed
        with pytest.raises(taskq.InvalidInput, match="is sealed"):
            client.job(mix).append([{"i": 9}], feed=news)
        got += [(x.source, x.chunks[0]["i"]) for x in _lease_until_completed(t)]
    assert got == _fed_reference(client, mix)
    assert sorted(got) == sorted(
        [(news, i) for i in range(5)] + [(names["web"], i) for i in range(6)]
    )
    assert client.status(mix).state == "completed"


def _lease_until_completed(t: taskq.Trainer) -> list[taskq.Task]:
    """Leases and acks until the job completes (each lease finds a task meanwhile)."""
    got = []
    while True:
        try:
            task = t.lease(timeout=0.5)
        except taskq.JobCompleted:
            return got
        assert task is not None
        got.append(task)
        t.ack(task)


def _check_fed(client: taskq.Client, mix: str, p: int) -> PassPlan:
    """The engine's handed-out sequence of pass ``p`` equals the reference's from the
    weight log and the engine's feed log, from slot ``p * N``, the slots that repaid a
    debt too (``repaid``); in the current pass, ``mix_status()``'s debts are the
    reference's at the charge's high-water (``plan_pass(..., length=<high_water>)``, or
    the whole pass's where it ended there), and its ``waits_on`` is the reference's wait
    at the high-water whenever it says one. Returns the whole plan."""
    spec = spec_of(client.connection, mix)
    log = weight_log(client.connection, mix)
    feed = feed_log(client.connection, mix)
    plan = plan_pass(spec, log, p, feed=feed, first_slot=p * spec.stride)
    rows = client.job(mix).mix_sequence(p)
    got = [(r["source"], r["source_task"]) for r in rows]
    assert got == [(spec.sources[s.source], s.task) for s in plan.slots][: len(got)]
    assert [r["slot"] for r in rows] == [s.slot for s in plan.slots[: len(got)]]
    check_debt_readers(client.job(mix), spec, log, feed, p, plan)
    return plan


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), rule=st.sampled_from(["drop", "stop"]))
def test_engine_feeds_stream_sources_as_the_reference(client, data, rule):
    """Stream sources in the engine (lib/mix.lua ``charge_stream``): feed appends, seals
    and weight changes interleaved with leases; after every step the handed-out sequence is
    ``pass_schedule(spec, log, p, feed=<the engine's mixfeed>, first_slot=p * N)``'s, a
    lease that finds nothing is the reference's wait (every charged slot handed out, its
    plan ending ``wait``, which ``mix_status()["waits_on"]`` names), and once every stream
    is sealed two passes drain as the reference makes them. After every step too, the
    slots that repaid a debt and each source's debt are the reference's (``_check_fed``)."""
    tag = f"mx{next(_ids)}"
    fixed = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=2), label="fixed")
    opened = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=2), label="streams")
    names = []
    for i, n in enumerate(fixed):
        names.append(f"{tag}-f{i}")
        client.create_job(names[-1], [{"s": names[-1], "i": j} for j in range(n)])
    streams = []
    for i, n in enumerate(opened):
        streams.append(f"{tag}-s{i}")
        client.create_job(streams[-1], [{"s": streams[-1], "i": j} for j in range(n)], stream=True)
    sources = names + streams
    weights = data.draw(
        st.lists(
            st.sampled_from(["0", "0.5", "1", "2"]), min_size=len(sources), max_size=len(sources)
        ).filter(lambda ws: any(float(w) > 0 for w in ws)),
        label="weights",
    )
    mix = f"{tag}-mix"
    max_debt = data.draw(st.integers(0, 2), label="max_debt")
    client.create_job(
        mix,
        mix=dict(zip(sources, map(float, weights), strict=True)),
        on_exhausted=rule,
        max_debt=max_debt,
        passes=2,
    )
    fed = dict(zip(streams, opened, strict=True))
    got: list[list[tuple[str | None, int]]] = [[], []]

    def lease(t: taskq.Trainer, timeout: float) -> bool:
        task = t.lease(timeout=timeout)
        if task is None:
            return False
        assert task.chunks[0]["s"] == task.source
        got[task.pass_no].append((task.source, task.chunks[0]["i"]))
        t.ack(task)
        return True

    with taskq.Trainer(mix, client=client) as t:
        try:
            for _ in range(data.draw(st.integers(1, 12), label="steps")):
                op = data.draw(st.sampled_from(["lease", "lease", "feed", "seal", "weights"]))
                if op == "lease":
                    for _ in range(data.draw(st.integers(1, 4))):
                        # (a lease that ends a pass finds nothing: the next one goes on)
                        if not lease(t, 0) and not lease(t, 0):
                            p = client.status(mix).pass_no
                            plan = _check_fed(client, mix, p)
                            assert plan.end == "wait" and plan.waits_on is not None
                            assert len(plan.slots) == len(_engine(client, mix, p))
                            # (the lease's charge stopped at the wait: the status says so)
                            assert client.job(mix).mix_status()["waits_on"] == {
                                "source": sources[plan.waits_on],
                                "slot": p * spec_of(client.connection, mix).stride
                                + len(plan.slots),
                            }
                            break
                elif op == "feed":
                    s = data.draw(st.sampled_from(streams))
                    more = data.draw(st.integers(1, 3))
                    try:
                        client.job(mix).append(
                            [{"s": s, "i": fed[s] + j} for j in range(more)], feed=s
                        )
                        fed[s] += more
                    except taskq.InvalidInput as e:
                        assert "is sealed" in str(e) or "is completed" in str(e)  # (stop)
                elif op == "seal":
                    client.job(mix).seal(feed=data.draw(st.sampled_from(streams)))
                else:
                    ws = data.draw(
                        st.lists(
                            st.sampled_from(["0", "1", "3"]),
                            min_size=len(sources),
                            max_size=len(sources),
                        ).filter(lambda ws: any(float(w) > 0 for w in ws))
                    )
                    client.job(mix).set_weights(dict(zip(sources, ws, strict=True)))
                _check_fed(client, mix, client.status(mix).pass_no)
            for s in streams:
                client.job(mix).seal(feed=s)
            while lease(t, 5):
                pass
            raise AssertionError("the job did not complete")
        except taskq.JobCompleted:
            pass
    for p in (0, 1):
        plan = _check_fed(client, mix, p)
        assert plan.end in ("done", "stop")
        assert got[p] == [(sources[s.source], s.task) for s in plan.slots]
        if rule == "drop":
            assert sorted(got[p]) == sorted(
                [(n, j) for n, size in zip(names, fixed, strict=True) for j in range(size)]
                + [(s, j) for s in streams for j in range(fed[s])]
            )
    assert client.status(mix).state == "completed"


@pytest.mark.parametrize(
    ("streams", "weights", "sealed", "changed", "then", "want"),
    [
        # the stream sealed empty after the change weighs 0 from slot 0: f0 takes it
        ([0], ["0", "0.5"], [], ["1", "0"], [0], "f0"),
        # the sealed empty stream weighs 0 from slot 0: the other stream's slot waits
        ([0, 0], ["0", "0.5", "0"], [0], ["0", "0", "1"], [], "wait"),
        # the sealed empty stream weighs 1 from slot 0: it ran out, the pass stops
        ([0, 0], ["0", "0", "0.5"], [0], ["0", "1", "1"], [], "stop"),
        ([0, 0], ["0", "0", "0.5"], [0], ["0", "1", "0"], [], "stop"),
    ],
)
def test_a_weight_change_at_a_waiting_first_slot_holds_from_the_pass_start(
    client, streams, weights, sealed, changed, then, want
):
    # on_exhausted=stop, max_debt 0: the pass's first slot waits on an empty stream (its
    # state made, nothing charged); weights set then hold from slot 0, so a source run out
    # at slot 0 (sealed empty, before or after the change) stops the pass by the new
    # weights, as plan_pass weighs it (the draws hypothesis found in
    # test_engine_feeds_stream_sources_as_the_reference).
    tag = f"mx{next(_ids)}"
    client.create_job(f"{tag}-f0", [{"s": f"{tag}-f0", "i": 0}])
    sources = [f"{tag}-f0"]
    for i, n in enumerate(streams):
        sources.append(f"{tag}-s{i}")
        client.create_job(sources[-1], [{"i": j} for j in range(n)], stream=True)
    mix = f"{tag}-mix"
    client.create_job(
        mix,
        mix=dict(zip(sources, map(float, weights), strict=True)),
        on_exhausted="stop",
        max_debt=0,
    )
    with taskq.Trainer(mix, client=client) as t:
        assert t.lease(timeout=0) is None
        assert _check_fed(client, mix, 0).end == "wait"
        for i in sealed:
            client.job(mix).seal(feed=f"{tag}-s{i}")
        assert client.job(mix).set_weights(dict(zip(sources, changed, strict=True))) == 0
        for i in then:
            client.job(mix).seal(feed=f"{tag}-s{i}")
        try:
            task = t.lease(timeout=0)
        except taskq.JobCompleted:  # (stop: the one pass ended)
            task = None
        plan = _check_fed(client, mix, 0)
        got = [] if task is None else [(task.source, task.chunks[0]["i"])]
        assert got == _engine(client, mix, 0)
        if want == "f0":
            assert got == [(f"{tag}-f0", 0)] and plan.slots[0].source == 0
        else:
            assert got == [] and plan.end == want and plan.slots == []
            assert (client.status(mix).state == "completed") == (want == "stop")


def test_a_rewind_to_an_earlier_pass_with_a_stream_source_reads_that_pass_length(client):
    # A stream source open: a pass's length is what its charge reached ('mixh'). Pass 0
    # leased to its wait, a checkpoint in it, pass 1 forced on and charged; the rewind to
    # pass 0 makes the schedule's state pass 0's at once, so status says pass 0's length
    # (read from pass 1's reach, it said 2^32 until a lease switched the state), and the
    # replay is pass 0's slots.
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"web": 2}, tag)
    news = f"{tag}-news"
    client.create_job(news, [{"src": "news", "i": 0}], stream=True)
    mix = f"{tag}-mix"
    client.create_job(
        mix, mix={names["web"]: 0.5, news: 0.5}, max_debt=0, passes=3, auto_advance=False
    )
    with taskq.Trainer(mix, client=client) as t:
        first = [t.lease(timeout=0)]
        t.ack(first[0])
        ckpt = client.job(mix).checkpoint()
        while (task := t.lease(timeout=0)) is not None:
            first.append(task)
            t.ack(task)
    charged = len(_check_fed(client, mix, 0).slots)
    assert client.status(mix).tasks == charged == len(first) == 3
    client.next_pass(mix, force=True)
    with taskq.Trainer(mix, client=client) as t:
        task = t.lease(timeout=0)
        assert task is not None and task.pass_no == 1
    assert client.status(mix).tasks == 3
    assert client.job(mix).rewind(ckpt)
    status = client.status(mix)
    assert (status.pass_no, status.tasks) == (0, charged)
    with taskq.Trainer(mix, client=client) as t:
        again = []
        while (task := t.lease(timeout=0)) is not None:
            again.append((task.pass_no, task.source, task.chunks[0]["i"]))
            t.ack(task)
    assert again == [(0, x.source, x.chunks[0]["i"]) for x in first[1:]]
    assert client.status(mix).tasks == charged
    _check_fed(client, mix, 0)


def test_repaid_slots_stay_with_their_kept_pass_and_go_below_the_kept_passes(client):
    # max_debt=1, web (4 tasks) and an open stream news (1 task): pass 0 owes news slot 3
    # and repays it at slot 4 once fed; sealed, the later passes repay nothing. Slot 4 is
    # recorded ('mixrepaid') while pass 0's sequence is kept (passes 1 and 2 keep it) and
    # goes when pass 3 starts (lib/mixfeed.lua forget_below: nothing below the kept passes).
    tag = f"mx{next(_ids)}"
    web = _sources(client, {"web": 4}, tag)["web"]
    news = f"{tag}-news"
    client.create_job(news, [{"src": "news", "i": 0}], stream=True)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={web: 0.5, news: 0.5}, max_debt=1, passes=4)
    key = client.keys(mix).mixrepaid
    recorded: dict[int, list[int]] = {}
    repaid: dict[int, list[int]] = {}
    with taskq.Trainer(mix, client=client) as t:
        for _ in range(4):
            t.ack(t.lease(timeout=0))
        assert t.lease(timeout=0) is None
        client.job(mix).append([{"src": "news", "i": 1}], feed=news)
        client.job(mix).seal(feed=news)
        while True:
            try:
                task = t.lease(timeout=1)
            except taskq.JobCompleted:
                break
            assert task is not None
            if task.pass_no not in recorded:
                recorded[task.pass_no] = [int(m) for m in client.redis.zrange(key, 0, -1)]
                repaid[task.pass_no] = [
                    r["slot"] for r in client.job(mix).mix_sequence(0) if r["repaid"]
                ]
            t.ack(task)
    assert recorded == {0: [4], 1: [4], 2: [4], 3: []}
    assert repaid == {0: [4], 1: [4], 2: [4], 3: []}  # (pass 0 kept, then not)


def test_a_trainer_waiting_on_a_starving_stream_is_woken_by_its_feed(client):
    # max_debt 0 (wait): the first slot the rule gives the empty stream waits; the trainer
    # blocked in its lease gets the slot as soon as the feed appends (no polling), and a
    # feed's seal wakes a trainer waiting for the pass to end.
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"web": 1}, tag)
    news = f"{tag}-news"
    client.create_job(news, [], stream=True)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={news: 1, names["web"]: 1})
    t = taskq.Trainer(mix, client=client, worker_id="w")
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(t.lease(timeout=30)))
    waiter.start()
    assert support.wait_until(lambda: client.redis.zcard(client.keys(mix).waiting) == 1)
    assert not got
    client.job(mix).append([{"src": "news", "i": 0}], feed=news)
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    assert got[0] is not None and (got[0].source, got[0].chunks[0]["i"]) == (news, 0)
    t.ack(got[0])
    rest = [t.lease(timeout=5)]
    assert rest[0] is not None and rest[0].source == names["web"]
    t.ack(rest[0])
    ended: list = []

    def last_lease() -> None:
        try:
            ended.append(t.lease(timeout=30))
        except taskq.JobCompleted:
            ended.append("completed")

    waiter = threading.Thread(target=last_lease)
    waiter.start()
    assert support.wait_until(lambda: client.redis.zcard(client.keys(mix).waiting) == 1)
    client.job(mix).seal(feed=news)
    waiter.join(timeout=10)
    assert not waiter.is_alive() and ended == ["completed"]
    assert client.status(mix).state == "completed"
    assert _engine(client, mix) == _fed_reference(client, mix)
    t.close()


def test_an_open_stream_source_under_cycle_or_by_samples_is_refused(client):
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 2}, tag)
    stream = f"{tag}-stream"
    client.create_job(stream, [{"i": 0}], stream=True)
    for how in ({"on_exhausted": "cycle"}, {"mix_by": "samples"}):
        with pytest.raises(
            taskq.InvalidInput, match="open stream: on_exhausted=cycle and mix_by=samples"
        ):
            client.create_job(f"{tag}-m", mix={stream: 1, names["a"]: 1}, **how)
        assert not client.redis.exists(client.keys(f"{tag}-m").meta)
        assert client.redis.hget(client.keys(stream).meta, "feeds") is None
    with pytest.raises(taskq.InvalidInput, match="max_debt must be at most 1024"):
        client.create_job(f"{tag}-m", mix={stream: 1, names["a"]: 1}, max_debt=1025)
    assert f"{tag}-m" not in client.list_jobs()


# -- trimming a mix fed by an open stream source (docs/mixing.md, "Trim") -----------------
class _KeptLogs:
    """A mixed job's feed and weight logs as its engine wrote them, kept across its trims:
    what a trim step removed (read just before and after it) joins what the job still
    holds, so the reference is built from the whole logs."""

    def __init__(self, client: taskq.Client, mix: str) -> None:
        self.client, self.mix = client, mix
        self.feed_gone: set[str] = set()
        self.log_gone: set[str] = set()

    def _members(self) -> tuple[set[str], set[str]]:
        keys, r = self.client.keys(self.mix), self.client.redis
        return set(r.zrange(keys.mixfeed, 0, -1)), set(r.zrange(keys.mixlog, 0, -1))

    def trim(self, steps: int = 8) -> int:
        feed, log = self._members()
        passed = self.client.job(self.mix).trim(steps)
        feed_after, log_after = self._members()
        self.feed_gone |= feed - feed_after
        self.log_gone |= log - log_after
        return passed

    def feed(self) -> list[Feed]:
        return feed_entries(self._members()[0] | self.feed_gone)

    def log(self) -> list[tuple[int, list[str]]]:
        return weight_entries(self._members()[1] | self.log_gone)

    def reference(self, pass_no: int = 0) -> list[tuple[str, int]]:
        spec = spec_of(self.client.connection, self.mix)
        plan = plan_pass(
            spec, self.log(), pass_no, feed=self.feed(), first_slot=pass_no * spec.stride
        )
        return [(spec.sources[s.source], s.task) for s in plan.slots]


def _lease_all(t: taskq.Trainer, ack: bool = True) -> list[taskq.Task]:
    """Leases until the job has nothing now (a stream source waits), acking each."""
    got = []
    while (task := t.lease(timeout=0)) is not None:
        got.append(task)
        if ack:
            t.ack(task)
    return got


def _news_feeder(client: taskq.Client, mix: str, news: str):
    """Feeds the mix's stream source from one growing file (`source`: exact across a
    restart) with an id a chunk; returns the function that adds ``k`` more chunks."""
    sent: list[dict[str, Any]] = []

    def feed(k: int) -> taskq.models.AppendResult:
        sent.extend([{"src": "news", "i": i} for i in range(len(sent), len(sent) + k)])
        return client.job(mix).append(
            sent, ids=[f"n{c['i']}" for c in sent], feed=news, source="news.jsonl"
        )

    return feed, sent


def _stream_fed_mix(
    client: taskq.Client, web_tasks: int, news_weight: float, max_debt: int
) -> tuple[str, str, str]:
    """A mixed job of a fixed source ``web`` and an open stream ``news`` (empty at create,
    fed through the mix), weights ``news_weight`` and ``1 - news_weight``: (mix, news, web)."""
    tag = f"mx{next(_ids)}"
    web = _sources(client, {"web": web_tasks}, tag)["web"]
    news, mix = f"{tag}-news", f"{tag}-mix"
    client.create_job(news, [], stream=True)
    client.create_job(mix, mix={news: news_weight, web: 1 - news_weight}, max_debt=max_debt)
    return mix, news, web


def test_a_stream_fed_mix_is_trimmed_behind_its_watermark(client):
    # A mix fed by an open stream source, in its last pass: the watermark moves over done
    # positions only (never past a leased one, nor a kept checkpoint's cut, nor the cut a
    # rewind went back to); below it each position's records go, and its copy's chunks and
    # feed ids; the feed and weight logs keep what a charge reads; leasing on hands out the
    # reference's slots from the whole logs; a resend of trimmed chunks naming their file
    # adds nothing; the status counts every source's acked positions, the audit passes.
    mix, news, web = _stream_fed_mix(client, 40, 0.5, max_debt=0)
    job, keys, r = client.job(mix), client.keys(mix), client.redis
    logs = _KeptLogs(client, mix)
    feed, sent = _news_feeder(client, mix, news)
    job.set_weights({news: 0.6, web: 0.4}, at=3)
    job.set_weights({news: 0.5, web: 0.5}, at=9)
    t = taskq.Trainer(mix, client=client, worker_id="w")
    got: list[taskq.Task] = []
    for _ in range(3):  # each round waits on the news: the next charge starts a page
        feed(3)
        got += _lease_all(t)
    feed(3)
    held = _lease_all(t, ack=False)
    t.ack(held[1:])
    got += held
    low = held[0].id  # leased, not acked: the watermark stops there
    rows = {row["position"]: row for row in job.mix_sequence()}
    assert logs.trim() == low == client.status(mix).trimmed
    assert logs.trim() == 0

    def copy(pos: int) -> str:
        return copy_field(0 if rows[pos]["source"] == news else 1, rows[pos]["source_task"])

    assert not any(r.hexists(keys.chunks, copy(p)) for p in range(low))
    assert all(r.hexists(keys.chunks, copy(p)) for p in range(low, len(rows)))
    assert not any(r.hexists(keys.leases, str(p)) for p in range(low))
    assert not any(r.hexists(keys.counts, f"a:{p}") for p in range(low))
    news_trimmed = {rows[p]["source_task"] for p in range(low) if rows[p]["source"] == news}
    assert news_trimmed and not any(r.hexists(keys.appids, f"0:n{i}") for i in news_trimmed)
    assert r.hlen(keys.appids) == r.hlen(keys.appidx) == len(sent) - len(news_trimmed)
    # the logs: fewer entries, and the same store and weights at every slot from the floor
    assert logs.feed_gone and logs.log_gone
    spec = spec_of(client.connection, mix)
    for slot in range(low, len(rows) + 10):
        assert _store_at(spec, feed_log(client.connection, mix), slot) == _store_at(
            spec, logs.feed(), slot
        )
        kept = [ws for at, ws in sorted(weight_log(client.connection, mix)) if at <= slot]
        whole = [ws for at, ws in sorted(logs.log()) if at <= slot]
        assert kept[-1:] == whole[-1:]
    # a trimmed position: done, its chunks gone; the pass's reset refused
    shown = client.task(mix, 0)
    assert (shown["state"], shown["chunks"]) == ("done", None)
    with pytest.raises(taskq.InvalidInput, match=f"trimmed below task {low}"):
        client.reset_pass(mix)
    assert [row["position"] for row in job.mix_sequence()][0] == low
    # a kept checkpoint's cut holds the watermark, and the rewind to it replays its slots
    ckpt = job.checkpoint()
    t.ack(held[0])
    feed(2)
    after = _lease_all(t)
    got += after
    assert logs.trim() == 0
    assert job.rewind(ckpt)
    assert logs.trim() == 0
    again = _lease_all(t)
    assert [(x.source, x.chunks) for x in again] == [
        (x.source, x.chunks) for x in [held[0], *after]
    ]  # (the rest of `held` was acked at the cut)
    job.checkpoint(keep=1)  # the first goes: its cut no longer holds the watermark
    while logs.trim():
        pass
    for _ in range(3):  # (the sweep of the kept cuts)
        logs.trim()
    assert job.mix_sequence() == []  # every position handed out is done and trimmed
    # a resend of the whole file adds nothing, trimmed or not (its record is per source)
    resent = client.job(mix).append(
        sent, ids=[f"n{c['i']}" for c in sent], feed=news, source="news.jsonl"
    )
    assert (resent.tasks, resent.skipped) == (0, len(sent))
    # leasing on: the reference's slots from the whole logs
    feed(4)
    got += _lease_all(t)
    job.seal(feed=news)
    got += _lease_until_completed(t)
    t.close()
    assert [(x.source, x.chunks[0]["i"]) for x in got] == logs.reference()
    assert client.status(mix).state == "completed"
    status = job.mix_status()
    ref = logs.reference()
    assert [row["acked"] for row in status["sources"]] == [
        sum(1 for s, _ in ref if s == source) for source in (news, web)
    ]
    assert client.audit(mix)["ok"]


def test_the_audit_of_a_trimmed_mix_still_finds_a_missing_copy(client):
    mix, news, _ = _stream_fed_mix(client, 10, 0.5, max_debt=2)
    feed, _ = _news_feeder(client, mix, news)
    feed(6)
    t = taskq.Trainer(mix, client=client)
    held = [t.lease(timeout=0) for _ in range(7)]
    t.ack(held[:6])
    assert client.job(mix).trim() == 6
    assert client.audit(mix)["ok"]
    pos = client.job(mix).mix_sequence()[0]  # the first position not trimmed: leased
    assert pos["position"] == held[6].id == 6
    field = copy_field(0 if pos["source"] == news else 1, pos["source_task"])
    assert client.redis.hdel(client.keys(mix).chunks, field) == 1
    audit = client.audit(mix)
    assert not audit["ok"] and not audit["checks"]["tasks_match_descriptors"]
    t.close()


def test_a_fixed_mix_is_not_trimmed(client):
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 4, "b": 4}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["a"]: 0.5, names["b"]: 0.5})
    _drain(client, mix)
    assert client.job(mix).trim() == 0
    assert client.redis.hlen(client.keys(mix).chunks) == 8


def test_a_stream_fed_mix_stays_bounded_across_feed_lease_ack_trim_cycles(client):
    # 20 cycles of 50 tasks fed, leased, acked and trimmed (with weight changes and a
    # checkpoint a cycle): every hash's fields and the logs' entries stay below a bound
    # that does not grow with the cycles.
    mix, news, web = _stream_fed_mix(client, 1, 0.9, max_debt=0)
    job, keys, r = client.job(mix), client.keys(mix), client.redis
    feed, _ = _news_feeder(client, mix, news)
    sizes = []
    with taskq.Trainer(mix, client=client, worker_id="w") as t:
        for cycle in range(20):
            for _ in range(5):  # five feeds a cycle: five entries of the feed log
                feed(10)
                _lease_all(t)
            job.set_weights({news: 0.9 - 0.01 * (cycle % 5), web: 0.1})
            job.checkpoint(keep=2)
            while job.trim():
                pass
            sizes.append(
                {
                    "chunks": r.hlen(keys.chunks),
                    "counts": r.hlen(keys.counts),
                    "leases": r.hlen(keys.leases),
                    "appids": r.hlen(keys.appids),
                    "appidx": r.hlen(keys.appidx),
                    "mixfeed": r.zcard(keys.mixfeed),
                    "mixlog": r.zcard(keys.mixlog),
                }
            )
    assert client.status(mix).trimmed > 900
    bound = {"chunks": 60, "counts": 60, "leases": 60, "appids": 60, "appidx": 60}
    bound |= {"mixfeed": 12, "mixlog": 4}
    for got in sizes:
        assert all(got[k] <= bound[k] for k in bound), (got, sizes)
    assert client.audit(mix)["ok"]


def test_the_trim_drops_the_repaid_slots_below_its_watermark(client):
    # A starving stream that owes slots (max_debt 2) repays them when fed: the repaid
    # slots are recorded (mixrepaid); once leased, acked and trimmed, those below the
    # watermark go with the positions, and the sequence from the watermark still says
    # which of its slots repaid (as it did before the trim).
    mix, news, web = _stream_fed_mix(client, 40, 0.5, max_debt=2)
    job, keys, r = client.job(mix), client.keys(mix), client.redis
    feed, _ = _news_feeder(client, mix, news)
    with taskq.Trainer(mix, client=client) as t:
        for _ in range(6):
            _lease_all(t)  # (news starves: web takes its slots, news owes them)
            feed(3)  # (repaid first)
        held = _lease_all(t, ack=False)  # (the last feed's slots held: the trim stops there)
        before = {row["slot"]: row["repaid"] for row in job.mix_sequence()}
        repaid = [int(s) for s in r.zrange(keys.mixrepaid, 0, -1)]
        assert repaid and all(before[s] for s in repaid)
        while job.trim():
            pass
        w = client.status(mix).trimmed
        assert w == held[0].id
        assert [s for s in repaid if s < w] and [s for s in repaid if s >= w]
        assert [int(s) for s in r.zrange(keys.mixrepaid, 0, -1)] == [s for s in repaid if s >= w]
        rows = job.mix_sequence()
        assert rows[0]["position"] == w
        assert {row["slot"]: row["repaid"] for row in rows} == {
            s: v for s, v in before.items() if s >= w
        }


def test_a_sharded_job_is_never_mixed_and_says_so(client):
    """The mix verbs on a sharded job are refused (their ROUTES line), and so is a mixed
    job over shards, with nothing written."""
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 4, "b": 4}, tag)
    sharded = f"{tag}-sh"
    client.create_job(sharded, [{"i": i} for i in range(4)], shards=2)
    job = client.job(sharded)
    for call in (
        lambda: job.set_weights({names["a"]: 1}),
        job.mix_sequence,
        job.mix_status,
    ):
        with pytest.raises(taskq.InvalidInput, match="is sharded, not a mixed job"):
            call()
    with pytest.raises(taskq.InvalidInput, match="no shards, stream or shuffle"):
        client.create_job(f"{tag}-m", mix={names["a"]: 1, names["b"]: 1}, shards=2)
    with pytest.raises(taskq.InvalidInput, match="sharded job"):
        client.create_job(f"{tag}-m", mix={names["a"]: 1, sharded: 1})
    assert not client.redis.exists(client.keys(f"{tag}-m").meta)
    assert f"{tag}-m" not in client.list_jobs()


def _checkpoint_at_100_leased_to_180(client):
    """A mixed job of 3 sources (150, 100, 50 tasks; weights 0.5, 0.3, 0.2), leased and
    acked to slot 100, a checkpoint there, then to 180: (its name, the sources' names, the
    checkpoint, slots 100..179)."""
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 150, "b": 100, "c": 50}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["a"]: 0.5, names["b"]: 0.3, names["c"]: 0.2})
    with taskq.Trainer(mix, client=client) as t:
        _lease_ack(t, 100)
        ckpt = client.job(mix).checkpoint()
        first = _lease_ack(t, 80)
    return mix, names, ckpt, first


def test_rewind_replays_the_same_slots(client):
    mix, names, ckpt, first = _checkpoint_at_100_leased_to_180(client)
    job = client.job(mix)
    # weights set now hold from slot 180, after everything charged: the replay keeps them
    assert job.set_weights({names["a"]: 0.1, names["b"]: 0.1, names["c"]: 0.8}) == 180
    assert job.rewind(ckpt)
    with taskq.Trainer(mix, client=client) as t:
        again = _lease_ack(t, 80)
        assert again == first
        rest = _lease_ack(t, 120)
    seq = _engine(client, mix)
    assert seq == _reference(client, mix)
    assert seq[100:180] == first and seq[180:] == rest
    assert client.status(mix).state == "completed"


def test_weights_set_after_a_rewind_hold_past_the_slots_handed_out_before_it(client):
    """A rewind moves the cursor back, not how far leases reached: weights set after it hold
    from slot 180, and the replay of 100..179 is the same (a reach read from the cursor
    alone fails it: next_slot 100)."""
    mix, names, ckpt, first = _checkpoint_at_100_leased_to_180(client)
    job = client.job(mix)
    assert job.rewind(ckpt)
    assert job.mix_status()["next_slot"] == 180
    assert job.set_weights({names["a"]: 0.1, names["b"]: 0.1, names["c"]: 0.8}) == 180
    with taskq.Trainer(mix, client=client) as t:
        assert _lease_ack(t, 80) == first
        _lease_ack(t, 120)
    assert _engine(client, mix) == _reference(client, mix)


def test_a_checkpoint_carries_the_position_and_a_policy_blob(client):
    """An online policy's state (opaque bytes, up to 64 KiB) goes with the checkpoint and
    comes back after a rewind with the same slots; a bigger blob is refused with nothing
    written; dropping the checkpoint drops its blob."""
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 30, "b": 30}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["a"]: 0.7, names["b"]: 0.3})
    job = client.job(mix)
    blob = bytes(range(256)) * 256  # 64 KiB, every byte value (NULs too)
    with taskq.Trainer(mix, client=client) as t:
        _lease_ack(t, 20)
        ckpt = job.checkpoint(keep=1, policy=blob)
        first = _lease_ack(t, 15)
    with pytest.raises(taskq.InvalidInput, match="at most 65536"):
        job.checkpoint(policy=blob + b"x")
    with pytest.raises(taskq.InvalidInput, match="policy must be bytes"):
        job.checkpoint(policy="text")  # type: ignore[arg-type]
    assert [c["id"] for c in job.checkpoints()] == [ckpt["id"]]
    assert ckpt["policy"] == len(blob)
    assert job.rewind(ckpt)
    assert job.checkpoint_policy(ckpt) == blob
    with taskq.Trainer(mix, client=client) as t:
        assert _lease_ack(t, 15) == first  # slots 20..34 again
    plain = job.checkpoint(keep=1)  # the first goes, its blob with it
    assert job.checkpoint_policy(plain) is None
    assert not client.redis.hexists(client.keys(mix).ckpt, f"{ckpt['id']}:policy")


def test_passes_replay_and_a_rewind_to_an_earlier_pass(client):
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 6, "b": 4}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["a"]: 0.5, names["b"]: 0.5}, passes=None)
    job = client.job(mix)
    with taskq.Trainer(mix, client=client) as t:
        p0 = _lease_ack(t, 10)
        ckpt = job.checkpoint()  # pass 1, position 0
        assert job.set_weights({names["a"]: 0.9, names["b"]: 0.1}, at=13) == 13
        p1 = _lease_ack(t, 10)
        _lease_ack(t, 10)  # pass 2
    assert _engine(client, mix, 0) == p0 == _reference(client, mix, 0)
    assert _engine(client, mix, 1) == p1 == _reference(client, mix, 1)
    assert p1[:3] == p0[:3] and p1 != p0  # the change holds from slot 13 (position 3)
    assert job.rewind(ckpt)
    with taskq.Trainer(mix, client=client) as t:
        assert _lease_ack(t, 10) == p1


# -- random interleavings of every verb on a real server ---------------------------------
WORKERS = ("w0", "w1", "w2")


class MixMachine(RuleBasedStateMachine):
    """Trainers join, lease, ack, fail, release and die (the manual clock), operators revoke,
    reset, checkpoint, rewind and set weights; after every step the stored sequence of the
    current pass is the reference recomputed from the weight log, and what a slot was
    never changes (but for later passes' slots after a weight change: the log remakes
    them)."""

    url = ""

    def __init__(self) -> None:
        super().__init__()
        self.client = taskq.connect(self.url)
        tag = f"mxsm{next(_ids)}"
        self.names = _sources(self.client, {"a": 7, "b": 5, "c": 3}, tag)
        self.mix = f"{tag}-mix"
        self.client.create_job(
            self.mix,
            mix={self.names["a"]: 0.5, self.names["b"]: 0.3, self.names["c"]: 0.2},
            passes=3,
            manual_clock=True,
            task_timeout=None,
        )
        self.job = self.client.job(self.mix)
        self.trainers: dict[str, taskq.Trainer] = {}
        self.held: dict[str, list[taskq.Task]] = {}
        self.seen: dict[int, list[tuple[str, int]]] = {}
        self.ckpts: list[dict] = []
        self.ended = False

    def _trainer(self, w: str) -> taskq.Trainer:
        if w not in self.trainers:
            self.trainers[w] = taskq.Trainer(
                self.mix, client=self.client, worker_id=w, heartbeat=False
            )
            self.held[w] = []
        return self.trainers[w]

    def _forget_leases(self) -> None:
        for w in self.held:
            self.held[w] = []

    @rule(w=st.sampled_from(WORKERS))
    def lease(self, w):
        try:
            task = self._trainer(w).lease(timeout=0)
        except (taskq.JobCompleted, taskq.JobCancelled):
            self.ended = True
            return
        if task is not None:
            self.held[w].append(task)

    @rule(w=st.sampled_from(WORKERS), n=st.integers(1, 8))
    def run(self, w, n):
        """A trainer takes and acks n tasks (a stretch of training)."""
        t = self._trainer(w)
        for _ in range(n):
            try:
                task = t.lease(timeout=0)
                if task is None:
                    return
                t.ack(task)
            except (taskq.JobCompleted, taskq.JobCancelled):
                self.ended = True
                return

    @rule(w=st.sampled_from(WORKERS), verb=st.sampled_from(["ack", "fail", "release"]))
    def end(self, w, verb):
        if not self.held.get(w):
            return
        task = self.held[w].pop(0)
        try:
            getattr(self.trainers[w], verb)(task)
        except taskq.LeaseLost:
            pass
        except (taskq.JobCompleted, taskq.JobCancelled):
            self.ended = True

    @rule(w=st.sampled_from(WORKERS))
    def die(self, w):
        """w stops heartbeating; the others beat while the clock passes its ttl; reap."""
        if w not in self.trainers:
            return
        dead = self.trainers.pop(w)
        self.held.pop(w)
        for _ in range(3):
            for t in self.trainers.values():
                t.heartbeat()
            self.job.advance_clock(2000)
        for t in self.trainers.values():
            t.heartbeat()
        self.job.reap()
        del dead  # (never closed: a SIGKILLed trainer leaves nothing behind)

    @rule(data=st.data())
    def revoke(self, data):
        held = [t for ts in self.held.values() for t in ts]
        if held:
            self.job.revoke(data.draw(st.sampled_from(held)).id)

    @rule(
        ws=st.lists(st.sampled_from(["0", "0.1", "0.5", "1", "3"]), min_size=3, max_size=3),
        ahead=st.integers(0, 20),
    )
    def set_weights(self, ws, ahead):
        if not any(float(w) > 0 for w in ws):
            return
        status = self.job.mix_status()
        at = status["next_slot"] + ahead
        got = self.job.set_weights(dict(zip(self.names.values(), ws, strict=True)), at=at)
        assert got == at
        for p in [p for p in self.seen if p > status["pass"]]:
            del self.seen[p]  # (a later pass left by a rewind: the log makes it again)

    @rule()
    def checkpoint(self):
        if self.client.status(self.mix).state in ("running", "waiting"):
            self.ckpts.append(self.job.checkpoint(keep=5))
            self.ckpts = self.ckpts[-5:]

    @rule(data=st.data())
    def rewind(self, data):
        if self.ckpts and not self.ended:
            try:
                self.job.rewind(data.draw(st.sampled_from(self.ckpts)))
            except taskq.InvalidInput as e:  # a pass whose sequence is no longer kept
                assert "no longer kept" in str(e)
                return
            self._forget_leases()

    @rule()
    def reset(self):
        if self.client.status(self.mix).state == "running":
            self.job.reset()
            self._forget_leases()

    @invariant()
    def sequence_is_the_reference(self):
        p = self.client.status(self.mix).pass_no
        got = _engine(self.client, self.mix, p)
        assert got == _reference(self.client, self.mix, p)[: len(got)]
        before = self.seen.get(p, [])
        assert got[: len(before)] == before[: len(got)]
        if len(got) >= len(before):
            self.seen[p] = got

    def teardown(self) -> None:
        for t in self.trainers.values():
            try:
                t.close()
            except taskq.TaskqError:
                pass
        self.client.delete_job(self.mix)


@pytest.fixture
def mix_machine(url):
    MixMachine.url = url
    return MixMachine


def test_mixed_job_under_random_interleavings(mix_machine):
    run_state_machine_as_test(
        mix_machine,
        settings=settings(
            max_examples=60,
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )


# -- the CLI -------------------------------------------------------------------------------
def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ENTRY_POINT, "--url", url, *args], capture_output=True, text=True, timeout=60
    )


def test_cli_create_set_status_export(url, client):
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 8, "b": 4}, tag)
    mix = f"{tag}-mix"
    r = _cli(url, "job", "create", mix, "--mix", f"{names['a']}=0.5,{names['b']}=0.5")
    assert r.returncode == 0, r.stderr
    assert "12 tasks" in r.stdout
    r = _cli(url, "mix", "set", mix, f"{names['a']}=3,{names['b']}=1", "--at", "4", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["slot"] == 4
    _drain(client, mix)
    r = _cli(url, "mix", "export", mix)
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["source"], x["source_task"]) for x in rows] == _reference(client, mix)
    r = _cli(url, "mix", "status", mix, "--json")
    st = json.loads(r.stdout)
    assert [(x["source"], x["weight"], x["acked"], x["pass"]) for x in st["sources"]] == [
        (names["a"], 3.0, 8, 0),
        (names["b"], 1.0, 4, 0),
    ]
    assert [x["samples"] for x in st["sources"]] == [None, None]  # chunks without a size
    r = _cli(url, "mix", "status", mix)
    assert r.returncode == 0, r.stderr
    header, *table = r.stdout.splitlines()[1:]
    # every column docs/mixing.md lists; a fixed source owes nothing
    assert header.split() == [
        "source",
        "weight",
        "charged",
        "acked",
        "samples",
        "tasks",
        "pass",
        "debt",
    ]
    assert [row.split() for row in table] == [
        [names["a"], "3", "8", "8", "?", "8", "0", "0"],
        [names["b"], "1", "4", "4", "?", "4", "0", "0"],
    ]


def test_cli_status_shows_a_starving_streams_debt_and_wait_and_export_the_repaid_slot(url, client):
    # max_debt=1, web (4 tasks) and an open stream news (1 task) at equal weights: slots
    # 0-2 are web, news, web; slot 3's pick is news with nothing: it owes the slot (web
    # takes it) and slot 4's pick of news, owing 1 already, waits. The status shows the
    # debt and the wait; once news is fed, slot 4 repays it: the export says so.
    tag = f"mx{next(_ids)}"
    web = _sources(client, {"web": 4}, tag)["web"]
    news = f"{tag}-news"
    client.create_job(news, [{"src": "news", "i": 0}], stream=True)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={web: 0.5, news: 0.5}, max_debt=1)
    with taskq.Trainer(mix, client=client) as t:
        for _ in range(4):
            task = t.lease(timeout=0)
            assert task is not None
            t.ack(task)
        assert t.lease(timeout=0) is None
        r = _cli(url, "mix", "status", mix)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[1].split()[-1] == "debt"
        assert [(row.split()[0], row.split()[-1]) for row in lines[2:4]] == [
            (web, "0"),
            (news, "1"),
        ]
        assert lines[4:] == [f"waits on {news} at slot 4"]
        st = json.loads(_cli(url, "mix", "status", mix, "--json").stdout)
        assert st["waits_on"] == {"source": news, "slot": 4}
        assert (st["high_water"], [x["debt"] for x in st["sources"]]) == (4, [0, 1])
        client.job(mix).append([{"src": "news", "i": 1}], feed=news)
        task = t.lease(timeout=0)
        assert task is not None and (task.source, task.chunks[0]["i"]) == (news, 1)
        t.ack(task)
    rows = [json.loads(line) for line in _cli(url, "mix", "export", mix).stdout.splitlines()]
    assert [(x["slot"], x["source"], x["repaid"]) for x in rows] == [
        (0, web, False),
        (1, news, False),
        (2, web, False),
        (3, web, False),
        (4, news, True),
    ]
    # (the charge went on: slot 5's pick of news, all taken again, owes it (web takes it,
    # its last); slot 6's waits)
    st = json.loads(_cli(url, "mix", "status", mix, "--json").stdout)
    assert (st["high_water"], [x["debt"] for x in st["sources"]]) == (6, [0, 1])
    assert st["waits_on"] == {"source": news, "slot": 6}
    assert _check_fed(client, mix, 0).deferred == [(3, 1), (5, 1)]  # (the reference's)


def test_a_trimmed_mix_skips_a_resent_file_and_the_cli_exports_from_the_watermark(url, client):
    # A producer that names its file (`source`, no ids) and resends it whole after its
    # copies were trimmed appends nothing (the file-source record is kept per source);
    # `taskq mix export` rows start at the watermark, stderr saying where; `taskq tasks
    # show` of a trimmed position says it is done, with no chunks.
    mix, news, _ = _stream_fed_mix(client, 4, 0.5, max_debt=0)
    chunks = [{"src": "news", "i": i} for i in range(3)]
    assert client.job(mix).append(chunks, feed=news, source="news.jsonl").tasks == 3
    t = taskq.Trainer(mix, client=client)
    held = _lease_all(t, ack=False)
    t.ack(held[:-1])
    assert client.job(mix).trim() == len(held) - 1
    again = client.job(mix).append(chunks, feed=news, source="news.jsonl")
    assert (again.tasks, again.skipped) == (0, 3)
    assert stores(client.connection, mix, spec_of(client.connection, mix))[0] == 3
    r = _cli(url, "mix", "export", mix)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["position"] for row in rows] == [held[-1].id]
    assert r.stderr.strip() == f"# trimmed below slot {held[-1].id}"
    r = _cli(url, "tasks", "show", mix, "0", "--json")
    assert r.returncode == 0, r.stderr
    assert (json.loads(r.stdout)["state"], json.loads(r.stdout)["chunks"]) == ("done", None)
    t.close()


def test_cli_errors_are_one_line(url, client):
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 2}, tag)
    sharded = f"{tag}-sh"
    client.create_job(sharded, [{"i": i} for i in range(4)], shards=2)
    stream = f"{tag}-stream"
    client.create_job(stream, [{"i": 0}], stream=True)
    for args in (
        ("mix", "set", names["a"], f"{names['a']}=1"),  # not a mixed job
        ("mix", "set", f"{tag}-none", "x=1"),  # no such job
        ("mix", "status", sharded),  # a sharded job is not a mixed job
        ("job", "create", f"{tag}-m", "--mix", f"{names['a']}=x"),  # a bad weight
        ("job", "create", f"{tag}-m", "--mix", f"{tag}-none=1"),  # no such source
        ("job", "create", f"{tag}-m", "--mix", f"{sharded}=1"),  # a sharded source
        # an open stream source under cycle
        ("job", "create", f"{tag}-m", "--mix", f"{stream}=1", "--on-exhausted", "cycle"),
        ("job", "create", f"{tag}-m", "--mix", f"{names['a']}=1", "--shards", "2"),  # sharded
        # weights counting samples, a source's tasks not saying their sizes
        ("job", "create", f"{tag}-m", "--mix", f"{names['a']}=1", "--mix-by", "samples"),
        ("job", "create", f"{tag}-m", "--mix", f"{names['a']}=1", "--mix-by", "rows"),
    ):
        r = _cli(url, *args)
        assert r.returncode != 0, (args, r.stdout, r.stderr)
        one_error_line(r.stderr)
        if "samples" in args:
            assert "does not say its size" in r.stderr, r.stderr
    assert not client.redis.exists(client.keys(f"{tag}-m").meta)


def test_a_rewind_to_a_pass_no_longer_kept_is_refused_with_nothing_changed(client):
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 2, "b": 2}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["a"]: 1, names["b"]: 1}, passes=None)
    job = client.job(mix)
    with taskq.Trainer(mix, client=client) as t:
        _lease_ack(t, 1)
        old = job.checkpoint()  # pass 0, position 1
        _lease_ack(t, 3 + 4 * 2 + 1)  # into pass 3: pass 0's sequence goes
        recent = job.checkpoint()  # pass 3, position 1
        assert _engine(client, mix, 0) == [] and len(_engine(client, mix, 1)) == 4
    before = client.status(mix)
    with pytest.raises(taskq.InvalidInput, match="no longer kept"):
        job.rewind(old)
    after = client.status(mix)
    assert (after.pass_no, after.done, after.state) == (before.pass_no, before.done, before.state)
    assert job.rewind(recent)


def test_a_rewind_to_the_start_of_a_pass_no_longer_kept_is_refused(client):
    """A cut at position 0 replays the whole pass: once that pass was charged and is no
    longer kept, its slots would come again from a trimmed log, so it is refused too; a cut
    at the start of the current pass, not charged yet, is not."""
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 2, "b": 2}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["a"]: 1, names["b"]: 1}, passes=None)
    job = client.job(mix)
    start = job.checkpoint()  # pass 0, position 0: nothing charged yet
    with taskq.Trainer(mix, client=client) as t:
        _lease_ack(t, 4 * 3)  # passes 0-2 done: pass 3 started, not charged
        assert client.status(mix).pass_no == 3
        now = job.checkpoint()  # pass 3, position 0
        _lease_ack(t, 1)  # pass 3 charged: pass 0's sequence goes
        assert _engine(client, mix, 0) == []
    before = client.status(mix)
    with pytest.raises(taskq.InvalidInput, match="no longer kept"):
        job.rewind(start)
    assert client.status(mix).done == before.done
    assert job.rewind(now)


def test_the_weight_log_stays_bounded(client):
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 3, "b": 2}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["a"]: 1, names["b"]: 1}, passes=None)
    job = client.job(mix)
    for k in range(50):  # nothing charged: every change at slot 0, the last wins
        assert job.set_weights({names["a"]: k % 3 + 1, names["b"]: 1}) == 0
    assert weight_log(client.connection, mix) == [(0, ["2.0", "1.0"])]
    with taskq.Trainer(mix, client=client) as t:
        for p in range(6):
            job.set_weights({names["a"]: p + 1, names["b"]: 1}, at=p * 5 + 2)
            _lease_ack(t, 5)
            assert _engine(client, mix, p) == _reference(client, mix, p)
        _lease_ack(t, 1)  # into pass 6: kept are passes 4..6, and the change in force at 20
    assert [at for at, _ in weight_log(client.connection, mix)] == [17, 22, 27]
    assert _engine(client, mix, 4) == _reference(client, mix, 4)


# -- the rules when a source runs out: cycle and stop (the reference, then lib/mixrule.lua) --
def _units(task_sizes, src: int, task: int) -> int:
    return 1 if task_sizes is None else task_sizes[src][task]


def _whole_pass_bound_ok(spec: MixSpec, log, slots: list[Slot], task_sizes=None) -> None:
    """``cycle`` and ``stop``: no source runs out inside a pass, so a segment starts only at
    the pass's first slot and at a logged change; in every prefix of every segment each
    source's count (slots, or samples with ``task_sizes``) is within the bound of ``w * m``,
    the weights renormalised over the sources of positive weight. Segments re-derived here
    from the log alone."""
    changes = {at for at, _ in log}
    most = None if task_sizes is None else sample_bound(task_sizes)
    counts, total, w = [0] * len(spec.sizes), 0, [0.0] * len(spec.sizes)
    for h, s in enumerate(slots):
        if h == 0 or s.slot in changes:
            weights = list(spec.weights)
            for _, (at, ws) in sorted(enumerate(log), key=lambda e: (e[1][0], e[0])):
                if at <= s.slot:
                    weights = list(ws)
            pos = sum(float(x) for x in weights if float(x) > 0)
            w = [float(x) / pos if float(x) > 0 else 0.0 for x in weights]
            counts, total = [0] * len(spec.sizes), 0
        step = _units(task_sizes, s.source, s.task)
        counts[s.source] += step
        total += step
        limit = bound(sum(1 for x in w if x > 0)) if most is None else most
        for i, c in enumerate(counts):
            assert abs(c - w[i] * total) <= limit + 1e-9 * (1 + total), (h, i, counts, w)


def _drawn_mix(data, rule: str, passes: int, by: str = "tasks"):
    """A spec of 1 to 5 sources (1 to 12 tasks each) under ``rule``, its weights changed up
    to 4 times over ``passes`` passes, and with ``by="samples"`` every task's size."""
    sizes = data.draw(st.lists(st.integers(1, 12), min_size=1, max_size=5))
    k = len(sizes)
    first, log = _weights_and_log(data, k, passes * sum(sizes))
    task_sizes = None
    if by == "samples":
        task_sizes = [
            data.draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)) for n in sizes
        ]
    spec = MixSpec(tuple(f"s{i}" for i in range(k)), tuple(sizes), first, rule, by)
    return spec, log, task_sizes


@settings(max_examples=200, deadline=None)
@given(data=st.data(), by=st.sampled_from(["tasks", "samples"]))
def test_cycle_takes_each_task_once_per_source_pass_within_the_bound(data, by):
    """``cycle``: every mixed pass is ``N`` slots; source ``i``'s ``j``-th slot over the
    job's life takes its task ``j mod n_i`` of source pass ``j div n_i``, so each source
    pass takes each task exactly once, in order, across mixed passes; every prefix of every
    segment of the whole pass is within the bound (slots, or the largest task by samples);
    the counts carried from pass to pass are the ones ``life_before`` makes from slot 0."""
    spec, log, task_sizes = _drawn_mix(data, "cycle", 3, by)
    life = [0] * len(spec.sizes)
    taken: list[list[tuple[int, int]]] = [[] for _ in spec.sizes]
    for p in range(3):
        assert life == life_before(spec, log, p, task_sizes)
        plan = plan_pass(spec, log, p, task_sizes=task_sizes, life=life)
        assert plan.end == "done" and len(plan.slots) == spec.total
        assert [s.slot for s in plan.slots] == list(range(p * spec.total, (p + 1) * spec.total))
        _whole_pass_bound_ok(spec, log, plan.slots, task_sizes)
        for s in plan.slots:
            taken[s.source].append((s.source_pass, s.task))
        h = data.draw(st.integers(0, spec.total - 1))
        assert slot_at(spec, log, plan.slots[h].slot, task_sizes=task_sizes) == plan.slots[h]
        life = plan.life
    for i, n in enumerate(spec.sizes):
        assert taken[i] == [(j // n, j % n) for j in range(len(taken[i]))]
        assert len(taken[i]) == life[i]


@settings(max_examples=200, deadline=None)
@given(data=st.data(), by=st.sampled_from(["tasks", "samples"]))
def test_stop_ends_the_pass_after_the_first_run_out_within_the_bound(data, by):
    """``stop``: the pass is the ``drop`` schedule up to the slot where a source of positive
    weight takes its last task, and ends after it; each task at most once in the pass, in
    order; every prefix within the bound; the next pass starts every source again at its
    first task."""
    spec, log, task_sizes = _drawn_mix(data, "stop", 2, by)
    for p in range(2):
        plan = plan_pass(spec, log, p, task_sizes=task_sizes)
        assert plan.end == "stop"
        drop = plan_pass(replace(spec, on_exhausted="drop"), log, p, task_sizes=task_sizes)
        given_ = [0] * len(spec.sizes)
        first_out = None
        for h, s in enumerate(drop.slots):
            given_[s.source] += 1
            if given_[s.source] == spec.sizes[s.source]:
                first_out = h
                break
        assert first_out is not None
        assert plan.slots == drop.slots[: first_out + 1]
        last = plan.slots[-1]
        weights = list(spec.weights)
        for _, (at, ws) in sorted(enumerate(log), key=lambda e: (e[1][0], e[0])):
            if at <= last.slot:
                weights = list(ws)
        assert float(weights[last.source]) > 0  # (a weight-0 source is never drawn here)
        for i in range(len(spec.sizes)):
            assert [s.task for s in plan.slots if s.source == i] == list(range(plan.taken[i]))
        _whole_pass_bound_ok(spec, log, plan.slots, task_sizes)


def test_cycle_and_stop_on_a_small_mix():
    """The two rules on sources of 2 and 6 tasks at 0.5 / 0.5: ``cycle`` gives the small
    one its second and third source passes inside the first mixed pass; ``stop`` ends the
    pass after the small one's second task (slots 0..3), and pass 1 starts again at task 0."""
    spec = MixSpec(("a", "b"), (2, 6), ("0.5", "0.5"), "cycle")
    plan = plan_pass(spec, [], 0)
    assert [(s.source, s.source_pass, s.task) for s in plan.slots] == [
        (0, 0, 0), (1, 0, 0), (0, 0, 1), (1, 0, 1),
        (0, 1, 0), (1, 0, 2), (0, 1, 1), (1, 0, 3),
    ]  # fmt: skip
    assert plan.life == [4, 4]
    nxt = plan_pass(spec, [], 1, life=plan.life)
    assert [(s.source, s.source_pass, s.task) for s in nxt.slots][:2] == [(0, 2, 0), (1, 0, 4)]
    stop = plan_pass(replace(spec, on_exhausted="stop"), [], 1)
    assert [(s.slot, s.source, s.task) for s in stop.slots] == [(8, 0, 0), (9, 1, 0), (10, 0, 1)]
    assert (stop.end, stop.taken) == ("stop", [2, 1])
    stop_spec = replace(spec, on_exhausted="stop")
    assert slot_at(stop_spec, [], 10) == Slot(10, 0, 1, 1)
    assert slot_at(stop_spec, [], 11) is None  # (slots 11..15: past pass 1's end)
    assert slot_at(spec, [], 12) == Slot(12, 0, 0, 3)  # cycle: a's 7th slot, source pass 3


def test_the_reference_refuses_what_it_does_not_define():
    with pytest.raises(taskq.InvalidInput, match="one of drop, cycle, stop"):
        plan_pass(MixSpec(("a",), (1,), ("1.0",), "later"), [], 0)
    with pytest.raises(taskq.InvalidInput, match="fixed size"):
        plan_pass(MixSpec(("a",), (1,), ("1.0",), "cycle", streams=(True,)), [], 0)
    with pytest.raises(taskq.InvalidInput, match="count tasks"):
        plan_pass(
            MixSpec(("a",), (1,), ("1.0",), by="samples", streams=(True,)), [], 0, task_sizes=[[1]]
        )
    with pytest.raises(taskq.InvalidInput, match="not a stream"):
        plan_pass(MixSpec(("a",), (1,), ("1.0",)), [], 0, feed=[Feed(0, 0, 3, False)])


# The rule's Lua (lib/mixrule.lua), run as it is by EVAL on the test server: a charge of a
# whole pass made of its functions, the way lib/mix.lua's charge is to call them (the
# choice, a scan up to 24 sources and a heap above, settle, choose_by_samples, segment, cycle_task, on_last, owed_first, defers).
_HARNESS = """
local R = (function() %s end)()
local a = cjson.decode(ARGV[1])
local n, k, rule, by = a.n, #a.n, a.rule, a.by == 'samples'
local every, huge = rule == 'cycle', 4503599627370496
local function weights_at(slot)
  local ws = a.w0
  for _, e in ipairs(a.log) do if e[1] <= slot then ws = e[2] end end
  local out = {}
  for i, x in ipairs(ws) do out[i] = tonumber(x) end
  return out
end
local function next_change(slot)
  for _, e in ipairs(a.log) do if e[1] > slot then return e[1] end end
  return -1
end
local o, flat, at = {}, {}, 0
for i = 1, k do
  o[i] = at
  at = at + n[i]
  if by then for j = 1, n[i] do flat[#flat + 1] = a.sizes[i][j] end end
end
local function size_of(id) return flat[id + 1] end
local t, c, debt, ran, avail, sealed, life = {}, {}, {}, {}, {}, {}, {}
for i = 1, k do
  t[i], c[i], debt[i], ran[i] = 0, 0, 0, false
  avail[i], sealed[i], life[i] = n[i], not a.streams[i], a.life[i]
end
local start, total = a.first, at
local limit = nil
if every then limit = total end
if a.length >= 0 and (not limit or a.length < limit) then limit = a.length end
local wn, nx = weights_at(start), next_change(start)
local rs, mseg, msamp, fi = true, 0, 0, 1
local act, w, d, ch = nil, nil, 0, nil
local out, defs = {}, {}
local function done(why, on, owed)
  return cjson.encode({slots = out, why = why, on = on or -1, defs = defs, debt = owed or debt})
end
while true do
  if limit and #out >= limit then
    if every and limit == total then return done('done') end
    return done('length')
  end
  local slot = start + #out
  while a.feed[fi] and a.feed[fi][1] <= slot do
    local f = a.feed[fi]
    avail[f[2] + 1], sealed[f[2] + 1] = f[3], f[4]
    fi = fi + 1
  end
  if not every then
    local all, stops = true, false
    for i = 1, k do
      if not ran[i] and sealed[i] and t[i] >= avail[i] then
        ran[i], debt[i] = true, 0
        if R.on_last(rule, wn[i]) == 'stop' then stops = true end
        rs = true
      end
      if not ran[i] then all = false end
    end
    if stops then return done('stop') end
    if all then return done('done') end
  end
  if nx >= 0 and slot >= nx then wn, nx, rs = weights_at(slot), next_change(slot), true end
  if rs then
    for i = 1, k do c[i] = 0 end
    rs, mseg, msamp, act = false, 0, 0, nil
  end
  local owed = R.owed_first(t, avail, debt)
  if owed then
    out[#out + 1] = {slot, owed - 1, t[owed], a.pass, 1}
    t[owed], debt[owed] = t[owed] + 1, debt[owed] - 1
  else
    if not act then
      local cap = {}  -- (a stream source open: no end yet)
      for i = 1, k do if ran[i] then cap[i] = 0 else cap[i] = huge end end
      if not every and not a.any_stream then cap = n end
      act, w, d = R.segment(t, cap, wn, every)
      if not by then ch = R.choice(act, c, w, d, mseg + 1) end
    end
    local best
    local undo_defs, undo_debt = #defs, {unpack(debt)}
    while true do
      if by then
        local tc = {}
        for i = 1, k do
          tc[i] = t[i]
          if every then tc[i] = R.cycle_task(life[i] + t[i], n[i]) end
        end
        best = R.choose_by_samples(w, c, tc, o, size_of, msamp, {})
      else
        best = R.choose(ch, act, mseg + 1)
      end
      if every or t[best] < avail[best] then break end
      if not R.defers(debt[best], a.max_debt) then
        for j = #defs, undo_defs + 1, -1 do defs[j] = nil end
        return done('wait', best - 1, undo_debt)
      end
      debt[best] = debt[best] + 1
      defs[#defs + 1] = {slot, best - 1}
      c[best], mseg = c[best] + 1, mseg + 1
      R.settle(ch, best, c[best], w[best], d, mseg)
    end
    local task, sp = life[best] + t[best], a.pass
    if every then task, sp = R.cycle_task(task, n[best]) end
    out[#out + 1] = {slot, best - 1, task, sp, 0}
    local step = 1
    if by then step = size_of(o[best] + task); msamp = msamp + step end
    c[best], t[best], mseg = c[best] + step, t[best] + 1, mseg + 1
    if not by then R.settle(ch, best, c[best], w[best], d, mseg) end
  end
end
"""


def _lua_plan(
    redis, spec: MixSpec, log, pass_no: int, *, task_sizes=None, life=None, feed=(), length=None
):
    """``plan_pass`` by lib/mixrule.lua's functions (``_HARNESS`` on the real server):
    (slots, why they end, the source waited on or None, the deferrals, the debts)."""
    text = (resources.files("taskq.engine") / "lua" / "lib" / "mixrule.lua").read_text()
    last: dict[int, list[str]] = {}
    for at, ws in log:  # (the last logged of a slot wins)
        last[at] = list(ws)
    k = len(spec.sizes)
    arg = {
        "n": list(spec.sizes),
        "rule": spec.on_exhausted,
        "by": spec.by,
        "w0": list(spec.weights),
        "log": [[at, last[at]] for at in sorted(last)],
        "sizes": [list(s) for s in task_sizes] if task_sizes is not None else [],
        "streams": list(spec.streams) if spec.streams else [False] * k,
        "any_stream": any(spec.streams),
        "max_debt": spec.max_debt,
        "life": list(life) if life is not None else [0] * k,
        "feed": [[f.slot, f.source, f.tasks, f.sealed] for f in sorted(feed, key=lambda f: f.slot)],
        "first": pass_no * spec.total,
        "pass": pass_no,
        "length": -1 if length is None else length,
    }
    got = json.loads(redis.eval(_HARNESS % text, 0, json.dumps(arg)))
    slots = [Slot(s, i, j, sp, bool(r)) for s, i, j, sp, r in (got["slots"] or [])]
    defs = [(s, i) for s, i in (got["defs"] or [])]
    return slots, got["why"], None if got["on"] < 0 else got["on"], defs, list(got["debt"] or [])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(),
    rule=st.sampled_from(["drop", "cycle", "stop"]),
    by=st.sampled_from(["tasks", "samples"]),
)
def test_lua_rule_functions_equal_the_reference(client, data, rule, by):
    """lib/mixrule.lua's functions, composed into a charge of whole passes, make the
    reference's slots for ``drop``, ``cycle`` and ``stop``, by tasks and by samples: the
    same comparisons in the same order, so the same floats decide."""
    spec, log, task_sizes = _drawn_mix(data, rule, 2, by)
    life = [0] * len(spec.sizes)
    for p in range(2):
        want = plan_pass(spec, log, p, task_sizes=task_sizes, life=life)
        slots, why, _, _, _ = _lua_plan(
            client.redis, spec, log, p, task_sizes=task_sizes, life=life
        )
        assert (slots, why) == (want.slots, want.end)
        if rule == "cycle":
            life = want.life


# -- stream sources: defer (max_debt) and wait (max_debt=0) ------------------------------
def _store_at(spec: MixSpec, feed: list[Feed], slot: int) -> tuple[list[int], list[bool]]:
    """Each source's store at ``slot`` by the feed log: its tasks, sealed or not."""
    avail, sealed = list(spec.sizes), [not s for s in spec.streams]
    for f in sorted(feed, key=lambda f: f.slot):
        if f.slot <= slot:
            avail[f.source], sealed[f.source] = f.tasks, f.sealed
    return avail, sealed


def _fed_mix(data, rule: str):
    """A spec of 2 to 4 sources, one or more of them streams (0 to 4 tasks at create), its
    weights changed up to 3 times, and a feed log made as an engine makes it: each append
    (or seal) is seen at a slot no later than the first the schedule has not charged."""
    k = data.draw(st.integers(2, 4))
    streams = tuple(data.draw(st.lists(st.booleans(), min_size=k, max_size=k).filter(any)))
    sizes = tuple(data.draw(st.integers(0 if s else 1, 4 if s else 10)) for s in streams)
    first, log = _weights_and_log(data, k, 40, changes=3)
    spec = MixSpec(
        tuple(f"s{i}" for i in range(k)),
        sizes,
        first,
        rule,
        streams=streams,
        max_debt=data.draw(st.integers(0, 3)),
    )
    feed: list[Feed] = []
    store = {i: (sizes[i], False) for i in range(k) if streams[i]}
    at = 0
    for _ in range(data.draw(st.integers(0, 8))):
        open_ = [i for i, (_, sealed) in store.items() if not sealed]
        if not open_:
            break
        i = data.draw(st.sampled_from(open_))
        tasks = store[i][0] + data.draw(st.integers(0, 4))
        sealed = data.draw(st.booleans())
        reached = len(plan_pass(spec, log, 0, feed=feed, length=200).slots)
        at = min(at + data.draw(st.integers(0, 6)), reached)
        feed.append(Feed(at, i, tasks, sealed))
        store[i] = (tasks, sealed)
    return spec, log, feed


@settings(max_examples=300, deadline=None)
@given(data=st.data(), rule=st.sampled_from(["drop", "stop"]))
def test_stream_sources_defer_repay_first_and_keep_the_owed_bound(data, rule):
    """A stream source with nothing in its store when the rule picks it owes the slot (up to
    ``max_debt``; beyond, and with ``max_debt=0`` at once, the slot waits on it); owed slots
    are repaid before the rule is asked, as soon as its store has a task. Checked from the
    slots, the deferrals and the feed log alone: each task at most once, in order, and only
    once in the store; a deferral only of a source with nothing; no slot to the rule while
    an owing source has a task; 0 <= debt <= max_debt; counting each deferral as its
    source's slot and each repaid slot as none, every prefix of every segment within the
    rule's bound; on the slots themselves, ``|c_i - w_i*m| <= bound + max_debt * streams``."""
    spec, log, feed = _fed_mix(data, rule)
    plan = plan_pass(spec, log, 0, feed=feed, length=200)
    k, streams = len(spec.sizes), sum(spec.streams)
    defs: dict[int, list[int]] = {}
    for s, i in plan.deferred:
        defs.setdefault(s, []).append(i)
    taken, debt, ran = [0] * k, [0] * k, [False] * k
    changes = {at for at, _ in log}
    restart, tokens, given_, w = True, 0, [0] * k, [0.0] * k
    slots_in_seg, actual, debt0 = 0, [0] * k, [0] * k
    ends = [s.slot for s in plan.slots] + ([plan.slots[-1].slot + 1] if plan.slots else [0])
    for h, slot in enumerate(sorted(set(ends))):
        avail, sealed = _store_at(spec, feed, slot)
        for i in range(k):
            if not ran[i] and sealed[i] and taken[i] >= avail[i]:
                ran[i], debt[i], restart = True, 0, True
        if slot in changes or restart:
            weights = list(spec.weights)
            for _, (at, ws) in sorted(enumerate(log), key=lambda e: (e[1][0], e[0])):
                if at <= slot:
                    weights = list(ws)
            pos = sum(float(weights[i]) for i in range(k) if not ran[i] and float(weights[i]) > 0)
            left = [i for i in range(k) if not ran[i]]
            w = [
                (float(weights[i]) / pos if float(weights[i]) > 0 else 0.0)
                if pos > 0
                else 1 / len(left)
                if i in left
                else 0.0
                for i in range(k)
            ]
            w = [w[i] if i in left else 0.0 for i in range(k)]
            restart, tokens, given_ = False, 0, [0] * k
            slots_in_seg, actual, debt0 = 0, [0] * k, list(debt)
        d = bound(sum(1 for x in w if x > 0))
        for i in defs.get(slot, []):
            assert taken[i] >= avail[i] and not sealed[i], "a deferral of a source with nothing"
            debt[i] += 1
            assert debt[i] <= spec.max_debt
            given_[i] += 1
            tokens += 1
            assert abs(given_[i] - w[i] * tokens) <= d + 1e-9
        if h >= len(plan.slots):
            break
        s = plan.slots[h]
        assert s.slot == slot and s.task == taken[s.source] < avail[s.source]
        owing = [i for i in range(k) if debt[i] > 0 and taken[i] < avail[i]]
        if s.repaid:
            assert owing and s.source == owing[0]
            debt[s.source] -= 1
        else:
            assert not owing, "owed slots are repaid before the rule is asked"
            given_[s.source] += 1
            tokens += 1
        taken[s.source] += 1
        actual[s.source] += 1
        slots_in_seg += 1
        for i in range(k):
            assert abs(given_[i] - w[i] * tokens) <= d + 1e-9, (slot, i)
            moved = (debt[i] - debt0[i]) - w[i] * sum(debt[j] - debt0[j] for j in range(k))
            assert abs(actual[i] + moved - w[i] * slots_in_seg) <= d + 1e-9 + 1e-9 * tokens
            limit = d + spec.max_debt * streams + 1e-9
            assert abs(actual[i] - w[i] * slots_in_seg) <= limit
    assert (taken, debt) == (plan.taken, plan.debt)
    if plan.end == "wait":  # (a slot that waits commits nothing: no deferral at it)
        i = plan.waits_on
        assert i is not None and spec.streams[i] and ends[-1] not in defs
        avail, sealed = _store_at(spec, feed, ends[-1])
        assert taken[i] >= avail[i] and not sealed[i] and debt[i] <= spec.max_debt
        assert not [j for j in range(k) if debt[j] > 0 and taken[j] < avail[j]]
        before = plan_pass(spec, log, 0, feed=feed, length=len(plan.slots))
        # (but a source run out at the waiting slot: its debt goes there, wait or not)
        ran_out = [sealed[j] and taken[j] >= avail[j] for j in range(k)]
        owed = [0 if ran_out[j] else before.debt[j] for j in range(k)]
        assert (before.deferred, owed) == (plan.deferred, plan.debt)
    elif plan.end == "done":
        assert all(ran)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), rule=st.sampled_from(["drop", "stop"]))
def test_a_stream_source_never_starved_changes_nothing(data, rule):
    """Stream sources whose stores are sealed and full from slot 0: the schedule is the one
    of the same sources of fixed size (no deferral, no wait)."""
    spec, log, _ = _drawn_mix(data, rule, 1)
    streams = tuple(
        data.draw(st.lists(st.booleans(), min_size=len(spec.sizes), max_size=len(spec.sizes)))
    )
    fed = replace(
        spec,
        sizes=tuple(0 if s else n for s, n in zip(streams, spec.sizes, strict=True)),
        streams=streams,
        max_debt=1,
    )
    feed = [Feed(0, i, n, True) for i, n in enumerate(spec.sizes) if streams[i]]
    plan = plan_pass(fed, log, 0, feed=feed)
    assert (plan.slots, plan.end, plan.deferred) == (
        plan_pass(spec, log, 0).slots,
        plan_pass(spec, log, 0).end,
        [],
    )


def test_defer_repays_first_and_wait_holds_the_slot():
    """Sources a (fixed, 6 tasks) and b (a stream, empty) at 0.5 / 0.5. ``max_debt=2``: b's
    first two picks are deferred (a takes slots 0..2), its third waits at slot 3; b's store
    gets 3 tasks seen at slot 3: slots 3 and 4 repay b, then the rule goes on. ``wait``
    (max_debt 0): slot 1 waits for b."""
    spec = MixSpec(("a", "b"), (6, 0), ("0.5", "0.5"), streams=(False, True), max_debt=2)
    plan = plan_pass(spec, [], 0)
    assert [(s.source, s.task) for s in plan.slots] == [(0, 0), (0, 1), (0, 2)]
    assert (plan.end, plan.waits_on, plan.deferred, plan.debt) == (
        "wait",
        1,
        [(1, 1), (2, 1)],
        [0, 2],
    )
    plan = plan_pass(spec, [], 0, feed=[Feed(3, 1, 3, True)])
    assert [(s.source, s.task, s.repaid) for s in plan.slots] == [
        (0, 0, False), (0, 1, False), (0, 2, False),
        (1, 0, True), (1, 1, True), (1, 2, False),  # b repaid twice, then the rule picks b
        (0, 3, False), (0, 4, False), (0, 5, False),  # b ran out (sealed): drop renormalises
    ]  # fmt: skip
    assert (plan.end, plan.debt) == ("done", [0, 0])
    wait = plan_pass(replace(spec, max_debt=0), [], 0)
    assert ([(s.source, s.task) for s in wait.slots], wait.end, wait.waits_on) == (
        [(0, 0)],
        "wait",
        1,
    )


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), rule=st.sampled_from(["drop", "stop"]))
def test_lua_rule_functions_equal_the_reference_with_stream_sources(client, data, rule):
    """The charge made of lib/mixrule.lua's functions (``owed_first``, ``defers``) on the
    same feed log: the same slots, end, source waited on, deferrals and debts."""
    spec, log, feed = _fed_mix(data, rule)
    want = plan_pass(spec, log, 0, feed=feed, length=200)
    got = _lua_plan(client.redis, spec, log, 0, feed=feed, length=200)
    assert got == (want.slots, want.end, want.waits_on, want.deferred, want.debt)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), by=st.sampled_from(["tasks", "samples"]))
def test_cycle_from_the_kept_log_and_each_sources_life_at_the_pass_start(data, by):
    """What a check after every step (MixedMachine) has of a ``cycle`` job in pass ``p``:
    the weight log the engine keeps (trimmed below the last 3 passes but for the change in
    force at their start, lib/mix.lua ``switch_to``) and each source's slots over the job's
    life at a kept pass's start (kept by the engine with the pass's state). From those
    alone, ``pass_schedule(..., life=...)`` makes every kept pass as the whole log does."""
    spec, log, task_sizes = _drawn_mix(data, "cycle", 6, by)
    p = data.draw(st.integers(3, 5))
    last: dict[int, list[str]] = {}
    for at, ws in log:
        last[at] = list(ws)
    cut = (p - 2) * spec.total
    below = [at for at in last if at <= cut]
    kept_log = [(at, last[at]) for at in sorted(last) if not below or at >= max(below)]
    for q in range(p - 2, p + 1):
        life = life_before(spec, log, q, task_sizes)
        want = list(pass_schedule(spec, log, q, task_sizes=task_sizes))
        assert list(pass_schedule(spec, kept_log, q, task_sizes=task_sizes, life=life)) == want


# -- the engine under cycle ----------------------------------------------------------------
def _drawn_engine_mix(client, data, by: str, rule: str):
    """A mixed job under ``rule`` of 1 to 5 drawn sources (their tasks' sizes: 1 each by
    tasks, 0 to 50 by samples), its weights changed up to 4 times over 3 passes; its
    sources' count, their tasks' sizes, names, the job's name, Job and spec."""
    k = data.draw(st.integers(1, 5))
    if by == "samples":
        task_sizes = data.draw(
            st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=9), min_size=k, max_size=k)
        )
    else:
        task_sizes = [
            [1] * n for n in data.draw(st.lists(st.integers(1, 9), min_size=k, max_size=k))
        ]
    total = sum(len(r) for r in task_sizes)
    first, changes = _weights_and_log(data, k, 3 * total, changes=4)
    tag = f"mx{next(_ids)}"
    names = _sized_sources(client, {f"s{i}": r for i, r in enumerate(task_sizes)}, tag)
    mix = f"{tag}-mix"
    client.create_job(
        mix,
        mix={names[f"s{i}"]: float(w) for i, w in enumerate(first)},
        mix_by=by,
        on_exhausted=rule,
        passes=3,
    )
    job = client.job(mix)
    for at, ws in changes:
        job.set_weights({names[f"s{i}"]: float(w) for i, w in enumerate(ws)}, at=at)
    spec = spec_of(client.connection, mix)
    assert spec.on_exhausted == rule
    return k, task_sizes, names, mix, job, spec


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), by=st.sampled_from(["tasks", "samples"]))
def test_engine_cycles_as_the_reference_across_passes(client, data, by):
    """``on_exhausted="cycle"`` in the engine (lib/mix.lua ``charge_page``: ``segment(...,
    true)``, ``cycle_task`` on each source's slots over the job's life, kept in the state):
    three passes drained by a trainer, weights changed inside and across pages, each pass's
    handed-out sequence, its leased tasks' chunks and each row's ``source_pass`` equal the
    reference's (``plan_pass`` with the life carried from the pass before), and each
    source pass takes each of its source's tasks once, in order."""
    k, task_sizes, names, mix, job, spec = _drawn_engine_mix(client, data, by, "cycle")
    total = sum(len(r) for r in task_sizes)
    sizes = task_sizes if by == "samples" else None
    life = [0] * k
    taken: list[list[tuple[int, int]]] = [[] for _ in range(k)]
    with taskq.Trainer(mix, client=client) as t:
        for p in range(3):
            got = []
            for _ in range(total):
                task = t.lease(timeout=1)
                assert task is not None and task.pass_no == p
                got.append((task.source, int(task.chunks[0]["path"].rsplit("/", 1)[1])))
                t.ack(task)
            log = weight_log(client.connection, mix)
            plan = plan_pass(spec, log, p, task_sizes=sizes, life=life)
            want = [(spec.sources[s.source], s.task) for s in plan.slots]
            assert got == want
            rows = job.mix_sequence(p)
            assert [(r["source"], r["source_task"], r["source_pass"]) for r in rows] == [
                (spec.sources[s.source], s.task, s.source_pass) for s in plan.slots
            ]
            for s in plan.slots:
                taken[s.source].append((s.source_pass, s.task))
            life = plan.life
    for i, r in enumerate(task_sizes):
        assert taken[i] == [(j // len(r), j % len(r)) for j in range(len(taken[i]))]
    assert client.status(mix).state == "completed"


# -- the engine under stop -----------------------------------------------------------------
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), by=st.sampled_from(["tasks", "samples"]))
def test_engine_stops_as_the_reference(client, data, by):
    """``on_exhausted="stop"`` in the engine (lib/mix.lua ``charge_page``: the charge ends
    after the slot where a source of positive weight takes its last task; meta 'mixe' the
    pass's length): three passes drained by a trainer, weights changed inside and across
    passes, each pass hands out exactly the reference's slots (``plan_pass``, its end
    ``stop`` or ``done``), its status says the pass's length, no slot past the stop is
    leased (the next lease is the next pass's first slot), and every source starts again
    at its first task in the next pass."""
    k, task_sizes, names, mix, job, spec = _drawn_engine_mix(client, data, by, "stop")
    sizes = task_sizes if by == "samples" else None
    with taskq.Trainer(mix, client=client) as t:
        for p in range(3):
            log = weight_log(client.connection, mix)
            plan = plan_pass(spec, log, p, task_sizes=sizes)
            assert plan.end in ("stop", "done")
            want = [(spec.sources[s.source], s.task) for s in plan.slots]
            got = []
            for i in range(len(want)):
                task = t.lease(timeout=1)
                assert task is not None and (task.pass_no, task.id) == (p, i)
                got.append((task.source, int(task.chunks[0]["path"].rsplit("/", 1)[1])))
                if i == len(want) - 1:
                    assert client.status(mix).tasks == len(want)
                t.ack(task)
            assert got == want
            assert _engine(client, mix, p) == want
    assert client.status(mix).state == "completed"


def test_cli_creates_a_stop_job_whose_pass_ends_at_the_stop(url, client):
    """``taskq job create --on-exhausted stop`` on docs/mixing.md's small mix (a of 2 tasks,
    b of 6, 0.5 / 0.5): each pass is a0 b0 a1 (a's last task ends it), the status says 3
    tasks once the pass is charged, the job completes after its 2 passes with b's other tasks never leased, and the
    second pass starts every source at its first task again."""
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 2, "b": 6}, tag)
    mix = f"{tag}-mix"
    mix_arg = f"{names['a']}=0.5,{names['b']}=0.5"
    r = _cli(url, "job", "create", mix, "--mix", mix_arg, "--on-exhausted", "stop",
             "--passes", "2")  # fmt: skip
    assert r.returncode == 0, r.stderr
    a, b = names["a"], names["b"]
    with taskq.Trainer(mix, client=client) as t:
        assert _lease_ack(t, 3) == [(a, 0), (b, 0), (a, 1)]
        assert client.status(mix).pass_no == 1
        # (the length is known once the charge, a page ahead of the leases, reaches the stop)
        assert _lease_ack(t, 1) == [(a, 0)]
        assert (client.status(mix).tasks, client.status(mix).todo) == (3, 2)
        assert _lease_ack(t, 2) == [(b, 0), (a, 1)]
    assert client.status(mix).state == "completed"
    assert _engine(client, mix, 1) == [(a, 0), (b, 0), (a, 1)]


def test_a_rewind_to_a_stopped_pass_replays_it_with_its_length(client):
    """A checkpoint inside a stop pass (a of 2 tasks, b of 6, 0.5 / 0.5: a0 b0 a1), the
    job on into the next pass, a rewind to the checkpoint: at once (before any lease
    charges again) the status counts the pass's 3 slots, not N = 8 (lib/mixslot.lua
    ``mix_rewound`` sets meta ``mixe`` from the kept pass's state), and the replay hands
    out the same slot and then the next pass."""
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 2, "b": 6}, tag)
    mix = f"{tag}-mix"
    a, b = names["a"], names["b"]
    client.create_job(mix, mix={a: 0.5, b: 0.5}, on_exhausted="stop", passes=2)
    job = client.job(mix)
    with taskq.Trainer(mix, client=client) as t:
        assert _lease_ack(t, 2) == [(a, 0), (b, 0)]
        ckpt = job.checkpoint()
        assert _lease_ack(t, 2) == [(a, 1), (a, 0)]  # (the last of pass 0, pass 1's first)
        assert client.status(mix).pass_no == 1
    assert job.rewind(ckpt)
    status = client.status(mix)
    assert (status.pass_no, status.tasks) == (0, 3)
    with taskq.Trainer(mix, client=client) as t:
        assert _lease_ack(t, 2) == [(a, 1), (a, 0)]
        assert client.status(mix).pass_no == 1


def test_inspect_of_a_position_past_the_stop_says_it_is_past_the_passs_end(url, client):
    """A stop pass (a of 2 tasks, b of 6, 0.5 / 0.5: a0 b0 a1, N = 8) has tasks 0-2:
    ``job.task``, ``taskq tasks show`` and ``job.revoke`` of positions 3-7, once the
    charge reached the stop, say the pass ended there (one line, exit 1), as for a task
    past ``N``; its own tasks answer as before, in this pass and the next."""
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 2, "b": 6}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["a"]: 0.5, names["b"]: 0.5}, on_exhausted="stop", passes=2)
    job = client.job(mix)
    with taskq.Trainer(mix, client=client) as t:
        assert _lease_ack(t, 1) == [(names["a"], 0)]  # (the charge reached the stop)
        assert client.status(mix).tasks == 3
        assert [job.task(k)["state"] for k in range(3)] == ["done", "todo", "todo"]
        assert job.task(0)["chunks"] == [{"src": "a", "i": 0}]
        for k in (3, 7):
            with pytest.raises(taskq.InvalidInput, match=f"no task {k} in pass 0: the pass"):
                job.task(k)
        with pytest.raises(taskq.InvalidInput, match="no task 8 "):
            job.task(8)
        with pytest.raises(taskq.InvalidInput, match="no task 4 in pass 0: the pass"):
            job.revoke(4)  # (it reads the task first)
        r = _cli(url, "tasks", "show", mix, "5")
        assert r.returncode == 1 and "Traceback" not in r.stderr
        line = one_error_line(r.stderr)
        assert "no task 5 in pass 0: the pass ended at the stop after 3 tasks (0-2)" in line
        assert _lease_ack(t, 3) == [(names["b"], 0), (names["a"], 1), (names["a"], 0)]
        assert job.task(0)["state"] == "done" and job.task(1)["state"] == "todo"
        with pytest.raises(taskq.InvalidInput, match="no task 3 in pass 1: the pass"):
            job.task(3)


def test_cli_creates_a_cycle_job_and_says_each_source_pass(url, client):
    """``taskq job create --on-exhausted cycle``: the small source comes round again inside
    the mixed pass (docs/mixing.md's small mix: a of 2 tasks and b of 6 at 0.5 / 0.5), the
    export says each slot's source pass and the status each source's;
    an unknown rule is refused with one line, nothing written."""
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 2, "b": 6}, tag)
    mix = f"{tag}-mix"
    mix_arg = f"{names['a']}=0.5,{names['b']}=0.5"
    r = _cli(url, "job", "create", mix, "--mix", mix_arg, "--on-exhausted", "cycle")
    assert r.returncode == 0, r.stderr
    with taskq.Trainer(mix, client=client) as t:
        got = _lease_ack(t, 8)
    a, b = names["a"], names["b"]
    assert got == [(a, 0), (b, 0), (a, 1), (b, 1), (a, 0), (b, 2), (a, 1), (b, 3)]
    r = _cli(url, "mix", "export", mix)
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["source"], x["source_task"], x["source_pass"]) for x in rows] == [
        (a, 0, 0), (b, 0, 0), (a, 1, 0), (b, 1, 0), (a, 0, 1), (b, 2, 0), (a, 1, 1), (b, 3, 0),
    ]  # fmt: skip
    st = json.loads(_cli(url, "mix", "status", mix, "--json").stdout)
    assert st["on_exhausted"] == "cycle"
    assert [(x["charged"], x["acked"], x["pass"]) for x in st["sources"]] == [(4, 4, 2), (4, 4, 0)]
    r = _cli(url, "job", "create", f"{tag}-m2", "--mix", mix_arg, "--on-exhausted", "loop")
    assert r.returncode != 0, r.stdout
    assert "'loop' is not one of 'drop', 'cycle', 'stop'" in one_error_line(r.stderr), r.stderr
    with pytest.raises(taskq.InvalidInput, match="on_exhausted must be one of drop, cycle, stop"):
        client.create_job(f"{tag}-m2", mix={a: 1}, on_exhausted="loop")
    assert not client.redis.exists(client.keys(f"{tag}-m2").meta)


def test_a_cycle_pass_left_early_carries_only_what_it_handed_out(client):
    """``cycle``: the whole pass is charged ahead of the leases (a page), but a pass forced
    on after 3 of its 8 slots hands out the rest never: the next pass starts each source
    where those 3 left it (``plan_pass(..., length=3).life``), not where the charged page
    ends, so each source pass still takes every task once, in order."""
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 2, "b": 6}, tag)
    mix = f"{tag}-mix"
    client.create_job(
        mix, mix={names["a"]: 0.5, names["b"]: 0.5}, on_exhausted="cycle", passes=2,
        auto_advance=False,
    )  # fmt: skip
    job = client.job(mix)
    with taskq.Trainer(mix, client=client) as t:
        first = _lease_ack(t, 3)
        client.next_pass(mix, force=True)
        second = _lease_ack(t, 8)
    spec = spec_of(client.connection, mix)
    life = plan_pass(spec, [], 0, length=3).life
    assert life == [2, 1]
    want = plan_pass(spec, [], 1, life=life).slots
    a, b = names["a"], names["b"]
    assert first == [(a, 0), (b, 0), (a, 1)]
    assert second == [(spec.sources[s.source], s.task) for s in want]
    assert second[:2] == [(a, 0), (b, 1)]  # b's source pass 0 goes on at its task 1
    assert [r["source_pass"] for r in job.mix_sequence(1)][:2] == [1, 0]
