"""The hot path's shortcuts keep the semantics: reclaim's stored hint, the packed FCALL.

Against a real redis-server. Reclaim skips its scans while the job clock is below the
meta field ``due``; these tests set deadlines below a stored hint (a short-ttl worker, a
short task timeout) and check that the next ordinary call still reclaims on time. The
packed FCALL keeps one connection out of the pool: a restart of Redis and a forked child
must not see a stale or shared socket.
"""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import sys
from functools import partial

import pytest
import redis
import support
from redis.backoff import NoBackoff
from redis.retry import Retry

import taskq
from taskq.engine.transport import Scripts
from taskq.keys import JobKeys
from taskq.testing import lease_secret

make_job = partial(
    support.make_job, manual_clock=True, worker_ttl=5.0, heartbeat_interval=1.0, task_timeout=None
)


def trainer(client: taskq.Client, job: str, wid: str, **kw: object) -> taskq.Trainer:
    return taskq.Trainer(job, client=client, worker_id=wid, heartbeat=False, **kw)  # type: ignore[arg-type]


def counters(client: taskq.Client, job: str) -> dict:
    return client.status(job, summaries=0).counters


def test_a_short_ttl_worker_joining_under_the_hint_is_reclaimed_on_time(client, job_name):
    make_job(client, job_name, n=3)
    a = trainer(client, job_name, "a")
    a.lease(timeout=0)  # reclaim scanned: the hint is a second ahead at most
    b = trainer(client, job_name, "b", worker_ttl=0.2)  # a deadline below that hint
    lost = b.lease(timeout=0)
    client.advance_clock(job_name, 300)
    again = a.lease(timeout=0)  # an ordinary call (no reaper): lazy reclaim
    assert counters(client, job_name)["expired_worker_lost"] == 1
    assert again is not None and again.id == lost.id, "b's task went back and was leased"


def test_a_task_timeout_below_the_hint_expires_on_time(client, job_name):
    make_job(client, job_name, n=2, task_timeout=0.3, max_failures=5)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    stuck = a.lease(timeout=0)
    client.advance_clock(job_name, 400)
    b.heartbeat()  # b stays alive; a's lease is past its 300 ms timeout
    got = b.lease(timeout=0)
    assert counters(client, job_name)["expired_task_timeout"] == 1
    assert got is not None and got.id in (stuck.id, 1 - stuck.id)


def test_nothing_is_reclaimed_before_it_is_due(client, job_name):
    make_job(client, job_name, n=2, worker_ttl=1.0, heartbeat_interval=0.25)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    a.lease(timeout=0)
    client.advance_clock(job_name, 999)
    b.heartbeat()  # (b's heartbeats renew it, its leases do not: docs/design.md)
    b.lease(timeout=0)
    assert counters(client, job_name)["expired_worker_lost"] == 0
    client.advance_clock(job_name, 2)
    b.heartbeat()
    assert counters(client, job_name)["expired_worker_lost"] == 1


def test_a_lost_worker_a_budgeted_reclaim_left_is_answered_lost(client, job_name):
    """A lease call does not renew its worker (heartbeats do): past its deadline it is
    lost, also when the call's reclaim stopped at its budget before reaching it."""
    from taskq.engine.contract import LAZY_RECLAIM, Code

    make_job(client, job_name, n=LAZY_RECLAIM + 4, worker_ttl=1.0, heartbeat_interval=0.25)
    holders = [trainer(client, job_name, f"h{i}") for i in range(LAZY_RECLAIM + 2)]
    for t in holders:
        assert t.lease(timeout=0) is not None
    late = trainer(client, job_name, "late")  # the latest deadline: reclaimed last
    client.advance_clock(job_name, 1001)
    who = [late.job_incarnation, "late", late.incarnation]
    reply = client.connection.run(
        job_name,
        "lease",
        [*who, 1, 10**6, "S", -1, lease_secret(late)],
        passthrough=(Code.REREGISTER,),
    )
    assert reply[0] == Code.REREGISTER
    assert counters(client, job_name)["expired_worker_lost"] == LAZY_RECLAIM
    assert client.status(job_name).leased == 2  # nothing granted to the lost worker


def test_calls_go_on_after_redis_restarts_under_the_kept_connection(own_redis, job_name):
    client = taskq.connect(own_redis.url)
    make_job(client, job_name, n=3)
    t = trainer(client, job_name, "w")
    first = t.lease(timeout=0)
    own_redis.restart(kill=False)  # (a clean stop keeps the AOF) the kept socket is dead now
    t.ack(first)
    nxt = t.lease(timeout=2)
    assert nxt is not None and nxt.id != first.id
    assert counters(client, job_name)["acked"] == 1


def test_a_call_timed_out_on_the_kept_connection_goes_on_through_the_retry(client, job_name):
    url = client.redis.connection_pool.connection_kwargs
    slow = taskq.connect(f"redis://{url['host']}:{url['port']}/0", socket_timeout=0.3)
    make_job(slow, job_name, n=4)
    t = trainer(slow, job_name, "w")
    first = t.lease(timeout=0)
    assert first is not None
    client.redis.client_pause(1000)  # every client's commands wait 1 s: this read times out
    t.ack(first)
    nxt = t.lease(timeout=0)
    assert nxt is not None and nxt.id != first.id
    assert counters(client, job_name)["acked"] == 1
    assert [tk.id for tk in t.held] == [nxt.id]


def test_a_read_that_times_out_drops_the_kept_connection_and_its_late_reply(client, job_name):
    """The kept connection is read below redis-py's wrappers: a read that times out must
    drop it, so its late reply is never taken for a later call's; an error reply is read
    whole."""
    make_job(client, job_name, n=2)
    make_job(client, f"{job_name}-5", n=5)
    url = client.redis.connection_pool.connection_kwargs
    # no retry: the timed-out call raises (and its job is told apart from the next call's)
    r = redis.Redis(
        host=url["host"], port=url["port"], socket_timeout=0.3, decode_responses=True,
        retry=Retry(NoBackoff(), 0),
    )  # fmt: skip
    scripts = Scripts(r)

    def tasks(job: str) -> int:
        reply = scripts.call("stats", JobKeys(job).script, [1])
        meta = dict(zip(reply[1][::2], reply[1][1::2], strict=True))
        return int(meta["n"])

    assert tasks(job_name) == 2 and scripts.own_resets == 0  # the kept connection is made
    client.redis.client_pause(1500)  # longer than both reads (the kept one, the fallback)
    with pytest.raises(redis.exceptions.TimeoutError):
        tasks(job_name)
    assert scripts.own_resets == 1, "dropped: its late reply cannot be read"
    client.redis.ping()  # answered once the pause is over
    assert tasks(f"{job_name}-5") == 5, "its own reply, not the late one (2)"
    client.redis.set(JobKeys(f"{job_name}-bad").meta, "not a hash")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        tasks(f"{job_name}-bad")
    assert tasks(job_name) == 2, "an error reply is read whole"
    assert scripts.own_resets == 1
    r.close()


def test_a_redis_py_whose_internals_are_not_known_is_refused_at_import():
    """The kept connection reads redis-py's private members: a redis-py outside the
    majors they were read for stops the import, saying what to install."""
    code = "import redis; redis.__version__ = '9.0.0'; import taskq"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "this is redis-py 9.0.0" in out.stderr
    assert "pip install 'redis>=5,<9'" in out.stderr


def test_an_error_reply_on_the_kept_connection_is_raised_and_the_library_reloaded(client, job_name):
    make_job(client, job_name, n=3)
    t = trainer(client, job_name, "w")
    first = t.lease(timeout=0)
    client.redis.function_flush()  # the next call's FCALL answers "Function not found"
    nxt = t.lease(timeout=0, acks=[first])
    assert nxt is not None and nxt.id != first.id
    assert counters(client, job_name)["acked"] == 1


def _child_calls(client: taskq.Client, job: str, out: mp.Queue) -> None:
    out.put([client.status(job, summaries=0).counters["leased"] for _ in range(50)])


def test_a_forked_child_does_not_share_the_kept_connection(client, job_name):
    make_job(client, job_name, n=4)
    t = trainer(client, job_name, "w")
    t.lease(timeout=0)  # the parent's calls now go through its kept connection
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_calls, args=(client, job_name, out))
    child.start()
    parent = [counters(client, job_name)["leased"] for _ in range(50)]
    seen = out.get(timeout=30)
    child.join(timeout=30)
    assert child.exitcode == 0
    assert parent == [1] * 50 and seen == [1] * 50, "every reply answered its own call"


def test_auto_task_timeout_is_ten_times_the_p99_bucket(client, job_name):
    """The auto timeout reads the duration histogram in one HMGET: 20 tasks of 10 s each
    put the p99 in the 10,000 ms bucket, so the timeout is 100 s (above the 60 s floor)."""
    make_job(client, job_name, n=25, task_timeout="auto", worker_ttl=60.0)
    t = trainer(client, job_name, "w")
    for _ in range(20):
        task = t.lease(timeout=0)
        assert task is not None
        client.advance_clock(job_name, 10_000)
        t.heartbeat()  # (its heartbeats keep it alive through 200 s, not its calls)
        t.ack(task)
    status = client.status(job_name, summaries=0)
    assert status.config["auto_task_timeout_s"] == 100.0


def test_a_batch_of_acks_counts_as_its_acks_one_by_one(client, job_name):
    """A batch's ack counts are made once (lib/endings.lua acks_counted): the done count,
    the histogram, the counters and the auto timeout, recomputed once where the batch
    passes the 20th ack, are what 24 single acks make."""
    make_job(client, job_name, n=30, task_timeout="auto", worker_ttl=60.0)
    t = trainer(client, job_name, "w")
    batches = t.batches(8)
    held = next(batches)
    for _ in range(3):
        client.advance_clock(job_name, 10_000)
        t.heartbeat()
        held = next(batches)  # acks the 8 held, leases 8 more
    assert len(held) == 6  # the last 6 of 30
    status = client.status(job_name, summaries=0)
    assert (status.done, status.counters["acked"], status.leased) == (24, 24, 6)
    assert status.config["auto_task_timeout_s"] == 100.0
    keys = client.keys(job_name)
    hist = client.redis.hgetall(keys.hist)
    assert sum(int(v) for f, v in hist.items() if f.startswith("dur:")) == 24
    assert client.redis.hget(keys.meta, "dur_sum") == str(24 * 10_000)
    assert client.audit(job_name)["ok"]
    t.close()


def test_meta_hash_is_kept_in_the_hashtable_encoding(client, job_name):
    """A create writes the padding field, so the meta hash's ~30 reads per call are O(1);
    a job created without it (an older taskq) gets it from its first register."""
    make_job(client, job_name, n=2)
    meta = client.keys(job_name).meta
    assert client.redis.object("encoding", meta) == "hashtable"
    client.redis.hdel(meta, "enc")  # as a job written before the field existed
    trainer(client, job_name, "a")
    assert client.redis.hget(meta, "enc") is not None


def test_counters_that_come_back_are_correct_in_the_hash(client, job_name):
    """A call that ends one lease and grants another leaves nleased / nreserved unwritten
    (the same number); the stored numbers still match what is held."""
    make_job(client, job_name, n=6)
    t = trainer(client, job_name, "a", prefetch=1)
    it = iter(t)
    for _ in range(4):
        next(it)
        status = client.status(job_name, summaries=0)
        assert (status.leased, status.reserved) == (2, 1)
    t.close()
    status = client.status(job_name, summaries=0)
    assert (status.leased, status.reserved, status.done) == (0, 0, 3)


def test_a_batch_writes_its_leases_indexes_and_records_together(client, job_name):
    """A batch's lease writes are gathered into one command per key (lib/leases.lua
    lw_flush): what it leases and acks lands in every index, and a task listed twice in
    one ack is acked once (the second listing reads the record the first wrote: DUP)."""
    from taskq.engine.contract import Code

    make_job(client, job_name, n=20)
    t = trainer(client, job_name, "a")
    keys = client.keys(job_name)
    batches = t.batches(8)
    first = next(batches)
    assert len(first) == 8
    assert client.redis.zcard(keys.owned) == 8 and client.redis.zcard(keys.started) == 8
    assert client.status(job_name, summaries=0).leased == 8
    a, b = first[0], first[1]
    who = [t.job_incarnation, "a", t.incarnation]
    reply = client.connection.run(
        job_name,
        "ack",
        [*who, 10**6, 3, a.id, a.token, a.id, a.token, b.id, b.token, 0, 0, "S", -1]
        + [lease_secret(t)],
    )
    assert reply[4] == [Code.OK, Code.DUP, Code.OK]
    status = client.status(job_name, summaries=0)
    assert (status.done, status.leased, status.counters["acked"]) == (2, 6, 2)
    assert status.counters["stale"] == 0
    assert client.redis.zcard(keys.owned) == 6 and client.redis.zcard(keys.started) == 6
    assert client.audit(job_name)["ok"]
    t.close()


def test_a_worker_whose_member_is_gone_is_lost_not_renewed(client, job_name):
    """Renewing with ZADD XX never re-adds a worker the server removed: its next heartbeat
    is answered as a lost worker's (it re-registers under a new incarnation)."""
    make_job(client, job_name, n=3)
    t = trainer(client, job_name, "a")
    old = t.incarnation
    client.redis.zrem(client.keys(job_name).workers, f"a|{old}")
    t.heartbeat()
    assert t.lease(timeout=0) is not None
    assert t.incarnation != old
    assert client.redis.zscore(client.keys(job_name).workers, f"a|{old}") is None


def test_duration_histogram_sum_and_count_without_their_hash_fields(client, job_name):
    """An ack writes one bucket of the hist hash; the sum is the meta field ``dur_sum``
    and the count the buckets' sum: status reports both exactly."""
    make_job(client, job_name, n=4)
    t = trainer(client, job_name, "w")
    for ms in (3, 40, 700):
        task = t.lease(timeout=0)
        assert task is not None
        client.advance_clock(job_name, ms)
        t.ack(task)
    h = client.status(job_name, summaries=0).histograms["task_duration"]
    assert h["count"] == 3 and h["sum_s"] == 0.743
    assert sum(h["counts"]) == 3 and h["counts"][0] == 1  # 3 ms: the 5 ms bucket
    keys = client.keys(job_name)
    assert client.redis.hget(keys.meta, "dur_sum") == "743"
    assert not {"dur:count", "dur:sum"} & set(client.redis.hkeys(keys.hist))


def test_a_histogram_written_by_the_older_layout_still_reads_right(client, job_name):
    """A job whose hist hash holds ``dur:count`` / ``dur:sum`` (written before the sum moved
    to the meta hash) keeps them; status adds the old sum to the new one and counts the
    buckets, which both layouts write."""
    make_job(client, job_name, n=3)
    keys = client.keys(job_name)
    # what the older scripts left after two acks of 1 s and 2 s
    client.redis.hset(keys.hist, mapping={"dur:8": 1, "dur:9": 1, "dur:count": 2, "dur:sum": 3000})
    t = trainer(client, job_name, "w")
    task = t.lease(timeout=0)
    assert task is not None
    client.advance_clock(job_name, 20)
    t.ack(task)
    h = client.status(job_name, summaries=0).histograms["task_duration"]
    assert h["count"] == 3 and h["sum_s"] == 3.02
    assert h["counts"][2] == 1 and h["counts"][7] == 1 and h["counts"][8] == 1
    assert client.redis.hget(keys.hist, "dur:count") == "2", "the old field is left as it was"


def test_the_waiting_count_follows_the_set_and_a_job_without_it_counts_once(client, job_name):
    """``nwaiting`` is the waiting set's size (a worker that got tasks skips the set's ZREM
    when it is 0); a job whose meta lacks it (an older taskq) counts the set once and a
    waiting worker still leaves the set when it gets a task."""
    make_job(client, job_name, n=2)
    keys = client.keys(job_name)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    first, second = a.lease(timeout=0), a.lease(timeout=0)
    assert first is not None and second is not None
    assert b.lease(timeout=0) is None  # nothing left: b waits
    assert client.redis.zcard(keys.waiting) == 1
    assert client.redis.hget(keys.meta, "nwaiting") == "1"
    client.redis.hdel(keys.meta, "nwaiting")  # as a job written before the field
    a.fail(first, "boom")  # back to the front, for b (a failed it; b is alive)
    got = b.lease(timeout=0)
    assert got is not None and got.id == first.id
    assert client.redis.zcard(keys.waiting) == 0, "b left the waiting set"
    assert client.redis.hget(keys.meta, "nwaiting") == "0"
    a.ack(second)
    b.ack(got)
    assert client.redis.zcard(keys.waiting) == 0
