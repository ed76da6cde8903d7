"""Appending to a stream job: descriptors appended per second, and the time from an
append to a waiting trainer's lease.

Usage: .venv/bin/python bench/streams.py [--chunks 100000] [--latency-samples 300]
       .venv/bin/python bench/streams.py --bounded 1000000 [--backlog 10000]

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

`--bounded N` instead streams N chunks through one stream job (one-pass, ids on every
chunk, `max_backlog` `--backlog`): a producer thread appends pages, a trainer process
leases and acks in batches of 32, and the driver runs the reaper's trim step (as
`taskq reaper` does each tick) and samples Redis's `used_memory` every 5 % of the way.
It prints the memory at the first sample, at the end and its highest, and the SLOWLOG
entries at 10 ms (`slowlog-log-slower-than 10000`), which should be none; `--no-trim`
runs the same without the trim, for the memory it would take.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import threading
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


def consumer(url: str, job: str) -> None:
    """Lease and ack in batches of 32 until the sealed stream completes."""
    with taskq.Trainer(job, url=url, worker_id="consumer") as trainer:
        for batch in trainer.batches(32):
            trainer.ack(batch)


def bounded(url: str, n: int, backlog: int, trim: bool = True) -> dict[str, object]:
    """Stream ``n`` chunks through a one-pass stream job; memory samples and SLOWLOG."""
    client = taskq.Client(url)
    client.redis.config_set("slowlog-log-slower-than", 10_000)
    client.redis.slowlog_reset()
    job = "bounded"
    client.create_job(job, [], stream=True, passes=1, max_backlog=backlog)
    handle = client.job(job)
    page = 5000

    def produce() -> None:
        for base in range(0, n, page):
            k = min(page, n - base)
            handle.append(descriptors(k, base), ids=[f"id-{base + i:09d}" for i in range(k)])
        handle.seal()

    producer = threading.Thread(target=produce)
    proc = mp.get_context("spawn").Process(target=consumer, args=(url, job))
    proc.start()
    t0 = time.perf_counter()
    producer.start()
    samples: list[tuple[int, int]] = []
    step = max(1, n // 20)
    next_at = step
    try:
        while True:
            while trim and handle.trim():
                pass
            st = client.status(job, summaries=0)
            if st.done >= next_at or st.state == "completed":
                samples.append((st.done, int(client.redis.info("memory")["used_memory"])))
                next_at += step
            if st.state == "completed":
                break
            time.sleep(0.05)
    finally:
        producer.join(timeout=60)
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    elapsed = time.perf_counter() - t0
    st = client.status(job, summaries=0)
    mem = [m for _, m in samples]
    return {
        "chunks": n,
        "seconds": elapsed,
        "acked": st.counters["acked"],
        "trimmed": st.trimmed,
        "first_mib": mem[0] / 2**20,
        "last_mib": mem[-1] / 2**20,
        "max_mib": max(mem) / 2**20,
        "samples": samples,
        "slowlog": client.redis.slowlog_get(128),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--latency-samples", type=int, default=300)
    ap.add_argument("--bounded", type=int, default=0, metavar="N")
    ap.add_argument("--backlog", type=int, default=10_000)
    ap.add_argument("--no-trim", action="store_true", help="--bounded without the trim")
    a = ap.parse_args()
    common.install_signal_handlers()
    with common.start_redis() as server:
        url = f"redis://{common.LOOPBACK}:{server.port}/0"
        if a.bounded:
            r = bounded(url, a.bounded, a.backlog, trim=not a.no_trim)
            print(
                f"streamed {r['chunks']:,} chunks (ids, backlog {a.backlog:,}) in "
                f"{r['seconds']:.0f} s: acked {r['acked']:,}, trimmed {r['trimmed']:,}; "
                f"used_memory first {r['first_mib']:.1f} MiB, last {r['last_mib']:.1f} MiB, "
                f"max {r['max_mib']:.1f} MiB"
            )
            for done, mem in r["samples"]:  # type: ignore[attr-defined]
                print(f"  done {done:>10,}: {mem / 2**20:6.1f} MiB")
            slow = r["slowlog"]
            print(f"SLOWLOG at 10 ms: {len(slow)} entries")  # type: ignore[arg-type]
            for entry in slow:  # type: ignore[attr-defined]
                print(f"  {entry['duration']} us: {entry['command'][:80]!r}")
            return 0
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
