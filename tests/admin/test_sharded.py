"""Sharded jobs: one job over several shards (ordinary jobs), one pass for all.

Most tests run on a real local 3-master Redis Cluster (module fixture, as in
test_cluster.py); a few use the session's single server. Trainers run in threads, and as
real subprocesses for SIGKILL / SIGTERM; a master is paused with SIGSTOP.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result
from support import RedisClusterProcs, free_port, wait_until

import taskq
from cli.main import cli
from taskq.admin import jobs, shardset
from taskq.keys import JobKeys

PROC = os.path.join(os.path.dirname(__file__), "..", "sharded_proc.py")


@pytest.fixture
def job_name(job_name: str) -> str:
    """A unique name short enough for a sharded job (its shards add a suffix)."""
    return job_name[:20] + job_name[-8:]


def run_trainers(url: str, name: str, count: int, **kw: object) -> list[tuple[int, int]]:
    """``count`` sharded trainers in threads until the job ends; (pass, global id) of
    every task acked."""
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()
    errs: list[BaseException] = []

    def work() -> None:
        try:
            with taskq.Trainer(name, url=url, **kw) as trainer:  # type: ignore[arg-type]
                for one_pass in trainer.passes():
                    for task in one_pass:
                        gid = trainer.global_id(task)
                        try:
                            trainer.ack(task)
                        except taskq.LeaseLost:
                            continue  # a backup lease of it was acked first: counted there
                        with lock:
                            seen.append((task.pass_no, gid))
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errs.append(e)

    threads = [threading.Thread(target=work) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errs, errs
    assert not any(t.is_alive() for t in threads)
    return seen


# -- single server --------------------------------------------------------------------
def test_one_shard_is_todays_job(client: taskq.Client, job_name: str) -> None:
    status = client.create_job(job_name, [{"i": i} for i in range(4)], shards=1)
    assert isinstance(status, taskq.JobStatus) and status.tasks == 4
    assert shardset.load(client, job_name) is None


def test_bad_shard_counts_and_names_write_nothing(client: taskq.Client, job_name: str) -> None:
    for bad, says in ((0, "an integer >= 1"), (5, "2..4")):
        with pytest.raises(taskq.InvalidInput, match=f"shards must be {says}"):
            client.create_job(job_name, [{"i": i} for i in range(4)], shards=bad)
    with pytest.raises(taskq.InvalidInput, match="bad sharded job name"):
        client.create_job("x" * 60, [{"i": 1}, {"i": 2}], shards=2)
    assert shardset.load(client, job_name) is None
    assert not any(j.startswith(job_name) for j in client.list_jobs())


def test_one_job_config_makes_a_plain_and_a_sharded_job(
    client: taskq.Client, job_name: str
) -> None:
    """``create_job`` takes a ``JobConfig`` (or its fields); a setting it does not have, or
    a config that is not one, is one line and writes nothing."""
    cfg = taskq.JobConfig(passes=2, max_failures=5, backup_leases=True, backup_factor=3.0)
    plain = client.create_job(job_name + "p", [{"i": i} for i in range(4)], cfg)
    sharded = client.create_job(job_name + "s", [{"i": i} for i in range(4)], cfg, shards=2)
    for st in (plain, sharded):
        assert (st.passes, st.config["max_failures"]) == (2, 5)
    assert len(sharded.shards) == 2
    for bad, says in (
        ({"config": {"passes": 2}}, "config must be a JobConfig, got dict"),
        ({"pases": 2}, "unknown job setting"),
        ({"backup_factor": 1.0}, "backup_factor must be a number > 1"),
        ({"max_backlog": 0}, "max_backlog must be an integer >= 1"),
        ({"shuffle": 1}, "shuffle must be True or False, got 1"),
        ({"heartbeat_interval": 0.004}, "heartbeat_interval must be at least 0.01 s"),
    ):
        with pytest.raises(taskq.InvalidInput, match=says):
            client.create_job(job_name + "x", [{"i": 1}], **bad)  # type: ignore[arg-type]
    assert not any(j.startswith(job_name + "x") for j in client.list_jobs(sharded=True))


def test_tasks_stride_over_shards_and_names_collide_with_nothing(
    client: taskq.Client, job_name: str
) -> None:
    st = client.create_job(job_name, [{"i": i} for i in range(10)], shards=3, chunks_per_task=2)
    sset = shardset.require(client, job_name)
    assert sset.shards == [f"{job_name}.s{k}" for k in range(3)]
    assert (st.tasks, [s.tasks for s in st.shards]) == (5, [2, 2, 1])
    # global task i is task i // 3 of shard i % 3, chunks as a one-shard job groups them
    assert client.task(sset.shards[1], 1, history=0)["chunks"] == [{"i": 8}, {"i": 9}]
    assert sset.locate(4) == (sset.shards[1], 1) and sset.global_id(sset.shards[1], 1) == 4
    with pytest.raises(taskq.JobExists):
        client.create_job(job_name, [{"i": 1}, {"i": 2}], shards=2)
    client.create_job(job_name + "-plain", [{"i": 1}])
    with pytest.raises(taskq.JobExists, match="one shard"):
        client.create_job(job_name + "-plain", [{"i": 1}, {"i": 2}], shards=2, replace=True)
    client.create_job(job_name + "-x.s1", [{"i": 1}])
    with pytest.raises(taskq.JobExists, match="would be a shard"):
        client.create_job(job_name + "-x", [{"i": 1}, {"i": 2}], shards=2)
    assert shardset.load(client, job_name + "-x") is None
    # replace with fewer shards: the old extra shard goes
    client.create_job(job_name, [{"i": i} for i in range(4)], shards=2, replace=True)
    assert f"{job_name}.s2" not in client.list_jobs()
    client.job(job_name).delete()
    assert shardset.load(client, job_name) is None
    assert [j for j in client.list_jobs() if j.startswith(job_name)] == [
        job_name + "-plain",
        job_name + "-x.s1",
    ]


def test_barrier_holds_a_finished_shard_until_every_shard_is_done(
    client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(4)], shards=2, passes=3)
    sset = shardset.require(client, job_name)
    s0, s1 = sset.shards
    with taskq.Trainer(s0, client=client, heartbeat=False) as tr:
        for task in iter(lambda: tr.lease(timeout=0, expect_pass=0), None):
            tr.ack(task)
    st = client.job(job_name).status()
    assert [(s.state, s.pass_no) for s in st.shards] == [("waiting", 0), ("running", 0)]
    assert (st.state, st.pass_no, st.done) == ("running", 0, 2)
    assert client.job(job_name).advance() is None  # s1 not done: nothing moves
    with pytest.raises(taskq.PassIncomplete, match=s1):
        client.job(job_name).next()
    with taskq.Trainer(s1, client=client, heartbeat=False) as tr:
        for task in iter(lambda: tr.lease(timeout=0, expect_pass=0), None):
            tr.ack(task)
    assert client.job(job_name).status().reason == "barrier"
    # a step that died half-way (s0 advanced, s1 not) is finished by the next one
    client.next_pass(s0, expected_pass=0)
    assert client.job(job_name).advance() == 1
    assert [s.pass_no for s in client.job(job_name).status().shards] == [1, 1]
    assert client.job(job_name).advance() is None  # repeated: nothing more


def test_cancel_reset_retry_act_on_every_shard(client: taskq.Client, job_name: str) -> None:
    client.create_job(job_name, [{"i": i} for i in range(6)], shards=3, passes=None, max_failures=1)
    sset = shardset.require(client, job_name)
    with taskq.Trainer(sset.shards[2], client=client, heartbeat=False) as tr:
        task = tr.lease(timeout=0)
        assert task is not None
        tr.fail(task, "boom")
    st = client.job(job_name).status()
    assert st.dead == 1
    assert client.job(job_name).retry([sset.global_id(sset.shards[2], task.id)]) == 1
    assert client.job(job_name).reset(expected_pass=0) == 0
    with pytest.raises(taskq.PassMismatch):
        client.job(job_name).reset(expected_pass=3)
    client.job(job_name).cancel()
    st = client.job(job_name).status()
    assert st.state == "cancelled" and {s.state for s in st.shards} == {"cancelled"}


def test_a_cancel_that_died_half_way_is_finished_by_the_next_step(
    client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(4)], shards=2)
    sset = shardset.require(client, job_name)
    client.cancel_job(sset.shards[0])
    client.job(job_name).advance()
    assert [s.state for s in client.job(job_name).status().shards] == ["cancelled"] * 2


def test_trainers_on_a_single_redis_run_every_pass_once(
    client: taskq.Client, url: str, job_name: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(30)], shards=3, passes=3)
    seen = run_trainers(url, job_name, 4, idle_wait=0.2)
    assert sorted(seen) == [(p, i) for p in range(3) for i in range(30)]
    audit = client.job(job_name).audit()
    assert audit["ok"], audit["checks"]
    assert [(p["pass"], p["done"]) for p in audit["passes"]] == [(0, 30), (1, 30), (2, 30)]


def test_a_trainer_of_either_kind_of_job_is_a_trainer(
    client: taskq.Client, url: str, job_name: str
) -> None:
    """``taskq.Trainer(name)`` is one class: for a sharded job and a plain one alike it is
    a ``taskq.Trainer`` (its ``sharded`` says which part it composes), chosen from the
    job's record, not by a probe returning another class."""
    plain = job_name[:-1] + "p"
    client.create_job(job_name, [{"i": i} for i in range(6)], shards=3)
    client.create_job(plain, [{"i": i} for i in range(6)])
    for name, is_sharded in ((job_name, True), (plain, False)):
        with taskq.Trainer(name, url=url, heartbeat=False, handle_signals=False) as tr:
            assert type(tr) is taskq.Trainer and isinstance(tr, taskq.Trainer)
            assert tr.sharded is is_sharded
            task = tr.lease(timeout=2.0)
            assert task is not None
            tr.ack(task)


def kill_shard(client: taskq.Client, shard: str) -> list[int]:
    """Fail every task of ``shard`` once (dead at ``max_failures=1``); their ids."""
    ids = []
    with taskq.Trainer(shard, client=client, heartbeat=False) as tr:
        for task in iter(lambda: tr.lease(timeout=0), None):
            tr.fail(task, "boom")
            ids.append(task.id)
    return ids


def test_a_shard_whose_tasks_all_died_does_not_hold_the_barrier(
    client: taskq.Client, url: str, job_name: str
) -> None:
    """As in a plain job, a pass ends once its live tasks are done: a shard with none
    left is finished; only a job with no live task at all waits ``all_dead``."""
    n, passes = 9, 3
    client.create_job(
        job_name, [{"i": i} for i in range(n)], shards=3, passes=passes, max_failures=1
    )
    sset = shardset.require(client, job_name)
    dead = {sset.global_id(sset.shards[2], t) for t in kill_shard(client, sset.shards[2])}
    assert dead == {2, 5, 8}
    st = client.job(job_name).status()
    assert st.shards[2].reason == "all_dead" and (st.state, st.dead) == ("running", 3)
    seen = run_trainers(url, job_name, 2, idle_wait=0.05)
    live = [i for i in range(n) if i not in dead]
    assert sorted(seen) == [(p, i) for p in range(passes) for i in live]
    st = client.job(job_name).status()
    assert st.state == "completed"
    audit = client.job(job_name).audit()
    assert audit["ok"], audit["checks"]
    assert [(p["done"], p["dead"]) for p in audit["passes"]] == [(6, 3)] * passes


def test_a_job_with_no_live_task_waits_all_dead_until_a_retry(
    client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(4)], shards=2, passes=2, max_failures=1)
    sset = shardset.require(client, job_name)
    for shard in sset.shards:
        kill_shard(client, shard)
    st = client.job(job_name).status()
    assert (st.state, st.reason, st.dead) == ("waiting", "all_dead", 4)
    assert client.job(job_name).advance() is None  # nothing to run: no pass moves
    with pytest.raises(taskq.PassIncomplete, match="all dead"):
        client.job(job_name).next()
    assert [s.pass_no for s in client.job(job_name).status().shards] == [0, 0]
    assert client.job(job_name).retry() == 4
    assert client.job(job_name).status().state == "running"


def fcalls(r: redis.Redis) -> int:
    """Script calls (``FCALL``) the server has answered so far."""
    return int(r.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))


def test_a_task_costs_one_call_acked_with_the_next_lease(
    client: taskq.Client, url: str, job_name: str
) -> None:
    """One trainer through every shard: the iterator acks each task in the call that
    leases the next (the old lease + ack pattern spent two calls per task)."""
    n = 60
    client.create_job(job_name, [{"i": i} for i in range(n)], shards=3, passes=1)
    raw = redis.Redis.from_url(url)
    before = fcalls(raw)
    seen = []
    with taskq.Trainer(job_name, url=url, home=0, heartbeat=False, idle_wait=0.05) as tr:
        for task in tr:
            seen.append(tr.global_id(task))
    calls = fcalls(raw) - before
    assert sorted(seen) == list(range(n))
    assert client.job(job_name).status().done == n
    # n ack-and-lease calls, plus a register, a leave and a few empty leases per shard
    assert calls <= n + 20, calls


def run_batched(url: str, name: str, **kw: object) -> list[tuple[int, int, int]]:
    """One ``batches(3)`` trainer and one ``prefetch=2`` trainer in threads, until the
    job ends; (pass, global id, batch size) of every task handed out."""
    seen: list[tuple[int, int, int]] = []
    lock = threading.Lock()
    errs: list[BaseException] = []

    def batched() -> None:
        try:
            with taskq.Trainer(name, url=url, **kw) as tr:  # type: ignore[arg-type]
                for batch in tr.batches(3):
                    assert len({t.job for t in batch} | {t.pass_no for t in batch}) == 2
                    with lock:
                        seen.extend((t.pass_no, tr.global_id(t), len(batch)) for t in batch)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errs.append(e)

    def prefetching() -> None:
        try:
            with taskq.Trainer(name, url=url, prefetch=2, **kw) as tr:  # type: ignore[arg-type]
                for task in tr:
                    with lock:
                        seen.append((task.pass_no, tr.global_id(task), 1))
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errs.append(e)

    threads = [threading.Thread(target=batched), threading.Thread(target=prefetching)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errs, errs
    assert not any(t.is_alive() for t in threads)
    return seen


def test_batches_and_prefetch_run_every_pass_once(
    client: taskq.Client, url: str, job_name: str
) -> None:
    n, passes = 40, 3
    client.create_job(job_name, [{"i": i} for i in range(n)], shards=3, passes=passes)
    seen = run_batched(url, job_name, idle_wait=0.05)
    assert sorted((p, i) for p, i, _ in seen) == [(p, i) for p in range(passes) for i in range(n)]
    assert max(size for _, _, size in seen) == 3  # batches of up to 3 (one shard, one pass)
    audit = client.job(job_name).audit()
    assert audit["ok"], audit["checks"]
    assert [(p["pass"], p["done"]) for p in audit["passes"]] == [(p, n) for p in range(passes)]
    st = client.job(job_name).status()
    assert st.state == "completed" and st.workers == 0 and st.leased == 0


def test_prefetched_tasks_are_released_on_close(
    client: taskq.Client, url: str, job_name: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(12)], shards=2, passes=1)
    with taskq.Trainer(job_name, url=url, home=0, prefetch=3, heartbeat=False) as tr:
        first = next(iter(tr))
        assert first.job == tr.shards[0]
        assert client.job(job_name).status().leased == 4  # the current one + 3 ahead
    st = client.job(job_name).status()
    assert (st.leased, st.done, st.workers) == (0, 0, 0)  # nothing acked: it never ended


def test_an_error_in_the_with_block_fails_the_current_task_and_releases_the_rest(
    client: taskq.Client, url: str, job_name: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(8)], shards=2, passes=1)
    with pytest.raises(ValueError, match="bad sample"):
        with taskq.Trainer(job_name, url=url, home=1, prefetch=2, heartbeat=False) as tr:
            task = next(iter(tr))
            raise ValueError("bad sample")
    shard = shardset.require(client, job_name).shards[1]
    st = client.status(shard, summaries=0)
    assert (st.counters["failed"], st.leased, st.workers, st.done) == (1, 0, 0, 0)
    assert client.task(shard, task.id, history=0)["failures"] == 1


def test_bad_prefetch_and_batch_sizes_are_refused(
    client: taskq.Client, url: str, job_name: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(4)], shards=2)
    with pytest.raises(taskq.InvalidInput, match="prefetch"):
        taskq.Trainer(job_name, url=url, prefetch=-1)
    with taskq.Trainer(job_name, url=url, heartbeat=False) as tr:
        with pytest.raises(taskq.InvalidInput, match=r"batches\(k\): k must be 1 to"):
            next(tr.batches(0))


def test_taskq_work_runs_a_sharded_job(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    n = 9
    client.create_job(job_name, [{"i": i} for i in range(n)], shards=3, passes=2)
    out = tmp_path / "out.txt"
    script = (
        "import json, os, sys; t = json.load(sys.stdin); "
        f"open({str(out)!r}, 'a').write('%s %s %s %s\\n' % (os.environ['TASKQ_PASS'], "
        "os.environ['TASKQ_GLOBAL_ID'], os.environ['TASKQ_JOB'], t['chunks'][0]['i']))"
    )
    r = CliRunner().invoke(
        cli,
        ["--url", url, "work", job_name, "--prefetch", "1", "--", sys.executable, "-c", script],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    rows = [line.split() for line in out.read_text().splitlines()]
    sset = shardset.require(client, job_name)
    # the global id names the chunk; each shard's tasks ran under the shard's name
    assert sorted((int(p), int(g)) for p, g, _, _ in rows) == [
        (p, i) for p in range(2) for i in range(n)
    ]
    assert all(g == i and job == sset.locate(int(g))[0] for _, g, job, i in rows)
    st = client.job(job_name).status()
    assert st.state == "completed" and st.workers == 0


def test_cli_against_a_stopped_cluster_prints_one_line(tmp_path: Path) -> None:
    url = f"redis+cluster://127.0.0.1:{free_port()}"
    r = CliRunner().invoke(cli, ["--url", url, "job", "status", "anything"])
    assert r.exit_code != 0
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot reach the cluster" in lines[0], r.output
    assert "Traceback" not in r.output


# -- cluster --------------------------------------------------------------------------
def test_shards_land_on_different_masters(
    cluster: RedisClusterProcs, cclient: taskq.Client
) -> None:
    for name, shards in (("place-a", 3), ("place-b", 3), ("place-c", 6)):
        cclient.create_job(name, [{"i": i} for i in range(12)], shards=shards, replace=True)
        sset = shardset.require(cclient, name)
        owners = [cluster.owner_port(JobKeys(s).meta) for s in sset.shards]
        assert sorted(owners) == sorted([s.port for s in cluster.servers] * (shards // 3))
        st = cclient.job(name).status()
        assert len(set(st.masters)) == 3 and st.tasks == 12


def test_a_cluster_job_of_three_shards_runs_passes_in_step(
    cluster: RedisClusterProcs, cclient: taskq.Client
) -> None:
    name = "steps"
    cclient.create_job(name, [{"i": i} for i in range(60)], shards=3, passes=3, replace=True)
    seen = run_trainers(cluster.url, name, 3, idle_wait=0.2)
    assert sorted(seen) == [(p, i) for p in range(3) for i in range(60)]
    audit = cclient.job(name).audit()
    assert audit["ok"], audit["checks"]
    st = cclient.job(name).status()
    assert st.state == "completed" and st.workers == 0


def test_a_shard_whose_last_trainer_vanished_still_finishes(
    cluster: RedisClusterProcs, cclient: taskq.Client
) -> None:
    name = "orphan"
    cclient.create_job(
        name,
        [{"i": i} for i in range(30)],
        shards=3,
        passes=2,
        replace=True,
        worker_ttl=1.0,
        heartbeat_interval=0.25,
    )
    sset = shardset.require(cclient, name)
    # the only trainer homed on shard 2 takes a task and vanishes (no heartbeat, no leave)
    gone = taskq.Trainer(sset.shards[2], url=cluster.url, heartbeat=False)
    assert gone.lease(timeout=0) is not None
    seen: list[tuple[int, int]] = []
    stolen = []
    for home in (0, 1):
        with taskq.Trainer(name, url=cluster.url, home=home, idle_wait=0.2) as tr:
            for task in tr:
                seen.append((task.pass_no, tr.global_id(task)))
                assert tr.registered_shards[0] == sset.shards[home]
            stolen.append(tr.taken_elsewhere)
    assert sorted(seen) == [(p, i) for p in range(2) for i in range(30)]
    assert stolen[0] >= 20  # shards 1 and 2 came to the first trainer
    assert cclient.job(name).audit()["ok"]


def start_proc(url: str, name: str, log: Path, sleep: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, PROC, url, name, "--log", str(log), "--sleep", str(sleep)],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_killed_trainers_and_a_paused_master_keep_every_pass_exactly_once(
    cluster: RedisClusterProcs, cclient: taskq.Client, tmp_path: Path
) -> None:
    name = "chaos"
    n, passes = 45, 4
    cclient.create_job(
        name,
        [{"i": i} for i in range(n)],
        shards=3,
        passes=passes,
        replace=True,
        worker_ttl=1.5,
        heartbeat_interval=0.3,
    )
    log = tmp_path / "acks.log"
    procs = [start_proc(cluster.url, name, log, 0.05) for _ in range(4)]
    # (a ttl of its own that a loaded machine's stalls cannot outlast: the trainers' 1.5 s
    # is part of the scenario, the holder is the test's instrument)
    holder = taskq.Trainer(
        name, url=cluster.url, worker_id="holder", worker_ttl=30.0, handle_signals=False
    )
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().startswith("READY")

        def done_count() -> int:
            return cclient.job(name).status().done

        assert wait_until(lambda: done_count() >= 10, timeout=60, interval=0.05)
        # a task of this pass held here keeps its shard running the pass once the others
        # have finished theirs and wait at the barrier, for as long as the pause below
        # needs: without it that window lasts about one step (the trainers take each
        # other's tails), and the polls of a loaded machine missed every one
        held = holder.lease(timeout=30)
        assert held is not None
        procs[0].kill()  # mid-task, holding a lease
        procs[1].send_signal(signal.SIGTERM)  # releases what it holds, leaves
        assert procs[1].wait(30) != 0
        procs += [start_proc(cluster.url, name, log, 0.05) for _ in range(2)]
        for p in procs[-2:]:
            assert p.stdout is not None and p.stdout.readline().startswith("READY")

        # pause, across a pass boundary, the master of the shard still running its pass
        # while another shard already waits at the barrier; longer than the cluster's
        # node timeout (2 s), so the cluster flags it too
        def boundary() -> bool:
            shards = {s.job: s for s in cclient.job(name).status().shards}
            mine = shards[held.job]
            return (mine.state, mine.pass_no) == ("running", held.pass_no) and any(
                (s.state, s.pass_no) == ("waiting", held.pass_no)
                for job, s in shards.items()
                if job != held.job
            )

        assert wait_until(boundary, timeout=60, interval=0.05)
        port = cluster.owner_port(JobKeys(held.job).meta)
        paused = next(s.proc for s in cluster.servers if s.port == port)
        assert paused is not None
        paused.send_signal(signal.SIGSTOP)
        time.sleep(3.0)
        paused.send_signal(signal.SIGCONT)
        holder.close()  # the held task goes back: a trainer does it, the pass ends
        for p in procs[2:]:
            p.wait(120)
            assert p.returncode == 0
    finally:
        holder.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    st = cclient.job(name).status()
    assert st.state == "completed"
    acked = [tuple(map(int, line.split())) for line in log.read_text().split("\n") if line]
    assert len(acked) == len(set(acked))  # no task counted twice in a pass
    audit = cclient.job(name).audit()
    assert audit["ok"], audit["checks"]
    assert [(p["pass"], p["done"]) for p in audit["passes"]] == [(p, n) for p in range(passes)]


def cli_run(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--url", url, *args])


def test_cli_creates_shows_advances_audits_and_cancels_a_sharded_job(
    cluster: RedisClusterProcs, cclient: taskq.Client, tmp_path: Path
) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(9)))
    url = cluster.url
    r = cli_run(
        url,
        "job",
        "create",
        "clijob",
        "--manifest",
        str(manifest),
        "--shards",
        "3",
        "--passes",
        "3",
        "--manual-advance",
        "--json",
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["tasks"] == 9 and len(doc["shards"]) == 3
    assert len({s["master"] for s in doc["shards"]}) == 3
    r = cli_run(url, "pass", "next", "clijob")
    assert r.exit_code != 0 and "has work left" in r.output
    seen = []
    with taskq.Trainer("clijob", url=url, idle_wait=0.1) as tr:
        for task in next(iter(tr.passes())):
            seen.append(tr.global_id(task))
    assert sorted(seen) == list(range(9))
    r = cli_run(url, "job", "status", "clijob")
    assert r.exit_code == 0 and "waiting (manual_advance)" in r.output
    assert all(s in r.output for s in shardset.require(cclient, "clijob").shards)
    r = cli_run(url, "pass", "next", "clijob", "--expect", "0", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["pass"] == 1
    assert [s.pass_no for s in cclient.job("clijob").status().shards] == [1, 1, 1]
    r = cli_run(url, "job", "audit", "clijob")
    assert r.exit_code == 0, r.output
    assert "ok   passes_agree" in r.output and "ok   once_per_pass" in r.output
    r = cli_run(url, "job", "cancel", "clijob")
    assert r.exit_code == 0, r.output
    assert {s.state for s in cclient.job("clijob").status().shards} == {"cancelled"}
    r = cli_run(url, "job", "delete", "clijob", "--yes")
    assert r.exit_code == 0, r.output
    assert shardset.load(cclient, "clijob") is None
    assert not any(j.startswith("clijob") for j in cclient.list_jobs())


def test_pause_checkpoint_and_rewind_act_on_every_shard_as_one(
    cluster: RedisClusterProcs, cclient: taskq.Client
) -> None:
    name, n = "ckpt", 30
    cclient.create_job(name, [{"i": i} for i in range(n)], shards=3, passes=2, replace=True)
    sset = shardset.require(cclient, name)
    url = cluster.url
    r = cli_run(url, "job", "pause", name, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == {
        "job": name,
        "state": "paused",
        "state_before": "running",
        "pass": 0,
        "shards": 3,
    }
    assert [s.state for s in cclient.job(name).status().shards] == ["paused"] * 3
    with taskq.Trainer(sset.shards[1], url=url, heartbeat=False) as tr:
        assert tr.lease(timeout=0) is None  # no shard gives work while paused
    r = cli_run(url, "job", "resume", name)
    assert r.exit_code == 0 and "resumed (all 3 shards)" in r.output
    assert cclient.job(name).status().state == "running"
    with taskq.Trainer(name, url=url, heartbeat=False) as st:
        for task in itertools.islice(st, 10):
            st.ack(task)
    r = cli_run(url, "job", "checkpoint", name, "--json")
    assert r.exit_code == 0, r.output
    ck = json.loads(r.output)
    assert (ck["pass"], ck["done"], len(ck["shards"])) == (0, 10, 3)
    assert cclient.checkpoint(name, ckpt=ck["id"])["done"] == 10  # repeated: the same one
    r = cli_run(url, "job", "checkpoints", name, "--json")
    assert [c["id"] for c in json.loads(r.output)] == [ck["id"]]
    first = run_trainers(url, name, 2, idle_wait=0.05)
    assert len(first) == 2 * n - 10
    assert cclient.job(name).status().state == "completed"
    r = cli_run(url, "job", "rewind", name, ck["id"])
    assert r.exit_code == 0 and "10 done, 3 shards" in r.output, r.output
    st_ = cclient.job(name).status()
    assert (st_.state, st_.pass_no, st_.done) == ("running", 0, 10)
    again = run_trainers(url, name, 2, idle_wait=0.05)
    assert sorted(again) == sorted(first)  # the same work again, from the same point
    assert cclient.job(name).status().state == "completed"
    r = cli_run(url, "job", "rewind", name, "nosuch")
    assert r.exit_code != 0 and "no checkpoint 'nosuch'" in r.output


def test_a_checkpoint_across_a_pass_boundary_rewinds_to_one_pass(
    cluster: RedisClusterProcs, cclient: taskq.Client
) -> None:
    name = "ckb"
    cclient.create_job(
        name, [{"i": i} for i in range(6)], shards=3, passes=3, auto_advance=False, replace=True
    )
    sset = shardset.require(cclient, name)
    for shard in sset.shards:
        with taskq.Trainer(shard, url=cluster.url, heartbeat=False) as tr:
            for task in iter(lambda: tr.lease(timeout=0, expect_pass=0), None):  # noqa: B023
                tr.ack(task)
    cclient.next_pass(sset.shards[0], expected_pass=0)  # a step that stopped half-way
    ck = cclient.checkpoint(name)
    assert [c["pass"] for c in ck["shards"]] == [1, 0, 0] and ck["job_state"] == "mixed"
    # the checkpoint's taker ran the barrier step after the cut: the half-way step is done
    assert [s.pass_no for s in cclient.job(name).status().shards] == [1, 1, 1]
    assert cclient.rewind(name, ck["id"])
    assert [s.pass_no for s in cclient.job(name).status().shards] == [1, 1, 1]
    assert cclient.job(name).audit()["checks"]["passes_agree"]


def test_a_boundary_with_no_trainer_left_is_advanced_by_the_reapers_step(
    client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(4)], shards=2, passes=2)
    sset = shardset.require(client, job_name)
    for shard in sset.shards:  # every shard done with pass 0, nobody ran the step
        with taskq.Trainer(shard, client=client, heartbeat=False) as tr:
            for task in iter(lambda: tr.lease(timeout=0, expect_pass=0), None):  # noqa: B023
                tr.ack(task)
    assert client.job(job_name).status().reason == "barrier"
    assert jobs.advance_all(client.connection)[job_name] == 1
    assert client.job(job_name).status().state == "running"
    assert job_name not in jobs.advance_all(client.connection)


def test_homes_spread_evenly_and_a_trainer_registers_elsewhere_only_to_take(
    client: taskq.Client, url: str, job_name: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(6)], shards=3, passes=2)
    sset = shardset.require(client, job_name)
    trainers = [taskq.Trainer(job_name, url=url, heartbeat=False) for _ in range(6)]
    try:
        assert [t.home for t in trainers] == [0, 1, 2, 0, 1, 2]
        assert [t.registered_shards for t in trainers[:3]] == [[s] for s in sset.shards]
    finally:
        for t in trainers:
            t.close()
    # shard 0 done by others: its home trainer takes shards 1 and 2 and leaves them again
    with taskq.Trainer(sset.shards[0], client=client, heartbeat=False) as other:
        for task in iter(lambda: other.lease(timeout=0, expect_pass=0), None):
            other.ack(task)
    with taskq.Trainer(job_name, url=url, home=0, heartbeat=False, idle_wait=0.1) as tr:
        first = next(iter(tr.passes()))
        got = []
        for task in first:
            got.append(tr.global_id(task))
            assert tr.registered_shards == [sset.shards[0], task.job]
            assert [w["id"] for w in client.workers(task.job)] == [tr.worker_id]
        assert sorted(got) == [1, 2, 4, 5] and tr.taken_elsewhere == 4
        assert tr.registered_shards == [sset.shards[0]]
        assert all(client.workers(s) == [] for s in sset.shards[1:])
        assert [s.pass_no for s in client.job(job_name).status().shards] == [1, 1, 1]
