"""Failure placement against a real redis-server: a task a worker just failed goes to
another worker first; the failer gets it back only after one heartbeat interval, or at
once when it is the only live worker (docs/trainers.md, "Tails").

Jobs run on the manual clock, so the backoff passes only when a test moves the clock.
"""

from __future__ import annotations

from typing import Any

import taskq
from taskq.testing import lease_secret


def make_job(client: taskq.Client, name: str, n: int = 3, **kw: Any) -> taskq.JobStatus:
    kw.setdefault("manual_clock", True)
    kw.setdefault("worker_ttl", 5.0)
    kw.setdefault("heartbeat_interval", 1.0)
    kw.setdefault("task_timeout", None)
    return client.create_job(name, chunks=[{"i": i} for i in range(n)], **kw)


def trainer(client: taskq.Client, job: str, wid: str) -> taskq.Trainer:
    return taskq.Trainer(job, client=client, worker_id=wid, heartbeat=False, ranges=True)


def test_a_failed_task_goes_to_another_live_worker_first(client, job_name):
    make_job(client, job_name, n=3, max_failures=2)
    broken, healthy = trainer(client, job_name, "broken"), trainer(client, job_name, "healthy")
    first = broken.lease(timeout=0)
    broken.fail(first, error="CUDA error")
    nxt = broken.lease(timeout=0)
    assert nxt is not None and nxt.id != first.id, "the failer gets other work first"
    again = healthy.lease(timeout=0)
    assert again is not None and again.id == first.id, "the failed task waits at the front"
    assert again.attempt == 2


def test_one_broken_node_cannot_burn_a_task_to_dead(client, job_name):
    make_job(client, job_name, n=1, max_failures=2)
    broken, healthy = trainer(client, job_name, "broken"), trainer(client, job_name, "healthy")
    task = broken.lease(timeout=0)
    broken.fail(task, error="boom")
    assert broken.lease(timeout=0) is None, "not handed back to the worker that failed it"
    s = client.status(job_name, summaries=0)
    assert (s.dead, s.todo) == (0, 1)
    again = healthy.lease(timeout=0)
    assert again is not None and again.id == task.id
    healthy.ack(again)
    assert client.status(job_name, summaries=0).state == "completed"


def test_the_failer_gets_it_back_after_one_heartbeat_interval(client, job_name):
    make_job(client, job_name, n=1, max_failures=3, heartbeat_interval=1.0)
    broken = trainer(client, job_name, "broken")
    busy = trainer(client, job_name, "busy")  # alive, but never asks for work here
    task = broken.lease(timeout=0)
    broken.fail(task)
    client.advance_clock(job_name, 999)
    broken.heartbeat(), busy.heartbeat()
    assert broken.lease(timeout=0) is None, "still inside the backoff"
    client.advance_clock(job_name, 1)
    again = broken.lease(timeout=0)
    assert again is not None and again.id == task.id, "after the backoff it may retry it"


def test_the_only_live_worker_gets_its_failed_task_back_at_once(client, job_name):
    make_job(client, job_name, n=1, max_failures=3)
    alone = trainer(client, job_name, "alone")
    task = alone.lease(timeout=0)
    alone.fail(task)
    again = alone.lease(timeout=0)
    assert again is not None and again.id == task.id, "nobody else could take it"


def test_a_lost_other_worker_does_not_count_as_able_to_take_it(client, job_name):
    make_job(client, job_name, n=1, max_failures=3, worker_ttl=2.0, heartbeat_interval=0.5)
    gone = trainer(client, job_name, "gone")
    broken = trainer(client, job_name, "broken")
    client.advance_clock(job_name, 1900)
    task = broken.lease(timeout=0)  # renews "broken" only: "gone" expires at 2000
    broken.fail(task)
    client.advance_clock(job_name, 200)
    assert gone.worker_id == "gone"
    again = broken.lease(timeout=0)
    assert again is not None and again.id == task.id


def test_the_failed_worker_waits_no_longer_than_the_backoff(client, job_name):
    make_job(client, job_name, n=1, max_failures=3, heartbeat_interval=1.0)
    broken, busy = trainer(client, job_name, "broken"), trainer(client, job_name, "busy")
    task = broken.lease(timeout=0)
    broken.fail(task)
    client.advance_clock(job_name, 400)
    keys = client.keys(job_name)
    reply = client.connection.scripts.call(
        "lease",
        keys.script,
        [
            broken.job_incarnation,
            "broken",
            broken.incarnation,
            1,
            999,
            "S",
            -1,
            lease_secret(broken),
        ],
    )
    assert int(reply[0]) == 1 and reply[1] == []  # NOTHING
    assert 0 < int(reply[2]) <= 601, "the wait bound ends with the backoff"
    assert busy.worker_id == "busy"


def test_an_ack_forgets_who_failed_the_task(client, job_name):
    make_job(client, job_name, n=1, max_failures=3, passes=2)
    broken, healthy = trainer(client, job_name, "broken"), trainer(client, job_name, "healthy")
    task = broken.lease(timeout=0)
    broken.fail(task)
    healthy.ack(healthy.lease(timeout=0))
    counts = client.redis.hgetall(client.keys(job_name).counts)
    assert not any(k.startswith("x:") for k in counts), counts
    again = broken.lease(timeout=0)  # pass 2
    assert again is not None and again.id == task.id
