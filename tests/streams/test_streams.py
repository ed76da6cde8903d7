"""Jobs whose data keeps arriving: append, stream jobs, seal, backpressure, against a
real redis-server (docs/streams.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
import support
from click.testing import CliRunner, Result
from taskq.cli.main import cli
from torch_helpers import jsonl_reader, rows_of, write_jsonl

import taskq
import taskq.torch
from taskq.admin.jobs import Job
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


def test_append_refuses_a_completed_job_and_leaves_it_as_it_was(client, job_name):
    """An append never reopens a job (the producer's credential writes no state): on a
    completed job it is refused, readably, with nothing written; a resend of chunks
    appended before adds nothing and says so."""
    make_job(client, job_name, n=2)
    job = client.job(job_name)
    job.append([{"early": 1}], ids=["e"])
    t = trainer(client, job_name, "w")
    drain(t)
    before = client.status(job_name)
    assert (before.state, before.tasks) == ("completed", 3)
    with pytest.raises(taskq.InvalidInput, match="append does not reopen it; reopen needs"):
        job.append([{"late": 1}], ids=["l"])
    after = client.status(job_name)
    assert (after.state, after.tasks, after.todo, after.appended) == ("completed", 3, 0, 1)
    assert after.counters == before.counters
    r = job.append([{"early": 1}], ids=["e"])  # already in: nothing to reopen for
    assert (r.tasks, r.skipped) == (0, 1)
    assert client.audit(job_name)["ok"]


def test_append_refuses_a_job_waiting_at_a_manual_boundary_until_its_owner_advances(
    client, job_name
):
    make_job(client, job_name, n=2, passes=2, auto_advance=False)
    job = client.job(job_name)
    t = trainer(client, job_name, "w")
    drain(t)
    assert (client.status(job_name).state, client.status(job_name).reason) == (
        "waiting",
        "manual_advance",
    )
    with pytest.raises(taskq.InvalidInput, match="manual_advance.*taskq pass next"):
        job.append([{"late": 1}])
    assert client.status(job_name).tasks == 2
    job.next(expected_pass=0)
    assert job.append([{"late": 1}]).tasks == 1
    assert sorted(drain(t)) == [0, 1, 2]
    assert client.status(job_name).state == "completed"
    assert client.audit(job_name)["ok"]


def test_append_writes_no_meta_field_and_leaves_a_silence_to_the_jobs_next_call(client, job_name):
    """Append opens the job reading only (the producer's credential writes no meta
    field): not even the silence rule's stamp; the counts go to the appended record. A
    silence the append saw is the next call's to see, whole."""
    client.create_job(
        job_name, [], stream=True, manual_clock=True, worker_ttl=5.0, heartbeat_interval=1.0
    )
    keys = client.keys(job_name)
    t = trainer(client, job_name, "w")
    job = client.job(job_name)
    job.append([{"i": 0}], ids=["a"], source="f")
    job.advance_clock(10_000, silent=True)  # a silence: longer than ttl - interval
    meta = client.redis.hgetall(keys.meta)
    r = job.append([{"i": 1}, {"i": 2}, {"i": 0}], ids=["b", "c", "a"], source="g")
    assert (r.tasks, r.skipped) == (2, 1)
    assert client.redis.hgetall(keys.meta) == meta
    assert client.redis.hgetall(keys.appended) == {
        "tasks": "3",
        "chunks": "3",
        "dup": "1",
        "src_seq": "2",
    }
    st = client.status(job_name)
    assert (st.tasks, st.appended, st.config["chunks"]) == (3, 3, 3)
    t.lease(timeout=0)
    assert int(client.redis.hget(keys.meta, "offset")) == 10_000  # the lease saw it whole


def test_replace_and_delete_drop_the_appended_record(client, job_name):
    make_job(client, job_name, n=1)
    client.job(job_name).append([{"i": 1}, {"i": 2}])
    keys = client.keys(job_name)
    assert client.redis.hget(keys.appended, "tasks") == "2"
    make_job(client, job_name, n=1, replace=True)
    assert not client.redis.exists(keys.appended)
    assert client.status(job_name).tasks == 1
    assert client.audit(job_name)["ok"]
    client.delete_job(job_name)
    assert support.job_keys(client, job_name) == []


def test_audit_sees_an_appended_record_that_disagrees_with_the_descriptors(client, job_name):
    """The appended record is the producer's to write (docs/security.md): one it padded
    or lowered is seen by the audit, and never hides the create's tasks."""
    make_job(client, job_name, n=2)
    client.job(job_name).append([{"i": 2}])
    keys = client.keys(job_name)
    client.redis.hincrby(keys.appended, "tasks", 5)
    audit = client.audit(job_name)
    assert not audit["ok"] and not audit["checks"]["tasks_match_descriptors"]
    client.redis.hset(keys.appended, "tasks", -100)
    assert client.status(job_name).tasks == 2  # never below the create's
    # an append over a task that exists is refused, nothing written
    with pytest.raises(taskq.InvalidInput, match="task 2 exists"):
        client.job(job_name).append([{"i": 9}])
    assert json.loads(client.redis.hget(keys.chunks, "2")) == [{"i": 2}]
    client.redis.hset(keys.appended, "tasks", 1)
    assert client.audit(job_name)["checks"]["tasks_match_descriptors"]


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


def test_duplicate_ids_with_chunks_per_task_group_the_new_chunks(client, job_name):
    client.create_job(job_name, chunks=[], stream=True, chunks_per_task=2, manual_clock=True)
    job = client.job(job_name)
    job.append([{"c": 0}, {"c": 1}], ids=["0", "1"])
    r = job.append([{"c": 1}, {"c": 2}, {"c": 3}, {"c": 4}], ids=["1", "2", "3", "4"])
    assert (r.tasks, r.skipped, r.first_task) == (2, 1, 1)  # [2, 3] and [4]
    t = trainer(client, job_name, "w")
    assert [task.chunks for task in drain_tasks(t)] == [
        [{"c": 0}, {"c": 1}],
        [{"c": 2}, {"c": 3}],
        [{"c": 4}],
    ]
    assert client.status(job_name).config["chunks"] == 5


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
    assert support.wait_until(lambda: client.redis.zcard(client.keys(job_name).waiting) == 1)
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
    assert support.wait_until(lambda: client.redis.xlen(client.keys(job_name).events) > 0)
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


# -- every verb meets an appended task -------------------------------------------------
def test_appended_tasks_fail_expire_revoke_and_retry_like_any(client, job_name):
    client.create_job(
        job_name, chunks=[], stream=True, manual_clock=True, task_timeout=None, max_failures=1
    )
    job = client.job(job_name)
    job.append([{"i": i} for i in range(4)])
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    t0 = a.lease(timeout=0)
    a.fail(t0, "bad")  # max_failures=1: dead
    assert client.status(job_name).dead == 1
    t1 = a.lease(timeout=0)
    assert client.revoke(job_name, t1.id)  # back to the front
    with pytest.raises(taskq.LeaseLost):
        a.ack(t1)
    t2 = b.lease(timeout=0)
    assert t2.id == t1.id  # the front first
    t3 = a.lease(timeout=0)
    for _ in range(2):  # a stops calling; b heartbeats: a is lost after its ttl
        client.advance_clock(job_name, 3000)
        b.heartbeat()
    client.reap(job_name)
    with pytest.raises(taskq.LeaseLost):
        a.ack(t3)
    b.ack(t2)
    assert client.retry(job_name) == 1
    assert sorted(drain(b)) == [0, 2, 3]
    st = client.status(job_name)
    assert (st.state, st.done, st.dead, st.backlog) == ("running", 4, 0, 0)
    job.seal()
    assert client.status(job_name).state == "completed"
    assert client.audit(job_name)["ok"]


def test_reset_and_forced_advance_take_appended_tasks_along(client, job_name):
    make_job(client, job_name, n=2, passes=3, shuffle=True)
    job = client.job(job_name)
    t = trainer(client, job_name, "w")
    t.ack(t.lease(timeout=0))
    job.append([{"i": 2}, {"i": 3}])
    client.reset_pass(job_name)  # the attempt again, over all four, in one order
    assert sorted(drain_tasks_one_pass(t, client, job_name, 0)) == [0, 1, 2, 3]
    job.append([{"i": 4}])
    t.ack(t.lease(timeout=0))
    client.next_pass(job_name, force=True)
    st = client.status(job_name)
    assert (st.pass_no, st.todo, st.tasks) == (2, 5, 5)
    assert sorted(drain(t)) == [0, 1, 2, 3, 4]
    assert client.audit(job_name)["ok"]


def drain_tasks_one_pass(t: taskq.Trainer, client: taskq.Client, job: str, p: int) -> list[int]:
    """Ack what pass ``p`` hands out; the ids."""
    out = []
    while client.status(job).pass_no == p and (task := t.lease(timeout=0)) is not None:
        t.ack(task)
        out.append(task.id)
    return out


def test_pause_holds_appended_tasks_and_cancel_ends_the_stream(client, job_name):
    client.create_job(job_name, chunks=[], stream=True, manual_clock=True)
    job = client.job(job_name)
    client.pause_job(job_name)
    job.append([{"i": 0}])
    t = trainer(client, job_name, "w")
    assert t.lease(timeout=0) is None
    client.resume_job(job_name)
    task = t.lease(timeout=0)
    assert task.id == 0
    client.cancel_job(job_name)
    with pytest.raises(taskq.JobCancelled):
        job.append([{"i": 1}])
    with pytest.raises(taskq.LeaseLost):
        t.ack(task)


def test_checkpoint_holds_the_append_position_and_rewind_keeps_later_appends(client, job_name):
    client.create_job(job_name, chunks=[], stream=True, manual_clock=True, task_timeout=None)
    job = client.job(job_name)
    job.append([{"i": i} for i in range(4)])
    t = trainer(client, job_name, "w")
    first = [t.lease(timeout=0), t.lease(timeout=0)]
    for task in first:
        t.ack(task)
    rec = client.checkpoint(job_name)
    assert (rec["tasks"], rec["done"]) == (4, 2)
    t.ack(t.lease(timeout=0))
    job.append([{"i": 4}, {"i": 5}])  # after the cut: never done at it, still to train
    assert client.rewind(job_name, rec)
    st = client.status(job_name)
    assert (st.done, st.tasks, st.todo, st.stream) == (2, 6, 4, "open")
    assert sorted(drain(t)) == [2, 3, 4, 5]
    job.seal()
    assert client.status(job_name).state == "completed"
    assert client.audit(job_name)["ok"]


# -- trimming behind the watermark ------------------------------------------------------
def _fields(client: taskq.Client, job: str) -> dict[str, int]:
    keys = client.keys(job)
    r = client.redis
    return {
        "chunks": r.hlen(keys.chunks),
        "appids": r.hlen(keys.appids),
        "appidx": r.hlen(keys.appidx),
        "appends": r.zcard(keys.appends),
        "leases": r.hlen(keys.leases),
    }


def test_trim_drops_the_done_prefix_and_stops_at_a_task_not_done(client, job_name):
    client.create_job(job_name, chunks=[], stream=True, manual_clock=True, task_timeout=None)
    job = client.job(job_name)
    for k in range(3):  # three appends of 4 tasks, with ids
        ids = [f"c{k}-{i}" for i in range(4)]
        job.append([{"id": i} for i in ids], ids=ids)
    t = trainer(client, job_name, "w")
    held = [t.lease(timeout=0) for _ in range(7)]
    t.ack([task for task in held if task.id != 5])  # 0-4 and 6 done, 5 held
    assert job.trim() == 5  # the watermark stops at task 5, not done
    assert job.trim() == 0
    st = client.status(job_name)
    assert (st.trimmed, st.done, st.tasks, st.backlog) == (5, 6, 12, 6)
    f = _fields(client, job_name)
    assert (f["chunks"], f["appids"], f["appidx"]) == (7, 7, 7)
    assert f["appends"] == 2  # the first append is wholly below the watermark
    assert client.task(job_name, 2)["chunks"] is None  # trimmed: done, its descriptor gone
    assert client.task(job_name, 2)["state"] == "done"
    t.ack(held[5])
    assert sorted(drain(t)) == list(range(7, 12))
    assert job.trim() == 7
    assert _fields(client, job_name) == {
        "chunks": 0,
        "appids": 0,
        "appidx": 0,
        "appends": 1,
        "leases": 0,
    }
    # an id trimmed with its task is not remembered: what is still above the watermark is
    ids = ["c2-3", "late"]
    assert job.append([{"id": i} for i in ids], ids=ids).tasks == 2
    job.seal()
    assert sorted(drain(t)) == [12, 13]
    assert client.status(job_name).state == "completed"
    assert client.audit(job_name)["ok"]


def test_trim_keeps_what_a_kept_checkpoint_can_rewind_to(client, job_name):
    client.create_job(job_name, chunks=[], stream=True, manual_clock=True, task_timeout=None)
    job = client.job(job_name)
    job.append([{"i": i} for i in range(8)])
    t = trainer(client, job_name, "w")
    t.ack([t.lease(timeout=0) for _ in range(3)])
    rec = client.checkpoint(job_name)  # its cut: tasks 0-2 done
    t.ack([t.lease(timeout=0) for _ in range(3)])
    assert job.trim() == 3  # not past the cut's lowest task not done
    assert client.rewind(job_name, rec)
    assert sorted(drain(t)) == [3, 4, 5, 6, 7]  # every task the rewind made todo has its chunks
    job.seal()
    assert client.status(job_name).state == "completed"
    assert client.audit(job_name)["ok"]


def _hgets(client: taskq.Client) -> int:
    return int(client.redis.info("commandstats").get("cmdstat_hget", {}).get("calls", 0))


def test_a_trim_step_reads_a_bounded_number_of_checkpoints_however_many_are_kept():
    """1,001 checkpoints of a stream at keep 1,000 (the last seal drops the first): each
    trim step reads at most SWEEP_STEP (25) checkpoint records, in the sweep that makes
    the kept cuts' bound again (lib/cuts.lua), and a handful once it is made; the
    watermark never passes the lowest kept cut meanwhile and reaches it once the sweep
    ends. Counted in the server's commandstats (each record is one HGET), on a private
    server: before the bound, every step read the 1,000 records."""
    server = support.RedisServer()
    try:
        client = taskq.connect(server.url)
        name = "ckpts"
        client.create_job(name, chunks=[], stream=True, manual_clock=True, task_timeout=None)
        job = client.job(name)
        job.append([{"i": i} for i in range(1100)])
        t = trainer(client, name, "w")
        for k in range(1001):  # checkpoint k: its cut's lowest task not done is k
            client.checkpoint(name, keep=1000, ckpt=f"c{k:04d}")
            t.ack(t.lease(timeout=0))
        reads, trimmed = [], []
        while not trimmed or trimmed[-1] == 0:
            before = _hgets(client)
            trimmed.append(job.trim(steps=1))
            reads.append(_hgets(client) - before)
            assert len(reads) < 100, reads
        assert max(reads) <= 25 + 10, reads
        assert len(reads) >= 1000 // 25  # the sweep read every kept one, 25 a step
        assert trimmed[-1] == 1  # up to the lowest kept cut's (c0001's) lowest task
        before = _hgets(client)
        assert job.trim(steps=1) == 0
        assert _hgets(client) - before <= 10
        assert client.rewind(name, "c0001")
        assert sorted(drain(t)) == list(range(1, 1100))  # each with its descriptor
        t.close()
    finally:
        server.cleanup()


def test_a_stream_checkpointed_before_the_bound_is_trimmed_once_a_sweep_read_its_checkpoints(
    client, job_name
):
    """A stream whose kept checkpoints have no bound (one made before it, modelled by
    removing the field): the watermark waits while trim steps sweep them, then moves up
    to their lowest cut, no further."""
    client.create_job(job_name, chunks=[], stream=True, manual_clock=True, task_timeout=None)
    job = client.job(job_name)
    job.append([{"i": i} for i in range(100)])
    t = trainer(client, job_name, "w")
    for k in range(60):
        client.checkpoint(job_name, keep=100, ckpt=f"c{k:02d}")
        t.ack(t.lease(timeout=0))
    t.ack([t.lease(timeout=0) for _ in range(20)])
    client.redis.hdel(client.keys(job_name).ckpt, ":bound")
    # 60 records: 3 steps of 25, then the bound holds at c00's cut (task 0 was not done)
    assert [job.trim(steps=1) for _ in range(4)] == [0, 0, 0, 0]
    client.checkpoint(job_name, keep=60, ckpt="last")  # c00 goes: the bound is swept again
    while (step := job.trim(steps=1)) == 0:
        pass
    assert step == 1 and client.status(job_name).trimmed == 1  # c01's lowest task
    t.close()


def test_trim_leaves_plain_jobs_and_earlier_passes_alone_and_reset_is_refused_after(
    client, job_name
):
    client.create_job(job_name + "p", chunks=[{"i": 0}], manual_clock=True)
    t = trainer(client, job_name + "p", "w")
    drain(t)
    assert client.job(job_name + "p").trim() == 0  # not a stream
    client.create_job(job_name, chunks=[], stream=True, passes=2, manual_clock=True)
    job = client.job(job_name)
    job.append([{"i": i} for i in range(3)])
    t = trainer(client, job_name, "v")
    t.ack([t.lease(timeout=0) for _ in range(2)])
    assert job.trim() == 0  # pass 0 of 2: pass 1 reads every task again
    client.create_job(job_name + "r", chunks=[], stream=True, manual_clock=True)
    job = client.job(job_name + "r")
    job.append([{"i": i} for i in range(3)])
    t = trainer(client, job_name + "r", "u")
    t.ack(t.lease(timeout=0))
    assert job.trim() == 1
    with pytest.raises(taskq.InvalidInput, match="trimmed below task 1"):
        client.reset_pass(job_name + "r")


def test_the_reaper_trims_a_stream(url, client, job_name):
    from taskq.ops.reaper import Reaper

    client.create_job(job_name, chunks=[], stream=True, manual_clock=True)
    client.job(job_name).append([{"i": i} for i in range(5)])
    t = trainer(client, job_name, "w")
    drain(t)
    Reaper(client, jobs=[job_name]).tick()
    assert client.status(job_name).trimmed == 5


def test_status_shows_the_oldest_unfinished_age(client, job_name):
    client.create_job(job_name, chunks=[], stream=True, manual_clock=True)
    job = client.job(job_name)
    assert client.status(job_name).oldest_unfinished_age_s is None
    client.advance_clock(job_name, 1000)
    job.append([{"i": 0}, {"i": 1}])
    client.advance_clock(job_name, 3000)
    job.append([{"i": 2}])
    st = client.status(job_name)
    assert (st.oldest_unfinished_age_s, st.backlog, st.appended) == (3.0, 3, 3)
    t = trainer(client, job_name, "w")
    t.ack(t.lease(timeout=0))
    t.ack(t.lease(timeout=0))
    assert client.status(job_name).oldest_unfinished_age_s == 0.0  # task 2, just appended
    t.ack(t.lease(timeout=0))
    st = client.status(job_name).as_dict()
    assert (st["oldest_unfinished_age_s"], st["backlog"], st["stream"]) == (None, 0, "open")


# -- the CLI ----------------------------------------------------------------------------
def run(url: str, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["--url", url, *args], input=input)


def test_cli_stream_create_append_stdin_seal_and_status(url, client, job_name):
    r = run(url, "job", "create", job_name, "--stream", "--max-backlog", "100")
    assert r.exit_code == 0, r.output
    assert "a stream" in r.output
    lines = "".join(json.dumps({"path": f"p{i}", "id": f"p{i}"}) + "\n" for i in range(5))
    r = run(url, "job", "append", job_name, "-", "--id-key", "id", "--json", input=lines)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["tasks_appended"] == 5
    r = run(url, "job", "append", job_name, "-", "--id-key", "id", input=lines)  # a retry
    assert "0 tasks appended, 5 chunks skipped" in r.output
    r = run(url, "job", "status", job_name)
    assert "stream open, 5 tasks appended, 0 done, backlog 5 (max 100)" in r.output
    t = trainer(client, job_name, "w")
    assert len(drain(t)) == 5
    r = run(url, "job", "seal", job_name)
    assert r.exit_code == 0 and "sealed with 5 tasks (completed)" in r.output


def test_cli_append_bad_line_is_one_line_and_writes_nothing(url, client, job_name):
    client.create_job(job_name, chunks=[], stream=True)
    r = run(url, "job", "append", job_name, "-", input='{"a": 1}\nnot json\n')
    assert r.exit_code != 0
    assert "stdin line 2 is not JSON" in r.output and "Traceback" not in r.output
    assert client.status(job_name).tasks == 0
    r = run(url, "job", "append", "no-such-job-" + job_name, "-", input='{"a": 1}\n')
    assert r.exit_code != 0 and "not found" in r.output


def test_cli_append_files_twice_adds_them_once(url, client, job_name, tmp_path):
    for i in range(3):
        (tmp_path / f"part-{i}.jsonl").write_text("".join(f'{{"x": {k}}}\n' for k in range(10)))
    client.create_job(job_name, chunks=[], stream=True)
    pattern = str(tmp_path / "part-*.jsonl")
    args = ("job", "append", job_name, "--files", pattern, "--records-per-chunk", "5", "--json")
    first = json.loads(run(url, *args).output)
    again = json.loads(run(url, *args).output)
    assert (first["tasks_appended"], again["tasks_appended"], again["chunks_skipped"]) == (6, 0, 6)


#: How long a test waits for what a follower does first: its start (the interpreter and
#: its imports) takes ~9 s alone on a 2-core machine at load 18.
FOLLOWER_START_S = 60.0


#: The followers this test process started; each test's are killed at its end if still
#: running (a test that failed half way leaves none behind).
_FOLLOWERS: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_follower_left() -> Any:
    yield
    while _FOLLOWERS:
        proc = _FOLLOWERS.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _started(proc: subprocess.Popen) -> subprocess.Popen:
    _FOLLOWERS.append(proc)
    return proc


def _follow(url: str, job: str, pattern: str, *extra: str) -> subprocess.Popen:
    return _started(
        subprocess.Popen(
            [
                support.ENTRY_POINT,
                "--url",
                url,
                "job",
                "follow",
                job,
                "--files",
                pattern,
                "--every",
                "0.05",
                "--records-per-chunk",
                "1",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )


def test_follow_appends_new_files_once_across_restarts(url, client, job_name, tmp_path):
    client.create_job(job_name, chunks=[], stream=True)
    pattern = str(tmp_path / "*.jsonl")
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    follower = _follow(url, job_name, pattern)
    assert support.wait_until(lambda: client.status(job_name).tasks == 1, FOLLOWER_START_S)
    (tmp_path / "b.jsonl").write_text('{"x": 2}\n')
    assert support.wait_until(lambda: client.status(job_name).tasks == 2)
    follower.send_signal(signal.SIGTERM)
    assert follower.wait(timeout=20) == 0
    # a file the follower half appended: its first chunk went in, the record was not written
    (tmp_path / "c.jsonl").write_text('{"x": 3}\n{"x": 4}\n')
    info = os.stat(tmp_path / "c.jsonl")
    key = f"{tmp_path / 'c.jsonl'}|{info.st_size}|{info.st_mtime}"
    client.job(job_name).append([{"half": 1}], ids=[f"{key}#0"])
    follower = _follow(url, job_name, pattern, "--seal-after", "0")
    assert follower.wait(timeout=30) == 0, follower.stderr.read() if follower.stderr else ""
    st = client.status(job_name)
    # a and b not again; of c only its second line (its first chunk's id went in before)
    assert (st.tasks, st.stream) == (4, "sealed")
    last = client.job(job_name).task(3)["chunks"][0]
    assert (last["path"], last["offset"]) == (str(tmp_path / "c.jsonl"), 9)


def test_cli_append_to_a_completed_job_is_one_line_and_writes_nothing(url, client, job_name):
    make_job(client, job_name, n=1)
    drain(trainer(client, job_name, "w"))
    p = subprocess.run(
        [support.ENTRY_POINT, "--url", url, "job", "append", job_name, "-"],
        input='{"late": 1}\n',
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0
    line = support.one_error_line(p.stderr)
    assert "completed: an append does not reopen it; reopen needs the job's owner" in line
    st = client.status(job_name)
    assert (st.state, st.tasks) == ("completed", 1)


def test_follow_of_a_missing_job_is_one_line(url, job_name, tmp_path):
    p = _follow(url, "no-such-" + job_name, str(tmp_path / "*.jsonl"))
    _, err = p.communicate(timeout=30)
    assert p.returncode != 0
    assert "not found" in support.one_error_line(err)


class _Said:
    """A follower's stderr, read as it comes (a thread), for waits on what it said."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[str] = []
        assert proc.stderr is not None
        self.reader = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self.reader.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line)

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=20)
        self.reader.join(timeout=5)
        return code


def test_follow_appends_a_file_written_across_listings_once_whole(url, client, job_name, tmp_path):
    """A file seen half written is appended once, when it stopped changing: all its
    records once (before: the half, then the whole under its new size)."""
    client.create_job(job_name, chunks=[], stream=True)
    path = tmp_path / "a.jsonl"
    said = _Said(
        _follow(url, job_name, str(tmp_path / "*.jsonl"), "--every", "2", "--settle", "1h")
    )
    path.write_text("".join(f'{{"x": {k}}}\n' for k in range(50)))
    assert support.wait_until(lambda: said.count("a.jsonl: new (") == 1, FOLLOWER_START_S)
    with path.open("a") as f:  # the second half, before the next listing
        f.write("".join(f'{{"x": {k}}}\n' for k in range(50, 100)))
    assert support.wait_until(lambda: said.count("a.jsonl: 100 tasks appended") == 1, timeout=30)
    assert said.count("a.jsonl: still being written") == 1
    assert client.status(job_name).tasks == 100
    assert said.stop() == 0
    assert said.count("tasks appended") == 1


def test_follow_record_stays_bounded_as_files_accumulate(url, client, job_name, tmp_path):
    """The record keeps a watermark and the files of the last --horizon: with a horizon
    of 0 it is one field however many files were appended, and a restarted follower
    appends none of them again."""
    client.create_job(job_name, chunks=[], stream=True)
    handle = client.job(job_name)
    pattern = str(tmp_path / "*.jsonl")
    said = _Said(_follow(url, job_name, pattern, "--settle", "0", "--horizon", "0"))
    for batch in range(3):
        for i in range(10):
            (tmp_path / f"p{batch}-{i}.jsonl").write_text(f'{{"x": {i}}}\n')
        assert support.wait_until(
            lambda b=batch: client.status(job_name).tasks == 10 * (b + 1), FOLLOWER_START_S
        )
        assert support.wait_until(lambda: client.redis.hlen(handle.keys.follow) == 1)
    assert said.stop() == 0
    record = handle.follow_record()
    assert record.files == [] and record.watermark is not None
    assert record.watermark[1] == str(tmp_path / "p2-9.jsonl")
    again = _follow(url, job_name, pattern, "--settle", "0", "--seal-after", "0")
    assert again.wait(timeout=30) == 0
    assert (client.status(job_name).tasks, client.status(job_name).stream) == (30, "sealed")


def test_follow_asks_redis_about_new_files_only(url, client, job_name, tmp_path):
    """A listing costs O(new files) in Redis: with 40 files appended and listed in full
    at every interval (a ``**`` pattern), the follower's HMGETs of its record name the
    new file alone (before: every listed file, at every listing)."""
    client.create_job(job_name, chunks=[], stream=True)
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(40):
        (folder / f"p{i:02d}.jsonl").write_text('{"x": 1}\n')
    pattern = str(tmp_path / "**" / "*.jsonl")  # recursive: listed in full each time
    said = _Said(_follow(url, job_name, pattern, "--settle", "0"))
    assert support.wait_until(lambda: client.status(job_name).tasks == 40, FOLLOWER_START_S)
    follow_key = client.job(job_name).keys.follow
    hmgets: list[int] = []
    monitor = redis.Redis.from_url(url, decode_responses=True).monitor()
    with monitor as m:

        def watch() -> None:
            try:
                for entry in m.listen():
                    parts = entry["command"].split()
                    if parts[0].upper() == "HMGET" and parts[1] == follow_key:
                        hmgets.append(len(parts) - 2)
            except (redis.exceptions.ConnectionError, ValueError, AttributeError):
                pass

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        for i in (40, 41):  # each appended at its first listing; many listings between
            (folder / f"p{i:02d}.jsonl").write_text('{"x": 1}\n')
            assert support.wait_until(lambda n=i + 1: client.status(job_name).tasks == n)
        m.connection.disconnect()
        watcher.join(timeout=5)
    assert said.stop() == 0
    assert hmgets and max(hmgets) == 1, hmgets


#: A follower whose every directory listing under ``$LISTINGS_UNDER`` is written, one
#: path a line, to ``$LISTINGS_FILE`` (Python's audit events for os.scandir / os.listdir:
#: the real process observed, nothing replaced).
_COUNTED_FOLLOWER = """
import os, sys
root, out = os.environ["LISTINGS_UNDER"], open(os.environ["LISTINGS_FILE"], "a", buffering=1)
def hook(event, args):
    if event in ("os.scandir", "os.listdir") and args and str(args[0]).startswith(root):
        out.write(f"{args[0]}\\n")
sys.addaudithook(hook)
from taskq.cli.main import main
sys.argv[0] = "taskq"
sys.exit(main())
"""


def _follow_counted(
    url: str, job: str, pattern: str, under: Path, listings: Path, *extra: str
) -> subprocess.Popen:
    env = dict(os.environ, LISTINGS_UNDER=str(under), LISTINGS_FILE=str(listings))
    return _started(
        subprocess.Popen(
            [sys.executable, "-c", _COUNTED_FOLLOWER, "--url", url, "job", "follow", job]
            + ["--files", pattern, "--every", "0.05", "--records-per-chunk", "1", *extra],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    )


def _listed_folders(listings: Path) -> list[str]:
    return listings.read_text().splitlines() if listings.exists() else []


def test_an_idle_follower_over_several_folders_lists_none_of_them_again(
    url, client, job_name, tmp_path
):
    """With nothing new, a follower of ``data/day-*/*.jsonl`` lists the folders' parent
    at each interval and none of the folders of files; a new file in one of them makes
    it list that folder alone and append the file, and a new folder is found. Before:
    every folder was listed in full at every interval (one stat per file)."""
    client.create_job(job_name, chunks=[], stream=True)
    data = tmp_path / "data"
    folders = [data / f"day-{d}" for d in range(3)]
    for folder in folders:
        folder.mkdir(parents=True)
        for i in range(5):
            path = folder / f"p{i}.jsonl"
            path.write_text('{"x": 1}\n')
            os.utime(path, (1, 1))
        os.utime(folder, (1, 1))  # old: its mtime is trusted at once
    listings = tmp_path / "listings.txt"
    pattern = str(data / "day-*" / "*.jsonl")
    said = _Said(_follow_counted(url, job_name, pattern, data, listings, "--settle", "0"))
    assert support.wait_until(lambda: said.count("tasks appended") == 15, FOLLOWER_START_S)
    idle_from = len(_listed_folders(listings))
    # 40 intervals with nothing new: the parent listed 40 times, nothing else
    assert support.wait_until(
        lambda: _listed_folders(listings)[idle_from:].count(str(data)) >= 40, timeout=60
    )
    idle = _listed_folders(listings)[idle_from:]
    assert set(idle) == {str(data)}, idle
    (folders[1] / "new.jsonl").write_text('{"x": 2}\n')
    assert support.wait_until(lambda: client.status(job_name).tasks == 16)
    moved = [p for p in _listed_folders(listings)[idle_from:] if p != str(data)]
    assert set(moved) == {str(folders[1])}, moved
    (data / "day-9").mkdir()
    (data / "day-9" / "first.jsonl").write_text('{"x": 3}\n')
    assert support.wait_until(lambda: client.status(job_name).tasks == 17)
    assert said.stop() == 0
    assert said.count("tasks appended") == 17


def test_a_file_growing_in_an_unchanged_folder_is_appended_once_whole_when_another_folder_moves(
    url, client, job_name, tmp_path
):
    """A file being written in place does not move its folder: while another folder's
    change brings a listing, the growing file is taken as it is now (a stat), not as its
    folder was last listed: appended once, whole, when it stops changing, and not again
    when its folder is listed later (before: taken at its old size as settled, appended,
    then again whole under its new size)."""
    client.create_job(job_name, chunks=[], stream=True)
    data = tmp_path / "data"
    day0, day1 = data / "day-0", data / "day-1"
    for d in (day0, day1):
        d.mkdir(parents=True)
        (d / "old.jsonl").write_text('{"x": 0}\n')
        os.utime(d / "old.jsonl", (1, 1))
    growing = day0 / "growing.jsonl"
    growing.write_text("".join(f'{{"x": {k}}}\n' for k in range(50)))
    for d in (day0, day1):
        os.utime(d, (1, 1))  # old folders: only a change moves them
    pattern = str(data / "day-*" / "*.jsonl")
    said = _Said(_follow(url, job_name, pattern, "--every", "2", "--settle", "1h"))
    assert support.wait_until(lambda: said.count("growing.jsonl: new (") == 1, FOLLOWER_START_S)
    with growing.open("a") as f:  # the rest, in place: day-0 does not move
        f.write("".join(f'{{"x": {k}}}\n' for k in range(50, 100)))
    (day1 / "other.jsonl").write_text('{"x": 1}\n')  # day-1 moves: a listing
    assert support.wait_until(
        lambda: said.count("growing.jsonl: 100 tasks appended") == 1, timeout=60
    ), said.lines
    (day0 / "later.jsonl").write_text('{"x": 2}\n')  # day-0 moves: listed again
    assert support.wait_until(lambda: said.count("later.jsonl: 1 tasks appended") == 1, 60)
    assert said.stop() == 0
    assert said.count("growing.jsonl:") == 3, "".join(said.lines)  # new, growing, appended
    assert said.count("tasks appended") == 5  # 2 old, growing, other, later
    assert client.status(job_name).tasks == 2 + 100 + 1 + 1


def test_a_change_within_the_folders_timestamp_grain_of_its_listing_is_found(
    url, client, job_name, tmp_path
):
    """A file system whose timestamps are coarse (1-2 s) or a server whose clock runs
    ahead can leave a folder's mtime as the follower last saw it after a file is added:
    the folder is listed again until a listing came more than the grain after its
    mtime. Here the folder's mtime is 7 s ahead, so every listing up to the one that
    found ``b`` came within the grain of it; the follower is then stopped (SIGSTOP) until
    the clock is past the grain, ``c`` is added and the mtime put back: found at the
    next interval (before: the mtime was trusted once 2 s old by the clock, ``c`` never
    listed). Stopping the follower keeps its listings within the grain however slowly
    this test gets to add ``c`` (a 3 s window without it, missed once under load)."""
    client.create_job(job_name, chunks=[], stream=True)
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"x": 1}\n')
    os.utime(folder / "a.jsonl", (1, 1))
    os.utime(folder, (1, 1))
    pattern = str(folder / "*.jsonl")
    said = _Said(_follow(url, job_name, pattern, "--settle", "0", "--every", "3"))
    assert support.wait_until(lambda: said.count("a.jsonl: 1 tasks appended") == 1, 60)
    (folder / "b.jsonl").write_text('{"x": 2}\n')
    ahead = time.time() + 7.0
    os.utime(folder, (ahead, ahead))
    assert support.wait_until(lambda: said.count("b.jsonl: 1 tasks appended") == 1, 30)
    said.proc.send_signal(signal.SIGSTOP)  # its listings so far: within the grain
    try:
        assert support.wait_until(lambda: time.time() > ahead + 2.5, 20)
        (folder / "c.jsonl").write_text('{"x": 3}\n')
        os.utime(folder, (ahead, ahead))  # the change left the mtime as it was
    finally:
        said.proc.send_signal(signal.SIGCONT)
    assert support.wait_until(lambda: said.count("c.jsonl: 1 tasks appended") == 1, 30), "".join(
        said.lines
    )
    assert said.stop() == 0
    assert client.status(job_name).tasks == 3


def test_follow_says_once_that_nothing_matches_then_appends(url, client, job_name, tmp_path):
    client.create_job(job_name, chunks=[], stream=True)
    said = _Said(_follow(url, job_name, str(tmp_path / "*.jsonl")))
    assert support.wait_until(lambda: said.count("no file matches") == 1, FOLLOWER_START_S)
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    assert support.wait_until(lambda: said.count("a.jsonl: 1 tasks appended") == 1)
    (tmp_path / ".b.jsonl").write_text('{"x": 2}\n')  # being written: a hidden name
    (tmp_path / "_SUCCESS").write_text("")
    assert said.stop() == 0
    assert said.count("no file matches") == 1
    assert client.status(job_name).tasks == 1


def test_follow_waiting_for_the_backlog_says_so_and_stops_on_sigterm(
    url, client, job_name, tmp_path
):
    """Before: blocked in the append, it ignored SIGTERM (only SIGKILL ended it)."""
    client.create_job(job_name, chunks=[], stream=True, max_backlog=1)
    client.job(job_name).append([{"x": 0}])
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    said = _Said(_follow(url, job_name, str(tmp_path / "*.jsonl"), "--settle", "0"))
    assert support.wait_until(
        lambda: said.count("waiting for the backlog: 1 of max_backlog 1 tasks not done") == 1,
        FOLLOWER_START_S,
    ), said.lines
    assert said.stop() == 0
    assert said.count("waiting for the backlog") == 1
    assert client.status(job_name).tasks == 1
    assert client.job(job_name).files_appended([str(tmp_path / "a.jsonl")]) == [False]


def test_follow_waiting_for_its_next_listing_stops_on_sigterm(url, client, job_name, tmp_path):
    """Between listings (--every 1h) the follower waits on the signal, not the clock:
    SIGTERM ends it (exit 0) long before its next listing."""
    client.create_job(job_name, chunks=[], stream=True)
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    pattern = str(tmp_path / "*.jsonl")
    said = _Said(_follow(url, job_name, pattern, "--settle", "0", "--every", "1h"))
    assert support.wait_until(
        lambda: said.count("a.jsonl: 1 tasks appended") == 1, FOLLOWER_START_S
    )
    assert said.stop() == 0


def test_follow_passes_a_file_whose_name_is_not_utf8_and_appends_the_rest(
    url, client, job_name, tmp_path
):
    """A file named by bytes that are not UTF-8 (its name cannot be a chunk's path in
    Redis) is said once and passed by the watermark; the other files go in (before: the
    record's lookup raised UnicodeEncodeError, a traceback, and nothing was appended)."""
    client.create_job(job_name, chunks=[], stream=True)
    (tmp_path / os.fsdecode(b"caf\xe9.jsonl")).write_text('{"x": 1}\n')
    (tmp_path / "ok.jsonl").write_text('{"x": 2}\n')
    pattern = str(tmp_path / "*.jsonl")
    said = _Said(_follow(url, job_name, pattern, "--settle", "0", "--horizon", "0"))
    assert support.wait_until(
        lambda: said.count("ok.jsonl: 1 tasks appended") == 1, FOLLOWER_START_S
    )
    (tmp_path / "later.jsonl").write_text('{"x": 3}\n')
    assert support.wait_until(lambda: said.count("later.jsonl: 1 tasks appended") == 1, timeout=30)
    assert said.stop() == 0
    assert said.count("caf\\xe9.jsonl not appended: its name is not UTF-8 (rename it)") == 1
    assert "Traceback" not in "".join(said.lines)
    assert client.status(job_name).tasks == 2


def test_cli_append_files_with_a_name_not_utf8_is_one_line_and_appends_nothing(
    url, client, job_name, tmp_path
):
    client.create_job(job_name, chunks=[], stream=True)
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    (tmp_path / os.fsdecode(b"caf\xe9.jsonl")).write_text('{"x": 2}\n')
    p = subprocess.run(
        [support.ENTRY_POINT, "--url", url, "job", "append", job_name]
        + ["--files", str(tmp_path / "*.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0
    line = support.one_error_line(p.stderr)
    assert line.endswith("caf\\xe9.jsonl: its name is not UTF-8 (rename it); nothing appended")
    assert client.status(job_name).tasks == 0


# -- trainers in processes, a producer appending -------------------------------------
HERE = Path(__file__).resolve().parents[1]


def _trainer(url: str, job: str, log: Path, wid: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "trainer_proc.py"),
            url,
            job,
            "--log",
            str(log),
            "--sleep",
            "0.005",
            "--worker-id",
            wid,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith("READY")
    return proc


class Producer:
    """Appends chunks ``{"i": "c<k>"}`` (ids ``c<k>``) to a stream job, counting them."""

    def __init__(self, client: taskq.Client, job: str) -> None:
        self.client, self.name, self.job = client, job, client.job(job)
        self.appended = 0

    def append(self, k: int) -> None:
        """Append ``k`` new chunks (waiting on max_backlog up to 60 s)."""
        ids = [f"c{i}" for i in range(self.appended, self.appended + k)]
        assert self.job.append([{"i": i} for i in ids], ids=ids, timeout=60).tasks == k
        self.appended += k

    def retry_last(self, k: int) -> None:
        """A producer's retry of the last ``k`` chunks: every one skipped."""
        again = [f"c{i}" for i in range(self.appended - k, self.appended)]
        assert self.job.append([{"i": i} for i in again], ids=again).skipped == k

    def wait_done(self, n: int) -> None:
        assert support.wait_until(lambda: self.client.status(self.name).done >= n, timeout=60)

    def check_acked_once(self, log: Path) -> None:
        """The sealed job completed with every chunk acked, once (the trainers' ack log)."""
        st = self.client.status(self.name)
        assert (st.state, st.tasks, st.counters["acked"]) == (
            "completed",
            self.appended,
            self.appended,
        )
        logged = [line.split()[1] for line in log.read_text().splitlines()]
        assert len(logged) == len(set(logged)), "a task acked twice"
        assert self.client.audit(self.name)["ok"]


def kill_left(procs: dict[str, subprocess.Popen[str]]) -> None:
    """Kill and reap the processes of ``procs`` still running (a test's cleanup)."""
    for p in procs.values():
        if p.poll() is None:
            p.kill()
        p.wait()


def test_trainers_consume_a_stream_through_sigkill_sigterm_and_scaling(
    url, client, job_name, tmp_path
):
    """Every appended chunk acked exactly once while trainers are killed, stopped and
    added, with backpressure holding the producer, and the sealed stream completes."""
    client.create_job(
        job_name, chunks=[], stream=True, worker_ttl=2.0, heartbeat_interval=0.2, max_backlog=40
    )
    producer = Producer(client, job_name)
    log = tmp_path / "acks.log"
    procs = {w: _trainer(url, job_name, log, w) for w in ("a", "b")}
    try:
        producer.append(30)
        producer.wait_done(10)
        procs["a"].kill()  # SIGKILL mid-stream: what it held goes back after its ttl
        procs["c"] = _trainer(url, job_name, log, "c")  # a trainer added
        producer.append(30)
        producer.wait_done(40)
        procs["b"].send_signal(signal.SIGTERM)  # a trainer removed: it gives back and leaves
        assert procs["b"].wait(timeout=20) in (0, 128 + signal.SIGTERM, -signal.SIGTERM)
        producer.append(30)
        producer.retry_last(30)
        procs["d"] = _trainer(url, job_name, log, "d")
        producer.append(30)  # (max_backlog 40: waits for the trainers' acks)
        producer.job.seal()
        for w in ("c", "d"):
            assert procs[w].wait(timeout=60) == 0  # the loop ends with the job
    finally:
        kill_left(procs)
    producer.check_acked_once(log)
    summary = client.status(job_name).summaries[-1]
    assert summary["acked"] == summary["live"] == producer.appended


# -- taskq.torch over a stream ------------------------------------------------------------
def _torch_loader(url: str, job: str, **ds_kw: object) -> taskq.torch.DataLoader:
    ds = taskq.torch.TaskDataset(job, url=url, reader=jsonl_reader, seed=3, **ds_kw)  # type: ignore[arg-type]
    return taskq.torch.DataLoader(ds, batch_size=4, num_workers=2)


def read_a_stream_while_appending(
    url: str, job: Job, chunks: list[dict], middle: int
) -> list[tuple[int, int]]:
    """One DataLoader iteration (2 workers) over the stream ``job`` while a producer
    appends ``chunks`` in three parts and seals it; the rows the loop got. The producer
    waits for rows the loop got, not for the job's done count: while the stream is open a
    task whose last rows sit in a worker's partial batch is not acked (the batch goes out
    with more rows or when the readers stop), so "done" may stall short of a bound."""
    third = len(chunks) // 3
    job.append(chunks[:third])
    rows: list[tuple[int, int]] = []
    waited: list[bool] = []

    def produce() -> None:
        try:
            waited.append(support.wait_until(lambda: len(rows) >= 4, timeout=60))
            job.append(chunks[third : 2 * third])
            waited.append(support.wait_until(lambda: len(rows) >= middle, timeout=60))
            job.append(chunks[2 * third :])
        finally:
            job.seal()  # the iteration ends even if a wait failed

    producer = threading.Thread(target=produce)
    producer.start()
    with _torch_loader(url, job.name) as loader:
        for batch in loader:  # one iteration: the whole stream, appends and all
            rows += rows_of(batch)
        assert loader.state == "completed"
    producer.join(timeout=10)
    assert waited == [True, True]  # the loop read appended rows before the next append
    return rows


def test_torch_reads_a_stream_until_sealed_and_drained(url, client, job_name, tmp_path):
    chunks = write_jsonl(tmp_path, 9, 10)
    client.create_job(job_name, chunks=[], stream=True, worker_ttl=2.0, heartbeat_interval=0.3)
    rows = read_a_stream_while_appending(url, client.job(job_name), chunks, middle=40)
    assert sorted(rows) == sorted((f, i) for f in range(9) for i in range(10))
    assert client.audit(job_name)["ok"]


def test_torch_loop_waiting_for_appends_is_not_a_wait_for_data(url, client, job_name, tmp_path):
    """A loop that read all appended rows waits for the producer: its meter counts that
    wait as nothing to lease, not as data wait (before: all of it data wait, and
    TaskqInputBound's ratio near 1 on a healthy stream)."""
    chunks = write_jsonl(tmp_path, 2, 6)  # 6 rows a file, batches of 4: a partial batch
    client.create_job(job_name, chunks=[], stream=True, worker_ttl=2.0, heartbeat_interval=0.3)
    job = client.job(job_name)
    job.append(chunks[:1])
    rows: list[tuple[int, int]] = []
    with _torch_loader(url, job_name) as loader:
        meter = loader.input_meter

        seen: list[Any] = []

        def produce() -> None:
            try:
                # the loop read the first file and waits: its wait is nothing to lease
                if support.wait_until(lambda: meter.totals()[4] > 0, timeout=20):
                    seen.append(meter.totals())
                    support.wait_until(lambda: meter.totals()[4] >= seen[0][4] + 0.3)
                    seen.append(meter.totals())
                job.append(chunks[1:])
            finally:
                job.seal()

        producer = threading.Thread(target=produce)
        producer.start()
        for batch in loader:
            rows += rows_of(batch)
        producer.join(timeout=10)
    assert sorted(rows) == sorted((f, i) for f in range(2) for i in range(6))
    assert len(seen) == 2, "the loop's wait for the append was not counted apart"
    before, after = seen
    assert after[4] - before[4] >= 0.3
    assert after[1] - before[1] < 0.05  # the data wait did not grow meanwhile


def test_torch_max_idle_ends_an_iteration_and_the_next_goes_on(url, client, job_name, tmp_path):
    chunks = write_jsonl(tmp_path, 4, 5)
    client.create_job(job_name, chunks=chunks[:2], stream=True, worker_ttl=2.0)
    rows: list[tuple[int, int]] = []
    with _torch_loader(url, job_name, max_idle=0.5) as loader:
        for batch in loader:
            rows += rows_of(batch)
        assert (loader.state, len(rows)) == ("idle", 10)
        client.job(job_name).append(chunks[2:])
        client.job(job_name).seal()
        for batch in loader:  # the same pass, the new tasks
            rows += rows_of(batch)
        assert loader.state == "completed"
    assert sorted(rows) == sorted((f, i) for f in range(4) for i in range(5))


def _torch_trainer(url: str, job: str, log: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "torch_stream_proc.py"), url, job, "2", str(log)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith("READY")
    return proc


def test_torch_trainers_consume_a_stream_through_sigkill_sigterm_and_scaling(
    url, client, job_name, tmp_path
):
    """2 processes x 2 DataLoader workers read a stream while it is appended to; one is
    SIGKILLed, one SIGTERMed, one added: every appended task acked once, every row read,
    the sealed stream completes."""
    chunks = write_jsonl(tmp_path / "data", 24, 20)
    client.create_job(job_name, chunks=[], stream=True, worker_ttl=2.0, heartbeat_interval=0.3)
    job = client.job(job_name)
    logs = {w: tmp_path / f"{w}.log" for w in ("a", "b", "c")}
    procs = {w: _torch_trainer(url, job_name, logs[w]) for w in ("a", "b")}

    def done_at_least(n: int) -> None:
        assert support.wait_until(lambda: client.status(job_name).done >= n, timeout=120)

    try:
        job.append(chunks[:8], ids=[c["path"] for c in chunks[:8]])
        done_at_least(2)
        procs["a"].kill()  # SIGKILL mid-stream: its leases go back after its ttl
        procs["c"] = _torch_trainer(url, job_name, logs["c"])  # a trainer added
        job.append(chunks[8:16], ids=[c["path"] for c in chunks[8:16]])
        done_at_least(10)
        procs["b"].send_signal(signal.SIGTERM)  # a trainer removed
        procs["b"].wait(timeout=60)
        job.append(chunks[16:], ids=[c["path"] for c in chunks[16:]])
        job.seal()
        assert procs["c"].wait(timeout=120) == 0
        assert procs["c"].stdout is not None and "DONE completed" in procs["c"].stdout.read()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
    st = client.status(job_name)
    assert (st.state, st.tasks, st.counters["acked"]) == ("completed", 24, 24)
    assert st.summaries[-1]["acked"] == st.summaries[-1]["live"] == 24
    read = {
        tuple(map(int, line.split()))
        for p in logs.values()
        if p.exists()
        for line in p.read_text().splitlines()
    }
    assert read == {(f, i) for f in range(24) for i in range(20)}  # nothing skipped
    assert client.audit(job_name)["ok"]


# -- checked whole, sealing, bad ids (docs/streams.md, "The model") -----------------------
def test_an_append_with_a_lone_surrogate_deep_in_it_writes_nothing(client, job_name):
    """1,200 chunks, chunk 1,100 holding a lone surrogate (its JSON escape is refused by
    Redis's cjson): refused before the first page, not at the third."""
    client.create_job(job_name, chunks=[], stream=True, manual_clock=True)
    keys = support.job_keys(client, job_name)
    before = {k: client.redis.dump(k) for k in keys}
    chunks = [{"i": i, "text": "fine \U0001f600"} for i in range(1200)]
    chunks[1100] = {"i": 1100, "text": "half a pair \ud800"}
    with pytest.raises(taskq.InvalidInput, match="chunk 1100 holds a lone UTF-16 surrogate") as e:
        client.job(job_name).append(chunks)
    assert "\n" not in str(e.value)
    ids = [f"c{i}" for i in range(1200)]
    ids[1100] = "c\udc00"
    with pytest.raises(taskq.InvalidInput, match="id 1100 holds a lone UTF-16 surrogate"):
        client.job(job_name).append([{"i": i} for i in range(1200)], ids=ids)
    assert {k: client.redis.dump(k) for k in keys} == before
    assert client.status(job_name).tasks == 0
    # a surrogate pair is one character: Redis takes it
    assert client.job(job_name).append([{"t": "\ud83d\ude00"}, {"t": "\\ud800"}]).tasks == 2


def test_a_page_refused_after_others_went_in_says_which_chunks_did(client, job_name):
    """A stream sealed while an append waits for its backlog: the error names the chunks
    that went in, so the resend adds nothing twice."""
    client.create_job(job_name, chunks=[], stream=True, max_backlog=APPEND_MAX, manual_clock=True)
    job = client.job(job_name)
    got: list[BaseException] = []

    def append() -> None:
        try:
            job.append([{"i": i} for i in range(2 * APPEND_MAX + 50)])
        except taskq.TaskqError as e:
            got.append(e)

    appender = threading.Thread(target=append)
    appender.start()
    assert support.wait_until(lambda: client.status(job_name).tasks == APPEND_MAX)
    job.seal()
    appender.join(30)
    assert not appender.is_alive()
    assert len(got) == 1 and isinstance(got[0], taskq.InvalidInput)
    message = str(got[0])
    assert "sealed" in message and "\n" not in message
    assert f"chunks 0-{APPEND_MAX - 1} went in ({APPEND_MAX} tasks appended" in message
    assert f"nothing from chunk {APPEND_MAX} on" in message


def test_cli_append_stdin_with_a_bad_line_deep_in_it_appends_nothing(url, client, job_name):
    client.create_job(job_name, chunks=[], stream=True)
    lines = [json.dumps({"i": i, "id": f"r{i}"}) for i in range(1200)]
    lines[1099] = '{"i": 1099, "id": "r1099", "text": "\\ud800"}'  # line 1,100
    r = run(url, "job", "append", job_name, "-", "--id-key", "id", input="\n".join(lines) + "\n")
    assert r.exit_code != 0
    out = r.output.strip()
    assert "\n" not in out and "Traceback" not in out
    assert "stdin line 1100" in out and "lone UTF-16 surrogate" in out
    assert "0 tasks appended before it" in out
    assert client.status(job_name).tasks == 0


def test_a_lone_surrogate_in_any_id_is_invalid_input(client, job_name):
    make_job(client, job_name, n=1)
    with pytest.raises(taskq.InvalidInput, match="not UTF-8 text"):
        client.drain(job_name, "worker-\ud800")
    with pytest.raises(taskq.InvalidInput, match="not UTF-8 text"):
        trainer(client, job_name, "w\udfff").lease(timeout=0)
    assert client.status(job_name).workers == 0


@pytest.mark.parametrize("key", ["x\ud800", "", "watermark", 7])
def test_a_bad_file_key_of_the_follow_record_is_invalid_input(client, job_name, key):
    """A follower record's file key that is not UTF-8 text (before: a raw
    UnicodeEncodeError), empty, the watermark's field (before: overwritten) or not a
    string is refused by every verb of the record, and nothing is written."""
    client.create_job(job_name, chunks=[], stream=True)
    handle = client.job(job_name)
    handle.forget_files((1.0, "a.jsonl"), [])
    handle.file_appended("b.jsonl|9|2.0", 1)
    before = client.redis.hgetall(handle.keys.follow)
    for call in (
        lambda: handle.files_appended(["b.jsonl|9|2.0", key]),
        lambda: handle.file_appended(key, 1),
        lambda: handle.forget_files((3.0, "c.jsonl"), ["b.jsonl|9|2.0", key]),
    ):
        with pytest.raises(taskq.InvalidInput, match="file key") as e:
            call()
        assert "\n" not in str(e.value)
    assert client.redis.hgetall(handle.keys.follow) == before


def test_an_empty_stream_completes_at_its_seal_and_its_trainers_end(client, job_name):
    client.create_job(job_name, chunks=[], stream=True, passes=3)
    got: list[int] = []
    t = taskq.Trainer(job_name, client=client, worker_id="w")
    loop = threading.Thread(target=lambda: got.extend(task.id for task in t))
    loop.start()
    assert support.wait_until(lambda: client.status(job_name).workers == 1)
    sealed = client.job(job_name).seal()
    assert (sealed, sealed.already_sealed) == (0, False)
    loop.join(30)
    assert not loop.is_alive() and got == []
    st = client.status(job_name)
    assert (st.state, st.reason, st.dead) == ("completed", "", 0)
    assert client.audit(job_name)["ok"]
    t.close()


def test_sealing_twice_says_so(url, client, job_name):
    client.create_job(job_name, chunks=[], stream=True)
    client.job(job_name).append([{"i": 0}])
    first, again = client.job(job_name).seal(), client.job(job_name).seal()
    assert (first, first.already_sealed, again, again.already_sealed) == (1, False, 1, True)
    r = run(url, "job", "seal", job_name)
    assert r.exit_code == 0
    assert (
        r.output.strip()
        == f"job {job_name}: already sealed, with 1 tasks (running); nothing changed"
    )
    r = run(url, "job", "seal", job_name, "--json")
    assert json.loads(r.output)["already_sealed"] is True


def test_trim_leaves_no_per_task_field_across_append_train_trim_cycles(client, job_name):
    """Tasks whose size went with their progress (the leases hash's n:<task>), failed
    once (counts), with ids: a long stream's hash fields stay flat cycle after cycle."""
    client.create_job(
        job_name, chunks=[], stream=True, manual_clock=True, task_timeout=None, max_failures=5
    )
    job, keys = client.job(job_name), client.keys(job_name)
    hashes = (keys.chunks, keys.leases, keys.counts, keys.progress, keys.appids, keys.appidx)
    t = trainer(client, job_name, "w")
    sizes = []
    for cycle in range(6):
        ids = [f"{cycle}-{i}" for i in range(20)]
        chunks = [
            {
                "format": "lines",
                "path": f"/nonexistent/{i}",
                "offset": 0,
                "length": 1,
                "records": 50,
            }
            for i in ids
        ]
        job.append(chunks, ids=ids)
        first = t.lease(timeout=0)
        t.fail(first, "once")  # counts a: f: x:
        while (task := t.lease(timeout=0)) is not None:
            t.progress(task, 10, end=None)  # the size goes along: n:<task>
            t.flush_progress()
            t.ack(task)
        while job.trim():
            pass
        assert client.status(job_name).trimmed == 20 * (cycle + 1)
        sizes.append(sum(client.redis.hlen(k) for k in hashes))
    assert sizes == [sizes[0]] * 6, sizes
    assert client.redis.hlen(keys.leases) <= 1, client.redis.hkeys(keys.leases)  # v:<worker>


# -- exact across restarts and trims ------------------------------------------------------
def test_a_source_restarted_after_its_first_pages_were_trimmed_adds_nothing_twice(client, job_name):
    client.create_job(job_name, chunks=[], stream=True, manual_clock=True, task_timeout=None)
    job = client.job(job_name)
    chunks = [{"line": i} for i in range(1000)]
    first = job.append(chunks[:600], source="file-a")  # stopped after 600 chunks
    assert first.tasks == 600
    t = trainer(client, job_name, "w")
    assert len(drain(t)) == 600
    while job.trim():
        pass
    assert client.status(job_name).trimmed == 600
    # the whole file again, without ids: only what did not go in
    again = job.append(chunks, source="file-a")
    assert (again.tasks, again.skipped, again.first_task) == (400, 600, 600)
    assert job.append(chunks, source="file-a").tasks == 0
    assert [task.chunks[0]["line"] for task in drain_tasks(t)] == list(range(600, 1000))
    # another source is its own record; a bad one is refused before anything is written
    assert job.append(chunks[:3], source="file-b").tasks == 3
    for bad in ("", "x" * 1025, "half \ud800"):
        with pytest.raises(taskq.InvalidInput, match="source"):
            job.append(chunks[:1], source=bad)
    assert client.status(job_name).tasks == 1003


def test_the_job_keeps_the_last_sources_keep_sources(client, job_name):
    from taskq.engine.contract import SOURCES_KEEP

    client.create_job(job_name, chunks=[], stream=True)
    job, keys = client.job(job_name), client.keys(job_name)
    for i in range(SOURCES_KEEP + 5):
        job.append([{"i": i}], source=f"s{i}")
    assert client.redis.hlen(keys.sources) == client.redis.zcard(keys.srcseq) == SOURCES_KEEP
    assert client.redis.hget(keys.sources, "s4") is None  # the oldest went
    assert job.append([{"i": 5}], source="s5").tasks == 0  # a recent one is kept


def test_a_follower_killed_mid_file_and_restarted_after_a_trim_appends_it_once(
    url, client, job_name, tmp_path
):
    """The follower SIGKILLed while its backlog holds a file's later pages; the first
    pages trained and trimmed; the restarted follower appends the rest of the file only."""
    half = 4 * APPEND_MAX  # four pages in, the fifth held by the backlog
    client.create_job(job_name, chunks=[], stream=True, max_backlog=half, task_timeout=None)
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"x": k}) + "\n" for k in range(2 * half)))
    follower = _follow(url, job_name, str(tmp_path / "*.jsonl"))
    # then it waits
    assert support.wait_until(lambda: client.status(job_name).tasks == half, FOLLOWER_START_S)
    follower.kill()
    follower.wait(timeout=20)
    t = trainer(client, job_name, "w")
    trained = [task.chunks[0]["offset"] for task in drain_tasks(t)]
    assert len(trained) == half
    job = client.job(job_name)
    while job.trim():
        pass
    assert client.status(job_name).trimmed == half
    # --no-wait: the rest of the file fits the backlog; the file again would not
    restarted = _follow(url, job_name, str(tmp_path / "*.jsonl"), "--seal-after", "0", "--no-wait")
    assert restarted.wait(timeout=60) == 0, restarted.stderr.read() if restarted.stderr else ""
    trained += [task.chunks[0]["offset"] for task in drain_tasks(t)]
    st = client.status(job_name)
    assert (st.tasks, st.state) == (2 * half, "completed")
    assert len(trained) == len(set(trained)) == 2 * half  # every line once


# -- a dead task on a stream --------------------------------------------------------------
def _fail_to_death(t: taskq.Trainer, task_id: int) -> None:
    """Fail the task with id ``task_id`` (leased by ``t``) until it is dead."""
    task = t.lease(timeout=0)
    while task is not None and task.id != task_id:
        t.release(task)
        task = t.lease(timeout=0)
    assert task is not None
    t.fail(task, "poison")


def test_trim_passes_a_dead_task_which_stays_listed_retryable_and_audited(client, job_name):
    client.create_job(
        job_name, chunks=[], stream=True, manual_clock=True, task_timeout=None, max_failures=1
    )
    job = client.job(job_name)
    job.append([{"i": i} for i in range(10)], ids=[f"c{i}" for i in range(10)])
    t = trainer(client, job_name, "w")
    t.fail(t.lease(timeout=0), "poison")  # task 0: dead at once
    assert sorted(drain(t)) == list(range(1, 10))
    assert job.trim() == 10  # the watermark passes it (it waited there for good before)
    st = client.status(job_name)
    assert (st.trimmed, st.dead, st.done) == (10, 1, 9)
    assert [row["id"] for row in client.tasks(job_name, "dead")] == [0]
    assert client.task(job_name, 0)["chunks"] == [{"i": 0}]  # kept aside, with its records
    assert client.task(job_name, 5)["chunks"] is None
    audit = client.audit(job_name)
    assert audit["ok"] and audit["current"]["dead"] == 1 and audit["dead"]["dead"] == 1
    job.append([{"i": 10}])
    assert client.retry(job_name, [0]) == 1
    again = t.lease(timeout=0)
    assert (again.id, again.chunks) == (0, [{"i": 0}])
    t.ack(again)
    assert drain(t) == [10]
    job.trim()
    assert client.task(job_name, 0)["chunks"] is None  # done now: its records went
    assert client.redis.zcard(client.keys(job_name).aside) == 0
    assert client.redis.hlen(client.keys(job_name).chunks) == 0
    job.seal()
    assert client.status(job_name).state == "completed"
    assert client.audit(job_name)["ok"]


def test_trim_passes_a_dead_first_task_before_any_ack(client, job_name):
    # no done bitmap yet: BITPOS answers 0 whatever the range asked, which walked the
    # trim back to task 0 and left it set aside under an unmoved watermark (found by
    # tests/engine/test_state_machine.py's TrimmedStreamMachine)
    client.create_job(
        job_name, chunks=[], stream=True, manual_clock=True, task_timeout=None, max_failures=1
    )
    job = client.job(job_name)
    job.append([{"i": i} for i in range(3)])
    t = trainer(client, job_name, "w")
    t.fail(t.lease(timeout=0), "poison")  # task 0 dead, nothing acked
    assert job.trim() == 1
    keys = client.keys(job_name)
    assert client.redis.zrange(keys.aside, 0, -1) == ["0"]
    assert int(client.redis.hget(keys.meta, "trim_w") or 0) == 1
    assert client.audit(job_name)["ok"]


def test_a_task_dead_at_a_kept_checkpoint_keeps_its_records_for_the_rewind(client, job_name):
    client.create_job(
        job_name, chunks=[], stream=True, manual_clock=True, task_timeout=None, max_failures=1
    )
    job = client.job(job_name)
    job.append([{"i": i} for i in range(6)])
    t = trainer(client, job_name, "w")
    t.ack(t.lease(timeout=0))
    t.fail(t.lease(timeout=0), "poison")  # task 1 dead
    assert sorted(drain(t)) == [2, 3, 4, 5]
    rec = client.checkpoint(job_name, keep=1)  # its cut: task 1 dead, the rest done
    assert job.trim() == 6
    assert client.retry(job_name, [1]) == 1
    assert drain(t) == [1]
    job.trim()
    assert client.task(job_name, 1)["chunks"] == [{"i": 1}]  # the checkpoint has it dead
    assert client.rewind(job_name, rec)
    assert client.status(job_name).dead == 1
    assert client.retry(job_name, [1]) == 1
    assert [task.chunks for task in drain_tasks(t)] == [[{"i": 1}]]  # leased with its chunks
    client.checkpoint(job_name, keep=1)  # the older checkpoint goes: nothing needs task 1
    job.trim()
    assert client.task(job_name, 1)["chunks"] is None
    job.seal()
    assert client.status(job_name).state == "completed"
    assert client.audit(job_name)["ok"]


def test_the_dead_tasks_set_aside_are_bounded(client, job_name):
    from taskq.engine.contract import ASIDE_MAX

    client.create_job(
        job_name, chunks=[], stream=True, manual_clock=True, task_timeout=None, max_failures=1
    )
    job = client.job(job_name)
    job.append([{"i": i} for i in range(ASIDE_MAX + 3)])
    t = trainer(client, job_name, "w")
    while batch := t.lease_many(32, timeout=0):
        for task in batch:
            if task.id < ASIDE_MAX + 1:
                t.fail(task, "poison")
            else:
                t.ack(task)
    while job.trim():
        pass
    assert client.status(job_name).trimmed == ASIDE_MAX  # waits at the one past the bound
    assert client.redis.zcard(client.keys(job_name).aside) == ASIDE_MAX
    assert client.retry(job_name, [5]) == 1
    assert drain(t) == [5]
    # trim looks at the tasks set aside a hundred a call, in turn: the done one goes
    for _ in range(ASIDE_MAX // 100 + 1):
        job.trim()
    assert client.status(job_name).trimmed == ASIDE_MAX + 3  # room again: it went on
