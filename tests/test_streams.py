"""Jobs whose data keeps arriving: append, stream jobs, seal, backpressure, against a
real redis-server (docs/streams.md)."""

from __future__ import annotations

import threading
from functools import partial

import pytest
import support

import taskq
from taskq.engine.contract import APPEND_MAX

make_job = partial(
    support.make_job, manual_clock=True, worker_ttl=5.0, heartbeat_interval=1.0, task_timeout=None
)


def trainer(client: taskq.Client, job: str, wid: str, **kw: object) -> taskq.Trainer:
    return taskq.Trainer(job, client=client, worker_id=wid, heartbeat=False, **kw)  # type: ignore[arg-type]


def drain_tasks(t: taskq.Trainer) -> list[taskq.Task]:
    """Lease and ack whatever can be leased now (without waiting), in order."""
    acked = []
    try:
        while (task := t.lease(timeout=0)) is not None:
            t.ack(task)
            acked.append(task)
    except taskq.JobCompleted:
        pass
    return acked


def drain(t: taskq.Trainer) -> list[int]:
    """The ids ``drain_tasks`` acked."""
    return [task.id for task in drain_tasks(t)]


# -- append to any job -------------------------------------------------------------
def test_append_joins_the_current_pass_after_its_own_order(client, job_name):
    make_job(client, job_name, n=3)
    t = trainer(client, job_name, "w")
    first = t.lease(timeout=0)
    r = client.job(job_name).append([{"i": 3}, {"i": 4}])
    assert (r.tasks, r.skipped, r.first_task) == (2, 0, 3)
    t.ack(first)
    rest = drain(t)
    assert sorted([first.id, *rest]) == [0, 1, 2, 3, 4]
    assert rest[-2:] == [3, 4]  # appended tasks come after the pass's own order
    st = client.status(job_name)
    assert (st.state, st.tasks, st.appended, st.backlog) == ("completed", 5, 2, 0)


def test_append_with_shuffle_keeps_the_walked_positions(client, job_name):
    make_job(client, job_name, n=8, shuffle=True, seed=7, passes=2)
    t = trainer(client, job_name, "w")
    got = [t.lease(timeout=0) for _ in range(4)]
    for task in got:
        t.ack(task)
    client.job(job_name).append([{"i": k} for k in range(8, 12)])
    rest = drain(t)
    # pass 0: the 8 shuffled once each (none repeated by the order's growth), then 8..11
    assert sorted([g.id for g in got] + rest[: rest.index(8)]) == list(range(8))
    assert rest[rest.index(8) : rest.index(8) + 4] == [8, 9, 10, 11]
    # pass 1: all twelve in one shuffled order
    assert sorted(rest[rest.index(8) + 4 :]) == list(range(12))
    assert client.status(job_name).state == "completed"


def test_append_reopens_a_completed_job(client, job_name):
    make_job(client, job_name, n=2)
    t = trainer(client, job_name, "w")
    drain(t)
    assert client.status(job_name).state == "completed"
    client.job(job_name).append([{"late": 1}])
    st = client.status(job_name)
    assert (st.state, st.todo, st.backlog) == ("running", 1, 1)
    assert drain(t) == [2]
    assert client.status(job_name).state == "completed"
    assert client.audit(job_name)["ok"]


def test_append_groups_chunks_per_task_and_pages(client, job_name):
    make_job(client, job_name, n=1, chunks_per_task=3)
    chunks = [{"i": i} for i in range(2 * APPEND_MAX + 10)]
    r = client.job(job_name).append(chunks)
    assert r.tasks == -(-len(chunks) // 3)
    t = trainer(client, job_name, "w", prefetch=0)
    seen = [c for task in drain_tasks(t) for c in task.chunks]
    assert seen[1:] == chunks  # (after the create's one chunk)


def test_duplicate_ids_are_skipped(client, job_name):
    make_job(client, job_name, n=1)
    job = client.job(job_name)
    r1 = job.append([{"f": "a"}, {"f": "b"}], ids=["a", "b"])
    r2 = job.append([{"f": "b"}, {"f": "c"}, {"f": "c"}], ids=["b", "c", "c"])
    assert (r1.tasks, r1.skipped) == (2, 0)
    assert (r2.tasks, r2.skipped) == (1, 2)
    t = trainer(client, job_name, "w")
    assert sorted(x for task_id in drain(t) for x in [task_id]) == [0, 1, 2, 3]
    assert client.status(job_name).appended == 3


@pytest.mark.parametrize(
    ("chunks", "ids"),
    [
        ([{"a": object()}], None),
        ([{"a": float("nan")}], None),
        ({"a": 1}, None),
        ([{"a": 1}, {"a": 2}], ["only-one"]),
        ([{"a": 1}], [""]),
        ([{"a": 1}], [7]),
        ([{"a": 1}], "x"),
    ],
)
def test_bad_append_raises_one_line_and_writes_nothing(client, job_name, chunks, ids):
    make_job(client, job_name, n=1)
    keys = support.job_keys(client, job_name)
    before = {k: client.redis.dump(k) for k in keys}
    with pytest.raises(taskq.InvalidInput) as e:
        client.job(job_name).append(
            [{"ok": 1}] * 600 + chunks if isinstance(chunks, list) and ids is None else chunks,
            ids=ids,
        )
    assert "\n" not in str(e.value)
    assert {k: client.redis.dump(k) for k in keys} == before


def test_append_to_a_cancelled_job_is_refused(client, job_name):
    make_job(client, job_name, n=1)
    client.cancel_job(job_name)
    with pytest.raises(taskq.JobCancelled):
        client.job(job_name).append([{"a": 1}])


# -- stream jobs ------------------------------------------------------------------
def test_stream_pass_stays_open_until_sealed(client, job_name):
    client.create_job(job_name, chunks=[], stream=True, manual_clock=True, task_timeout=None)
    st = client.status(job_name)
    assert (st.state, st.tasks, st.stream) == ("running", 0, "open")
    t = trainer(client, job_name, "w")
    assert t.lease(timeout=0) is None
    job = client.job(job_name)
    job.append([{"i": 0}, {"i": 1}])
    assert drain(t) == [0, 1]
    st = client.status(job_name)
    assert (st.state, st.pass_no, st.backlog) == ("running", 0, 0)  # open: no pass end
    job.append([{"i": 2}])
    task = t.lease(timeout=0)
    assert job.seal() == 3
    assert client.status(job_name).state == "running"  # task 2 is not done yet
    with pytest.raises(taskq.InvalidInput, match="sealed"):
        job.append([{"i": 3}])
    t.ack(task)
    st = client.status(job_name)
    assert (st.state, st.stream, st.summaries[-1]["acked"]) == ("completed", "sealed", 3)
    assert client.audit(job_name)["ok"]


def test_seal_of_a_drained_stream_completes_it_at_once(client, job_name):
    client.create_job(job_name, chunks=[{"i": 0}], stream=True, manual_clock=True)
    t = trainer(client, job_name, "w")
    assert drain(t) == [0]
    assert client.status(job_name).state == "running"
    client.job(job_name).seal()
    assert client.status(job_name).state == "completed"
    with pytest.raises(taskq.JobCompleted):
        t.lease(timeout=0)


def test_seal_of_a_plain_job_is_refused(client, job_name):
    make_job(client, job_name, n=1)
    with pytest.raises(taskq.InvalidInput, match="not a stream"):
        client.job(job_name).seal()


def test_waiting_trainer_is_woken_by_an_append(client, job_name):
    client.create_job(job_name, chunks=[], stream=True)
    t = taskq.Trainer(job_name, client=client, worker_id="w")
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(t.lease(timeout=30)))
    waiter.start()
    support.wait_until(lambda: client.redis.zcard(client.keys(job_name).waiting) == 1)
    client.job(job_name).append([{"i": 0}])
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    assert got and got[0] is not None and got[0].id == 0
    t.ack(got[0])
    t.close()


# -- backpressure -------------------------------------------------------------------
def test_append_past_max_backlog_is_refused_without_blocking(client, job_name):
    client.create_job(job_name, chunks=[], stream=True, max_backlog=3, manual_clock=True)
    job = client.job(job_name)
    assert job.append([{"i": i} for i in range(3)]).backlog == 3
    before = client.status(job_name).tasks
    with pytest.raises(taskq.BacklogFull, match="max_backlog 3") as e:
        job.append([{"i": 3}], block=False)
    assert "\n" not in str(e.value)
    assert client.status(job_name).tasks == before
    t = trainer(client, job_name, "w")
    t.ack(t.lease(timeout=0))
    assert job.append([{"i": 3}], block=False).tasks == 1


def test_blocked_append_goes_in_when_trainers_ack(client, job_name):
    client.create_job(job_name, chunks=[], stream=True, max_backlog=2)
    job = client.job(job_name)
    job.append([{"i": 0}, {"i": 1}])
    done: list = []
    producer = threading.Thread(target=lambda: done.append(job.append([{"i": 2}], timeout=30)))
    producer.start()
    support.wait_until(lambda: client.redis.xlen(client.keys(job_name).events) > 0)
    assert producer.is_alive()
    t = taskq.Trainer(job_name, client=client, worker_id="w")
    t.ack(t.lease(timeout=1))
    producer.join(timeout=10)
    assert done and done[0].tasks == 1
    t.close()


def test_blocked_append_times_out_with_one_line(client, job_name):
    client.create_job(job_name, chunks=[], stream=True, max_backlog=1)
    job = client.job(job_name)
    job.append([{"i": 0}])
    with pytest.raises(taskq.BacklogFull, match="0 tasks appended before"):
        job.append([{"i": 1}], timeout=0.2)
