"""taskq.torch against a static split with several trainer processes: the time of one
pass over a realistic set, even steps and one trainer's step 2x.

Where it sits: standalone, by hand (``python bench/torch_ranks.py``), beside
``torch_loader.py`` (one process). It starts its own redis-server (common.start_redis),
writes Parquet files (16 float features, row groups of 1,000 rows) to a temp dir and, for
each case, runs P trainer processes (forked, 2 DataLoader workers each) that wait at a
barrier and then train one pass with a small step (``--step-ms`` per batch of 64; trainer
1's step is ``--slow``x that in the uneven case; its rate is not ``--slow``x lower, a
fixed 2-3 ms a batch being outside the step: ``loader_cost.py``'s slow shape is): the
static split gives rank r the files r, r+P, ... (each of its workers a share of them,
each file's rows shuffled), taskq gives every trainer the job (one task per file). A
pass's time runs from the barrier to the last trainer's last batch (the static split
waits for its slowest rank); samples/s = rows / that time. Best of ``--repeat`` rounds,
the two alternating.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import common
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import IterableDataset, get_worker_info

import taskq
import taskq.torch
from taskq.data import reader_for

BATCH = 64
FEATURES = 16
PARQUET = reader_for({"format": "parquet"})


def write_files(root: Path, files: int, rows: int) -> list[dict[str, Any]]:
    """``files`` Parquet files of ``rows`` rows (id, 16 float features), row groups of
    1,000; one chunk descriptor each, as ``taskq job create`` describes a file (its
    rows from the footer: a size, what lets a task be split at a pass's tail;
    ``read_task`` reads its path)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    chunks = []
    for f in range(files):
        cols: dict[str, Any] = {"id": np.arange(f * rows, (f + 1) * rows)}
        for k in range(FEATURES):
            cols[f"x{k}"] = rng.standard_normal(rows).astype(np.float32)
        path = root / f"part-{f:04d}.parquet"
        pq.write_table(pa.table(cols), path, row_group_size=1000)
        # the file's row groups as one chunk: one task per file
        chunks += PARQUET.chunks([(str(path), 0)], row_groups_per_chunk=-(-rows // 1000))
    return chunks


def read_task(chunks: list[dict[str, Any]], start: int) -> Iterator[dict[str, Any]]:
    """The one reader both loaders use: rows of a task's files as dicts."""
    k = 0
    for chunk in chunks:
        for batch in pq.ParquetFile(chunk["path"]).iter_batches(batch_size=1000):
            for row in batch.to_pylist():
                if k >= start:
                    yield row
                k += 1


def to_tensor(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "x": torch.tensor([row[f"x{k}"] for k in range(FEATURES)], dtype=torch.float32),
    }


class StaticSplit(IterableDataset[Any]):
    """Rank r of P reads files r, r+P, ...; its worker k of n every n-th of those; each
    file's rows shuffled (as taskq does per task)."""

    def __init__(self, chunks: list[dict[str, Any]], rank: int, ranks: int) -> None:
        self.files = chunks[rank::ranks]

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        k, n = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(k, len(self.files), n):
            rows = list(read_task([self.files[i]], 0))
            random.Random(f"0:{i}").shuffle(rows)
            for row in rows:
                yield to_tensor(row)


def _trainer(kind: str, rank: int, ranks: int, chunks: Any, url: str, job: str,
             step_s: float, barrier: Any, out: Any) -> None:  # fmt: skip
    torch.set_num_threads(1)
    model = torch.nn.Linear(FEATURES, 1)
    if kind == "static":
        loader: Any = TorchLoader(StaticSplit(chunks, rank, ranks), batch_size=BATCH, num_workers=2)
    else:
        ds = taskq.torch.TaskDataset(job, transform=to_tensor, reader=read_task, url=url)
        loader = taskq.torch.DataLoader(ds, batch_size=BATCH, num_workers=2)
    barrier.wait()
    t0 = time.perf_counter()
    n = 0
    for batch in loader:
        model(batch["x"]).sum().backward()
        n += len(batch["id"])
        time.sleep(step_s)
    out.put((rank, n, t0, time.perf_counter()))
    if kind == "taskq":
        loader.close()


def one_pass(kind: str, chunks: Any, total: int, url: str, ranks: int, steps: list[float]) -> float:
    """samples/s of one pass with ``ranks`` trainer processes of these step times."""
    job = ""
    if kind == "taskq":
        job = f"bench-ranks-{time.monotonic_ns()}"
        taskq.connect(url).create_job(job, chunks)
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(ranks), ctx.Queue()
    procs = [
        ctx.Process(
            target=_trainer, args=(kind, r, ranks, chunks, url, job, steps[r], barrier, out)
        )
        for r in range(ranks)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(30)
    assert sum(n for _, n, _, _ in results) == total, results
    began = min(t0 for _, _, t0, _ in results)
    ended = max(t1 for _, _, _, t1 in results)
    if kind == "taskq":
        client = taskq.connect(url)
        assert client.audit(job)["passes"][0]["done"] == len(chunks)
        client.delete_job(job)
    return total / (ended - began)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--rows", type=int, default=1000, help="rows per file")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--slow", type=float, default=2.0, help="trainer 1's step, x")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    common.install_signal_handlers()
    step = args.step_ms / 1000
    cases = {
        "even": [step] * args.ranks,
        f"trainer 1's step {args.slow:g}x": [step * (args.slow if r == 1 else 1.0)
                                              for r in range(args.ranks)],
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="taskq-ranks-") as d, common.start_redis() as server:
        url = f"redis://{common.LOOPBACK}:{server.port}/0"
        chunks = write_files(Path(d), args.files, args.rows)
        total = args.files * args.rows
        rows = []
        for name, steps in cases.items():
            best = {"static": 0.0, "taskq": 0.0}
            for _ in range(args.repeat):
                for kind in ("static", "taskq"):
                    best[kind] = max(
                        best[kind], one_pass(kind, chunks, total, url, args.ranks, steps)
                    )
            row = {"case": name, **best, "ratio": best["taskq"] / best["static"]}
            rows.append(row)
            print(
                json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
            )
    print(
        f"| case ({args.ranks} processes x 2 workers, {total:,} rows, step {args.step_ms:g} ms"
        " per batch of 64) | static samples/s | taskq samples/s | taskq / static |"
    )
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['case']} | {r['static']:,.0f} | {r['taskq']:,.0f} | {r['ratio']:.2f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
