"""Backup leases against a real redis-server: at the tail of a pass an idle trainer takes
a backup lease of a task that has run longer than k x the job's median task time; the
first ack wins, the other holder's lease is revoked (its ack stale, counted), the audit
counts the task once; at most one backup per task, only at the tail, off with
backup_leases=False; when one holder fails, releases, leaves or is lost, the other carries
on (docs/trainers.md, "Tails").

Jobs run on the manual clock: every acked task takes 100 ms, so the median is 100 ms
and the default k = 2 puts the bar at 200 ms.
"""

from __future__ import annotations

from typing import Any

import pytest

import taskq
from taskq.testing import lease_secret

N = 12


def make_job(client: taskq.Client, name: str, **kw: Any) -> taskq.JobStatus:
    kw.setdefault("manual_clock", True)
    kw.setdefault("backup_leases", True)
    kw.setdefault("worker_ttl", 5.0)
    kw.setdefault("heartbeat_interval", 1.0)
    kw.setdefault("task_timeout", None)
    kw.setdefault("passes", 2)
    return client.create_job(name, chunks=[{"i": i} for i in range(N)], **kw)


def trainer(client: taskq.Client, job: str, wid: str) -> taskq.Trainer:
    return taskq.Trainer(job, client=client, worker_id=wid, heartbeat=False)


def tail(client: taskq.Client, job: str) -> tuple[taskq.Trainer, taskq.Trainer, Any]:
    """`fast` acks N - 1 tasks of 100 ms each; `slow` holds the last one, started."""
    fast, slow = trainer(client, job, "fast"), trainer(client, job, "slow")
    straggler = slow.lease(timeout=0)
    assert straggler is not None
    for _ in range(N - 1):
        task = fast.lease(timeout=0)
        assert task is not None
        client.advance_clock(job, 100)
        fast.ack(task)
    slow.heartbeat()
    fast.heartbeat()  # (heartbeats renew a worker, its leases and acks do not)
    s = client.status(job, summaries=0)
    assert (s.done, s.leased, s.todo) == (N - 1, 1, 0)
    return fast, slow, straggler


def counters(client: taskq.Client, job: str) -> dict[str, int]:
    return client.status(job, summaries=0).counters


def assert_pass_counted_once(client: taskq.Client, job: str) -> None:
    s = client.status(job, summaries=0)
    assert s.pass_no == 1, "the pass ended"
    assert counters(client, job)["acked"] == N, "every task acked once"
    audit = client.audit(job)
    assert audit["ok"], audit["checks"]
    assert audit["passes"][0]["done"] == N


def test_no_backup_before_k_times_the_median(client, job_name):
    make_job(client, job_name)
    fast, _, _ = tail(client, job_name)  # the straggler has run 1.1 s already
    keys = client.keys(job_name)
    client.redis.hset(keys.meta, "backup_k", 20)  # bar: 20 x 100 ms = 2 s
    assert fast.lease(timeout=0) is None
    client.advance_clock(job_name, 899)
    fast.heartbeat()
    assert fast.lease(timeout=0) is None, "1999 ms"
    client.advance_clock(job_name, 1)
    backup = fast.lease(timeout=0)
    assert backup is not None


@pytest.mark.parametrize("first", ["backup", "straggler"])
def test_the_first_ack_wins_and_the_other_lease_is_revoked(client, job_name, first):
    make_job(client, job_name)
    fast, slow, straggler = tail(client, job_name)
    backup = fast.lease(timeout=0)
    assert backup is not None and backup.id == straggler.id, "a backup of the straggler"
    assert backup.token != straggler.token
    assert client.status(job_name, summaries=0).leased == 1, "one task leased, not two"
    winner, won, loser, lost = (
        (fast, backup, slow, straggler) if first == "backup" else (slow, straggler, fast, backup)
    )
    client.advance_clock(job_name, 100)
    winner.ack(won)
    assert client.status(job_name, summaries=0).pass_no == 1, "the first ack ended the pass"
    assert loser.heartbeat() == [lost.id] and lost.revoked.is_set()
    with pytest.raises(taskq.LeaseLost):
        loser.ack(lost)
    c = counters(client, job_name)
    assert (c["revoked"], c["stale"]) == (1, 1)
    assert_pass_counted_once(client, job_name)


def test_at_most_one_backup_per_task(client, job_name):
    make_job(client, job_name)
    fast, _, straggler = tail(client, job_name)
    third = trainer(client, job_name, "third")
    assert fast.lease(timeout=0).id == straggler.id
    client.advance_clock(job_name, 1000)
    assert third.lease(timeout=0) is None, "the task has its one backup"
    assert fast.lease(timeout=0) is None
    assert client.redis.hget(client.keys(job_name).meta, "c_backups") == "1"


def test_only_at_the_tail_of_a_pass(client, job_name):
    make_job(client, job_name)
    fast, slow = trainer(client, job_name, "fast"), trainer(client, job_name, "slow")
    straggler = slow.lease(timeout=0)
    for _ in range(N - 2):
        task = fast.lease(timeout=0)
        client.advance_clock(job_name, 100)
        fast.ack(task)
    for _ in range(5):  # the straggler runs 5 s longer, alive
        client.advance_clock(job_name, 1000)
        slow.heartbeat(), fast.heartbeat()
    nxt = fast.lease(timeout=0)
    assert nxt is not None and nxt.id != straggler.id, "todo first, however long it runs"
    assert client.redis.hget(client.keys(job_name).meta, "c_backups") in (None, "0")


def test_backup_leases_false_turns_it_off(client, job_name):
    make_job(client, job_name, backup_leases=False)
    fast, _, _ = tail(client, job_name)
    client.advance_clock(job_name, 2000)
    assert fast.lease(timeout=0) is None


def test_a_bad_backup_factor_is_refused(client, job_name):
    with pytest.raises(taskq.InvalidInput, match="backup_factor"):
        make_job(client, job_name, backup_factor=1.0)


@pytest.mark.parametrize(
    ("holder", "end"),
    [("straggler", "fail"), ("backup", "fail"), ("backup", "leave")],
    ids=["straggler-fails", "backup-fails", "backup-holder-leaves"],
)
def test_one_holder_failing_or_leaving_leaves_the_other_running(client, job_name, holder, end):
    make_job(client, job_name)
    fast, slow, straggler = tail(client, job_name)
    backup = fast.lease(timeout=0)
    assert backup is not None
    ender, ended, other, kept = (
        (slow, straggler, fast, backup)
        if holder == "straggler"
        else (fast, backup, slow, straggler)
    )
    if end == "fail":
        ender.fail(ended, error="boom")
    else:
        ender.close()
    s = client.status(job_name, summaries=0)
    assert (s.leased, s.todo, s.dead) == (1, 0, 0), "not requeued: the other holder carries on"
    assert other.heartbeat() == []
    client.advance_clock(job_name, 100)
    other.ack(kept)
    assert_pass_counted_once(client, job_name)


def test_a_lost_straggler_leaves_the_backup_running(client, job_name):
    make_job(client, job_name)
    fast, _, straggler = tail(client, job_name)
    backup = fast.lease(timeout=0)
    client.advance_clock(job_name, 4000)
    fast.heartbeat()
    client.advance_clock(job_name, 2000)  # "slow" silent for > 5 s: lost
    assert fast.heartbeat() == [], "the backup is the task's lease now"
    s = client.status(job_name, summaries=0)
    assert (s.leased, s.todo) == (1, 0)
    assert counters(client, job_name)["expired_worker_lost"] == 1
    assert client.redis.hget(client.keys(job_name).counts, f"a:{backup.id}") == "1", (
        "the loss is charged though the backup carries on"
    )
    fast.ack(backup)
    assert_pass_counted_once(client, job_name)
    assert straggler.id == backup.id


def test_an_operator_revoke_takes_both_leases(client, job_name):
    make_job(client, job_name)
    fast, slow, straggler = tail(client, job_name)
    backup = fast.lease(timeout=0)
    client.revoke(job_name, straggler.id)
    s = client.status(job_name, summaries=0)
    assert (s.leased, s.todo) == (0, 1)
    assert slow.heartbeat() == [straggler.id] and fast.heartbeat() == [backup.id]


def test_a_waiter_comes_back_when_the_straggler_passes_the_bar(client, job_name):
    make_job(client, job_name)
    fast, _, _ = tail(client, job_name)  # the straggler started at 0; now is 1100 ms
    keys = client.keys(job_name)
    client.redis.hset(keys.meta, "backup_k", 20)  # bar: 20 x the median
    median = 100
    reply = client.connection.scripts.call(
        "lease",
        keys.script,
        [
            fast.job_incarnation,
            "fast",
            fast.incarnation,
            1,
            999,
            "S",
            -1,
            lease_secret(fast),
        ],
    )
    assert int(reply[0]) == 1 and reply[1] == []  # NOTHING
    assert int(reply[2]) == 20 * median - 1100 + 1, "woken when a backup is due"


def test_an_ending_the_other_lease_survives_is_still_charged(client, job_name):
    """A task that kills whoever runs it must not kill twice as many trainers."""
    make_job(client, job_name, max_failures=1)
    fast, slow, straggler = tail(client, job_name)
    backup = fast.lease(timeout=0)
    fast.fail(backup, error="boom")  # the cap is 1 failure: the task is dead
    s = client.status(job_name, summaries=0)
    assert (s.dead, s.pass_no) == (1, 1), "dead, and the pass ended over the live tasks"
    assert slow.heartbeat() == [straggler.id], "the straggler's lease went with it"
    assert client.audit(job_name)["ok"]
    assert counters(client, job_name)["failed"] == 1


def test_no_backup_of_a_task_that_already_cost_an_attempt(client, job_name):
    make_job(client, job_name)
    fast, slow, straggler = tail(client, job_name)
    slow.release(straggler)  # an attempt counted: it may be a poison task
    again = slow.lease(timeout=0)
    assert again is not None and again.id == straggler.id and again.attempt == 2
    client.advance_clock(job_name, 1000)
    slow.heartbeat()
    assert fast.lease(timeout=0) is None


def test_the_median_follows_the_usual_task_not_the_stragglers(client, job_name):
    client.create_job(
        job_name,
        chunks=[{"i": i} for i in range(40)],
        manual_clock=True,
        task_timeout=None,
        passes=1,
    )
    t = trainer(client, job_name, "w")
    for i in range(30):
        task = t.lease(timeout=0)
        client.advance_clock(job_name, 2000 if i % 6 == 5 else 100)  # 5 of 30 are slow
        t.heartbeat()
        t.ack(task)
    med_us = int(client.redis.hget(client.keys(job_name).meta, "dur_med"))
    assert 95_000 <= med_us <= 125_000, med_us
