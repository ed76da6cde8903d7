"""taskq on a real 3-master Redis Cluster: every job in one slot, jobs spread over masters.

The cluster is three local redis-server processes joined with ``redis-cli --cluster
create`` (module fixture). Each test uses job names of its own; the cluster is thrown
away at the end of the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import redis
from redis.cluster import RedisCluster
from support import RedisClusterProcs

import taskq
from taskq.admin.mix import spec_of, weight_log
from taskq.keys import JobKeys, jobs_index
from taskq.mix import pass_schedule
from taskq.ops.exporter import TaskqCollector
from taskq.ops.reaper import Reaper

TASKQ_CLI = os.path.join(os.path.dirname(sys.executable), "taskq")


def spread_names(cluster: RedisClusterProcs, stem: str, count: int = 10) -> list[str]:
    """``count`` job names whose slots cover every master (at least 3 on each of 3)."""
    per_master: dict[int, list[str]] = {s.port: [] for s in cluster.servers}
    i = 0
    while sum(min(len(v), 3) for v in per_master.values()) < 9:
        name = f"{stem}-{i}"
        per_master[cluster.owner_port(JobKeys(name).meta)].append(name)
        i += 1
    picked = [names[j] for names in per_master.values() for j in range(3)]
    extra = [n for names in per_master.values() for n in names[3:]]
    return sorted(picked + extra[: count - len(picked)])


def test_cluster_urls_make_the_cluster_client(cluster: RedisClusterProcs) -> None:
    ports = [s.port for s in cluster.servers]
    for client in (
        taskq.connect(cluster.url),
        taskq.connect(f"redis://127.0.0.1:{ports[0]}", cluster=True),
        taskq.connect(f"redis+cluster://127.0.0.1:{ports[1]},127.0.0.1:{ports[2]}"),
    ):
        assert isinstance(client.redis, RedisCluster)
        client.ping()
        assert len(client.redis.get_primaries()) == 3


def test_every_key_of_a_job_maps_to_one_slot_and_jobs_cover_all_masters(
    cluster: RedisClusterProcs,
) -> None:
    node = cluster.node(cluster.servers[0].port)
    names = spread_names(cluster, "slot")
    owners = set()
    for name in names:
        keys = JobKeys(name)
        slots = {
            node.cluster("keyslot", k)
            for k in [*keys.all, keys.staging_chunks("abc"), keys.staging_sizes("abc")]
        }
        assert len(slots) == 1, (name, slots)
        owners.add(cluster.owner_port(keys.meta))
    assert owners == {s.port for s in cluster.servers}


def test_ten_jobs_on_three_masters_create_lease_ack_reap_status(
    cluster: RedisClusterProcs, cclient: taskq.Client
) -> None:
    names = spread_names(cluster, "run")
    assert len(names) == 10
    for name in names:
        cclient.create_job(
            name,
            [{"i": i} for i in range(8)],
            worker_ttl=2.0,
            heartbeat_interval=0.5,
            manual_clock=True,
            replace=True,
        )
        owner = cluster.owner_port(JobKeys(name).meta)
        # the job's keys live on its slot's master; the others redirect (MOVED)
        assert cluster.node(owner).exists(*JobKeys(name).all) >= 2
        for s in cluster.servers:
            if s.port != owner:
                with pytest.raises(redis.exceptions.MovedError):
                    cluster.node(s.port).exists(JobKeys(name).meta)
    assert set(names) <= set(cclient.list_jobs())

    for name in names:
        # a trainer leases one task and goes silent: the reaper takes it back
        lost = taskq.Trainer(name, client=cclient, heartbeat=False)
        held = lost.lease(timeout=0)
        assert held is not None
        cclient.advance_clock(name, 3000)
        reclaimed, more, locked = cclient.reap(name)
        assert (reclaimed, more, locked) == (1, False, False)
        assert cclient.status(name).counters["expired_worker_lost"] == 1

        done = []
        with taskq.Trainer(name, client=cclient, heartbeat=False) as trainer:
            for task in trainer:
                done.append(task.id)
        assert sorted(done) == list(range(8))
        status = cclient.status(name)
        assert (status.state, status.done, status.todo, status.leased) == ("completed", 8, 0, 0)
        assert cclient.audit(name)["ok"]


def test_trainers_in_threads_share_a_cluster_job(
    cluster: RedisClusterProcs, cclient: taskq.Client, job_name: str
) -> None:
    cclient.create_job(job_name, [{"i": i} for i in range(60)], passes=2)
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def work() -> None:
        with taskq.Trainer(job_name, url=cluster.url, prefetch=1) as trainer:
            for task in trainer:
                with lock:
                    seen.append((task.pass_no, task.id))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(seen) == [(p, i) for p in range(2) for i in range(60)]
    assert cclient.status(job_name).state == "completed"
    assert cclient.audit(job_name)["ok"]


def test_reaper_and_exporter_read_every_master(
    cluster: RedisClusterProcs, cclient: taskq.Client
) -> None:
    names = spread_names(cluster, "obs")
    for name in names:
        cclient.create_job(
            name,
            [{"i": i} for i in range(4)],
            replace=True,
            manual_clock=True,
            worker_ttl=2.0,
            heartbeat_interval=0.5,
        )
        taskq.Trainer(name, client=cclient, heartbeat=False).lease(timeout=0)
        taskq.Trainer(name, client=cclient, heartbeat=False).lease(timeout=0)
    for name in names[::2]:
        cclient.advance_clock(name, 3000)
    # the reaper walks the index (every job, on every master) and reaps what expired
    assert Reaper(cclient).tick() == {
        **{n: 0 for n in cclient.list_jobs()},
        **{n: 2 for n in names[::2]},
    }

    collector = TaskqCollector(cclient, jobs=names)
    families = {f.name: f for f in collector.collect()}
    leased = {
        s.labels["job_name"]: s.value
        for s in families["taskq_tasks"].samples
        if s.labels.get("state") == "leased"
    }
    assert leased == {name: 0 if i % 2 == 0 else 2 for i, name in enumerate(names)}
    errors_total = families["taskq_exporter_scrape_errors"].samples[0].value
    assert errors_total == 0


def test_cli_job_status_and_list_on_a_cluster(
    cluster: RedisClusterProcs, cclient: taskq.Client
) -> None:
    names = spread_names(cluster, "cli", count=3)
    for name in names:
        cclient.create_job(name, [{"i": i} for i in range(5)], replace=True)
    for name in names:
        out = subprocess.run(
            [TASKQ_CLI, "--url", cluster.url, "job", "status", name, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["job"] == name and doc["tasks"] == 5 and doc["todo"] == 5

    # an index entry lost (the SADD after a create never ran) comes back with --repair
    cclient.redis.srem(jobs_index(), names[0])
    out = subprocess.run(
        [TASKQ_CLI, "--url", cluster.url, "job", "list", "--repair"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert names[0] in cclient.list_jobs()


def test_a_mixed_job_lives_in_one_slot_and_keeps_its_sequence_on_a_cluster(
    cluster: RedisClusterProcs, cclient: taskq.Client
) -> None:
    """A mixed job copies its sources' tasks at create (sources on the other masters) and
    keeps every key under its own hash tag: one slot on one master, one sequence, the
    reference's (docs/mixing.md, "Redis Cluster"); a sharded source or a sharded mixed
    job is refused with nothing written."""
    by_master: dict[int, str] = {}
    for name in spread_names(cluster, "mixc"):
        by_master.setdefault(cluster.owner_port(JobKeys(name).meta), name)
    mix, web, code = by_master.values()  # three jobs, one on each master
    books = f"{code}-books"
    for src, n in ((web, 30), (code, 20), (books, 10)):
        cclient.create_job(src, [{"src": src, "i": i} for i in range(n)], replace=True)
    cclient.create_job(mix, mix={web: 0.5, code: 0.3, books: 0.2}, replace=True)
    job = cclient.job(mix)
    assert job.set_weights({web: 0.2, code: 0.2, books: 0.6}, at=25) == 25
    owner = cluster.node(cluster.owner_port(JobKeys(mix).meta))
    keys = JobKeys(mix)
    assert len({owner.cluster("keyslot", k) for k in keys.all}) == 1
    assert owner.exists(keys.meta, keys.mixlog) == 2  # on the mixed job's own master

    with taskq.Trainer(mix, client=cclient, heartbeat=False) as trainer:
        leased = [(task.source, task.chunks[0]["i"]) for task in trainer]
    spec = spec_of(cclient.connection, mix)
    log = weight_log(cclient.connection, mix)
    want = [(spec.sources[s], j) for s, j in pass_schedule(spec, log, 0)]
    assert leased == want and len(want) == 60
    assert [(r["source"], r["source_task"]) for r in job.mix_sequence()] == want
    assert cclient.status(mix).state == "completed" and cclient.audit(mix)["ok"]
    assert owner.exists(keys.mixseq_block(0, 0)) == 1

    sharded = f"{mix}-sharded"
    cclient.create_job(sharded, [{"i": i} for i in range(4)], shards=2, replace=True)
    with pytest.raises(taskq.InvalidInput, match="is a sharded job"):
        cclient.create_job(f"{mix}-m", mix={web: 1, sharded: 1})
    with pytest.raises(taskq.InvalidInput, match="no shards"):
        cclient.create_job(f"{mix}-m", mix={web: 1, code: 1}, shards=2)
    assert f"{mix}-m" not in cclient.list_jobs()
    assert not cclient.redis.exists(JobKeys(f"{mix}-m").meta)
