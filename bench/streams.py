"""Appending to a stream job: descriptors appended per second, and the time from an
append to a waiting trainer's lease.

Usage: .venv/bin/python bench/streams.py [--chunks 100000] [--latency-samples 300]

Where it sits: a diagnostic beside `secret_cost.py` (not a section of run.py), against a
private redis-server it starts and stops (loopback, no persistence). Two measurements:

- throughput: `job.append` of `--chunks` descriptors of a Parquet file each
  (`{"path", "row_group", "rows"}`, ~70 bytes of JSON) into a stream job, in its pages
  of 500 (one FCALL each), without ids and with one id per chunk (the duplicate check:
  one HEXISTS and one HSET field per chunk); then the same append again with the ids
  (every chunk skipped). Descriptors per second, end to end (JSON encoding included).
- latency: one trainer process blocks in `lease()` on a drained stream; the driver
  appends one chunk carrying `time.monotonic()` (CLOCK_MONOTONIC, system-wide) once the
  trainer is in the waiting set, the trainer notes the clock when `lease()` returns it
  and acks. p50 / p99 / max over `--latency-samples` appends.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time

import common

import taskq


def descriptors(n: int, base: int = 0) -> list[dict[str, object]]:
    return [
        {
            "path": f"s3://bucket/events/part-{(base + i) // 8:06d}.parquet",
            "row_group": i % 8,
            "rows": 4096,
        }
        for i in range(n)
    ]


def throughput(url: str, n: int) -> dict[str, float]:
    """Descriptors per second of each shape, and the server's µs per append call (one
    page of 500; INFO commandstats)."""
    client = taskq.Client(url)
    out = {}
    for label, with_ids in (("no ids", False), ("ids", True)):
        job = f"tput-{label.replace(' ', '-')}"
        client.create_job(job, [], stream=True)
        chunks = descriptors(n)
        ids = [f"c{i}" for i in range(n)] if with_ids else None
        client.redis.config_resetstat()
        t0 = time.perf_counter()
        r = client.job(job).append(chunks, ids=ids)
        out[label] = n / (time.perf_counter() - t0)
        assert r.tasks == n, r
        stat = client.redis.info("commandstats")["cmdstat_fcall"]
        out[f"{label}: server µs per page (mean)"] = stat["usec_per_call"]
        if with_ids:
            t0 = time.perf_counter()
            r = client.job(job).append(chunks, ids=ids)
            out["ids, all skipped"] = n / (time.perf_counter() - t0)
            assert (r.tasks, r.skipped) == (0, n), r
    return out


def waiter(url: str, job: str, samples: int, out: mp.Queue) -> None:
    with taskq.Trainer(job, url=url, worker_id="waiter") as trainer:
        for _ in range(samples):
            task = trainer.lease(timeout=30)
            got = time.monotonic()
            assert task is not None
            out.put(got - task.chunks[0]["sent"])
            trainer.ack(task)


def latency(url: str, samples: int) -> list[float]:
    client = taskq.Client(url)
    job = "latency"
    client.create_job(job, [], stream=True)
    out: mp.Queue = mp.get_context("fork").Queue()
    proc = mp.get_context("fork").Process(target=waiter, args=(url, job, samples, out))
    proc.start()
    waiting = client.keys(job).waiting
    lat = []
    try:
        for _ in range(samples):
            deadline = time.monotonic() + 30
            while client.redis.zcard(waiting) == 0:  # (the driver's own wait, not measured)
                if time.monotonic() > deadline:
                    raise RuntimeError("the trainer never waited")
                time.sleep(0.001)
            client.job(job).append([{"sent": time.monotonic()}])
            lat.append(out.get(timeout=30))
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    return lat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--latency-samples", type=int, default=300)
    a = ap.parse_args()
    common.install_signal_handlers()
    with common.start_redis() as server:
        url = f"redis://{common.LOOPBACK}:{server.port}/0"
        for label, rate in throughput(url, a.chunks).items():
            unit = "" if "µs" in label else " /s"
            print(f"append {a.chunks:,} descriptors, {label}: {rate:,.0f}{unit}")
        lat = [x * 1000 for x in latency(url, a.latency_samples)]
        print(
            f"append -> waiting trainer's lease, {len(lat)} samples: p50 "
            f"{common.percentile(lat, 50):.2f} ms, p99 {common.percentile(lat, 99):.2f} ms, "
            f"max {max(lat):.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
