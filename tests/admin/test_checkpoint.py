"""Checkpoints of a job's position and rewinds to them, against a real redis-server:
what a checkpoint holds, keeping the last N, rewinding a running or completed job, the
fence on every lease held at the rewind, repeat-safety, paging, the CLI."""

from __future__ import annotations

import json
import threading
from functools import partial

import pytest
from click.testing import CliRunner
from support import manual_job, quiet_trainer
from taskq.cli.main import cli

import taskq
from taskq.admin import checkpoints
from taskq.engine.contract import MAX_BATCH, MAX_HELD, Code

make_job = partial(manual_job, n=6)
trainer = quiet_trainer


def done_ids(client: taskq.Client, job: str) -> set[int]:
    return {t["id"] for t in client.tasks(job, "done", limit=100000)}


def run(url: str, *args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["--url", url, *args])


# -- taking and listing ----------------------------------------------------------------
def test_checkpoint_records_pass_done_progress_and_counters(client, job_name):
    make_job(client, job_name)
    t = trainer(client, job_name, "a")
    for _ in range(2):
        t.ack(t.lease(timeout=0))
    half = t.lease(timeout=0)
    t.progress(half, 5)
    t.heartbeat()
    ck = client.checkpoint(job_name)
    assert (ck["pass"], ck["done"], ck["unfinished"], ck["state"]) == (0, 2, 1, "sealed")
    assert ck["counters"]["c_acked"] == 2
    assert ck["incarnation"] == client.status(job_name).incarnation
    assert client.checkpoints(job_name) == [ck]
    # the stored pages: the done bitmap and the unfinished task with its progress
    assert client.redis.hget(client.keys(job_name).ckpt, f"{ck['id']}:p:0") == f"{half.id}:5"


def test_only_the_last_keep_checkpoints_are_kept(client, job_name):
    make_job(client, job_name)
    ids = [client.checkpoint(job_name, keep=3)["id"] for _ in range(5)]
    assert [c["id"] for c in client.checkpoints(job_name)] == ids[2:]
    fields = client.redis.hkeys(client.keys(job_name).ckpt)
    assert not [f for f in fields if f.split(":")[0] in ids[:2]]  # their pages went too


def test_checkpoint_with_an_existing_id_is_not_rewritten(client, job_name):
    make_job(client, job_name)
    first = client.checkpoint(job_name, ckpt="epoch-1")
    t = trainer(client, job_name, "a")
    t.ack(t.lease(timeout=0))
    assert client.checkpoint(job_name, ckpt="epoch-1") == first


@pytest.mark.parametrize("kw", [{"keep": 0}, {"keep": 1001}, {"ckpt": "a b"}, {"ckpt": "x" * 65}])
def test_bad_checkpoint_arguments_write_nothing(client, job_name, kw):
    make_job(client, job_name)
    with pytest.raises(taskq.InvalidInput):
        client.checkpoint(job_name, **kw)
    assert client.redis.exists(client.keys(job_name).ckpt) == 0


def test_checkpoint_pages_many_unfinished_tasks(client, job_name):
    n = 5000
    make_job(client, job_name, n=n)
    # 3,000 leased tasks: more than one page of unfinished tasks; one worker holds at
    # most MAX_HELD and one call leases at most MAX_BATCH
    holders = [trainer(client, job_name, f"a{i}") for i in range(3000 // MAX_HELD + 1)]
    held: dict[taskq.Trainer, list[taskq.Task]] = {}
    total = 0
    for t in holders:
        while len(held.setdefault(t, [])) < MAX_HELD and total < 3000:
            got = t.lease_many(min(MAX_BATCH, MAX_HELD - len(held[t]), 3000 - total), timeout=0)
            held[t] += got
            total += len(got)
    assert total == 3000
    ck = client.checkpoint(job_name)
    assert ck["unfinished"] == 3000
    for t, tasks in held.items():
        for i in range(0, len(tasks), MAX_BATCH):
            t.release(tasks[i : i + MAX_BATCH])
    b = trainer(client, job_name, "b")
    acked = sum(len(got) for got in b.batches(MAX_BATCH))
    assert acked == n and client.status(job_name).state == "completed"
    assert client.rewind(job_name, ck["id"])
    s = client.status(job_name)
    assert (s.state, s.done, s.todo) == ("running", 0, n)
    again = {x.id for got in b.batches(MAX_BATCH) for x in got}
    assert again == set(range(n))


def _ck(client: taskq.Client, job: str, *args: object) -> list:
    return client.connection.run(job, "checkpoint", ["", "ck1", *args])


def _lease_full(t: taskq.Trainer, want: int = MAX_HELD) -> list[taskq.Task]:
    got: list[taskq.Task] = []
    while len(got) < want:
        more = t.lease_many(min(MAX_BATCH, want - len(got)), timeout=0)
        if not more:
            break
        got += more
    return got


def _position(client: taskq.Client, job: str) -> tuple[set[int], set[int], dict[str, str]]:
    """(done tasks, unfinished tasks (leased or in the front), progress hash)."""
    keys = client.keys(job)
    owned = {int(m.rsplit("|", 1)[1]) for m in client.redis.zrange(keys.owned, 0, -1)}
    front = {int(m) for m in client.redis.zrange(keys.front, 0, -1)}
    return done_ids(client, job), owned | front, client.redis.hgetall(keys.progress)


def _seal(client: taskq.Client, job: str, between=lambda: None) -> None:  # type: ignore[no-untyped-def]
    p, cursor = 0, "0"
    while True:
        cursor = _ck(client, job, "prog", p, cursor)[1]
        between()
        p += 1
        if cursor == "0":
            break
    assert _ck(client, job, "seal", 20)[0] == Code.OK


def test_work_between_the_cut_and_the_seal_leaves_the_cuts_position(client, job_name):
    """The cut is one call; between it and every later call of the checkpoint: acks of
    tasks leased at the cut (some with progress), progress reports, pops of the front,
    leases from the cursor, releases, a trainer lost (its leases back to the front), a
    dead task retried and acked. A rewind to the sealed checkpoint gives back exactly the
    cut's position: its done set, its unfinished tasks (leased or in the front) in the
    front with their progress; the rest of the pass then gives every other task once."""
    n = 4000
    make_job(client, job_name, n=n, max_failures=1)
    holders = [trainer(client, job_name, f"h{i}", worker_ttl=600) for i in range(36)]
    held = {t: _lease_full(t) for t in holders}
    short = trainer(client, job_name, "short", worker_ttl=1)
    lost = _lease_full(short)
    holders[0].fail(held[holders[0]][-1], "bad")  # dead at the cut
    held[holders[0]] = held[holders[0]][:-1]
    for i, t in enumerate(holders):
        t.ack(held[t][:4])
        for j, task in enumerate(held[t][4:10]):
            t.progress(task, 1 + i + j)
        t.heartbeat()
        if i % 9 == 0:  # into the front, some with progress
            t.release(held[t][4:24])
            held[t] = held[t][24:]
        else:
            held[t] = held[t][4:]
    short.progress(lost[0], 7)
    short.heartbeat()
    done0, todo0, prog0 = _position(client, job_name)
    dead0 = client.redis.smembers(client.keys(job_name).dead)
    assert len(todo0) > 2000 and prog0 and len(dead0) == 1
    steps = 0
    others: list[taskq.Trainer] = []

    def churn() -> None:
        nonlocal steps
        steps += 1
        for t in holders[steps % 6 :: 6]:
            if len(held[t]) >= 3:
                t.progress(held[t][0], 1000 + steps)
                t.heartbeat()
                t.ack(held[t][:2])
                t.progress(held[t][2], 500 + steps)
                t.heartbeat()
                held[t] = held[t][2:]
        c = trainer(client, job_name, f"c{steps}", worker_ttl=600)
        others.append(c)
        got = _lease_full(c)  # the front first, then the cursor
        c.ack(got[:20])
        c.progress(got[20], 3)
        c.heartbeat()
        c.release(got[20:24])
        if steps == 1:  # the dead task is retried and acked
            assert client.retry(job_name) == 1
            r = trainer(client, job_name, "r", worker_ttl=600)
            r.ack(r.lease(timeout=0))
        if steps == 2:  # the short-lived trainer is lost: its leases go to the front
            client.advance_clock(job_name, 1500)
            for t in holders + others:
                t.heartbeat()
            while client.reap(job_name)[1]:
                pass

    code, _, unfinished = _ck(client, job_name, "begin", 20)
    assert code == Code.OK and unfinished == len(todo0)
    churn()
    _seal(client, job_name, churn)
    ck = checkpoints.get(client.connection, job_name, "ck1")
    assert (ck["done"], ck["unfinished"], ck["dead"]) == (len(done0), len(todo0), 1)
    churn()
    assert client.rewind(job_name, "ck1")
    done1, todo1, prog1 = _position(client, job_name)
    assert done1 == done0
    assert todo1 == todo0  # every one of them in the front now
    assert prog1 == {t: v for t, v in prog0.items() if v != "0"}
    assert client.redis.smembers(client.keys(job_name).dead) == dead0
    b = trainer(client, job_name, "b")
    rest = [x.id for got in b.batches(MAX_BATCH) for x in got]
    assert sorted(rest) == sorted(set(range(n)) - done0 - {int(t) for t in dead0})
    assert client.status(job_name).state == "completed"


def test_no_checkpoint_call_pages_more_than_a_scan_step(client, job_name):
    """4,000 tasks with progress: the cut copies the progress hash in one COPY, and every
    page after it takes in one HSCAN step (about 2,000 entries), so it takes several."""
    n = 6000
    make_job(client, job_name, n=n)
    holders = [trainer(client, job_name, f"h{i}", worker_ttl=600) for i in range(63)]
    for t in holders:
        for task in _lease_full(t):
            t.progress(task, 5)
        t.heartbeat()
    keys = client.keys(job_name)
    assert client.redis.hlen(keys.progress) >= 4000
    assert _ck(client, job_name, "begin", 20)[0] == Code.OK
    assert client.redis.hlen(keys.ckprog) == client.redis.hlen(keys.progress)
    p, cursor, pages = 0, "0", []
    while True:
        cursor = _ck(client, job_name, "prog", p, cursor)[1]
        pages.append(len(client.redis.hget(keys.ckpt, f"ck1:p:{p}").split(",")))
        p += 1
        if cursor == "0":
            break
    assert max(pages) <= 3000 and len(pages) >= 2 and sum(pages) >= 4000, pages


def test_a_checkpoint_is_not_dropped_when_its_pass_attempt_ends_meanwhile(client, job_name):
    make_job(client, job_name, n=4, max_failures=1)
    t = trainer(client, job_name, "a")
    t.ack(t.lease(timeout=0))
    _ck(client, job_name, "begin", 20)
    client.reset_pass(job_name)  # a new attempt: the cut is taken already
    t.fail(t.lease(timeout=0), "bad")  # dead after the cut
    assert client.retry(job_name) == 1
    _seal(client, job_name)
    ck = checkpoints.get(client.connection, job_name, "ck1")
    assert (ck["done"], ck["dead"]) == (1, 0)
    assert client.rewind(job_name, ck)  # the record works as well as its id
    s = client.status(job_name)
    assert (s.done, s.dead, s.todo) == (1, 0, 3)


def test_rewind_refuses_what_is_not_a_checkpoint_in_one_line(client, job_name):
    make_job(client, job_name)
    with pytest.raises(taskq.InvalidInput, match="a checkpoint id or the record") as e:
        checkpoints.rewind(client.connection, job_name, 3)  # type: ignore[arg-type]
    assert "\n" not in str(e.value)


# -- rewinding -------------------------------------------------------------------------
def test_rewind_returns_later_work_to_todo_and_restores_progress(client, job_name):
    make_job(client, job_name, n=6)
    t = trainer(client, job_name, "a")
    early = [t.lease(timeout=0) for _ in range(2)]
    t.ack(early)
    mid = t.lease(timeout=0)
    t.progress(mid, 3)
    t.heartbeat()
    ck = client.checkpoint(job_name)
    t.progress(mid, 8)
    t.ack(mid)
    late = t.lease(timeout=0)
    t.ack(late)
    assert done_ids(client, job_name) == {early[0].id, early[1].id, mid.id, late.id}
    assert client.rewind(job_name, ck["id"])
    assert done_ids(client, job_name) == {early[0].id, early[1].id}
    b = trainer(client, job_name, "b")
    rest = {x.id: x.start for x in (b.lease(timeout=0) for _ in range(4))}
    assert rest == {mid.id: 3, late.id: 0, 4: 0, 5: 0}
    assert b.lease(timeout=0) is None


def test_rewind_fences_every_lease_held_at_that_moment(client, job_name):
    make_job(client, job_name, n=6)
    ck = client.checkpoint(job_name)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    ta, tb = a.lease(timeout=0), b.lease(timeout=0)
    client.rewind(job_name, ck["id"])
    assert a.heartbeat() == [ta.id] and ta.revoked.is_set()
    with pytest.raises(taskq.LeaseLost):
        b.ack(tb)  # a late ack from before the rewind is stale
    s = client.status(job_name)
    assert (s.done, s.counters["stale"]) == (0, 1)


def test_rewind_of_a_completed_job_undoes_its_passes_and_marks_them(client, job_name):
    make_job(client, job_name, n=2, passes=2)
    t = trainer(client, job_name, "a")
    t.ack(t.lease(timeout=0))
    ck = client.checkpoint(job_name)  # pass 0, one task done
    for _ in t:  # the rest of the job
        pass
    assert client.status(job_name).state == "completed"
    assert client.rewind(job_name, ck["id"])
    s = client.status(job_name)
    assert (s.state, s.pass_no, s.done) == ("running", 0, 1)
    summaries = client.audit(job_name)["passes"]
    raw = [json.loads(v) for v in client.redis.hvals(client.keys(job_name).passes)]
    assert len(summaries) == 2 and all(r["rewound"] and r["rewound_to"] == ck["id"] for r in raw)
    seen = [task.id for task in t]  # the rest of pass 0, then pass 1 again
    assert sorted(seen) == [0, 1, 1] or sorted(seen) == [0, 0, 1]
    assert client.status(job_name).state == "completed"


def test_rewind_is_safe_to_repeat_and_once_skips_a_second_time(client, job_name):
    make_job(client, job_name, n=4)
    t = trainer(client, job_name, "a")
    t.ack(t.lease(timeout=0))
    ck = client.checkpoint(job_name)
    t.ack(t.lease(timeout=0))
    assert client.rewind(job_name, ck["id"], once=True)
    assert not client.rewind(job_name, ck["id"], once=True)  # another trainer, same state
    assert client.rewind(job_name, ck["id"])  # without once: again (same result)
    assert client.status(job_name).done == 1
    t.ack(t.lease(timeout=0))  # work went on since: once rewinds again
    assert client.rewind(job_name, ck["id"], once=True)
    assert client.status(job_name).done == 1


def test_a_half_done_rewind_is_finished_by_repeating_it(client, job_name):
    make_job(client, job_name, n=4)
    t = trainer(client, job_name, "a")
    t.ack(t.lease(timeout=0))
    ck = client.checkpoint(job_name)["id"]
    t.ack(t.lease(timeout=0))
    client.connection.run(
        job_name, "rewind", ["", ck, "begin", 0, ""]
    )  # the caller died after begin
    s = client.status(job_name)
    assert (s.state, s.reason) == ("waiting", "rewinding")
    assert t.lease(timeout=0) is None  # nothing is given out meanwhile
    assert client.rewind(job_name, ck)
    s = client.status(job_name)
    assert (s.state, s.done) == ("running", 1)


def test_retry_pass_next_and_reset_refuse_a_half_done_rewind(url, client, job_name):
    """A dead task and a rewind whose caller died after begin: tasks retry, pass next
    --force and pass reset are refused before any write (the position is half copied),
    naming the rewind to repeat; the CLI says it in one line, exit 1. After the rewind
    is repeated, retry works."""
    make_job(client, job_name, n=4, max_failures=1)
    t = trainer(client, job_name, "a")
    t.fail(t.lease(timeout=0), "bad")  # task 0 is dead
    ck = client.checkpoint(job_name)["id"]
    client.connection.run(job_name, "rewind", ["", ck, "begin", 0, ""])
    before = client.redis.hgetall(client.keys(job_name).meta)
    for call in (
        lambda: client.retry(job_name),
        lambda: client.retry(job_name, [0]),
        lambda: client.next_pass(job_name, force=True),
        lambda: client.reset_pass(job_name),
    ):
        with pytest.raises(taskq.TaskqError, match=f"rewind to checkpoint {ck} is half done"):
            call()
    assert client.redis.hgetall(client.keys(job_name).meta) == before  # nothing written
    for args in (("tasks", "retry", job_name), ("pass", "next", job_name, "--force")):
        r = run(url, *args)
        assert r.exit_code == 1, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and f"taskq job rewind {job_name} {ck}" in lines[0], r.output
        assert "Traceback" not in r.output
    assert client.rewind(job_name, ck)
    assert client.retry(job_name) == 1


def test_a_superseded_rewind_stops_at_its_next_step(client, job_name):
    make_job(client, job_name, n=4)
    ck = client.checkpoint(job_name)["id"]
    first = client.connection.run(job_name, "rewind", ["", ck, "begin", 0, ""])
    client.connection.run(job_name, "rewind", ["", ck, "begin", 0, ""])  # a second rewind started
    reply = client.connection.run(job_name, "rewind", ["", ck, "seal", 0, int(first[1])])
    assert int(reply[0]) == taskq.engine.contract.Code.STALE


def test_rewind_to_an_unknown_checkpoint_is_one_clear_error(client, job_name):
    make_job(client, job_name)
    with pytest.raises(taskq.InvalidInput, match="no checkpoint 'nope'"):
        client.rewind(job_name, "nope")


def test_rewind_while_trainers_run_revokes_all_and_no_late_ack_counts(url, client, job_name):
    make_job(client, job_name, n=40, manual_clock=False, worker_ttl=2.0, heartbeat_interval=0.1)
    ck = client.checkpoint(job_name)
    holding = threading.Barrier(4)
    rewound = threading.Event()
    revoked: list[bool] = []
    late_acks: list[int] = []

    def run_trainer(wid: str) -> None:
        with taskq.Trainer(job_name, url=url, worker_id=wid, handle_signals=False) as tr:
            task = tr.lease(timeout=10)
            assert task is not None
            holding.wait(10)
            rewound.wait(10)
            revoked.append(task.revoked.wait(5))
            try:
                tr.ack(task)
            except taskq.LeaseLost:
                late_acks.append(task.id)

    threads = [threading.Thread(target=run_trainer, args=(f"w{i}",)) for i in range(3)]
    for th in threads:
        th.start()
    holding.wait(10)
    assert client.status(job_name).leased == 3
    client.rewind(job_name, ck["id"])
    rewound.set()
    for th in threads:
        th.join(20)
    assert revoked == [True, True, True] and len(late_acks) == 3
    s = client.status(job_name)
    assert (s.done, s.todo, s.counters["stale"]) == (0, 40, 3)
    assert client.audit(job_name)["ok"]


# -- the CLI -------------------------------------------------------------------------------
def test_cli_lists_checkpoints_and_rewinds(url, client, job_name):
    make_job(client, job_name, n=3)
    t = trainer(client, job_name, "a")
    t.ack(t.lease(timeout=0))
    ck = client.checkpoint(job_name)
    t.ack(t.lease(timeout=0))
    r = run(url, "job", "checkpoints", job_name, "--json")
    assert r.exit_code == 0, r.output
    assert [c["id"] for c in json.loads(r.output)] == [ck["id"]]
    r = run(url, "job", "checkpoints", job_name)
    assert ck["id"] in r.output
    r = run(url, "job", "rewind", job_name, ck["id"])
    assert r.exit_code == 0 and "rewound" in r.output
    assert client.status(job_name).done == 1
    r = run(url, "job", "rewind", job_name, "nope")
    assert r.exit_code == 1


def test_no_checkpoint_during_a_rewind_nor_of_a_cancelled_job(client, job_name):
    make_job(client, job_name, n=2)
    ck = client.checkpoint(job_name)["id"]
    client.connection.run(job_name, "rewind", ["", ck, "begin", 0, ""])
    with pytest.raises(taskq.TaskqError, match="rewind is in progress"):
        client.checkpoint(job_name)
    client.rewind(job_name, ck)
    client.cancel_job(job_name)
    with pytest.raises(taskq.JobCancelled):
        client.checkpoint(job_name)
    with pytest.raises(taskq.JobCancelled):
        client.rewind(job_name, ck)


def test_loader_state_restores_once_and_refuses_another_incarnation(client, job_name):
    make_job(client, job_name, n=3)
    t = trainer(client, job_name, "a")
    t.ack(t.lease(timeout=0))
    state = checkpoints.state_of(job_name, client.checkpoint(job_name))
    assert json.loads(json.dumps(state)) == state and state["done"] == 1
    t.ack(t.lease(timeout=0))
    assert [checkpoints.restore(client.connection, state) for _ in range(3)] == [True, False, False]
    assert client.status(job_name).done == 1
    make_job(client, job_name, n=3, replace=True)
    with pytest.raises(taskq.InvalidInput, match="earlier incarnation"):
        checkpoints.restore(client.connection, state)
    with pytest.raises(taskq.InvalidInput, match="not a taskq loader state"):
        checkpoints.restore(client.connection, {"job": job_name})


def test_once_with_a_restart_key_rewinds_once_per_restart_even_after_acks(client, job_name):
    make_job(client, job_name, n=4)
    t = trainer(client, job_name, "a")
    t.ack(t.lease(timeout=0))
    state = checkpoints.state_of(job_name, client.checkpoint(job_name))
    t.ack(t.lease(timeout=0))
    assert checkpoints.restore(client.connection, state, key="run1:0")
    b = trainer(client, job_name, "b")
    b.ack(b.lease(timeout=0))  # the first restarted trainer already works
    assert not checkpoints.restore(
        client.connection, state, key="run1:0"
    )  # a slower one: no rewind
    assert client.status(job_name).done == 2
    assert checkpoints.restore(client.connection, state, key="run1:1")  # the next restart rewinds
    assert client.status(job_name).done == 1
