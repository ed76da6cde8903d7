"""Mixed jobs (docs/mixing.md): the schedule's bound and once-per-pass in the reference
(taskq/mix.py), and a real server's sequence held to that reference whatever the
trainers do (join, lease, ack, fail, release, die, revoke), with weight changes at stated
slots, checkpoints and rewinds, the CLI, and taskq.torch over a mixed job."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskq
from taskq.admin.mix import spec_of, weight_log
from taskq.mix import MixSpec, bound, pass_schedule, weight_text

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


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    data=st.data(),
)
def test_reference_schedule_keeps_every_prefix_within_the_bound(sizes, data):
    k = len(sizes)
    first = data.draw(
        st.lists(weights_st, min_size=k, max_size=k).filter(
            lambda ws: any(float(w) > 0 for w in ws)
        )
    )
    spec = MixSpec(tuple(f"s{i}" for i in range(k)), tuple(sizes), tuple(first))
    changes = data.draw(
        st.lists(
            st.tuples(
                st.integers(0, sum(sizes) - 1),
                st.lists(weights_st, min_size=k, max_size=k).filter(
                    lambda ws: any(float(w) > 0 for w in ws)
                ),
            ),
            max_size=4,
        )
    )
    log = [(at, ws) for at, ws in changes]
    seq = list(pass_schedule(spec, log, 0))
    assert len(seq) == sum(sizes)
    _segments_ok(spec, log, seq)


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
    with pytest.raises(taskq.InvalidInput, match="not built"):
        client.create_job(f"{tag}-m2", mix={names["a"]: 1}, on_exhausted="cycle")
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
