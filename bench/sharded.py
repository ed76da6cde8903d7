"""Sharded jobs on a local 3-master cluster: Redis CPU and server time per master.

Where it sits: the numbers behind docs/capacity.md's sharded rows. Starts a private
3-master Redis Cluster (``taskq.devserver.RedisCluster``), then per row creates one job
of N tasks and P passes, runs W trainer processes in a closed loop (no work per task)
until the job completes, and reads ``INFO cpu`` and ``INFO commandstats`` of every master
before and after. Rows:

- S=1, the ``Trainer`` iterator (one ack-and-lease call per task): today's job;
- S=1, ``Trainer.lease(acks=[previous])`` (one call per task, the sharded trainer's
  pattern on one master);
- S=3, a sharded job's ``Trainer`` (one call per task, spread over the three masters).

Usage: python bench/sharded.py [--tasks N] [--passes P] [--trainers W] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import time
from typing import Any

import redis

import taskq
from taskq.devserver import LOOPBACK, RedisCluster


def snapshot(ports: list[int]) -> dict[int, dict[str, float]]:
    """Per master: CPU seconds, script calls and their server microseconds."""
    out = {}
    for port in ports:
        r = redis.Redis(host=LOOPBACK, port=port)
        cpu = r.info("cpu")
        stats = r.info("commandstats")
        calls = usec = 0.0
        for name in ("cmdstat_fcall", "cmdstat_fcall_ro"):
            calls += stats.get(name, {}).get("calls", 0)
            usec += stats.get(name, {}).get("usec", 0)
        out[port] = {
            "cpu": cpu["used_cpu_user"] + cpu["used_cpu_sys"],
            "calls": calls,
            "usec": usec,
        }
    return out


def worker(url: str, job: str, mode: str) -> None:
    """One trainer process, until the job completes."""
    if mode == "sharded":
        with taskq.Trainer(job, url=url, idle_wait=0.2) as st:
            for _ in st:
                pass
        return
    with taskq.Trainer(job, url=url) as tr:
        if mode == "iterator":
            for _ in tr:
                pass
            return
        done: list[taskq.Task] = []
        while True:  # lease(acks=...): the sharded trainer's one call per task
            try:
                task = tr.lease(timeout=1.0, acks=done)
            except taskq.JobCompleted:
                return
            done = [task] if task is not None else []


def row(
    url: str, ports: list[int], shards: int, mode: str, tasks: int, passes: int, trainers: int
) -> dict[str, Any]:
    client = taskq.connect(url)
    job = f"bench-{mode}-{shards}-{random.randint(0, 10**6)}"
    client.create_job(job, [{"i": i} for i in range(tasks)], shards=shards, passes=passes)
    before = snapshot(ports)
    t0 = time.monotonic()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(url, job, mode)) for _ in range(trainers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    took = time.monotonic() - t0
    after = snapshot(ports)
    done = tasks * passes
    per = {}
    for port in ports:
        d = {k: after[port][k] - before[port][k] for k in ("cpu", "calls", "usec")}
        per[port] = {
            "cpu_per_s": round(d["cpu"] / took, 3),
            "calls": int(d["calls"]),
            "server_us_per_task": round(d["usec"] / done, 1),
            "calls_per_task": round(d["calls"] / done, 2),
        }
    return {
        "shards": shards,
        "mode": mode,
        "tasks": done,
        "seconds": round(took, 2),
        "tasks_per_s": round(done / took),
        "masters": per,
        "server_us_per_task": round(
            sum(after[p]["usec"] - before[p]["usec"] for p in ports) / done, 1
        ),
        "calls_per_task": round(
            sum(after[p]["calls"] - before[p]["calls"] for p in ports) / done, 2
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=6000)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--trainers", type=int, default=3)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    with RedisCluster(3) as cluster:
        ports = [s.port for s in cluster.servers]
        rows = [
            row(cluster.url, ports, s, m, a.tasks, a.passes, a.trainers)
            for s, m in ((1, "iterator"), (1, "lease_acks"), (3, "sharded"))
        ]
    print(
        "| S | trainer | tasks/s | server µs/task (all) | calls/task | per master: "
        "CPU (cores), server µs/task, calls |"
    )
    print("|---|---|---:|---:|---:|---|")
    for r in rows:
        masters = "; ".join(
            f"{m['cpu_per_s']:.2f}, {m['server_us_per_task']}, {m['calls']}"
            for m in r["masters"].values()
        )
        print(
            f"| {r['shards']} | {r['mode']} | {r['tasks_per_s']} | "
            f"{r['server_us_per_task']} | {r['calls_per_task']} | {masters} |"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
