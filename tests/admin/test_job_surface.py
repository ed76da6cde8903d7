"""One job surface: the same verbs, trainer and CLI for a plain job and a sharded one.

Every test runs on a real local 3-master Redis Cluster (module fixture) and is
parametrized over a plain job and a 3-shard job; the sharded job's own guarantees (one
cut across the shards, a rewind to one pass, an audit that sees shards disagree) follow.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from typing import Any, cast

import pytest
from click.testing import CliRunner, Result
from support import RedisClusterProcs, make_job

import taskq
from cli.main import cli
from taskq.admin import barrier, jobs, shardset, stats
from taskq.admin.jobs import Job
from taskq.admin.shardset import ShardedStatus

KINDS = ["plain", "sharded"]


@pytest.fixture
def job_name(job_name: str) -> str:
    """A unique name short enough for a sharded job (its shards add a suffix)."""
    return job_name[:20] + job_name[-8:]


def create(client: taskq.Client, name: str, kind: str, n: int = 6, **kw: Any) -> None:
    make_job(client, name, n, shards=3 if kind == "sharded" else 1, **kw)


def run(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--url", url, *args])


@pytest.mark.parametrize("kind", KINDS)
def test_every_verb_works_on_the_handle(cclient: taskq.Client, job_name: str, kind: str) -> None:
    create(cclient, job_name, kind, max_failures=1, passes=3, auto_advance=False)
    job = cclient.job(job_name)
    assert job.sharded == (kind == "sharded")
    st = job.status()
    assert (st.tasks, st.todo, st.state, st.pass_no) == (6, 6, "running", 0)
    assert isinstance(st, ShardedStatus) == (kind == "sharded")
    assert sorted(t["id"] for t in job.tasks("todo")) == list(range(6))
    job.pause()
    assert job.status().state == "paused"
    job.resume()
    with taskq.Trainer(job_name, client=cclient, heartbeat=False) as trainer:
        assert trainer.sharded == (kind == "sharded")
        assert type(trainer) is taskq.Trainer  # one class, whatever the job's kind
        first = trainer.lease(timeout=1)
        assert first is not None
        gid = trainer.global_id(first)
        assert [t["id"] for t in job.tasks("leased")] == [gid]
        assert job.task(gid)["state"] == "leased"
        assert [w["id"] for w in job.workers()] == [trainer.worker_id]
        trainer.fail(first, "boom")
        assert job.task(gid)["state"] == "dead"
        assert job.retry([gid]) == 1
        ckpt = job.checkpoint()
        got = trainer.lease_many(6, timeout=1)
        assert got
        trainer.ack(got)
    assert job.status().done == len(got)
    assert any("acked" in f for _, f in job.events(count=1000) if f.get("type") == "step")
    assert job.rewind(ckpt)  # the record checkpoint() returned
    assert job.status().done == 0
    assert job.rewind(ckpt["id"])  # or its id
    assert [c["id"] for c in job.checkpoints()] == [ckpt["id"]]
    with pytest.raises(taskq.PassIncomplete, match="work left"):
        job.next()
    assert job.next(force=True) == 1
    assert job.reset(expected_pass=1) == 1
    assert job.audit()["ok"]
    job.cancel()
    assert job.status().state == "cancelled"
    job.delete()
    with pytest.raises(taskq.JobNotFound):
        cclient.status(job_name)


def _todo_on_one(job: Job, state: str = "todo") -> int:
    """A toy verb: the tasks in ``state`` on one engine job, by the ``peek`` script."""
    reply = job.connection.run(job.name, "peek", [state, "0", jobs.PAGE_MAX])
    return len(stats.parse_tasks(reply[1], state))


def test_a_new_verb_is_one_method_and_one_route(
    cclient: taskq.Client, job_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verb added through the surface (an existing script routed anew: ``peek`` summed
    over every shard) works on a plain and a sharded job; without its route a sharded job
    refuses it loudly."""
    create(cclient, job_name + "p", "plain")
    create(cclient, job_name + "s", "sharded")
    _todo_on_one.__name__ = "todo_count"
    monkeypatch.setattr(Job, "todo_count", jobs.verb(_todo_on_one), raising=False)
    toy = cast(Any, cclient.job(job_name + "s"))
    with pytest.raises(taskq.InvalidInput, match="todo_count has no sharded route"):
        toy.todo_count()
    monkeypatch.setitem(jobs.ROUTES, "todo_count", jobs.Route(jobs.EVERY, jobs.summed))
    for name in (job_name + "p", job_name + "s"):
        job = cast(Any, cclient.job(name))
        assert job.todo_count() == job.status().todo == 6
        assert job.task(task_id=5, history=0)["id"] == 5  # a task route, the id by name
        with taskq.Trainer(name, client=cclient, heartbeat=False) as trainer:
            assert trainer.lease(timeout=1) is not None
            assert job.todo_count() == 5 and job.todo_count("leased") == 1
    assert [r for r in jobs.ROUTES.values() if r.to not in jobs.ROUTE_KINDS] == []


@pytest.mark.parametrize("kind", KINDS)
def test_client_methods_take_any_job(cclient: taskq.Client, job_name: str, kind: str) -> None:
    create(cclient, job_name, kind, passes=2, auto_advance=False)
    assert cclient.status(job_name).tasks == 6
    assert len(cclient.tasks(job_name, "todo", limit=100)) == 6
    assert cclient.audit(job_name)["ok"]
    assert cclient.retry(job_name) == 0
    assert cclient.workers(job_name) == []
    rec = cclient.checkpoint(job_name)
    assert cclient.rewind(job_name, rec)
    assert cclient.next_pass(job_name, force=True) == 1
    cclient.pause_job(job_name)
    cclient.resume_job(job_name)
    cclient.cancel_job(job_name)
    cclient.delete_job(job_name)
    with pytest.raises(taskq.JobNotFound):
        cclient.audit(job_name)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad", [42, {"no": "id"}, "x" * 500, ["a"]])
def test_rewind_refuses_a_bad_argument_in_one_line(
    cclient: taskq.Client, job_name: str, kind: str, bad: Any
) -> None:
    create(cclient, job_name, kind)
    rec = cclient.checkpoint(job_name)
    with pytest.raises(taskq.InvalidInput) as info:
        cclient.rewind(job_name, bad)
    message = str(info.value)
    assert "\n" not in message and len(message) < 200, message
    assert json.dumps(rec)[:60] not in message


@pytest.mark.parametrize("kind", KINDS)
def test_one_trainer_surface(cluster: RedisClusterProcs, job_name: str, kind: str) -> None:
    client = taskq.connect(cluster.url)
    create(client, job_name, kind, n=9, passes=2)
    seen: list[tuple[int, int]] = []
    with taskq.Trainer(job_name, url=cluster.url, prefetch=1) as trainer:
        for epoch in trainer.passes():
            for task in epoch:
                trainer.progress(task, 1)
                seen.append((task.pass_no, trainer.global_id(task)))
        assert trainer.state == "completed"
    assert sorted(seen) == [(p, i) for p in range(2) for i in range(9)]
    assert client.audit(job_name)["ok"]
    create(client, job_name, kind, n=9, passes=1, replace=True)
    batches: list[list[int]] = []
    with taskq.Trainer(job_name, client=client) as trainer:
        for batch in trainer.batches(2):
            assert len(batch) <= 2
            batches.append([trainer.global_id(t) for t in batch])
    assert sorted(i for b in batches for i in b) == list(range(9))
    with taskq.Trainer(job_name, client=client, heartbeat=False) as trainer:
        with pytest.raises(taskq.JobCompleted):
            trainer.lease_many(1, timeout=0)


@pytest.mark.parametrize("kind", KINDS)
def test_the_cli_takes_any_job(cluster: RedisClusterProcs, job_name: str, kind: str) -> None:
    url = cluster.url
    client = taskq.connect(url)
    create(client, job_name, kind, max_failures=1, passes=2, auto_advance=False)
    trainer = taskq.Trainer(job_name, client=client, heartbeat=False)
    task = trainer.lease(timeout=1)
    assert task is not None
    gid = trainer.global_id(task)
    trainer.fail(task, "boom")
    for args in (
        ["job", "status", job_name],
        ["job", "status", job_name, "--json"],
        ["job", "audit", job_name],
        ["tasks", "list", job_name, "--state", "dead"],
        ["tasks", "show", job_name, str(gid)],
        ["tasks", "retry", job_name, "--id", str(gid)],
        ["workers", "list", job_name],
        ["workers", "list", job_name, "--json"],
        ["events", job_name, "-n", "5"],
        ["job", "checkpoint", job_name, "--id", "c1"],
        ["job", "checkpoints", job_name],
        ["job", "rewind", job_name, "c1"],
        ["job", "pause", job_name],
        ["job", "resume", job_name],
        ["pass", "next", job_name, "--force"],
        ["pass", "reset", job_name],
    ):
        r = run(url, *args)
        assert r.exit_code == 0, (args, r.output)
    trainer.close()
    assert json.loads(run(url, "job", "status", job_name, "--json").output)["pass"] == 1
    listed = {r["job"]: r for r in json.loads(run(url, "job", "list", "--json").output)}
    assert listed[job_name]["tasks"] == 6
    assert listed[job_name].get("shards") == (3 if kind == "sharded" else None)
    r = run(url, "pass", "next", job_name)
    assert r.exit_code == 1 and "work left" in r.output
    r = run(url, "job", "rewind", job_name, "nope")
    assert r.exit_code == 1 and "no checkpoint" in r.output
    assert run(url, "job", "cancel", job_name).exit_code == 0
    assert run(url, "job", "delete", job_name, "--yes").exit_code == 0
    r = run(url, "job", "status", job_name)
    assert r.exit_code == 1 and "not found" in r.output


# -- a sharded job's own guarantees ------------------------------------------------------
def _finish_pass(client: taskq.Client, name: str) -> None:
    """Lease and ack every task of the current pass (each shard, a plain trainer)."""
    sset = shardset.require(client.connection, name)
    for shard in sset.shards:
        tr = taskq.Trainer.of_shard(shard, client=client, heartbeat=False)
        while got := tr.lease_many(10, timeout=0):
            tr.ack(got)
        tr.close()


def test_the_barrier_does_not_move_during_a_cut(cclient: taskq.Client, job_name: str) -> None:
    create(cclient, job_name, "sharded", passes=3)
    _finish_pass(cclient, job_name)
    with barrier.barrier_lock(cclient.connection, job_name, "checkpoint", 5000) as held:
        assert held is not None
        assert cclient.job(job_name).advance() is None  # a cut holds the barrier
        assert cclient.status(job_name).pass_no == 0
    assert cclient.job(job_name).advance() == 1
    assert {s.pass_no for s in cclient.status(job_name).shards} == {1}


def test_a_cut_under_which_a_pass_moved_is_taken_again(
    cclient: taskq.Client, job_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    create(cclient, job_name, "sharded", passes=3)
    _finish_pass(cclient, job_name)  # every shard waits at the end of pass 0
    sset = shardset.require(cclient.connection, job_name)
    real = Job.checkpoint
    calls = []

    def checkpoint_then_move(self: Job, keep: int = 20, ckpt: str | None = None) -> Any:
        rec = real(self, keep, ckpt)
        if self.sharded:  # the one class: the whole job's call comes here too
            return rec
        calls.append(self.name)
        if len(calls) == 1:  # a step that outlived its lock: the other shards move on
            for shard in sset.shards[1:]:
                Job(cclient.connection, shard).next(expected_pass=0)
        return rec

    monkeypatch.setattr(Job, "checkpoint", checkpoint_then_move)
    rec = cclient.checkpoint(job_name, ckpt="cut1")
    monkeypatch.undo()
    assert len(calls) == 6  # the first cut refused, the second taken whole
    assert rec["id"] == "cut1" and set(rec["shard_ids"].values()) == {"cut1.r1"}
    assert [r["pass"] for r in rec["shards"]][1:] == [1, 1]
    # shard 0 was left at the boundary the others crossed (a step half-way): the cut's
    # taker ran the step after it
    assert [s.pass_no for s in cclient.status(job_name).shards] == [1, 1, 1]  # type: ignore[attr-defined]
    assert cclient.audit(job_name)["ok"]


def test_a_sharded_rewind_puts_every_shard_at_one_pass(
    cclient: taskq.Client, job_name: str
) -> None:
    create(cclient, job_name, "sharded", n=9, passes=3)
    tr = taskq.Trainer(job_name, client=cclient, heartbeat=False)
    tr.ack(tr.lease_many(2, timeout=1))
    rec = cclient.checkpoint(job_name)
    assert (rec["pass"], rec["done"]) == (0, 2)
    tr.close()
    _finish_pass(cclient, job_name)
    assert cclient.job(job_name).advance() == 1
    tr = taskq.Trainer(job_name, client=cclient, heartbeat=False)
    assert tr.lease_many(3, timeout=1)  # pass 1 is handed out
    assert cclient.rewind(job_name, rec)
    st = cclient.status(job_name)
    assert [s.pass_no for s in st.shards] == [0, 0, 0] and st.done == 2
    assert cclient.audit(job_name)["ok"]
    tr.close()


def test_the_sharded_audit_sees_shards_disagree(
    cluster: RedisClusterProcs, cclient: taskq.Client, job_name: str
) -> None:
    create(cclient, job_name, "sharded", n=9, passes=3)
    rec = cclient.checkpoint(job_name)
    _finish_pass(cclient, job_name)
    assert cclient.job(job_name).advance() == 1
    shard0 = shardset.require(cclient.connection, job_name).shards[0]
    Job(cclient.connection, shard0).rewind(rec["shard_ids"][shard0])  # one shard alone
    audit = cclient.audit(job_name)
    assert not audit["checks"]["shards_in_step"] and not audit["ok"]
    r = run(cluster.url, "job", "audit", job_name)
    assert r.exit_code == 1 and "shards_in_step" in r.output


def test_sharded_admin_keeps_the_listed_checkpoint(cclient: taskq.Client, job_name: str) -> None:
    create(cclient, job_name, "sharded")
    rec = cclient.checkpoint(job_name, ckpt="same")
    assert cclient.checkpoint(job_name, ckpt="same") == rec
    assert cclient.job(job_name).checkpoint_record("same") == rec


# -- per-job credentials -----------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_per_job_credential_on_the_cluster_runs_its_job_only(
    cluster: RedisClusterProcs, cclient: taskq.Client, job_name: str, kind: str
) -> None:
    create(cclient, job_name, kind, n=6, passes=2)
    other = job_name[:-1] + "X"
    create(cclient, other, kind, n=3)
    user = f"tr-{job_name}"
    r = CliRunner().invoke(
        cli,
        ["--url", cluster.url, "acl", "trainer", job_name, "--user", user]
        + ["--password-env", "TQ_JOB_PW", "--apply"],
        env={"TQ_JOB_PW": "job-pw"},
    )
    assert r.exit_code == 0, r.output
    for node in cluster.servers:  # applied on every master
        assert node.client().acl_getuser(user)
    url = cluster.url.replace("://", f"://{user}:job-pw@", 1)
    seen = []
    with taskq.Trainer(job_name, url=url) as trainer:
        assert trainer.sharded == (kind == "sharded")
        for task in trainer:
            seen.append(trainer.global_id(task))
    assert sorted(seen) == sorted(list(range(6)) * 2)
    for refused in (
        lambda: taskq.Trainer(other, url=url),
        lambda: taskq.connect(url).status(other),
        lambda: taskq.connect(url).delete_job(job_name),
    ):
        with pytest.raises(taskq.TaskqError) as info:
            refused()
        assert "refused by ACL" in str(info.value) and "\n" not in str(info.value)
    assert cclient.status(job_name).state == "completed"  # the refused delete changed nothing


HOLD_ONE = """
import sys, time, taskq
with taskq.Trainer(sys.argv[2], url=sys.argv[1]) as trainer:
    for task in trainer:
        kind = "ShardedTrainer" if trainer.sharded else type(trainer).__name__
        print("HOLDING", kind, trainer.global_id(task), flush=True)
        time.sleep(60)  # holds the task until killed
"""


@pytest.mark.parametrize("kind", KINDS)
def test_sigterm_releases_what_the_trainer_holds(
    cluster: RedisClusterProcs, cclient: taskq.Client, job_name: str, kind: str
) -> None:
    create(cclient, job_name, kind, n=6, worker_ttl=30, heartbeat_interval=1)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_ONE, cluster.url, job_name],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:2] == ["HOLDING", "ShardedTrainer" if kind == "sharded" else "Trainer"]
        assert cclient.status(job_name).leased == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    st = cclient.status(job_name)  # released at once, not after the 30 s ttl
    assert (st.leased, st.todo, st.workers) == (0, 6, 0)


def test_no_plain_job_beside_a_sharded_one(cclient: taskq.Client, job_name: str) -> None:
    create(cclient, job_name, "sharded")
    for make in (
        lambda: make_job(cclient, job_name, 3),
        lambda: make_job(cclient, job_name, 3, replace=True),
        lambda: cclient.job(job_name).replace([{"i": 0}], shards=1),
    ):
        with pytest.raises((taskq.JobExists, taskq.InvalidInput), match="sharded job"):
            make()
    st = cclient.job(job_name).replace([{"i": i} for i in range(4)])
    assert (st.tasks, len(st.shards)) == (4, 3)  # type: ignore[attr-defined]


def test_cuts_taken_while_trainers_cross_passes_rewind_to_one_pass(
    cluster: RedisClusterProcs, cclient: taskq.Client, job_name: str
) -> None:
    """Issue 26, case 5: checkpoints taken while the barrier moves; each one rewinds the
    job to a state where every shard is at one pass and the audit agrees."""
    create(cclient, job_name, "sharded", n=24, passes=3)
    errs: list[BaseException] = []

    def work() -> None:
        try:
            with taskq.Trainer(job_name, url=cluster.url, idle_wait=0.05) as trainer:
                for _ in trainer:
                    time.sleep(0.02)  # a training step
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errs.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    cuts = []
    try:
        while any(t.is_alive() for t in threads) and len(cuts) < 40:
            # never refused, though the trainers lease and ack meanwhile (issue 26, case 4)
            cuts.append(cclient.checkpoint(job_name, keep=50))
            time.sleep(0.05)  # the checkpoints' pace while the trainers work
    finally:
        for t in threads:
            t.join(60)
    assert not errs, errs
    assert len({c["pass"] for c in cuts}) > 1, (len(cuts), [c["pass"] for c in cuts])
    for cut in cuts:
        assert cclient.rewind(job_name, cut)
        st = cclient.status(job_name)
        live = {s.pass_no for s in st.shards if s.state != "completed"}
        assert len(live) <= 1, (cut["id"], [(s.pass_no, s.state) for s in st.shards])
        audit = cclient.audit(job_name)
        assert audit["checks"]["shards_in_step"] and audit["checks"]["passes_agree"], audit[
            "checks"
        ]
