"""taskq.torch.DataLoader next to a static split of the same files: samples/s, time to
first batch, Redis script calls per second per trainer process; then a trainer process
SIGKILLed mid-pass (samples re-read, and the audit); then heartbeats/s of one trainer
process with 0, 2, 4 and 8 DataLoader workers at the same step rate.

Where it sits: standalone, not part of CI or `run.py` (`python bench/torch_loader.py`).
It starts its own redis-server (common.start_redis), writes 200 JSONL and 50 Parquet
files to a temp dir, and for each format and num_workers in (0, 2, 4) runs, one after
the other, the static split (a plain torch DataLoader over an IterableDataset giving
worker k the files k, k+n, ...) and taskq.torch (one task per file), with the same reader,
the same transform (bytes of a text field to a 64-token tensor), the same per-file
shuffle, batch size and prefetch. One run each by default (``--repeat N``: the best of N,
the two loaders alternating); on a shared machine treat a few percent either way as noise.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import common
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import IterableDataset, get_worker_info

import taskq
import taskq.torch

SEQ = 64
BATCH = 32
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota"]


def write_files(root: Path, fmt: str, files: int, rows: int) -> list[dict[str, Any]]:
    """``files`` files of ``rows`` rows ``{"id", "text"}``; one chunk descriptor each."""
    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    chunks = []
    for f in range(files):
        ids = list(range(f * rows, (f + 1) * rows))
        texts = [" ".join(rng.choices(WORDS, k=rng.randint(10, 40))) for _ in ids]
        path = root / f"part-{f:04d}.{fmt}"
        if fmt == "jsonl":
            path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                                    for i, t in zip(ids, texts, strict=True)))
        else:
            pq.write_table(pa.table({"id": ids, "text": texts}), path, row_group_size=256)
        chunks.append({"path": str(path), "format": fmt})
    return chunks


def read_task(chunks: list[dict[str, Any]], start: int) -> Iterator[dict[str, Any]]:
    """The one reader both loaders use: JSONL lines or Parquet record batches."""
    for chunk in chunks:
        if chunk["format"] == "jsonl":
            with open(chunk["path"]) as f:
                for line in f:
                    yield json.loads(line)
        else:
            for batch in pq.ParquetFile(chunk["path"]).iter_batches(batch_size=1024):
                yield from batch.to_pylist()


def tokenize(row: dict[str, Any]) -> dict[str, Any]:
    data = row["text"].encode()[:SEQ]
    tokens = torch.zeros(SEQ, dtype=torch.long)
    tokens[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return {"id": row["id"], "tokens": tokens}


class StaticSplit(IterableDataset[Any]):
    """Worker k of n reads files k, k+n, ...; each file's rows shuffled (as taskq does)."""

    def __init__(self, chunks: list[dict[str, Any]], seed: int = 0) -> None:
        self.chunks, self.seed = chunks, seed

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        k, n = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(k, len(self.chunks), n):
            rows = list(read_task([self.chunks[i]], 0))
            random.Random(f"{self.seed}:{i}").shuffle(rows)
            for row in rows:
                yield tokenize(row)


def _drain(loader: Any) -> tuple[int, float, float]:
    """(samples, seconds to the first batch, samples/s over the whole pass)."""
    t0 = time.perf_counter()
    it = iter(loader)
    first = next(it)
    ttfb = time.perf_counter() - t0
    n = len(first["id"])
    for batch in it:
        n += len(batch["id"])
    return n, ttfb, n / (time.perf_counter() - t0)


def fcalls(server: common.RedisServer) -> int:
    stats = server.client(decode_responses=True).info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items()
               if k.split("|")[0] in ("cmdstat_fcall", "cmdstat_fcall_ro", "cmdstat_evalsha"))


def compare(server: common.RedisServer, chunks: list[dict[str, Any]], fmt: str, nw: int,
            total: int, repeat: int) -> dict[str, Any]:
    """The two loaders one after the other, ``repeat`` times; the best run of each."""
    runs = [(_static(chunks, nw, total), _taskq(server, chunks, fmt, nw, total))
            for _ in range(repeat)]
    (ttfb_s, rate_s), _ = max(runs, key=lambda r: r[0][1])
    _, (ttfb_t, rate_t, calls_s) = max(runs, key=lambda r: r[1][1])
    return {"format": fmt, "num_workers": nw, "static_sps": rate_s, "taskq_sps": rate_t,
            "ratio": rate_t / rate_s, "static_ttfb_ms": ttfb_s * 1000,
            "taskq_ttfb_ms": ttfb_t * 1000, "redis_calls_s": calls_s}


def _static(chunks: list[dict[str, Any]], nw: int, total: int) -> tuple[float, float]:
    n, ttfb, rate = _drain(TorchLoader(StaticSplit(chunks), batch_size=BATCH, num_workers=nw))
    assert n == total, (n, total)
    return ttfb, rate


def _taskq(server: common.RedisServer, chunks: list[dict[str, Any]], fmt: str, nw: int,
           total: int) -> tuple[float, float, float]:
    kw: dict[str, Any] = {"num_workers": nw}
    url = f"redis://{common.LOOPBACK}:{server.port}/0"
    job = f"bench-{fmt}-{nw}-{time.monotonic_ns()}"
    client = taskq.connect(url)
    client.create_job(job, chunks)
    ds = taskq.torch.TaskDataset(job, transform=tokenize, reader=read_task, url=url)
    before, t0 = fcalls(server), time.perf_counter()
    with taskq.torch.DataLoader(ds, batch_size=BATCH, **kw) as loader:
        n, ttfb_t, rate_t = _drain(loader)
    calls_s = (fcalls(server) - before) / (time.perf_counter() - t0)
    assert n == total, (n, total)
    audit = client.audit(job)
    assert audit["ok"] and audit["passes"][0]["done"] == len(chunks), audit
    client.delete_job(job)
    return ttfb_t, rate_t, calls_s


def heartbeat_rows(server: common.RedisServer, chunks: list[dict[str, Any]],
                   workers: list[int]) -> list[dict[str, Any]]:
    """Heartbeats/s and script calls/s of one trainer process whose loop is bound by a
    0.1 s step (so every row consumes at the same rate), for each num_workers."""
    url = f"redis://{common.LOOPBACK}:{server.port}/0"
    client = taskq.connect(url)
    out = []
    for nw in workers:
        job = f"bench-hb-{nw}-{time.monotonic_ns()}"
        client.create_job(job, chunks, heartbeat_interval=0.5, worker_ttl=3.0)
        before, t0 = fcalls(server), time.monotonic()
        ds = taskq.torch.TaskDataset(job, reader=read_task, url=url)
        with taskq.torch.DataLoader(ds, batch_size=4, num_workers=nw) as loader:
            it = iter(loader)
            for _ in it:
                time.sleep(0.1)
            assert it.feeder.trainer is not None
            beats = it.feeder.trainer.heartbeats_sent
        took = time.monotonic() - t0
        out.append({"num_workers": nw, "heartbeats_s": beats / took,
                    "calls_s": (fcalls(server) - before) / took})
        client.delete_job(job)
    return out


def _victim(url: str, job: str, log: str) -> None:
    ds = taskq.torch.TaskDataset(job, transform=tokenize, reader=read_task, url=url)
    with open(log, "a") as out, taskq.torch.DataLoader(ds, batch_size=BATCH,
                                                       num_workers=2) as loader:
        for batch in loader:
            out.write(" ".join(map(str, batch["id"].tolist())) + "\n")
            out.flush()
            time.sleep(0.005)


def kill_run(server: common.RedisServer, chunks: list[dict[str, Any]], total: int,
             tmp: Path) -> dict[str, Any]:
    """A trainer process (2 workers) SIGKILLed after about a third of the pass; a second
    one finishes it. Counts rows read twice, rows missing, and the audit."""
    url = f"redis://{common.LOOPBACK}:{server.port}/0"
    job = f"bench-kill-{time.monotonic_ns()}"
    client = taskq.connect(url)
    client.create_job(job, chunks, worker_ttl=2.0, heartbeat_interval=0.5)
    logs = [str(tmp / "victim.log"), str(tmp / "survivor.log")]
    ctx = multiprocessing.get_context("fork")
    victim = ctx.Process(target=_victim, args=(url, job, logs[0]))
    victim.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (
            not os.path.exists(logs[0]) or
            sum(len(x.split()) for x in open(logs[0])) < total // 3):
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
    victim.join()
    killed_at = time.monotonic()
    survivor = ctx.Process(target=_victim, args=(url, job, logs[1]))
    survivor.start()
    survivor.join(120)
    ids = [[int(i) for line in open(p) for i in line.split()] for p in logs]
    seen = Counter(ids[0]) + Counter(ids[1])
    audit = client.audit(job)
    return {"victim_rows": len(ids[0]), "survivor_rows": len(ids[1]),
            "read_twice": sum(1 for c in seen.values() if c > 1),
            "missing": total - len(seen), "done": audit["passes"][0]["done"],
            "tasks": len(chunks), "stale": audit["passes"][0]["stale"], "ok": audit["ok"],
            "finish_after_kill_s": time.monotonic() - killed_at}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2, 4])
    ap.add_argument("--rows-jsonl", type=int, default=250, help="rows per JSONL file (200)")
    ap.add_argument("--rows-parquet", type=int, default=1000, help="rows per Parquet file (50)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each; the best is kept")
    args = ap.parse_args()
    common.install_signal_handlers()
    rows = []
    with tempfile.TemporaryDirectory(prefix="taskq-torch-bench-") as d, \
            common.start_redis() as server:
        tmp = Path(d)
        sets = {"jsonl": (write_files(tmp / "jsonl", "jsonl", 200, args.rows_jsonl),
                          200 * args.rows_jsonl),
                "parquet": (write_files(tmp / "parquet", "parquet", 50, args.rows_parquet),
                            50 * args.rows_parquet)}
        for fmt, (chunks, total) in sets.items():
            for nw in args.workers:
                row = compare(server, chunks, fmt, nw, total, args.repeat)
                rows.append(row)
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                  for k, v in row.items()}), flush=True)
        kill = kill_run(server, *sets["jsonl"], tmp)
        small = write_files(tmp / "small", "jsonl", 16, 8)
        beats = heartbeat_rows(server, small, [0, 2, 4, 8])
    print("| format | workers | static samples/s | taskq samples/s | ratio | first batch "
          "static / taskq ms | Redis calls/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['format']} | {r['num_workers']} | {r['static_sps']:,.0f} | "
              f"{r['taskq_sps']:,.0f} | {r['ratio']:.2f} | {r['static_ttfb_ms']:.0f} / "
              f"{r['taskq_ttfb_ms']:.0f} | {r['redis_calls_s']:.1f} |")
    for b in beats:
        print(f"heartbeats: {b['num_workers']} workers: {b['heartbeats_s']:.2f}/s, "
              f"script calls {b['calls_s']:.1f}/s")
    print("kill:", json.dumps({k: round(v, 2) if isinstance(v, float) else v
                               for k, v in kill.items()}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
