"""Bad data under the key prefix: clear ``CorruptData`` errors naming the key, no crashes
in the reaper or the exporter, and a jobs index that interrupted creates and deletes
cannot leave wrong for good (``repair_index``, also on a Redis Cluster).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import RedisClusterProcs

import taskq
from taskq.admin.client import STAGING_TTL_S
from taskq.keys import JobKeys, jobs_index
from taskq.ops.exporter import TaskqCollector
from taskq.ops.reaper import Reaper

TASKQ_CLI = os.path.join(os.path.dirname(sys.executable), "taskq")


def test_corrupt_task_json_makes_lease_raise_corrupt_data_naming_the_key(
    client: taskq.Client, job_name: str
) -> None:
    """lease() raises naming the key and the task, and has already failed the task: it is
    not left leased to this trainer (one failure counted, back in todo)."""
    client.create_job(job_name, [{"i": 0}, {"i": 1}], shuffle=False)
    chunks_key = client.keys(job_name).chunks
    client.redis.hset(chunks_key, "0", "{not json")
    with taskq.Trainer(job_name, client=client, heartbeat=False) as trainer:
        with pytest.raises(taskq.CorruptData) as e:
            trainer.lease(timeout=0)
        assert trainer.held == []
        st = client.status(job_name)
        assert st.leased == 0 and st.counters["failed"] == 1
    assert chunks_key in str(e.value) and "field 0" in str(e.value)
    assert "task 0" in str(e.value) and "not JSON" in str(e.value)
    failed = [f for _, f in client.events(job_name) if f.get("type") == "failed"]
    assert failed and "not JSON" in failed[0]["error"]


def test_task_json_that_is_not_a_list_is_corrupt_data(client: taskq.Client, job_name: str) -> None:
    client.create_job(job_name, [{"i": 0}])
    client.redis.hset(client.keys(job_name).chunks, "0", '{"path": "x"}')
    with taskq.Trainer(job_name, client=client, heartbeat=False) as trainer:
        with pytest.raises(taskq.CorruptData, match="must be a JSON list"):
            trainer.lease(timeout=0)


@pytest.mark.parametrize("how", ["iterator", "prefetch", "batches"])
def test_a_corrupt_task_ends_dead_and_the_pass_completes(
    client: taskq.Client, job_name: str, how: str
) -> None:
    """One task with corrupt chunks JSON: the iterator logs, fails it and goes on; it is
    dead after max_failures, every other task is acked, the pass (the job) completes."""
    client.create_job(
        job_name,
        [{"i": i} for i in range(6)],
        max_failures=3,
        worker_ttl=2.0,
        heartbeat_interval=0.2,
    )
    client.redis.hset(client.keys(job_name).chunks, "3", "{not json")
    seen: list[int] = []
    with taskq.Trainer(
        job_name, client=client, prefetch=2 if how == "prefetch" else 0, reconnect_timeout=5
    ) as trainer:
        if how == "batches":
            for batch in trainer.batches(4):
                seen += [t.id for t in batch]
        else:
            for task in trainer:
                seen.append(task.id)
    assert sorted(seen) == [0, 1, 2, 4, 5]
    st = client.status(job_name)
    assert st.state == "completed" and st.dead == 1
    assert st.counters["acked"] == 5 and st.counters["failed"] == 3
    assert [t["id"] for t in client.tasks(job_name, "dead")] == [3]
    assert client.audit(job_name)["ok"]


def test_foreign_string_at_a_meta_key_is_corrupt_data_naming_it(
    client: taskq.Client, job_name: str
) -> None:
    meta = JobKeys(job_name).meta
    client.redis.set(meta, "hello, I belong to another tool")
    with pytest.raises(taskq.CorruptData) as e:
        client.status(job_name)
    assert meta in str(e.value) and "string" in str(e.value) and "hash" in str(e.value)
    with pytest.raises(taskq.CorruptData, match="meta"):
        client.reap(job_name)
    with pytest.raises(taskq.CorruptData, match="meta"):
        taskq.Trainer(job_name, client=client, heartbeat=False)


def test_foreign_key_of_another_type_inside_a_live_job_is_named(
    client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(3)])
    dead = client.keys(job_name).dead
    client.redis.set(dead, "oops")
    with pytest.raises(taskq.CorruptData) as e:
        client.status(job_name)
    assert dead in str(e.value) and "taskq writes a set there" in str(e.value)


def test_meta_hash_missing_fields_is_corrupt_data(client: taskq.Client, job_name: str) -> None:
    meta = JobKeys(job_name).meta
    client.redis.hset(meta, mapping={"inc": "abc", "owner": "someone else"})
    with pytest.raises(taskq.CorruptData) as e:
        client.status(job_name)
    assert meta in str(e.value)


def test_reaper_and_exporter_survive_foreign_jobs(client: taskq.Client, job_name: str) -> None:
    good, as_string, as_hash = job_name, job_name + "-s", job_name + "-h"
    client.create_job(good, [{"i": i} for i in range(3)])
    client.redis.set(JobKeys(as_string).meta, "not a hash")
    client.redis.hset(JobKeys(as_hash).meta, mapping={"colour": "blue"})
    client.redis.sadd(jobs_index(), as_string, as_hash)
    try:
        names = [good, as_string, as_hash]
        reaped = Reaper(client, jobs=names).tick()
        assert reaped == {good: 0, as_hash: 0} or reaped == {good: 0}
        assert as_string not in reaped
        assert good in Reaper(client).tick()  # the whole index, foreign entries included

        collector = TaskqCollector(client, jobs=names)
        families = {f.name: f for f in collector.collect()}
        exported = {s.labels["job_name"] for s in families["taskq_tasks"].samples}
        assert exported == {good}
        assert families["taskq_exporter_scrape_errors"].samples[0].value == 2
    finally:
        client.redis.srem(jobs_index(), as_string, as_hash)
        client.redis.delete(JobKeys(as_string).meta, JobKeys(as_hash).meta)


# --- the jobs index on a cluster -----------------------------------------------------------


def names_on_every_master(cluster: RedisClusterProcs, stem: str, count: int = 10) -> list[str]:
    names, owners = [], set()
    i = 0
    while len(names) < count or len(owners) < 3:
        name = f"{stem}-{i}"
        owners.add(cluster.owner_port(JobKeys(name).meta))
        names.append(name)
        i += 1
    return names


def test_interrupted_create_and_delete_are_repaired_on_a_cluster(
    cluster: RedisClusterProcs,
) -> None:
    client = taskq.connect(cluster.url)
    index = jobs_index()
    names = names_on_every_master(cluster, "repair")
    for name in names:
        client.create_job(name, [{"i": 0}, {"i": 1}])
    assert set(names) <= set(client.list_jobs())

    # a create cut off after the flip, before its SADD to the index (another slot)
    client.redis.srem(index, *names)
    assert not set(names) & set(client.list_jobs())
    # a create cut off before the flip: only the staging hash, which expires by itself
    half = JobKeys("half-created")
    staging = half.staging_chunks("deadbeef")
    pipe = client.redis.pipeline(transaction=False)
    pipe.hset(staging, mapping={"0": "[{}]"})
    pipe.expire(staging, STAGING_TTL_S)
    pipe.execute()
    assert 0 < client.redis.ttl(staging) <= STAGING_TTL_S
    # a delete cut off after the keys went, before its SREM from the index
    client.connection.run(names[0], "delete", [""])
    client.redis.sadd(index, names[0])

    added, removed = client.repair_index()  # SCAN on every master
    assert added == sorted(names[1:]) and removed == [names[0]]
    assert set(client.list_jobs()) >= set(names[1:])
    assert names[0] not in client.list_jobs() and "half-created" not in client.list_jobs()
    assert client.repair_index() == ([], [])
    for name in names[1:]:
        assert client.status(name).tasks == 2

    # the same through the CLI
    client.connection.run(names[1], "delete", [""])
    out = subprocess.run(
        [TASKQ_CLI, "--url", cluster.url, "job", "list", "--repair", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert names[1] not in client.list_jobs()
    assert names[1] not in json.dumps(json.loads(out.stdout))
