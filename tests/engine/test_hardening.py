"""Bounds and ways out, against a real redis-server: what one worker may hold and leave,
the size of an event, delete / cancel out of memory, a pass of dead tasks, the pass
compare-and-set, the summaries kept, pause and resume.
"""

from __future__ import annotations

import threading

import pytest
import redis
from support import RedisServer

import taskq
from taskq.engine.contract import (
    EVENT_LIST_MAX,
    MAX_BATCH,
    MAX_HELD,
    MAX_PREFETCH,
    MAX_RECLAIM,
    PAGE_MAX,
)
from taskq.keys import JobKeys


def trainer(client: taskq.Client, job: str, wid: str, **kw: object) -> taskq.Trainer:
    return taskq.Trainer(job, client=client, worker_id=wid, heartbeat=False, **kw)  # type: ignore[arg-type]


def make_job(client: taskq.Client, job: str, n: int, **kw: object) -> taskq.JobStatus:
    kw.setdefault("task_timeout", None)
    return client.create_job(job, chunks=[{"i": i} for i in range(n)], **kw)  # type: ignore[arg-type]


# -- what one worker may hold, and leaving with all of it ----------------------------
def test_prefetch_above_the_cap_is_refused(client, job_name):
    make_job(client, job_name, 4)
    with pytest.raises(taskq.InvalidInput, match=rf"prefetch must be in \[0, {MAX_PREFETCH}\]"):
        trainer(client, job_name, "w", prefetch=MAX_PREFETCH + 1)
    t = trainer(client, job_name, "w2", prefetch=MAX_PREFETCH)
    t.close()


def test_a_worker_holds_at_most_max_held_leases(client, job_name):
    make_job(client, job_name, MAX_HELD + 10)
    t = trainer(client, job_name, "w")
    for _ in range(MAX_HELD):
        assert t.lease(timeout=0) is not None
    with pytest.raises(taskq.InvalidInput, match=rf"holds {MAX_HELD} leases"):
        t.lease(timeout=0)
    assert client.status(job_name).leased == MAX_HELD
    t.close()


def test_the_cap_counts_the_worker_not_the_job(client, job_name):
    """The cap's count is skipped while the job as a whole holds too few to reach it; with
    others holding leases too, a worker at the cap is refused and a batch that would pass
    it is cut to what is left, while the others lease on."""
    make_job(client, job_name, 2 * MAX_HELD + 10)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    for _ in range(8):
        assert b.lease(timeout=0) is not None
    got = 0
    while got < MAX_HELD - 5:
        got += len(a.lease_many(min(MAX_BATCH, MAX_HELD - 5 - got), timeout=0))
    assert len(a.lease_many(MAX_BATCH, timeout=0)) == 5, "cut to the cap's remainder"
    with pytest.raises(taskq.InvalidInput, match=rf"holds {MAX_HELD} leases"):
        a.lease(timeout=0)
    assert b.lease(timeout=0) is not None
    assert client.status(job_name).leased == MAX_HELD + 9
    a.close()
    b.close()


def test_leaving_with_more_than_one_call_ends_leaves_the_rest_reclaimable(client, job_name):
    """Started leases with no deadline (auto timeout not known yet) used to stay leased
    for good past the leave's limit; the rest is now a lost worker's, reclaimed in
    bounded steps by the next calls, and the pass completes."""
    n = MAX_HELD + 20
    make_job(client, job_name, n, task_timeout="auto")
    t = trainer(client, job_name, "big")
    for _ in range(MAX_HELD):
        assert t.lease(timeout=0) is not None
    t.close()
    status = client.status(job_name)
    assert status.workers == 0
    assert status.leased == MAX_HELD - MAX_RECLAIM  # one call ended MAX_RECLAIM of them
    other = trainer(client, job_name, "other")
    assert sum(1 for task in other) == n  # lazy reclaim in its calls gave it the rest
    other.close()
    status = client.status(job_name)
    assert (status.state, status.leased, status.counters["acked"]) == ("completed", 0, n)
    assert client.audit(job_name)["ok"]
    assert client.redis.hlen(JobKeys(job_name).winfo) == 0


# -- listings come in pages ----------------------------------------------------------
def test_listings_page_through_every_state_completely(client, job_name):
    n = 3 * PAGE_MAX + 17
    make_job(client, job_name, n, max_failures=1, shuffle=True, seed=7)
    t = trainer(client, job_name, "w")
    done, dead, leased = set(), set(), set()
    for _ in range(PAGE_MAX + 5):
        task = t.lease(timeout=0)
        assert task is not None
        t.ack(task)
        done.add(task.id)
    for _ in range(7):
        task = t.lease(timeout=0)
        assert task is not None
        t.fail(task, "dead at once")
        dead.add(task.id)
    for _ in range(MAX_BATCH):
        task = t.lease(timeout=0)
        assert task is not None
        leased.add(task.id)
    t.release([x for x in t.held][:3])  # three back to the front: listed first in todo
    leased -= {x for x in leased if x not in {h.id for h in t.held}}
    expected = {
        "done": done,
        "dead": dead,
        "leased": leased,
        "todo": set(range(n)) - done - dead - leased,
    }
    for state, ids in expected.items():
        pages, cursor, seen = 0, "0", []
        while True:
            rows, cursor = client.tasks_page(job_name, state, cursor)
            assert len(rows) <= PAGE_MAX
            seen += [r["id"] for r in rows]
            pages += 1
            if cursor == "0":
                break
        assert sorted(seen) == sorted(ids), state
        assert {r["id"] for r in client.tasks(job_name, state, limit=10**6)} == ids
    assert len(client.tasks(job_name, "todo", limit=5)) == 5
    with pytest.raises(taskq.InvalidInput, match="count must be in"):
        client.tasks_page(job_name, "todo", "0", PAGE_MAX + 1)
    t.close()


# -- events: an entry is bounded ----------------------------------------------------
def test_a_batch_event_lists_a_bounded_number_of_tasks(client, job_name):
    make_job(client, job_name, MAX_BATCH)
    t = trainer(client, job_name, "w")
    batch = next(iter(t.batches(MAX_BATCH)))
    assert len(batch) == MAX_BATCH
    leased = [f for _, f in client.events(job_name, count=100) if "leased" in f]
    assert leased[0]["type"] == "step" and int(leased[0]["leased_count"]) == MAX_BATCH
    assert len(leased[0]["leased"].split(",")) == EVENT_LIST_MAX
    assert len(leased[0]["leased_tokens"].split(",")) == EVENT_LIST_MAX
    t.close()


# -- out of memory: the operator's way out ------------------------------------------
def fill(r: redis.Redis) -> None:
    """Write 1 MB values until Redis refuses (maxmemory, noeviction), then lower maxmemory
    under what is used, so the server stays out of memory whatever small buffers it frees."""
    for i in range(1000):
        try:
            r.set(f"filler:{i}", b"x" * 1_000_000)
        except redis.exceptions.OutOfMemoryError:
            break
    else:
        raise AssertionError("never out of memory")
    r.config_set("maxmemory", int(r.info("memory")["used_memory"]) - 4_000_000)


def test_delete_and_cancel_run_out_of_memory():
    server = RedisServer(extra=["--maxmemory", "50mb", "--maxmemory-policy", "noeviction"])
    try:
        client = taskq.connect(server.url)
        for job in ("a", "b"):
            make_job(client, job, 100)
        t = trainer(client, "a", "w")
        assert t.lease(timeout=0) is not None
        fill(server.client())
        with pytest.raises(taskq.TaskqError, match="out of memory"):
            client.connection.run("a", "lease", ["", "w2", "i", 1, 1, "S", -1])
        client.pause_job("b")  # a flag: allowed too
        client.cancel_job("a")
        assert client.status("a").state == "cancelled"
        client.delete_job("b")
        with pytest.raises(taskq.JobNotFound):
            client.status("b")
        client.delete_job("a")
        assert client.list_jobs() == []
    finally:
        server.cleanup()


# -- a pass of dead tasks --------------------------------------------------------------
def all_dead_job(client: taskq.Client, job: str) -> None:
    make_job(client, job, 2, max_failures=1, passes=None)
    t = trainer(client, job, "w")
    for _ in range(2):
        task = t.lease(timeout=0)
        assert task is not None
        t.fail(task, "boom")
    t.close()
    status = client.status(job)
    assert (status.state, status.reason) == ("waiting", "all_dead")


def test_forced_next_pass_of_all_dead_tasks_waits_at_once(client, job_name):
    all_dead_job(client, job_name)
    assert client.next_pass(job_name, force=True) == 1
    status = client.status(job_name)
    assert (status.state, status.reason, status.todo) == ("waiting", "all_dead", 0)


def test_reset_of_all_dead_tasks_waits_at_once(client, job_name):
    all_dead_job(client, job_name)
    client.reset_pass(job_name)
    status = client.status(job_name)
    assert (status.state, status.reason) == ("waiting", "all_dead")
    assert client.retry(job_name) == 2  # and the way back still works
    assert client.status(job_name).state == "running"


# -- the pass compare-and-set ----------------------------------------------------------
def test_concurrent_next_pass_without_expect_advances_once_per_read(client, job_name):
    """Both advancers read the same pass: exactly one moves it (the other's compare-and-set
    on the pass it read fails), 30 times over."""
    make_job(client, job_name, 4, passes=None)
    for _ in range(30):
        start = client.status(job_name).pass_no
        barrier = threading.Barrier(2)
        results: list[object] = []

        def advance(barrier: threading.Barrier = barrier, results: list[object] = results) -> None:
            c = taskq.Client(redis_client=client.redis)
            read = c.status(job_name, summaries=0).pass_no
            barrier.wait()
            try:
                results.append(c.next_pass(job_name, expected_pass=read, force=True))
            except taskq.PassMismatch as e:
                results.append(e)

        threads = [threading.Thread(target=advance) for _ in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(10)
        assert client.status(job_name).pass_no == start + 1
        assert sum(isinstance(r, taskq.PassMismatch) for r in results) == 1


# -- summaries kept --------------------------------------------------------------------
def test_reset_summaries_are_trimmed(client, job_name):
    make_job(client, job_name, 2)
    for _ in range(1010):
        client.reset_pass(job_name)
    assert client.redis.hlen(JobKeys(job_name).passes) == 1000
    kept = client.audit(job_name)["passes"]
    assert max(s["resets"] for s in kept) == 1009


# -- pause and resume ------------------------------------------------------------------
def test_pause_gives_no_new_leases_keeps_held_ones_and_resume_wakes_waiters(client, job_name):
    make_job(client, job_name, 4)
    holder, waiter = trainer(client, job_name, "holder"), trainer(client, job_name, "waiter")
    held = holder.lease(timeout=0)
    assert held is not None
    client.pause_job(job_name)
    client.pause_job(job_name)  # idempotent
    status = client.status(job_name)
    assert (status.state, status.leased) == ("paused", 1)
    assert waiter.lease(timeout=0.2) is None
    holder.ack(held)  # what is held is still acked as usual
    assert holder.heartbeat() == []
    got: list[taskq.Task | None] = []
    th = threading.Thread(target=lambda: got.append(waiter.lease(timeout=30)))
    th.start()
    try:
        assert th.is_alive()
        client.resume_job(job_name)
    finally:
        th.join(30)
    assert got and got[0] is not None
    kinds = [f["type"] for _, f in client.events(job_name, count=100)]
    assert "job_paused" in kinds and "job_resumed" in kinds
    assert client.status(job_name).state == "running"
    holder.close()
    waiter.close()


def test_cli_pause_and_resume(url, client, job_name):
    from click.testing import CliRunner
    from taskq.cli.main import cli

    make_job(client, job_name, 2)
    r = CliRunner().invoke(cli, ["--url", url, "job", "pause", job_name])
    assert r.exit_code == 0 and "paused" in r.output
    r = CliRunner().invoke(cli, ["--url", url, "job", "status", job_name, "--json"])
    assert r.exit_code == 0 and '"state": "paused"' in r.output
    r = CliRunner().invoke(cli, ["--url", url, "job", "resume", job_name])
    assert r.exit_code == 0 and "resumed" in r.output
    assert client.status(job_name).state == "running"
    client.cancel_job(job_name)
    r = CliRunner().invoke(cli, ["--url", url, "job", "pause", job_name])
    assert r.exit_code != 0 and "cancelled" in r.output + (r.stderr or "")


def test_a_paused_job_still_ends_a_per_pass_iterator_at_a_manual_boundary(client, job_name):
    make_job(client, job_name, 2, passes=2, auto_advance=False)
    t = trainer(client, job_name, "w")
    passes = t.passes()
    assert len(list(next(passes))) == 2
    client.pause_job(job_name)
    status = client.status(job_name)
    assert (status.state, status.reason) == ("waiting", "manual_advance")
    assert t.lease(timeout=0, expect_pass=0) is None
    # the pass is done for it (PASS_DONE): not left waiting for a resume
    assert client.redis.zcard(JobKeys(job_name).waiting) == 0
    client.next_pass(job_name)
    client.resume_job(job_name)
    assert len(list(next(passes))) == 2
    t.close()
    assert client.status(job_name).state == "completed"
