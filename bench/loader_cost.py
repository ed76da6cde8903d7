"""The loader's cost in CPU seconds, where a wall-clock ratio swings: taskq.torch against a
static split of the same files and step, CPU seconds per 1,000 samples of every process of
the run, the wall ratio beside it.

Where it sits: standalone, by hand (``python bench/loader_cost.py``), beside
``torch_ranks.py`` (the same trainers, timed by the wall clock only). Wall-clock ratios on
a shared 2-core machine move 0.5-1.1x between rounds; the CPU a pass costs moves little,
so a regression or a gain of 10 % shows here. It starts its own redis-server
(common.start_redis), writes Parquet files (16 float features, row groups of 1,000 rows)
and runs, for each loader, ``--ranks`` trainer processes (forked, ``--workers`` DataLoader
workers each) through one pass with a step per batch (a sleep: a training step): the static
split gives rank r the files r, r+P, ... (its workers a share each, each file's rows
shuffled), taskq gives every trainer the job (one task per file). Each trainer reports
its process's CPU (user + system, its DataLoader workers included: they are joined, so
psutil's ``children_*`` times hold them) from the barrier to the end of its pass and its
loader's shutdown; Redis's CPU (psutil, the server process) is taken over the same pass.
CPU per 1,000 samples = (every trainer's + Redis's) / samples x 1,000. Rounds alternate
the two loaders; the table gives each loader's lowest CPU figure and best wall time over
``--repeat`` rounds, and the CPU ratio's median over rounds.

Shapes (``--shapes``), each with every trainer's own samples/s, seconds blocked in
``next(loader)`` and when its last batch came, per pass:

- ``even``: every trainer at ``--step-ms`` (2 ms a batch of 64: the DataLoader workers,
  not the steps, bind both loaders on 2 cores);
- ``slow``: one trainer ``--slow`` times slower than the others in all it does, at a step
  long enough to bind (``--slow-step-ms``, 10 ms): trainer 1 sleeps ``--slow`` x the step
  plus ``--slow`` - 1 x what fetching and the forward pass of that batch took, so its
  batch takes ``--slow`` x the others' (a fixed ~2-3 ms a batch of unpickling, collate
  and the forward pass would otherwise leave it at ~0.57x at 2x its step). The static
  split waits for its slow rank; a shared queue whose trainers keep their rates to the
  end reaches 1.5x that at 2x. The table checks the claim every run: trainer 1's own
  samples/s over trainer 0's in the static split (each rank reads its own files to the
  end), and the ratio a shared queue would reach at those rates;
- ``slow-short``: the shape before ``slow``, trainer 1's step ``--slow`` x ``--step-ms``
  and nothing else: the readers bind, trainer 1 is ~0.7x as fast, not 0.5x (its row
  says by how much), so the static split loses little to it.

The files are described as ``taskq job create`` describes them (``taskq.data``'s
Parquet chunks: path, row groups, rows; ``torch_ranks.write_files``), so a task has a
size and is split at the pass's tail; the loaders' reader (``read_task``) reads the path.
``--trace PATH`` keeps taskq's pass of the slow shape furthest from the steps' bound
(the server's events and each trainer's batches, with the files they are of) for
``bench/tail.py --show PATH``, whose "x the ideal" is that pass's time over the steps'.

``--guard R``: exit 1 when the even shape's median CPU ratio (taskq / static) is above R:
the regression guard (bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import common
import psutil
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch_ranks import BATCH, StaticSplit, read_task, to_tensor, write_files

import taskq
import taskq.torch

KINDS = ("static", "taskq")


def _cpu(proc: psutil.Process, children: bool = True) -> float:
    """CPU seconds of ``proc`` and (``children``) of its children it has waited for."""
    t = proc.cpu_times()
    own = t.user + t.system
    return float(own + t.children_user + t.children_system if children else own)


def _trainer(kind: str, rank: int, ranks: int, chunks: Any, url: str, job: str,
             step: Step, workers: int, rows: int, barrier: Any, out: Any) -> None:  # fmt: skip
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
    n, blocked = 0, 0.0
    # when each batch came (ms of the wall clock) and the files (tasks) its samples are of
    batches: list[tuple[int, str, int]] = []
    it = iter(loader)
    while True:
        w0 = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            break
        w1 = time.perf_counter()
        blocked += w1 - w0
        files = ",".join(str(f) for f in sorted({int(i) // rows for i in batch["id"]}))
        batches.append((int(time.time() * 1000), files, len(batch["id"])))
        model(batch["x"]).sum().backward()
        n += len(batch["id"])
        # a stretched trainer is that much slower at the fetch and the forward pass too
        time.sleep(step.s + step.stretch * (time.perf_counter() - w0))
    t1 = time.perf_counter()
    if kind == "taskq":
        loader.close()
    del it, loader
    # the DataLoader workers are joined (their CPU is in children_*) before the reading
    deadline = time.monotonic() + 10
    while me.children() and time.monotonic() < deadline:
        time.sleep(0.01)
    cpu, main = _cpu(me) - cpu0, _cpu(me, children=False) - main0
    out.put(Rank(rank, n, t0, t1, blocked, cpu, main, os.getpid(), batches))


class Step(NamedTuple):
    """A trainer's step per batch: ``s`` seconds, plus ``stretch`` x what fetching and
    the forward pass of that batch took (a trainer 2x slower in all it does: s = 2 x the
    others' and stretch = 1)."""

    s: float
    stretch: float = 0.0


class Rank(NamedTuple):
    """One trainer's pass: its samples, its times (perf_counter; ``blocked``: seconds in
    ``next(loader)``), its CPU (all, main process), its pid and its batches."""

    rank: int
    n: int
    t0: float
    t1: float
    blocked: float
    cpu: float
    main: float
    pid: int
    batches: list[tuple[int, str, int]]

    @property
    def rate(self) -> float:
        return self.n / (self.t1 - self.t0)


class Pass(NamedTuple):
    """One pass of one loader: CPU seconds per 1,000 samples of every process, of which
    Redis's and the trainers' main processes', samples/s, each trainer's pass and the
    server's events (taskq: to explain the tail)."""

    cpu: float
    redis: float
    main: float
    rate: float
    ranks: list[Rank]
    events: list[tuple[str, dict[str, Any]]]


def one_pass(
    kind: str, chunks: Any, rows: int, server: Any, steps: list[Step], workers: int
) -> Pass:
    """One pass with one trainer per step time."""
    ranks, total = len(steps), len(chunks) * rows
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
            args=(kind, r, ranks, chunks, url, job, steps[r], workers, rows, barrier, out),
        )
        for r in range(ranks)
    ]
    for p in procs:
        p.start()
    barrier.wait()
    redis0 = _cpu(redis_proc)
    results: list[Rank] = sorted(out.get(timeout=600) for _ in procs)
    redis_cpu = _cpu(redis_proc) - redis0
    for p in procs:
        p.join(30)
    assert sum(r.n for r in results) == total, [r[:3] for r in results]
    wall = max(r.t1 for r in results) - min(r.t0 for r in results)
    cpu = sum(r.cpu for r in results) + redis_cpu
    events: list[tuple[str, dict[str, Any]]] = []
    if kind == "taskq":
        client = taskq.connect(url)
        assert client.audit(job)["passes"][0]["done"] == len(chunks)
        events = client.events(job, count=1_000_000)
        client.delete_job(job)
    main = sum(r.main for r in results)
    k = 1000 / total
    return Pass(cpu * k, redis_cpu * k, main * k, total / wall, results, events)


def timeline(p: Pass) -> dict[str, Any]:
    """The tail and each trainer's samples, samples/s, seconds blocked in ``next()`` and
    when its last batch came (seconds from the pass's start): where a pass's time went."""
    t0 = min(r.t0 for r in p.ranks)
    ranks = {
        f"trainer{r.rank}": {
            "samples": r.n,
            "samples_s": round(r.rate),
            "blocked_s": round(r.blocked, 2),
            "ended_s": round(r.t1 - t0, 2),
        }
        for r in p.ranks
    }
    return {
        # the tail: from the first trainer's last batch to the last one's; taskq's splits
        "tail_s": round(max(r.t1 for r in p.ranks) - min(r.t1 for r in p.ranks), 2),
        "splits": sum(1 for _, f in p.events if f.get("type") == "split"),
        **ranks,
    }


def trace_lines(shape: str, rnd: int, p: Pass, ideal: float) -> list[dict[str, Any]]:
    """A taskq pass as ``bench/tail.py --show`` reads it: the server's events and each
    trainer's batches (``tasks``: the files of its samples), ms from the first lease;
    ``ideal``: the pass's time over the steps' bound (its "x the ideal")."""
    ms = [int(i.split("-")[0]) for i, _ in p.events]
    first = min(ms, default=0)
    lines = [{"ms": m - first, **f} for m, (_, f) in zip(ms, p.events, strict=True)]
    lines += [
        {"ms": at - first, "type": "batch", "loader": r.rank, "pid": r.pid, "tasks": t, "n": n}
        for r in p.ranks
        for at, t, n in r.batches
    ]
    return [
        {"row": shape, "run": rnd, "ratio": round(ideal, 2), **e}
        for e in sorted(lines, key=lambda e: int(e["ms"]))
    ]


SHAPES = ("even", "slow", "slow-short")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=160)
    ap.add_argument("--rows", type=int, default=1000, help="rows per file")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers per trainer")
    ap.add_argument("--step-ms", type=float, default=2.0, help="even and slow-short shapes")
    ap.add_argument("--slow-step-ms", type=float, default=10.0, help="slow shape, fast trainers")
    ap.add_argument("--slow", type=float, default=2.0, help="trainer 1's step, x (slow shapes)")
    ap.add_argument(
        "--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES)
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--guard", type=float, help="exit 1 above this median CPU ratio (even)")
    ap.add_argument(
        "--trace", metavar="PATH", help="taskq's slowest slow-shape pass (tail.py --show)"
    )
    args = ap.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    slow_shapes = {"slow", "slow-short"} & set(shapes)
    if not shapes or set(shapes) - set(SHAPES) or args.ranks < 2 and slow_shapes:
        ap.error(f"--shapes: of {', '.join(SHAPES)} (the slow ones need --ranks >= 2)")
    if args.guard is not None and "even" not in shapes:
        ap.error("--guard reads the even shape")
    common.install_signal_handlers()

    def slowed(ms: float, whole: bool) -> list[Step]:
        """Trainer 1 ``--slow`` x slower: its step (``whole``: its whole batch's time)."""
        slow = Step(ms / 1000 * args.slow, args.slow - 1 if whole else 0.0)
        return [slow if r == 1 else Step(ms / 1000) for r in range(args.ranks)]

    steps = {
        "even": [Step(args.step_ms / 1000)] * args.ranks,
        "slow": slowed(args.slow_step_ms, whole=True),
        "slow-short": slowed(args.step_ms, whole=False),
    }
    total = args.files * args.rows
    runs: dict[tuple[str, str], list[Pass]] = {(sh, k): [] for sh in shapes for k in KINDS}
    worst: tuple[float, list[dict[str, Any]]] = (0.0, [])
    with tempfile.TemporaryDirectory(prefix="taskq-cost-") as d, common.start_redis() as server:
        chunks = write_files(Path(d), args.files, args.rows)
        for rnd in range(args.repeat):
            for shape in shapes:
                bound = total / sum(BATCH / s.s for s in steps[shape])  # the steps' own time
                for kind in KINDS:
                    p = one_pass(kind, chunks, args.rows, server, steps[shape], args.workers)
                    runs[shape, kind].append(p)
                    row = {
                        "shape": shape,
                        "kind": kind,
                        "cpu_s_per_1000": round(p.cpu, 4),
                        "of_it_redis": round(p.redis, 4),
                        "of_it_main": round(p.main, 4),
                        "samples_s": round(p.rate),
                        "x_steps_bound": round(total / p.rate / bound, 2),
                        **timeline(p),
                    }
                    print(json.dumps(row), flush=True)
                    if kind == "taskq" and shape == "slow" and total / p.rate / bound > worst[0]:
                        over = total / p.rate / bound
                        worst = (over, trace_lines(shape, rnd, p, over))
    print(
        f"| {args.ranks} trainers x {args.workers} workers, {total:,} rows | static | taskq "
        "| taskq / static |"
    )
    print("|---|---:|---:|---:|")
    ratio_of: dict[str, float] = {}
    for shape in shapes:
        ms = args.slow_step_ms if shape == "slow" else args.step_ms
        name = (
            f"{ms:g} ms a batch of {BATCH}, "
            + {
                "even": "even",
                "slow": f"trainer 1 {args.slow:g}x slower in all it does",
                "slow-short": f"trainer 1's step {args.slow:g}x (the readers bind)",
            }[shape]
        )
        static, tq = runs[shape, "static"], runs[shape, "taskq"]
        ratios = [t.cpu / s.cpu for s, t in zip(static, tq, strict=True)]
        ratio_of[shape] = statistics.median(ratios)
        print(
            f"| {name}: CPU s per 1,000 samples (lowest of {args.repeat}; ratio: median) | "
            f"{min(p.cpu for p in static):.3f} | {min(p.cpu for p in tq):.3f} | "
            f"{ratio_of[shape]:.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
        best_s, best_t = max(p.rate for p in static), max(p.rate for p in tq)
        rounds = ", ".join(f"{t.rate / s.rate:.2f}" for s, t in zip(static, tq, strict=True))
        print(
            f"| {name}: samples/s (best of {args.repeat}; rounds) | {best_s:,.0f} | "
            f"{best_t:,.0f} | **{best_t / best_s:.2f}** ({rounds}) |"
        )
        if shape != "even":
            # the shape's claim, checked: trainer 1's own rate in the static split, where
            # each rank reads its own files to the end
            own = statistics.median(p.ranks[1].rate / p.ranks[0].rate for p in static)
            fast = statistics.median(p.ranks[0].rate for p in static)
            slow = statistics.median(p.ranks[1].rate for p in static)
            # a shared queue whose trainers keep these rates to the end, over the static
            # split (which waits for its slowest): 1.5x for one trainer of two at 0.5x
            ideal = statistics.median(sum(r.rate for r in p.ranks) / p.rate for p in static)
            print(
                f"| {name}: static split, trainer 0 / trainer 1 samples/s (median) | "
                f"{fast:,.0f} / {slow:,.0f} | | trainer 1 at **{own:.2f}x** trainer 0; "
                f"both busy to the end: {ideal:.2f}x |"
            )
    sys.stdout.flush()
    if args.trace and worst[1]:
        Path(args.trace).write_text("".join(json.dumps(e) + "\n" for e in worst[1]))
        print(f"taskq's slowest slow-shape pass: {args.trace} (bench/tail.py --show prints it)")
    if args.guard is not None and ratio_of["even"] > args.guard:
        print(f"loader_cost: CPU ratio {ratio_of['even']:.2f} above the guard {args.guard:g}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
