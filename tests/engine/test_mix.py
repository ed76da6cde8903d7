"""Mixed jobs (docs/mixing.md): the schedule's bound and once-per-pass in the reference
(taskq/mix.py), and a real server's sequence held to that reference whatever the
trainers do (join, lease, ack, fail, release, die, revoke), with weight changes at stated
slots, checkpoints and rewinds, and the CLI. Trainer processes, ``taskq work`` and
taskq.torch over a mixed job: test_mix_blackbox.py."""

from __future__ import annotations

import itertools
import json
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from support import ENTRY_POINT, one_error_line

import taskq
from taskq.admin.mix import spec_of, weight_log
from taskq.mix import MixSpec, bound, pass_schedule, sample_bound, weight_text

_ids = itertools.count()

weights_st = st.floats(min_value=0.0, max_value=10.0, allow_nan=False).map(
    lambda w: weight_text(round(w, 3))
)


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
            weights = list(spec.weights)
            # the change of the highest slot at or below pos; of one slot, the last logged
            for _, (at, ws) in sorted(enumerate(log), key=lambda e: (e[1][0], e[0])):
                if at <= pos:
                    weights = ws
            left = [i for i in range(k) if taken[i] < spec.sizes[i]]
            total = sum(float(weights[i]) for i in left if float(weights[i]) > 0)
            if total > 0:
                w = [
                    float(weights[i]) / total if i in left and float(weights[i]) > 0 else 0.0
                    for i in range(k)
                ]
            else:
                w = [1 / len(left) if i in left else 0.0 for i in range(k)]
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
            weights = list(spec.weights)
            for _, (at, ws) in sorted(enumerate(log), key=lambda e: (e[1][0], e[0])):
                if at <= pos:
                    weights = ws
            left = [i for i in range(k) if taken[i] < spec.sizes[i]]
            pos_w = sum(float(weights[i]) for i in left if float(weights[i]) > 0)
            w = [
                (float(weights[i]) / pos_w if float(weights[i]) > 0 else 0.0)
                if pos_w > 0
                else 1 / len(left)
                if i in left
                else 0.0
                for i in range(k)
            ]
            w = [w[i] if i in left else 0.0 for i in range(k)]
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


def test_a_dead_copy_retried_before_its_pass_charged_it_is_leased_in_its_slot(client):
    # Dead copies retried in the next pass before its charge reached them: no slot holds
    # them yet, so a retry of all makes them live and the charge leases them in their slots.
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"web": 6, "code": 4}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["web"]: 0.5, names["code"]: 0.5}, max_failures=1, passes=None)
    job = client.job(mix)
    with taskq.Trainer(mix, client=client) as t:
        for _ in range(10):
            task = t.lease(timeout=1)
            if task.id in (0, 7):
                t.fail(task, "poison")
            else:
                t.ack(task)
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
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"web": 600, "code": 400}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["web"]: 0.5, names["code"]: 0.5}, max_failures=1, passes=None)
    job = client.job(mix)
    with taskq.Trainer(mix, client=client) as t:
        for _ in range(301):
            task = t.lease(timeout=1)
            if task.id in (0, 300):
                t.fail(task, "poison")  # their copies are dead
            else:
                t.ack(task)
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
def test_engine_equals_the_reference_with_many_sources(client, data):
    # The engine picks a slot's source with a heap and buckets (lib/mix.lua, O(log k) a
    # slot), the reference with a scan of every source: the same sequence, page after page,
    # with weights of 0, near ties and changes logged inside a page and across pages.
    k = data.draw(st.integers(2, 64))
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
    with pytest.raises(taskq.InvalidInput, match="no appends"):
        job.append([{"x": 1}])


def _lease_ack(t: taskq.Trainer, n: int) -> list[tuple[str | None, int]]:
    out = []
    for _ in range(n):
        task = t.lease(timeout=1)
        assert task is not None
        out.append((task.source, task.chunks[0]["i"]))
        t.ack(task)
    return out


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
    # every column docs/mixing.md lists; no debt (a stream source's: not built)
    assert header.split() == ["source", "weight", "charged", "acked", "samples", "tasks", "pass"]
    assert [row.split() for row in table] == [
        [names["a"], "3", "8", "8", "?", "8", "0"],
        [names["b"], "1", "4", "4", "?", "4", "0"],
    ]


def test_cli_errors_are_one_line(url, client):
    tag = f"mx{next(_ids)}"
    names = _sources(client, {"a": 2}, tag)
    sharded = f"{tag}-sh"
    client.create_job(sharded, [{"i": i} for i in range(4)], shards=2)
    for args in (
        ("mix", "set", names["a"], f"{names['a']}=1"),  # not a mixed job
        ("mix", "set", f"{tag}-none", "x=1"),  # no such job
        ("mix", "status", sharded),  # a sharded job is not a mixed job
        ("job", "create", f"{tag}-m", "--mix", f"{names['a']}=x"),  # a bad weight
        ("job", "create", f"{tag}-m", "--mix", f"{tag}-none=1"),  # no such source
        ("job", "create", f"{tag}-m", "--mix", f"{sharded}=1"),  # a sharded source
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
