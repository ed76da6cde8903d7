"""The loader's cost in CPU seconds, where a wall-clock ratio swings: taskq.torch against a
static split of the same files and step, CPU seconds per 1,000 samples of every process of
the run, the wall ratio beside it.

Where it sits: standalone, by hand (``python bench/loader_cost.py``), beside
``torch_ranks.py`` (the same trainers, timed by the wall clock only). Wall-clock ratios on
a shared 2-core machine move 0.5-1.1x between rounds; the CPU a pass costs moves little,
so a regression or a gain of 10 % shows here. It starts its own redis-server
(common.start_redis), writes Parquet files (16 float features, row groups of 1,000 rows)
and runs, for each loader, ``--ranks`` trainer processes (forked, ``--workers`` DataLoader
workers each) through one pass with a small step per batch (``--step-ms``): the static
split gives rank r the files r, r+P, ... (its workers a share each, each file's rows
shuffled), taskq gives every trainer the job (one task per file). Each trainer reports
its process's CPU (user + system, its DataLoader workers included: they are joined, so
psutil's ``children_*`` times hold them) from the barrier to the end of its pass and its
loader's shutdown; Redis's CPU (psutil, the server process) is taken over the same pass.
CPU per 1,000 samples = (every trainer's + Redis's) / samples x 1,000. Rounds alternate
the two loaders; the table gives each loader's lowest CPU figure and best wall time over
``--repeat`` rounds, and the CPU ratio's median over rounds.

Shapes (``--shapes``): ``even``, every trainer at ``--step-ms``; ``slow``, trainer 1 at
``--slow`` times that (the static split waits for its slow rank, taskq's fast trainer
takes more tasks): its row is the throughput, best of ``--repeat`` (the goal: >= 1.3x the
static split's at 2x), beside its CPU.

``--guard R``: exit 1 when the even shape's median CPU ratio (taskq / static) is above R:
the regression guard (bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
import psutil
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch_ranks import BATCH, StaticSplit, read_task, to_tensor, write_files

import taskq
import taskq.torch


def _cpu(proc: psutil.Process, children: bool = True) -> float:
    """CPU seconds of ``proc`` and (``children``) of its children it has waited for."""
    t = proc.cpu_times()
    own = t.user + t.system
    return float(own + t.children_user + t.children_system if children else own)


def _trainer(kind: str, rank: int, ranks: int, chunks: Any, url: str, job: str,
             step_s: float, workers: int, barrier: Any, out: Any) -> None:  # fmt: skip
    torch.set_num_threads(1)
    me = psutil.Process()
    model = torch.nn.Linear(16, 1)
    if kind == "static":
        split = StaticSplit(chunks, rank, ranks)
        loader: Any = TorchLoader(split, batch_size=BATCH, num_workers=workers)
    else:
        ds = taskq.torch.TaskDataset(job, transform=to_tensor, reader=read_task, url=url)
        loader = taskq.torch.DataLoader(ds, batch_size=BATCH, num_workers=workers)
    barrier.wait()
    cpu0, main0, t0 = _cpu(me), _cpu(me, children=False), time.perf_counter()
    n = 0
    for batch in loader:
        model(batch["x"]).sum().backward()
        n += len(batch["id"])
        time.sleep(step_s)
    t1 = time.perf_counter()
    if kind == "taskq":
        loader.close()
    del loader
    # the DataLoader workers are joined (their CPU is in children_*) before the reading
    deadline = time.monotonic() + 10
    while me.children() and time.monotonic() < deadline:
        time.sleep(0.01)
    out.put((rank, n, t0, t1, _cpu(me) - cpu0, _cpu(me, children=False) - main0))


def one_pass(
    kind: str, chunks: Any, total: int, server: Any, steps: list[float], workers: int
) -> tuple[float, float, float, float]:
    """(CPU seconds per 1,000 samples of every process, of which Redis's, of which the
    trainers' main processes', samples/s) of one pass, one trainer per step time."""
    ranks = len(steps)
    url = f"redis://{common.LOOPBACK}:{server.port}/0"
    job = ""
    if kind == "taskq":
        job = f"bench-cost-{time.monotonic_ns()}"
        taskq.connect(url).create_job(job, chunks)
    redis_proc = psutil.Process(server.process.pid)
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(ranks + 1), ctx.Queue()
    procs = [
        ctx.Process(
            target=_trainer,
            args=(kind, r, ranks, chunks, url, job, steps[r], workers, barrier, out),
        )
        for r in range(ranks)
    ]
    for p in procs:
        p.start()
    barrier.wait()
    redis0 = _cpu(redis_proc)
    results = [out.get(timeout=300) for _ in procs]
    redis_cpu = _cpu(redis_proc) - redis0
    for p in procs:
        p.join(30)
    assert sum(r[1] for r in results) == total, results
    wall = max(r[3] for r in results) - min(r[2] for r in results)
    cpu = sum(r[4] for r in results) + redis_cpu
    if kind == "taskq":
        client = taskq.connect(url)
        assert client.audit(job)["passes"][0]["done"] == len(chunks)
        client.delete_job(job)
    main = sum(r[5] for r in results)
    return cpu / total * 1000, redis_cpu / total * 1000, main / total * 1000, total / wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--rows", type=int, default=1000, help="rows per file")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers per trainer")
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--slow", type=float, default=2.0, help="trainer 1's step, x (slow shape)")
    ap.add_argument("--shapes", default="even,slow", help="comma-separated: even, slow")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--guard", type=float, help="exit 1 above this median CPU ratio (even)")
    args = ap.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if not shapes or set(shapes) - {"even", "slow"} or args.ranks < 2 and "slow" in shapes:
        ap.error("--shapes: even and/or slow (slow needs --ranks >= 2)")
    if args.guard is not None and "even" not in shapes:
        ap.error("--guard reads the even shape")
    common.install_signal_handlers()
    step = args.step_ms / 1000
    steps = {
        "even": [step] * args.ranks,
        "slow": [step * (args.slow if r == 1 else 1.0) for r in range(args.ranks)],
    }
    total = args.files * args.rows
    cpu: dict[tuple[str, str], list[float]] = {
        (sh, k): [] for sh in shapes for k in ("static", "taskq")
    }
    rate: dict[tuple[str, str], list[float]] = {
        (sh, k): [] for sh in shapes for k in ("static", "taskq")
    }
    with tempfile.TemporaryDirectory(prefix="taskq-cost-") as d, common.start_redis() as server:
        chunks = write_files(Path(d), args.files, args.rows)
        for _ in range(args.repeat):
            for shape in shapes:
                for kind in ("static", "taskq"):
                    c, redis_c, main_c, r = one_pass(
                        kind, chunks, total, server, steps[shape], args.workers
                    )
                    cpu[shape, kind].append(c)
                    rate[shape, kind].append(r)
                    row = {
                        "shape": shape,
                        "kind": kind,
                        "cpu_s_per_1000": c,
                        "of_it_redis": redis_c,
                        "of_it_main": main_c,
                        "samples_s": r,
                    }
                    print(
                        json.dumps(
                            {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
                        )
                    )
    print(
        f"| {args.ranks} trainers x {args.workers} workers, {total:,} rows, step "
        f"{args.step_ms:g} ms / batch of {BATCH} | static | taskq | taskq / static |"
    )
    print("|---|---:|---:|---:|")
    ratio_of: dict[str, float] = {}
    for shape in shapes:
        name = "even" if shape == "even" else f"trainer 1 {args.slow:g}x slower"
        ratios = [t / s for s, t in zip(cpu[shape, "static"], cpu[shape, "taskq"], strict=True)]
        ratio_of[shape] = statistics.median(ratios)
        print(
            f"| {name}: CPU s per 1,000 samples (lowest of {args.repeat}; ratio: median) | "
            f"{min(cpu[shape, 'static']):.3f} | {min(cpu[shape, 'taskq']):.3f} | "
            f"{ratio_of[shape]:.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
        best_s, best_t = max(rate[shape, "static"]), max(rate[shape, "taskq"])
        print(
            f"| {name}: samples/s (best of {args.repeat}) | {best_s:,.0f} | "
            f"{best_t:,.0f} | {best_t / best_s:.2f} |"
        )
    sys.stdout.flush()
    if args.guard is not None and ratio_of["even"] > args.guard:
        print(f"loader_cost: CPU ratio {ratio_of['even']:.2f} above the guard {args.guard:g}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
