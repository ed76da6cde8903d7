"""A sharded stream job on the suite's 3-master cluster: appends spread over the shards
(by chunk id, or in turn without ids), every chunk acked once by trainers in processes
through a SIGKILL and a SIGTERM, seal on every shard, and the verbs that name a task by
its global id reaching an appended one (docs/streams.md, "Sharded streams")."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import support
from click.testing import CliRunner, Result
from taskq.cli.main import cli
from test_streams import Producer, kill_left, read_a_stream_while_appending
from torch_helpers import write_jsonl

import taskq
import taskq.torch
from taskq.admin.jobs import Job
from taskq.admin.shardset import shard_of_id

HERE = Path(__file__).resolve().parents[1]
SHARDS = 3


def _create(cclient: taskq.Client, name: str, **kw: object) -> Job:
    kw.setdefault("worker_ttl", 2.0)
    kw.setdefault("heartbeat_interval", 0.3)
    cclient.create_job(name, chunks=[], shards=SHARDS, stream=True, **kw)  # type: ignore[arg-type]
    job = cclient.job(name)
    assert isinstance(job, Job) and job.sharded
    return job


def test_an_empty_sharded_stream_is_made_and_plain_shards_refuse_an_empty_create(cclient, job_name):
    _create(cclient, job_name)
    st = cclient.status(job_name)
    assert (st.state, st.tasks, st.stream, st.backlog) == ("running", 0, "open", 0)
    assert [s.stream for s in st.shards] == ["open"] * SHARDS
    with pytest.raises(taskq.InvalidInput):
        cclient.create_job(job_name + "x", chunks=[], shards=SHARDS)  # not a stream: no tasks


def test_appends_without_ids_go_in_turn_and_keep_the_global_layout(cclient, job_name):
    job = _create(cclient, job_name)
    first = job.append([{"i": i} for i in range(5)])
    assert (first.tasks, first.first_task) == (5, 0)
    second = job.append([{"i": i} for i in range(5, 7)])
    assert (second.tasks, second.first_task) == (2, 5)
    st = cclient.status(job_name)
    assert [s.tasks for s in st.shards] == [3, 2, 2]  # global task i in shard i % 3
    for gid in range(7):  # a task's global id names the chunk appended in that place
        assert cclient.task(job_name, gid)["chunks"] == [{"i": gid}]
    with pytest.raises(taskq.InvalidInput, match="no task 7"):
        cclient.task(job_name, 7)


def test_ids_route_to_one_shard_so_a_retry_skips_them_everywhere(cclient, job_name):
    job = _create(cclient, job_name)
    ids = [f"part-{i}" for i in range(12)]
    assert job.append([{"id": i} for i in ids], ids=ids).tasks == 12
    again = job.append([{"id": i} for i in ids[6:]] + [{"id": "new"}], ids=ids[6:] + ["new"])
    assert (again.tasks, again.skipped) == (1, 6)
    st = cclient.status(job_name)
    per_shard = [0] * SHARDS
    for chunk_id in ids + ["new"]:
        per_shard[shard_of_id(chunk_id, SHARDS)] += 1
    assert [s.tasks for s in st.shards] == per_shard
    assert (st.tasks, st.appended, st.backlog) == (13, 13, 13)


def test_ids_spread_evenly_over_two_shards() -> None:
    """Ids that differ in their last character only are not sent to one shard (CRC-32's
    low bits follow that character: k0..k3 all went to one shard of two)."""
    got = [shard_of_id(f"k{i}", 2) for i in range(8)]
    assert sorted(got) != [got[0]] * 8
    counts = [0, 0, 0]
    for i in range(3000):
        counts[shard_of_id(f"part-{i:06d}", 3)] += 1
    assert min(counts) > 900


def test_a_bad_append_writes_nothing_on_any_shard(cclient, job_name):
    job = _create(cclient, job_name)
    with pytest.raises(taskq.InvalidInput):
        job.append([{"i": 1}, {"i": float("nan")}])
    with pytest.raises(taskq.InvalidInput):
        job.append([{"i": 1}, {"i": 2}], ids=["a"])
    assert [s.tasks for s in cclient.status(job_name).shards] == [0] * SHARDS


def test_max_backlog_is_divided_among_the_shards(cclient, job_name):
    job = _create(cclient, job_name, max_backlog=6)
    st = cclient.status(job_name)
    assert [s.config["max_backlog"] for s in st.shards] == [2] * SHARDS
    assert st.config["max_backlog"] == 6
    job.append([{"i": i} for i in range(6)], block=False)
    with pytest.raises(taskq.BacklogFull):
        job.append([{"i": 6}], block=False)


def test_seal_seals_every_shard_and_a_drained_job_completes(cclient, job_name):
    job = _create(cclient, job_name)
    job.append([{"i": i} for i in range(4)])
    with taskq.Trainer(job_name, client=cclient, heartbeat=False, idle_wait=0.05) as tr:
        got = []
        while len(got) < 4:
            task = tr.lease(timeout=1)
            assert task is not None
            tr.ack(task)
            got.append(tr.global_id(task))
        assert sorted(got) == [0, 1, 2, 3]
        assert job.seal() == 4
        assert support.wait_until(lambda: cclient.status(job_name).state == "completed", 20)
    st = cclient.status(job_name)
    assert [s.stream for s in st.shards] == ["sealed"] * SHARDS and st.stream == "sealed"
    assert cclient.audit(job_name)["ok"]


def test_a_source_is_recorded_on_each_shard_and_a_restart_after_a_trim_adds_nothing(
    cclient, job_name
):
    job = _create(cclient, job_name)
    chunks = [{"line": i} for i in range(30)]
    ids = [f"f#{i}" for i in range(30)]
    assert job.append(chunks[:20], ids=ids[:20], source="f").tasks == 20
    with taskq.Trainer(job_name, client=cclient, heartbeat=False, idle_wait=0.05) as tr:
        for _ in range(20):
            task = tr.lease(timeout=1)
            assert task is not None
            tr.ack(task)
    while job.trim():
        pass
    assert cclient.status(job_name).trimmed == 20
    again = job.append(chunks, ids=ids, source="f")  # the ids of the first 20 are trimmed
    assert (again.tasks, again.skipped) == (10, 20)
    with pytest.raises(taskq.InvalidInput, match="source only with ids"):
        job.append(chunks, source="g")


def _trainer(url: str, job: str, log: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "sharded_proc.py"), url, job, "--sleep", "0.005"]
        + ["--log", str(log)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith("READY")
    return proc


def test_trainers_consume_a_sharded_stream_through_sigkill_and_sigterm(
    cluster, cclient, job_name, tmp_path
):
    """Every appended chunk acked exactly once over 3 shards while trainers are killed,
    stopped and added, a producer's retry skipped; the sealed job completes."""
    _create(cclient, job_name, max_backlog=45)
    producer = Producer(cclient, job_name)
    log = tmp_path / "acks.log"
    procs = {w: _trainer(cluster.url, job_name, log) for w in ("a", "b")}
    try:
        producer.append(30)
        producer.wait_done(10)
        procs["a"].kill()  # what it held goes back after its ttl, on every shard
        procs["c"] = _trainer(cluster.url, job_name, log)
        producer.append(30)
        producer.wait_done(40)
        procs["b"].send_signal(signal.SIGTERM)
        assert procs["b"].wait(timeout=20) in (0, 128 + signal.SIGTERM, -signal.SIGTERM)
        producer.retry_last(30)
        producer.append(30)  # max_backlog: waits for the acks
        producer.job.seal()
        assert procs["c"].wait(timeout=60) == 0  # the loop ends with the job
    finally:
        kill_left(procs)
    producer.check_acked_once(log)


def test_torch_reads_a_sharded_stream_until_sealed_and_drained(
    cluster, cclient, job_name, tmp_path
):
    """A ``taskq.torch.DataLoader`` (2 workers) over a sharded stream: one iteration reads
    everything appended while it runs, once, and ends when the job is sealed and drained."""
    chunks = write_jsonl(tmp_path, 9, 6)
    job = _create(cclient, job_name)
    rows = read_a_stream_while_appending(cluster.url, job, chunks, middle=24)
    assert sorted(rows) == sorted((f, i) for f in range(9) for i in range(6))
    assert cclient.audit(job_name)["ok"]


def test_cli_sharded_stream_create_append_status_and_seal(cluster, job_name):
    def run(*args: str, input: str | None = None) -> Result:
        return CliRunner().invoke(cli, ["--url", cluster.url, *args], input=input)

    r = run("job", "create", job_name, "--shards", "3", "--stream", "--max-backlog", "30")
    assert r.exit_code == 0, r.output
    lines = "".join(json.dumps({"path": f"p{i}", "id": f"p{i}"}) + "\n" for i in range(6))
    r = run("job", "append", job_name, "-", "--id-key", "id", "--json", input=lines)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["tasks_appended"] == 6
    r = run("job", "append", job_name, "-", "--id-key", "id", input=lines)  # a retry
    assert "0 tasks appended, 6 chunks skipped" in r.output
    r = run("job", "status", job_name)
    assert "stream open, 6 tasks appended, 0 done, backlog 6 (max 30)" in r.output, r.output
    r = run("job", "seal", job_name)
    assert r.exit_code == 0 and "sealed with 6 tasks" in r.output, r.output
