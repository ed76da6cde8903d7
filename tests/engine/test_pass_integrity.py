"""Pass integrity where features meet (issue 26), against a real redis-server: each case
the adversarial trial found is a test of its own. A pass attempt completes exactly when
every live task is in its done set; a checkpoint is one cut; a rewind restores it and
derives the rest; summaries are kept (a rewound one marked) and bounded in all."""

from __future__ import annotations

import json
import threading

import pytest
from support import manual_job, quiet_trainer

import taskq
from taskq.admin import checkpoints
from taskq.engine.contract import SUMMARIES_MAX

make_job = manual_job
trainer = quiet_trainer


def drain(t: taskq.Trainer, client: taskq.Client, job: str) -> list[int]:
    """Lease and ack one task at a time while the pass the job is in runs: the ids acked,
    in order (the caller compares them with what the pass had left: a pass that ended
    early stops the loop before them)."""
    pass0, acked = client.status(job).pass_no, []
    while (s := client.status(job)).pass_no == pass0 and s.state == "running":
        task = t.lease(timeout=0)
        if task is None:
            break
        t.ack(task)
        acked.append(task.id)
    return acked


def dead_ids(client: taskq.Client, job: str) -> set[int]:
    return {int(x) for x in client.redis.smembers(client.keys(job).dead)}


def done_ids(client: taskq.Client, job: str) -> set[int]:
    return {t["id"] for t in client.tasks(job, "done", limit=100000)}


def test_case1_rewind_over_a_retried_dead_task_leaves_no_live_task_unreachable(client, job_name):
    """Dead x, acked y, checkpoint C; x retried and acked; rewind to C: x is dead again
    (as at C) and the other two are leased and acked, which completes the pass."""
    make_job(client, job_name, max_failures=1, passes=1)
    t = trainer(client, job_name, "a")
    x = t.lease(timeout=0)
    t.fail(x, "bad")
    y = t.lease(timeout=0)
    t.ack(y)
    ck = client.checkpoint(job_name)
    assert client.retry(job_name) == 1
    t.ack(t.lease(timeout=0))  # x, from the front
    assert client.rewind(job_name, ck)
    assert dead_ids(client, job_name) == {x.id}
    rest = drain(t, client, job_name)
    assert sorted(rest) == sorted(set(range(4)) - {x.id, y.id})
    s = client.status(job_name)
    assert s.state == "completed"
    assert client.audit(job_name)["ok"], client.audit(job_name)["checks"]


def test_case2_rewind_after_a_later_death_does_not_end_the_pass_early(client, job_name):
    """a acked in pass 0; C while b is leased; pass 0 ends; in pass 1 a dies. Rewind to C:
    a is done and not dead, and pass 0 ends only once every other task was acked."""
    make_job(client, job_name, max_failures=1, passes=2)
    t = trainer(client, job_name, "a")
    a = t.lease(timeout=0)
    t.ack(a)
    b = t.lease(timeout=0)
    ck = client.checkpoint(job_name)
    t.ack(b)
    drain(t, client, job_name)
    assert client.status(job_name).pass_no == 1
    held = []
    while (task := t.lease(timeout=0)).id != a.id:
        held.append(task)
    t.fail(task, "bad")
    t.release(held)
    assert a.id in dead_ids(client, job_name)
    assert client.rewind(job_name, ck)
    assert dead_ids(client, job_name) == set() and done_ids(client, job_name) == {a.id}
    rest = drain(t, client, job_name)
    assert sorted(rest) == sorted(set(range(4)) - {a.id})
    assert client.status(job_name).pass_no == 1
    summaries = [json.loads(v) for v in client.redis.hvals(client.keys(job_name).passes)]
    redone = [s for s in summaries if s["pass"] == 0 and not s.get("rewound")]
    assert len(redone) == 1 and redone[0]["acked"] == redone[0]["live"] == 4
    assert client.audit(job_name)["ok"], client.audit(job_name)["checks"]


def test_case3_a_checkpoint_keeps_every_done_bit_while_the_cursor_crosses_it(client, job_name):
    """Pass 1: x (dead since pass 0, last in the order) retried and acked from the front,
    so it is done past the cursor; a checkpoint whose steps are interleaved with leases
    that carry the cursor over x. Its record and its bitmap both hold x; after a rewind
    the count matches the set and the pass completes with every other task acked."""
    make_job(client, job_name, n=6, max_failures=1, shuffle=False, passes=3)
    t = trainer(client, job_name, "a")
    got = [t.lease(timeout=0) for _ in range(6)]
    x = got[-1]  # the last of the order (no shuffle)
    t.ack(got[:-1])
    t.fail(x, "bad")
    assert client.status(job_name).pass_no == 1
    assert client.retry(job_name) == 1
    t.ack(t.lease(timeout=0))  # x, from the front; the cursor is at 0
    keys = client.keys(job_name)
    code, _, _ = client.connection.run(job_name, "checkpoint", ["", "c3", "begin", 20])
    assert code == 0
    crossing = [t.lease(timeout=0) for _ in range(5)]  # the cursor goes past x
    assert x.id not in {c.id for c in crossing}
    assert client.connection.run(job_name, "checkpoint", ["", "c3", "prog", 0, "0"])[1] == "0"
    assert client.connection.run(job_name, "checkpoint", ["", "c3", "seal", 20])[0] == 0
    ck = checkpoints.get(client, job_name, "c3")
    page = client.redis.hget(keys.ckpt, "c3:d:0") or ""
    bits = sum(bin(ord(c)).count("1") for c in page)
    assert ck["done"] == bits == 1
    t.release(crossing)
    assert client.rewind(job_name, "c3")
    assert client.audit(job_name)["checks"]["done_matches_bitmap"]
    assert done_ids(client, job_name) == {x.id}
    rest = drain(t, client, job_name)
    assert sorted(rest) == sorted(set(range(6)) - {x.id})
    assert client.status(job_name).pass_no == 2


def test_case4_a_checkpoint_at_a_passs_start_under_load_is_never_refused(client, job_name):
    """Nothing done yet and a trainer leasing and acking between every step (and in a
    thread, throughout): every checkpoint seals; none is left open."""
    make_job(client, job_name, n=200, passes=None)
    keys = client.keys(job_name)
    t = trainer(client, job_name, "a")
    assert client.connection.run(job_name, "checkpoint", ["", "c4", "begin", 20])[:2] == [0, 0]
    t.ack(t.lease(timeout=0))
    assert client.connection.run(job_name, "checkpoint", ["", "c4", "prog", 0, "0"])[0] == 0
    t.ack(t.lease(timeout=0))
    assert client.connection.run(job_name, "checkpoint", ["", "c4", "seal", 20])[0] == 0
    assert checkpoints.get(client, job_name, "c4")["done"] == 0
    stop = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        w = trainer(client, job_name, "w")
        try:
            while not stop.is_set():
                got = w.lease_many(32, timeout=0)
                if got:
                    w.ack(got)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    th = threading.Thread(target=work)
    th.start()
    try:
        records = [client.checkpoint(job_name, keep=5) for _ in range(30)]
    finally:
        stop.set()
        th.join(10)
    assert not errors
    assert all(r["state"] == "sealed" for r in records)
    assert client.redis.hget(keys.meta, "ck_open") == ""
    assert client.status(job_name).pass_no >= 1  # passes ended while they were taken


def test_case8_a_pass_redone_after_a_rewind_keeps_its_first_summary_marked(client, job_name):
    make_job(client, job_name, n=2, passes=2)
    t = trainer(client, job_name, "a")
    t.ack(t.lease(timeout=0))
    ck = client.checkpoint(job_name)
    drain(t, client, job_name)  # pass 0 ends
    t.ack(t.lease(timeout=0))  # pass 1 runs: its attempt is undone by the rewind
    assert client.rewind(job_name, ck)
    drain(t, client, job_name)  # pass 0 again
    raw = client.redis.hgetall(client.keys(job_name).passes)
    summaries = {f: json.loads(v) for f, v in raw.items()}
    rewound = {f for f, s in summaries.items() if s.get("rewound")}
    assert {f.split("/")[0] for f in rewound} == {"0", "1"}, raw
    assert all("/w" in f and summaries[f]["rewound_to"] == ck["id"] for f in rewound)
    assert summaries["0"]["state"] == "completed" and not summaries["0"].get("rewound")
    assert summaries["0"]["acked"] == summaries["0"]["live"] == 2


def test_case7_history_is_bounded_in_all_and_trimmed_by_the_write_that_adds(client, job_name):
    """Resets of three passes and the passes themselves: the hash never holds more than
    SUMMARIES_MAX summaries, the newest kept, its index the same fields."""
    make_job(client, job_name, n=1, passes=None)
    t = trainer(client, job_name, "a")
    keys = client.keys(job_name)
    per_pass = SUMMARIES_MAX // 2 + 10
    for _ in range(3):
        for _ in range(per_pass):
            client.reset_pass(job_name)
        assert client.redis.hlen(keys.passes) <= SUMMARIES_MAX
        t.ack(t.lease(timeout=0))
    assert client.redis.hlen(keys.passes) == SUMMARIES_MAX
    assert set(client.redis.hkeys(keys.passes)) == set(client.redis.zrange(keys.passidx, 0, -1))
    assert "2" in client.redis.hkeys(keys.passes)  # the newest: pass 2's own summary
    assert f"2/r{per_pass - 1}" in client.redis.hkeys(keys.passes)
    assert "0" not in client.redis.hkeys(keys.passes)  # the oldest went


def test_a_drifted_done_count_neither_ends_a_pass_early_nor_keeps_it_open(client, job_name):
    """The count is a cache: set wrong by hand (as a bug would), the pass's end counts
    the set again and decides by membership; a done bit on a dead task is taken out."""
    make_job(client, job_name, n=4, max_failures=1, passes=1)
    keys = client.keys(job_name)
    t = trainer(client, job_name, "a")
    t.ack(t.lease(timeout=0))
    client.redis.hset(keys.meta, "ndone", 3)  # drift: three done, says the count
    t.ack(t.lease(timeout=0))  # the count says 4 >= live: the set says 2
    s = client.status(job_name)
    assert (s.state, s.done) == ("running", 2)
    dead = t.lease(timeout=0)
    t.fail(dead, "bad")
    client.redis.setbit(keys.done, dead.id, 1)  # drift: a dead task in the done set
    client.redis.hset(keys.meta, "ndone", 3)
    last = t.lease(timeout=0)
    t.ack(last)
    s = client.status(job_name)
    assert s.state == "completed" and s.done == 3
    assert not client.redis.getbit(keys.done, dead.id)
    summary = json.loads(client.redis.hget(keys.passes, "0"))
    assert summary["acked"] == summary["live"] == 3 and summary["dead_done"] == 0


def test_rewind_is_idempotent_and_epoch_fenced(client, job_name):
    make_job(client, job_name, n=6, max_failures=1)
    t = trainer(client, job_name, "a")
    t.fail(t.lease(timeout=0), "bad")
    t.ack(t.lease(timeout=0))
    ck = client.checkpoint(job_name)
    client.retry(job_name)
    drain(t, client, job_name)
    first = client.connection.run(job_name, "rewind", ["", ck["id"], "begin", 0, ""])
    assert client.rewind(job_name, ck)  # a newer rewind: the first one's steps are stale
    assert (
        int(client.connection.run(job_name, "rewind", ["", ck["id"], "page", 0, first[1]])[0]) == 4
    )
    after = (done_ids(client, job_name), dead_ids(client, job_name))
    assert client.rewind(job_name, ck)
    assert (done_ids(client, job_name), dead_ids(client, job_name)) == after
    assert client.audit(job_name)["ok"]
    begun = client.connection.run(job_name, "rewind", ["", ck["id"], "begin", 0, ""])
    with pytest.raises(taskq.InvalidInput):  # out of order: the walk before the pages
        client.connection.run(job_name, "rewind", ["", ck["id"], "walk", 0, begun[1]])
    assert client.rewind(job_name, ck)
    assert (done_ids(client, job_name), dead_ids(client, job_name)) == after


def test_the_audit_checks_ended_attempts_and_sees_drift_after_a_pass_and_a_rewind(client, job_name):
    """The audit is ok while a pass runs, after it ended (waiting for `pass next`) and
    after a rewind; it sees a dead task in the done set, a dead bitmap apart from the
    set, an ended attempt that did not ack every live task, and a completed summary that
    says so."""
    make_job(client, job_name, n=4, max_failures=1, auto_advance=False, passes=None)
    keys = client.keys(job_name)
    t = trainer(client, job_name, "a")
    t.fail(t.lease(timeout=0), "bad")
    t.ack(t.lease(timeout=0))
    assert client.audit(job_name)["ok"]
    ck = client.checkpoint(job_name)
    drain(t, client, job_name)
    s = client.status(job_name)
    assert (s.state, s.reason) == ("waiting", "manual_advance")
    audit = client.audit(job_name)
    assert audit["ok"] and audit["checks"]["ended_attempt_acked_every_live_task"]
    assert audit["passes"][0]["acked"] == audit["passes"][0]["live"] == 3
    assert client.rewind(job_name, ck)
    assert client.audit(job_name)["ok"]
    dead = next(iter(dead_ids(client, job_name)))
    client.redis.setbit(keys.done, dead, 1)
    checks = client.audit(job_name)["checks"]
    assert not checks["no_dead_task_done"]
    client.redis.setbit(keys.done, dead, 0)
    client.redis.setbit(keys.deadbits, dead, 0)
    assert not client.audit(job_name)["checks"]["dead_bitmap_matches_set"]
    client.redis.setbit(keys.deadbits, dead, 1)
    drain(t, client, job_name)
    assert client.audit(job_name)["ok"]
    live = sorted(set(range(4)) - {dead})
    client.redis.setbit(keys.done, live[0], 0)  # an ended attempt missing a live task
    client.redis.hset(keys.meta, "ndone", 2)
    assert not client.audit(job_name)["checks"]["ended_attempt_acked_every_live_task"]
    summary = json.loads(client.redis.hget(keys.passes, "0"))
    summary["acked"] = 2
    client.redis.hset(keys.passes, "0", json.dumps(summary))
    assert not client.audit(job_name)["checks"]["completed_attempts_acked_every_live_task"]


def test_progress_above_a_tasks_known_size_is_refused_before_any_write(client, job_name):
    """Chunks that say their size (parquet ``rows``): a report above the task's samples is
    refused with one clear InvalidInput, nothing buffered or sent; without a known size
    (chunks of another shape) any report is taken."""
    chunks = [
        {"format": "parquet", "path": f"p{i}.parquet", "row_groups": [0], "rows": 10}
        for i in range(2)
    ]
    client.create_job(job_name, chunks=chunks, chunks_per_task=2, manual_clock=True)
    t = trainer(client, job_name, "a")
    task = t.lease(timeout=0)
    with pytest.raises(taskq.InvalidInput, match=r"progress 21 of task 0 is beyond its size \(20"):
        t.progress(task, 21)
    t.progress(task, 20)
    assert t.flush_progress() == []
    assert client.redis.hget(client.keys(job_name).progress, str(task.id)) == "20"
    other = f"{job_name}-x"
    make_job(client, other, n=1)
    u = trainer(client, other, "b")
    big = u.lease(timeout=0)
    u.progress(big, 2**40)  # no size known: the record moves forward


def test_a_rewind_brings_back_to_life_many_tasks_dead_since_the_cut(client, job_name):
    """1,500 tasks die after the cut, spread over every dead step of a 20,000-task job
    (512 tasks a step); 50 dead at the cut stay dead. The rewind makes the dead set and
    its bitmap the cut's, clears the failure counts of those live again, and the pass
    then gives each of them once."""
    n = 20_000
    make_job(client, job_name, n=n, max_failures=1, shuffle=True)
    keys = client.keys(job_name)
    t = trainer(client, job_name, "a")
    for _ in range(50):
        t.fail(t.lease(timeout=0), "dead at the cut")
    before = dead_ids(client, job_name)
    ck = client.checkpoint(job_name)
    died = set()
    for _ in range(1500):
        task = t.lease(timeout=0)
        t.fail(task, "dies after the cut")
        died.add(task.id)
    assert max(died) > 16 * 512 and min(died) < 512
    assert client.rewind(job_name, ck)
    assert dead_ids(client, job_name) == before
    assert client.redis.bitcount(keys.deadbits) == len(before)
    assert not any(client.redis.hexists(keys.counts, f"f:{x}") for x in list(died)[:50])
    b = trainer(client, job_name, "b")
    again = {x.id for got in b.batches(32) for x in got}
    assert again == set(range(n)) - before
    assert client.audit(job_name)["ok"]
