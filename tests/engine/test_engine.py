"""The engine's task life, clocks, fencing and passes, against a real redis-server.

Trainers here run without their heartbeat thread (``heartbeat=False``) and jobs use the
manual clock, so every time-dependent step is explicit and exact.
"""

from __future__ import annotations

import json
import threading
import time
from functools import partial

import pytest
import support
from redis.cluster import key_slot

import taskq
from taskq.keys import JobKeys
from taskq.testing import lease_secret, trainer_worker, wait_until

make_job = partial(
    support.make_job, manual_clock=True, worker_ttl=5.0, heartbeat_interval=1.0, task_timeout=None
)


def trainer(client: taskq.Client, job: str, wid: str, **kw: object) -> taskq.Trainer:
    return taskq.Trainer(job, client=client, worker_id=wid, heartbeat=False, **kw)  # type: ignore[arg-type]


def st(client: taskq.Client, job: str) -> dict:
    return client.status(job).as_dict()


# -- create and bad input ----------------------------------------------------------
def test_create_job_groups_chunks_into_tasks(client, job_name):
    status = client.create_job(job_name, chunks=[{"i": i} for i in range(10)], chunks_per_task=3)
    assert (status.tasks, status.todo, status.state) == (4, 4, "running")
    t = trainer(client, job_name, "w")
    got = [t.lease(timeout=0) for _ in range(4)]
    assert [len(x.chunks) for x in got if x] == [3, 3, 3, 1]
    assert got[0].chunks == [{"i": 0}, {"i": 1}, {"i": 2}]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"worker_ttl": 0},
        {"worker_ttl": -1.0},
        {"heartbeat_interval": 0},
        {"heartbeat_interval": 5.0, "worker_ttl": 5.0},
        {"chunks_per_task": 0},
        {"passes": 0},
        {"task_timeout": -3},
        {"max_failures": 0},
        {"max_attempts": 0},
    ],
)
def test_invalid_config_raises_and_writes_nothing(client, job_name, kwargs):
    before = client.redis.dbsize()
    with pytest.raises(taskq.InvalidInput):
        client.create_job(job_name, chunks=[{"a": 1}], **kwargs)
    assert client.redis.dbsize() == before


@pytest.mark.parametrize("name", ["", "a b", "x" * 65, "jo{b}", "a/b"])
def test_bad_job_name_raises(client, name):
    with pytest.raises(taskq.InvalidInput):
        client.create_job(name, chunks=[{"a": 1}])


def test_empty_or_non_json_chunks_raise_and_write_nothing(client, job_name):
    before = client.redis.dbsize()
    with pytest.raises(taskq.InvalidInput):
        client.create_job(job_name, chunks=[])
    with pytest.raises(taskq.InvalidInput):
        client.create_job(job_name, chunks=[{"a": object()}])
    with pytest.raises(taskq.InvalidInput):
        client.create_job(job_name, chunks=[{"a": float("nan")}])
    assert client.redis.dbsize() == before


def test_existing_name_raises_job_exists(client, job_name):
    make_job(client, job_name)
    with pytest.raises(taskq.JobExists):
        make_job(client, job_name)


def test_unknown_job_raises_job_not_found(client):
    with pytest.raises(taskq.JobNotFound):
        client.status("no-such-job")
    with pytest.raises(taskq.JobNotFound):
        taskq.Trainer("no-such-job", client=client, heartbeat=False)


def test_redis_down_raises_connection_lost_with_masked_password():
    from support import free_port

    c = taskq.connect(f"redis://user:s3cret@127.0.0.1:{free_port()}/0", retries=0)
    with pytest.raises(taskq.ConnectionLost) as e:
        c.status("x")
    assert "s3cret" not in str(e.value) and "***" in str(e.value)


def test_all_keys_of_a_job_share_one_cluster_slot():
    keys = JobKeys("mnist")
    slots = {key_slot(k.encode()) for k in keys.all + [keys.staging_chunks("abc")]}
    assert len(slots) == 1


# -- task life -----------------------------------------------------------------------
def test_ack_marks_done_and_completes_the_pass(client, job_name):
    make_job(client, job_name, n=2, passes=2)
    t = trainer(client, job_name, "w")
    a, b = t.lease(timeout=0), t.lease(timeout=0)
    assert st(client, job_name)["leased"] == 2
    t.ack(a)
    t.ack(b)
    s = st(client, job_name)
    assert (s["pass"], s["done"], s["todo"]) == (1, 0, 2)
    assert s["summaries"][0]["done"] == 2


def test_fail_requeues_to_front_then_dead_at_max_failures(client, job_name):
    make_job(client, job_name, n=3, max_failures=2)
    t = trainer(client, job_name, "w")
    first = t.lease(timeout=0)
    t.fail(first, error="boom")
    again = t.lease(timeout=0)
    assert again.id == first.id, "re-dispatched work goes to the front"
    assert again.attempt == 2
    t.fail(again, error="boom")
    s = st(client, job_name)
    assert s["dead"] == 1 and s["counters"]["failed"] == 2
    assert client.tasks(job_name, "dead")[0]["id"] == first.id


def test_fail_naming_a_task_twice_is_refused_and_changes_nothing(client, job_name):
    """fail([t, t]) would be a batch of one task, sent back uncharged where fail(t) makes
    it dead at max_failures=1: the call is refused before its first write."""
    make_job(client, job_name, n=2, max_failures=1)
    t = trainer(client, job_name, "w")
    task = t.lease(timeout=0)
    before = st(client, job_name)
    with pytest.raises(taskq.InvalidInput, match="named twice"):
        t.fail([task, task], error="boom")
    after = st(client, job_name)
    assert (after["leased"], after["dead"], after["counters"]) == (
        before["leased"],
        before["dead"],
        before["counters"],
    )
    t.fail(task, error="boom")
    assert st(client, job_name)["dead"] == 1


def test_release_counts_attempts_until_dead_at_max_attempts(client, job_name):
    make_job(client, job_name, n=1, max_attempts=3, passes=2)
    t = trainer(client, job_name, "w")
    for _ in range(3):
        t.release(t.lease(timeout=0))
    s = st(client, job_name)
    assert s["dead"] == 1
    assert (s["state"], s["reason"]) == ("waiting", "all_dead")


def test_pass_with_dead_tasks_completes_over_live_ones(client, job_name):
    make_job(client, job_name, n=3, max_failures=1, passes=2)
    t = trainer(client, job_name, "w")
    tasks = [t.lease(timeout=0) for _ in range(3)]
    t.fail(tasks[0])
    t.ack(tasks[1])
    t.ack(tasks[2])
    s = st(client, job_name)
    assert (s["pass"], s["dead"], s["todo"]) == (1, 1, 2), "dead tasks stay out of later passes"
    ids = {t.lease(timeout=0).id for _ in range(2)}
    assert tasks[0].id not in ids and t.lease(timeout=0) is None


def test_retry_puts_dead_task_in_front_and_reopens_completed_job(client, job_name):
    make_job(client, job_name, n=2, max_failures=1, passes=1)
    t = trainer(client, job_name, "w")
    a, b = t.lease(timeout=0), t.lease(timeout=0)
    t.fail(a)
    t.ack(b)
    assert st(client, job_name)["state"] == "completed"
    assert client.retry(job_name) == 1
    s = st(client, job_name)
    assert (s["state"], s["dead"], s["todo"]) == ("running", 0, 1)
    again = t.lease(timeout=0)
    assert again.id == a.id and again.attempt == 1
    t.ack(again)
    assert st(client, job_name)["state"] == "completed"


def test_manual_advance_waits_then_pass_next(client, job_name):
    make_job(client, job_name, n=1, passes=3, auto_advance=False)
    t = trainer(client, job_name, "w")
    t.ack(t.lease(timeout=0))
    s = st(client, job_name)
    assert (s["state"], s["reason"], s["pass"]) == ("waiting", "manual_advance", 0)
    assert t.lease(timeout=0) is None
    with pytest.raises(taskq.PassMismatch):
        client.next_pass(job_name, expected_pass=5)
    assert client.next_pass(job_name) == 1
    assert t.lease(timeout=0).pass_no == 1


def test_pass_next_refuses_incomplete_pass_unless_forced(client, job_name):
    make_job(client, job_name, n=3, passes=2)
    t = trainer(client, job_name, "w")
    held = t.lease(timeout=0)
    with pytest.raises(taskq.PassIncomplete):
        client.next_pass(job_name)
    assert client.next_pass(job_name, force=True) == 1
    s = st(client, job_name)
    assert s["summaries"][0]["skipped"] == 3 and s["summaries"][0]["state"] == "skipped"
    with pytest.raises(taskq.LeaseLost):
        t.ack(held)
    assert st(client, job_name)["counters"]["stale"] == 1


def test_reset_pass_makes_old_leases_stale_and_restarts(client, job_name):
    make_job(client, job_name, n=2)
    t = trainer(client, job_name, "w")
    a = t.lease(timeout=0)
    t.ack(t.lease(timeout=0))
    client.reset_pass(job_name)
    s = st(client, job_name)
    assert (s["pass"], s["done"], s["todo"], s["pass_attempt"]) == (0, 0, 2, 1)
    with pytest.raises(taskq.LeaseLost):
        t.ack(a)


def test_cancel_ends_leases_and_lease_raises(client, job_name):
    make_job(client, job_name, n=2)
    t = trainer(client, job_name, "w")
    a = t.lease(timeout=0)
    client.cancel_job(job_name)
    with pytest.raises(taskq.JobCancelled):
        t.lease(timeout=0)
    with pytest.raises(taskq.LeaseLost):
        t.release(a)


def test_completed_job_lease_raises_job_completed(client, job_name):
    make_job(client, job_name, n=1)
    t = trainer(client, job_name, "w")
    t.ack(t.lease(timeout=0))
    with pytest.raises(taskq.JobCompleted):
        t.lease(timeout=0)


def test_revoke_sends_task_back_without_counting(client, job_name):
    make_job(client, job_name, n=2)
    t = trainer(client, job_name, "w")
    a = t.lease(timeout=0)
    assert client.revoke(job_name, a.id)
    assert client.tasks(job_name, "todo")[0]["id"] == a.id
    assert t.heartbeat() == [a.id]
    assert a.revoked.is_set()
    b = t.lease(timeout=0)
    assert b.id == a.id and b.attempt == 1 and b.token > a.token


# -- fencing -------------------------------------------------------------------------
def test_stale_ack_is_rejected_counted_and_task_counted_once(client, job_name):
    make_job(client, job_name, n=1, worker_ttl=2.0, heartbeat_interval=0.5)
    frozen, other = trainer(client, job_name, "frozen"), trainer(client, job_name, "other")
    task = frozen.lease(timeout=0)
    client.advance_clock(job_name, 1000)
    other.heartbeat()
    client.advance_clock(job_name, 1500)
    other.heartbeat()
    again = other.lease(timeout=0)
    assert again.id == task.id and again.token > task.token
    other.ack(again)
    with pytest.raises(taskq.LeaseLost):
        frozen.ack(task)
    s = st(client, job_name)
    assert s["counters"]["stale"] == 1 and s["counters"]["acked"] == 1
    assert s["counters"]["expired_worker_lost"] == 1
    events = [f["type"] for _, f in client.events(job_name, count=1000)]
    assert "stale" in events


def test_repeated_ack_with_same_token_is_quiet_and_counted_once(client, job_name):
    make_job(client, job_name, n=2)
    t = trainer(client, job_name, "w")
    a = t.lease(timeout=0)
    t.ack(a)
    t.ack(a)
    s = st(client, job_name)
    assert s["counters"]["acked"] == 1 and s["counters"]["stale"] == 0 and s["done"] == 1


def test_ack_with_an_older_token_of_the_same_worker_is_stale(client, job_name):
    make_job(client, job_name, n=1)
    t = trainer(client, job_name, "w")
    old = t.lease(timeout=0)
    t.release(old)
    new = t.lease(timeout=0)
    assert new.id == old.id and new.token > old.token
    with pytest.raises(taskq.LeaseLost):
        t.ack(old)
    t.ack(new)
    s = st(client, job_name)
    assert s["counters"]["acked"] == 1 and s["counters"]["stale"] == 1


def test_ack_from_another_worker_with_the_right_token_is_stale(client, job_name):
    make_job(client, job_name, n=1)
    owner, thief = trainer(client, job_name, "owner"), trainer(client, job_name, "thief")
    task = owner.lease(timeout=0)
    with pytest.raises(taskq.LeaseLost):
        thief.ack(task)
    owner.ack(task)
    assert st(client, job_name)["counters"]["acked"] == 1


def test_tokens_grow_after_restart_that_lost_the_aof_tail(own_redis, job_name):
    c = taskq.connect(own_redis.url)
    make_job(c, job_name, n=3, manual_clock=False)
    t = trainer(c, job_name, "w")
    first = t.lease(timeout=0)
    c.redis.execute_command("BGREWRITEAOF")

    def rewritten() -> bool:
        info = c.redis.info("persistence")
        return not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]

    assert wait_until(rewritten, 10)
    copy = own_redis.dir / "copy"
    import shutil

    shutil.copytree(own_redis.dir / "appendonlydir", copy)
    second = t.lease(timeout=0)
    assert second.token > first.token
    own_redis.kill()
    shutil.rmtree(own_redis.dir / "appendonlydir")
    shutil.copytree(copy, own_redis.dir / "appendonlydir")
    own_redis.start()
    c2 = taskq.connect(own_redis.url)
    t2 = trainer(c2, job_name, "w2")
    third = t2.lease(timeout=0)
    assert third.token > second.token, "tokens only grow, even after losing writes"


# -- clocks ----------------------------------------------------------------------------
def test_silent_worker_is_lost_after_ttl_and_its_task_goes_back(client, job_name):
    make_job(client, job_name, n=2, worker_ttl=3.0)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    held = a.lease(timeout=0)
    client.advance_clock(job_name, 2000)
    b.heartbeat()
    assert b.lease(timeout=0).id != held.id
    client.advance_clock(job_name, 1500)
    again = b.lease(timeout=0)
    assert again is not None and again.id == held.id, "lazy reclaim in the lease call"
    assert a.heartbeat() == [held.id] and held.revoked.is_set()


def test_task_timeout_expires_a_stuck_but_alive_trainer(client, job_name):
    make_job(client, job_name, n=1, task_timeout=10.0, max_failures=5)
    t = trainer(client, job_name, "w")
    task = t.lease(timeout=0)
    for _ in range(3):
        client.advance_clock(job_name, 4000)
        revoked = t.heartbeat()  # any call reclaims what it meets, bounded
    client.reap(job_name)
    s = st(client, job_name)
    assert s["counters"]["expired_task_timeout"] == 1 and s["todo"] == 1
    assert revoked == [task.id] and task.revoked.is_set()
    again = t.lease(timeout=0)
    assert again.id == task.id and again.attempt == 2


def test_auto_task_timeout_starts_after_twenty_acks(client, job_name):
    make_job(client, job_name, n=25, task_timeout="auto")
    t = trainer(client, job_name, "w")
    for _ in range(20):
        task = t.lease(timeout=0)
        client.advance_clock(job_name, 100)
        t.ack(task)
    cfg = st(client, job_name)["config"]
    assert cfg["auto_task_timeout_s"] == 60.0, "10 x p99 (100 ms bucket), at least 60 s"


def test_auto_task_timeout_applies_to_tasks_already_running(client, job_name):
    # the timeout runs from the start time: the first auto value (after the 20th ack)
    # caps a task started before it, which had no deadline when it started
    make_job(client, job_name, n=25, task_timeout="auto")
    x, w = trainer(client, job_name, "x"), trainer(client, job_name, "w")
    stuck = x.lease(timeout=0)
    for _ in range(20):
        task = w.lease(timeout=0)
        client.advance_clock(job_name, 100)
        w.ack(task)
    assert st(client, job_name)["config"]["auto_task_timeout_s"] == 60.0
    for _ in range(19):  # 57 s more: 59 s since the start, inside the 60 s
        client.advance_clock(job_name, 3000)
        assert x.heartbeat() == [] and w.heartbeat() == []
    client.advance_clock(job_name, 2000)
    w.heartbeat()
    assert x.heartbeat() == [stuck.id] and stuck.revoked.is_set()
    assert st(client, job_name)["counters"]["expired_task_timeout"] == 1


def test_silence_gives_every_worker_one_more_ttl(client, job_name):
    make_job(client, job_name, n=2, worker_ttl=3.0)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    held = a.lease(timeout=0)
    client.advance_clock(job_name, 60_000, silent=True)  # nobody called: the server's silence
    b.heartbeat()
    client.reap(job_name)
    assert st(client, job_name)["counters"]["expired_worker_lost"] == 0, "silence is not death"
    client.advance_clock(job_name, 2000)
    b.heartbeat()
    client.reap(job_name)
    assert st(client, job_name)["counters"]["expired_worker_lost"] == 0, "one more ttl"
    client.advance_clock(job_name, 2000)
    b.heartbeat()
    client.reap(job_name)
    s = st(client, job_name)
    assert s["counters"]["expired_worker_lost"] == 1, "a real loss after the grace"
    assert b.lease(timeout=0).id == held.id
    assert a.heartbeat() == [held.id]


def test_reregister_after_being_declared_lost(client, job_name):
    make_job(client, job_name, n=2, worker_ttl=2.0)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    held = a.lease(timeout=0)
    client.advance_clock(job_name, 1500)
    b.heartbeat()
    client.advance_clock(job_name, 1500)
    client.reap(job_name)
    old_inc = a.incarnation
    a.heartbeat()
    assert held.revoked.is_set() and a.incarnation != old_inc
    assert a.lease(timeout=0) is not None


def test_same_worker_id_registering_again_declares_old_incarnation_lost(client, job_name):
    make_job(client, job_name, n=2)
    old = trainer(client, job_name, "pod-0")
    held = old.lease(timeout=0)
    trainer(client, job_name, "pod-0")
    s = st(client, job_name)
    assert s["counters"]["expired_worker_lost"] == 1 and s["todo"] == 2
    with pytest.raises(taskq.LeaseLost):
        old.ack(held)


# -- heartbeat held pairs ------------------------------------------------------------
def test_lease_whose_reply_was_lost_is_revoked_by_heartbeat(client, job_name):
    make_job(client, job_name, n=2)
    t = trainer(client, job_name, "w")
    keys = client.keys(job_name).script
    # a lease call whose reply never reached the trainer (call number 7)
    reply = client.connection.scripts.call(
        "lease",
        keys,
        [t.job_incarnation, t.worker_id, t.incarnation, 1, 7, "S", -1, lease_secret(t)],
    )
    lost_id = int(reply[1][0][0])
    trainer_worker(t).leases.last_reply_no = 6
    t.heartbeat()
    assert st(client, job_name)["leased"] == 1, "a call whose reply may be in flight stays"
    trainer_worker(t).leases.last_reply_no = 7
    t.heartbeat()
    s = st(client, job_name)
    assert (s["leased"], s["todo"], s["counters"]["revoked"]) == (0, 2, 1)
    assert client.tasks(job_name, "todo")[0]["id"] == lost_id


# -- prefetch and stealing ----------------------------------------------------------
def test_idle_trainer_steals_reserved_never_started(client, job_name):
    make_job(client, job_name, n=2)
    slow, idle = trainer(client, job_name, "slow"), trainer(client, job_name, "idle")
    keys = client.keys(job_name).script
    reply = client.connection.scripts.call(
        "lease",
        keys,
        [
            slow.job_incarnation,
            "slow",
            slow.incarnation,
            2,
            1,
            "F",
            -1,
            lease_secret(slow),
        ],
    )
    started, reserved = (int(r[0]) for r in reply[1])
    stolen = idle.lease(timeout=0)
    assert stolen.id == reserved
    assert idle.lease(timeout=0) is None, "a started task is never taken"
    assert st(client, job_name)["counters"]["stolen"] == 1
    assert started != reserved


# -- waiting ---------------------------------------------------------------------------
def blocked(client: taskq.Client) -> int:
    """Clients of the server blocked in a call (a waiting trainer's BLPOP)."""
    return int(client.redis.info("clients")["blocked_clients"])


def test_waiting_trainer_wakes_when_a_task_is_released(client, job_name):
    make_job(client, job_name, n=1, manual_clock=False)
    holder, waiter = trainer(client, job_name, "h"), trainer(client, job_name, "w")
    task = holder.lease(timeout=0)
    got: list[object] = []
    before = blocked(client)
    th = threading.Thread(target=lambda: got.append(waiter.lease(timeout=20)))
    th.start()
    assert wait_until(lambda: blocked(client) > before, 5), "the waiter blocks"
    t0 = time.monotonic()
    holder.release(task)
    th.join(10)
    assert got and got[0] is not None and got[0].id == task.id
    assert time.monotonic() - t0 < 3.0


def test_waiting_trainer_wakes_when_the_job_is_cancelled(client, job_name):
    make_job(client, job_name, n=1, manual_clock=False)
    holder, waiter = trainer(client, job_name, "h"), trainer(client, job_name, "w")
    holder.lease(timeout=0)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            waiter.lease(timeout=20)
        except taskq.TaskqError as e:
            errors.append(e)

    before = blocked(client)
    th = threading.Thread(target=run)
    th.start()
    assert wait_until(lambda: blocked(client) > before, 5), "the waiter blocks"
    client.cancel_job(job_name)
    th.join(10)
    assert errors and isinstance(errors[0], taskq.JobCancelled)


def test_replace_while_a_trainer_runs(client, job_name):
    make_job(client, job_name, n=2)
    t = trainer(client, job_name, "w")
    task = t.lease(timeout=0)
    make_job(client, job_name, n=3, replace=True)
    with pytest.raises(taskq.JobNotFound):
        t.ack(task)
    s = st(client, job_name)
    assert (s["tasks"], s["todo"], s["counters"]["acked"]) == (3, 3, 0)


def test_library_reloads_after_function_flush(client, job_name):
    make_job(client, job_name, n=2)
    client.redis.function_flush()
    t = trainer(client, job_name, "w")
    assert t.lease(timeout=0) is not None


def test_shuffle_is_a_permutation_that_changes_per_pass(client, job_name):
    n = 50
    client.create_job(
        job_name, chunks=list(range(n)), shuffle=True, seed=7, passes=2, manual_clock=True
    )
    t = trainer(client, job_name, "w")
    orders = []
    for _ in range(2):
        order = []
        for _ in range(n):
            task = t.lease(timeout=0)
            order.append(task.id)
            t.ack(task)
        orders.append(order)
    assert sorted(orders[0]) == list(range(n)) and sorted(orders[1]) == list(range(n))
    assert orders[0] != orders[1] and orders[0] != list(range(n))


def test_events_stream_records_the_story(client, job_name):
    make_job(client, job_name, n=1)
    t = trainer(client, job_name, "w")
    t.ack(t.lease(timeout=0))
    entries = [f for _, f in client.events(job_name, count=100)]
    kinds = [f["type"] for f in entries]
    for k in ("job_created", "worker_joined", "step", "pass_completed", "job_completed"):
        assert k in kinds
    # one step entry per call: the lease's, then the ack's
    steps = [f for f in entries if f["type"] == "step"]
    assert [("leased" in f, "acked" in f) for f in steps] == [(True, False), (False, True)]
    assert json.loads(client.redis.hget(client.keys(job_name).passes, "0"))["done"] == 1


def test_reset_attempt_keeps_its_own_summary(client, job_name):
    make_job(client, job_name, n=1, passes=1)
    t = trainer(client, job_name, "w")
    t.lease(timeout=0)
    client.reset_pass(job_name)
    t.ack(t.lease(timeout=0))
    rows = client.audit(job_name)["passes"]
    assert [(r["pass"], r["state"]) for r in rows] == [(0, "reset"), (0, "completed")]
    assert rows[1]["resets"] == 1 and rows[1]["done"] == 1


def test_outage_just_under_the_ttl_is_a_silence_too(client, job_name):
    make_job(client, job_name, n=2, worker_ttl=5.0, heartbeat_interval=1.0)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    a.lease(timeout=0)
    client.advance_clock(job_name, 900)
    b.heartbeat()  # a's last call was 0.9 s before the outage began
    client.advance_clock(job_name, 4500, silent=True)
    b.heartbeat()
    client.reap(job_name)
    assert st(client, job_name)["counters"]["expired_worker_lost"] == 0


def test_repeating_the_ack_that_completed_a_pass_is_quiet(client, job_name):
    make_job(client, job_name, n=1, passes=2)
    t = trainer(client, job_name, "w")
    task = t.lease(timeout=0)
    t.ack(task)  # completes pass 0; pass 1 starts
    t.ack(task)  # a blind retry after a lost reply
    s = st(client, job_name)
    assert (s["pass"], s["counters"]["acked"], s["counters"]["stale"]) == (1, 1, 0)


def test_a_call_across_a_pass_end_writes_a_step_entry_per_pass(client, job_name):
    """The ack that completes pass 0 and the lease of pass 1 go in one call: each kind is
    in the step entry of its own pass (the pass ends between them)."""
    make_job(client, job_name, n=2, passes=2)
    t = taskq.Trainer(job_name, client=client, heartbeat=False, handle_signals=False)
    try:
        seen = [(task.pass_no, task.id) for task, _ in zip(t, range(4), strict=False)]
    finally:
        t.close()
    assert [p for p, _ in seen] == [0, 0, 1, 1]
    steps = [f for _, f in client.events(job_name, count=100) if f["type"] == "step"]
    by_pass = [(f["pass"], sorted(k for k in ("acked", "leased") if k in f)) for f in steps]
    # lease 0; ack 0 + lease 1; ack 1 (pass 0 ends) | lease (pass 1); ack + lease; ...
    assert by_pass[:4] == [
        ("0", ["leased"]),
        ("0", ["acked", "leased"]),
        ("0", ["acked"]),
        ("1", ["leased"]),
    ], by_pass
