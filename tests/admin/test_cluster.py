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
from taskq.keys import JobKeys, jobs_index
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
