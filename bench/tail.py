"""Pass makespan with one slow trainer, backup leases on and off, and the work duplicated.

Where it sits: a standalone bench (not in run.py's suite), on its own private
redis-server. One trial is one job of `--tasks` tasks and `--trainers` trainer processes
whose step takes `--task-ms`; in the straggler trials one of them takes `--slow` times as
long (checking `task.revoked` every 10 ms, as a cooperative training step would). The
makespan runs from the pass's first lease to its end (the events stream's ids are the
server's clock). Three rows: no straggler; a straggler without backups
(`backup_leases=False`); a straggler with backups (`backup_leases=True`, k = 2). Goal: the last
<= 1.3 x the first (medians over `--repeat` trials). The duplicated work is the backups granted and the task time the
losing holders spent on them (from each backup's grant to the winner's ack).

`--torch`: the trainers are taskq.torch loaders instead (one process each, a DataLoader
with `--workers` worker processes, batches of `--batch`), over JSONL files the bench
writes (`--samples` records a task, `{"t": task, "i": k}`; `--data jsonl`, the default:
JSONL in the default byte-range chunks, counted when a loader starts a task; `parquet`;
`jsonl-counted`: ranges that say their samples); a step takes `--task-ms` / (samples / batch). Four
rows: no straggler; a straggler without splitting (`split_tails=False`); a straggler with
splitting (the default); a straggler with backups (`backup_leases=True`, splitting off).
Reported: makespan ratios to the even pass (best and median of `--repeat`), to the ideal
for the rates (every loader busy to the end: the pass's task time over the loaders' summed
rates, the slow one counting 1 / `--slow`; worst and median), the samples taken twice,
counted from the sample ids every loop delivered (and any never delivered), and the tail
pieces handed back by their taker within a heartbeat interval of being granted (a split's
piece or an orphan's lease, then its `piece_back`: a piece leased that was not read).
The server's events of each row's worst run (to the ideal) and of every run above
`--trace-above` (1.3 x), with each loader's batches (when it got them, of which tasks),
are kept in `--trace` (JSON lines, ms from the pass's first lease), so an outlier can be
explained after the run: `--show TRACE` prints them, workers named by loader (L0 slow).
`--rows split` runs the splitting row alone (its ratio to the ideal needs no other row).
Goals: the splitting row <= 1.15 x with 0 samples taken twice; at `--trainers 4 --tasks 16
--workers 0 --samples 100 --task-ms 1000`, worst <= 1.3 x and median <= 1.15 x the ideal
over 10 runs, 0 pieces handed back within a heartbeat.

Usage: .venv/bin/python bench/tail.py [--trainers 8] [--tasks 160] [--task-ms 100]
           [--slow 10] [--repeat 1] [--torch [--samples 64] [--batch 8] [--workers 1]
           [--tasks-ahead N] [--shuffle] [--data jsonl|parquet|jsonl-counted]
           [--rows all|split] [--trace PATH] [--trace-above 1.3]]
       .venv/bin/python bench/tail.py --show TRACE
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import common

import taskq

CTX = mp.get_context("fork")


def url_of(port: int) -> str:
    return f"redis://{common.LOOPBACK}:{port}/0"


def _trainer(url: str, job: str, step_s: float) -> None:
    with taskq.Trainer(job, url=url, handle_signals=False) as trainer:
        for task in trainer:
            end = time.monotonic() + step_s
            while time.monotonic() < end and not task.revoked.is_set():
                time.sleep(min(0.01, max(0.0, end - time.monotonic())))


def _ms(entry_id: str) -> int:
    return int(entry_id.split("-")[0])


def trial(
    port: int, name: str, trainers: int, tasks: int, step_s: float, slow: float, backups: bool
) -> dict[str, float]:
    """One job, one pass; returns its makespan (s) and the backups' numbers."""
    client = taskq.connect(url_of(port))
    client.create_job(name, [{"i": i} for i in range(tasks)], passes=1, backup_leases=backups)
    procs = [
        CTX.Process(
            target=_trainer,
            daemon=True,
            args=(url_of(port), name, step_s * (slow if i == 0 else 1.0)),
        )
        for i in range(trainers)
    ]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 300
        while client.status(name, summaries=0).state != "completed":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: not completed within 300 s")
            time.sleep(0.05)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    events = client.events(name, count=100_000)
    first = min(_ms(i) for i, f in events if "leased" in f or "reserved" in f)
    end = max(_ms(i) for i, f in events if f["type"] == "pass_completed")
    granted = {f["task"]: _ms(i) for i, f in events if f["type"] == "backup"}
    acked: dict[str, int] = {}
    for i, f in events:
        if f["type"] == "step" and "acked" in f:
            for task in f["acked"].split(","):
                acked.setdefault(task, _ms(i))
    duplicated_s = sum(max(0, acked.get(t, end) - at) for t, at in granted.items()) / 1000
    c = client.status(name, summaries=0).counters
    return {
        "makespan_s": (end - first) / 1000,
        "backups": len(granted),
        "revoked": c["revoked"],
        "stale": c["stale"],
        "duplicated_s": duplicated_s,
    }


def write_tasks(directory: Path, tasks: int, samples: int, data: str) -> list[dict[str, Any]]:
    """One file a task, ``samples`` records ``{"t": task, "i": k}``, its chunks as
    ``taskq.data.build_chunks`` makes them by default (``data``: ``jsonl``, byte ranges
    that do not say their samples: the reader counts them; ``parquet``, one row group;
    ``jsonl-counted``, a range that says its samples, as ``--records-per-chunk`` makes)."""
    import taskq.data

    chunks = []
    for t in range(tasks):
        rows = [{"t": t, "i": k} for k in range(samples)]
        if data == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            path = directory / f"task-{t:04d}.parquet"
            pq.write_table(pa.Table.from_pylist(rows), path)
        else:
            path = directory / f"task-{t:04d}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        [chunk] = taskq.data.build_chunks(str(path))
        if data == "jsonl-counted":
            chunk["samples"] = samples
        chunks.append(chunk)
    return chunks


def _as_list(samples: list[Any]) -> list[Any]:
    return samples


def _loader(
    url: str,
    job: str,
    step_s: float,
    batch: int,
    workers: int,
    tasks_ahead: int | None,
    shuffle: bool,
    ready: Any,
    go: Any,
    out: str,
) -> None:
    """One taskq.torch loader: a step of ``step_s`` a batch; the ids it delivered and when
    it got each batch (ms of the wall clock, its tasks, its size) to ``out`` (JSON)."""
    import taskq.torch  # imported by the bench before the fork

    ds = taskq.torch.TaskDataset(
        job, url=url, shuffle=shuffle, trainer_options={"handle_signals": False}
    )
    got: list[list[int]] = []
    batches: list[list[Any]] = []
    handed_on = 0
    with taskq.torch.DataLoader(
        ds, batch_size=batch, num_workers=workers, collate_fn=_as_list, tasks_ahead=tasks_ahead
    ) as loader:
        ready.release()
        go.wait(120)
        for b in loader:
            got += [[s["t"], s["i"]] for s in b]
            tasks = ",".join(str(t) for t in sorted({s["t"] for s in b}))
            batches.append([int(time.time() * 1000), tasks, len(b)])
            time.sleep(step_s)
        handed_on = loader.counts["samples_handed_on"]
    Path(out).write_text(
        json.dumps({"ids": got, "handed_on": handed_on, "pid": os.getpid(), "batches": batches})
    )


def torch_trial(
    port: int,
    name: str,
    chunks: list[dict[str, Any]],
    a: argparse.Namespace,
    slow: float,
    backups: bool,
    split: bool,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """One job, one pass read by ``a.trainers`` loaders; makespan and samples twice, and
    the trace: the server's events and the loaders' batches, ms from the first lease."""
    client = taskq.connect(url_of(port))
    client.create_job(
        name,
        chunks=chunks,
        passes=1,
        backup_leases=backups,
        split_tails=split,
        heartbeat_interval=a.heartbeat,
        worker_ttl=max(1.0, 10 * a.heartbeat),
    )
    step = a.task_ms / 1000 / max(1, a.samples // a.batch)
    go = CTX.Event()
    ready = CTX.Semaphore(0)
    with tempfile.TemporaryDirectory() as out_dir:
        outs = [os.path.join(out_dir, f"ids-{i}.json") for i in range(a.trainers)]
        procs = [
            CTX.Process(
                target=_loader,
                daemon=False,
                args=(
                    url_of(port),
                    name,
                    step * (slow if i == 0 else 1.0),
                    a.batch,
                    a.workers,
                    a.tasks_ahead,
                    a.shuffle,
                    ready,
                    go,
                    outs[i],
                ),
            )
            for i in range(a.trainers)
        ]
        for p in procs:
            p.start()
        for _ in procs:  # every loader built (their workers fork at iter)
            if not ready.acquire(timeout=120):
                raise RuntimeError(f"{name}: the loaders were not built within 120 s")
        go.set()
        try:
            deadline = time.monotonic() + 300
            for p in procs:
                p.join(max(1.0, deadline - time.monotonic()))
                if p.is_alive():
                    raise RuntimeError(f"{name}: a loader did not end within 300 s")
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
        delivered: Counter[tuple[int, int]] = Counter()
        handed_on = 0
        loaders: list[dict[str, Any]] = []
        for n, path in enumerate(outs):
            if os.path.exists(path):
                got = json.loads(Path(path).read_text())
                delivered.update((t, i) for t, i in got["ids"])
                handed_on += got["handed_on"]
                loaders += [
                    {"ms": at, "type": "batch", "loader": n, "pid": got["pid"], "tasks": t, "n": k}
                    for at, t, k in got["batches"]
                ]
    events = client.events(name, count=1_000_000)
    first = min(_ms(i) for i, f in events if "leased" in f or "reserved" in f)
    end = max(_ms(i) for i, f in events if f["type"] == "pass_completed")
    c = client.status(name, summaries=0).counters
    total = len(chunks) * a.samples
    # a tail piece granted to a worker (a split's grant, an orphan's lease) and handed back
    # by that worker within a heartbeat interval: leased, and not read
    granted: dict[tuple[str, str], int] = {}
    quick = 0
    # a split made -> its tail leased (its confirmation's wait, the idle trainer's with it)
    split_at: dict[str, int] = {}
    waits: list[float] = []
    for i, f in events:
        if f["type"] == "split":
            split_at[f["task"]] = _ms(i)
        elif f["type"] == "piece_leased" and f["task"] in split_at:
            waits.append((_ms(i) - split_at.pop(f["task"])) / 1000)
        if f["type"] in ("split", "piece_leased"):
            granted[(f["task"], f["worker"])] = _ms(i)
        elif f["type"] == "piece_back" and f.get("piece") == "tail":
            at = granted.pop((f["task"], f["worker"]), None)
            if at is not None and _ms(i) - at <= a.heartbeat * 1000:
                quick += 1
    ideal = len(chunks) * a.task_ms / 1000 / (a.trainers - 1 + 1 / slow)
    # the server's events and the loaders' batches (the same machine's wall clock)
    trace = sorted(
        [{"ms": _ms(i) - first, **f} for i, f in events]
        + [{**b, "ms": b["ms"] - first} for b in loaders],
        key=lambda e: int(e["ms"]),
    )
    return {
        "makespan_s": (end - first) / 1000,
        "ideal_s": ideal,
        "handed_back_quick": quick,
        "tail_wait_max_s": max(waits, default=0.0),
        "twice": sum(n - 1 for n in delivered.values()),
        "missing": total - len(delivered),
        "splits": c["splits"],
        "handed_on": handed_on,
        "backups": sum(1 for _, f in events if f["type"] == "backup"),
    }, trace


def torch_main(a: argparse.Namespace, port: int) -> None:
    import taskq.torch  # noqa: F401  (once, here: not in each loader process at once)

    rows = [
        ("no straggler", 1.0, False, True),
        ("straggler, no splitting", a.slow, False, False),
        ("straggler, splitting", a.slow, False, True),
        ("straggler, backups", a.slow, True, False),
    ]
    if a.rows == "split":
        rows = [rows[2]]
    results: dict[str, list[dict[str, float]]] = {}
    kept: dict[tuple[str, int], tuple[float, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as data:
        chunks = write_tasks(Path(data), a.tasks, a.samples, a.data)
        for r in range(a.repeat):
            for label, slow, backups, split in rows:
                res, events = torch_trial(
                    port,
                    f"ttail-{label.replace(' ', '').replace(',', '-')}-{r}",
                    chunks,
                    a,
                    slow,
                    backups,
                    split,
                )
                results.setdefault(label, []).append(res)
                ratio = res["makespan_s"] / res["ideal_s"]
                # keep the row's worst run and every run above --trace-above
                mine = [k for k in kept if k[0] == label]
                worst = max(mine, default=None, key=lambda k: kept[k][0])
                if worst is None or ratio > kept[worst][0]:
                    if worst is not None and kept[worst][0] <= a.trace_above:
                        del kept[worst]
                    kept[label, r] = (ratio, events)
                elif ratio > a.trace_above:
                    kept[label, r] = (ratio, events)
                print(
                    f"{label:26s} makespan {res['makespan_s']:.3f} s "
                    f"({res['makespan_s'] / res['ideal_s']:.2f} x the ideal); splits "
                    f"{res['splits']:.0f} (read ahead, handed on {res['handed_on']:.0f}), "
                    f"pieces handed back within a heartbeat {res['handed_back_quick']:.0f}, "
                    f"longest split -> tail leased {res['tail_wait_max_s']:.2f} s, "
                    f"backups {res['backups']:.0f}, samples twice "
                    f"{res['twice']:.0f}, never delivered {res['missing']:.0f}",
                    flush=True,
                )
    best0 = min(x["makespan_s"] for x in results[rows[0][0]])
    med0 = statistics.median(x["makespan_s"] for x in results[rows[0][0]])
    print(
        "| row | best s | best / first row | median / first row | worst / ideal "
        "| median / ideal | handed back within a heartbeat | samples twice | never delivered |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label, *_ in rows:
        res = results[label]
        spans = [x["makespan_s"] for x in res]
        ideal = [x["makespan_s"] / x["ideal_s"] for x in res]
        twice = max(x["twice"] for x in res)
        missing = max(x["missing"] for x in res)
        quick = sum(x["handed_back_quick"] for x in res)
        print(
            f"| {label} | {min(spans):.2f} | {min(spans) / best0:.2f} x | "
            f"{statistics.median(spans) / med0:.2f} x | {max(ideal):.2f} x | "
            f"{statistics.median(ideal):.2f} x | {quick:.0f} | {twice:.0f} | {missing:.0f} |",
            flush=True,
        )
    if a.trace:
        with open(a.trace, "w") as f:
            for (label, r), (ratio, events) in kept.items():
                for e in events:
                    f.write(json.dumps({"row": label, "run": r, "ratio": round(ratio, 3), **e}))
                    f.write("\n")
        print(
            f"events and batches of each row's worst run and of every run above "
            f"{a.trace_above:g} x the ideal: {a.trace} (--show {a.trace} prints them)"
        )


def show(path: str) -> None:
    """A kept trace as one line an event: workers named by loader (L0 the slow one)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    for (label, r), group in itertools.groupby(rows, key=lambda e: (e["row"], e["run"])):
        events = list(group)
        names = {f":{e['pid']}:": f"L{e['loader']}" for e in events if e["type"] == "batch"}
        print(f"# {label}, run {r}: {events[0]['ratio']} x the ideal")
        for e in events:
            skip = ("row", "run", "ratio", "ms", "type", "pass", "pid", "incarnation")
            rest = {k: v for k, v in e.items() if k not in skip and not k.endswith("_tokens")}
            for k in ("worker", "of", "from", "by"):
                if isinstance(rest.get(k), str):
                    rest[k] = next((v for p, v in names.items() if p in rest[k]), rest[k])
            if e["type"] == "batch":
                rest = {"loader": f"L{e['loader']}", "tasks": e["tasks"], "n": e["n"]}
            print(f"{e['ms']:>7} {e['type']:14s} " + " ".join(f"{k}={v}" for k, v in rest.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trainers", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=160)
    ap.add_argument("--task-ms", type=float, default=100.0)
    ap.add_argument("--slow", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--torch", action="store_true", help="taskq.torch loaders as trainers")
    ap.add_argument("--samples", type=int, default=64, help="--torch: samples a task")
    ap.add_argument("--batch", type=int, default=8, help="--torch: samples a batch")
    ap.add_argument("--workers", type=int, default=1, help="--torch: DataLoader workers")
    ap.add_argument("--tasks-ahead", type=int, default=None, help="--torch: tasks_ahead=")
    ap.add_argument(
        "--shuffle",
        action="store_true",
        help="--torch: shuffle=True (the loader's default: samples shuffled per task, two "
        "tasks interleaved a reader; without it, tasks read in order, one at a time)",
    )
    ap.add_argument(
        "--data",
        choices=("jsonl", "parquet", "jsonl-counted"),
        default="jsonl",
        help="--torch: the tasks' files and chunks (jsonl: default byte ranges, counted by "
        "the reader; parquet: a row group a task; jsonl-counted: ranges that say their samples)",
    )
    ap.add_argument(
        "--heartbeat",
        type=float,
        default=0.1,
        help="--torch: the jobs' heartbeat interval (s; worker_ttl 10 x, >= 1 s)",
    )
    ap.add_argument(
        "--rows",
        choices=("all", "split"),
        default="all",
        help="--torch: every row, or the straggler-with-splitting row alone",
    )
    ap.add_argument(
        "--trace",
        default=os.path.join(tempfile.gettempdir(), "taskq-tail-worst.jsonl"),
        help="--torch: where the events of each row's worst run (to the ideal) and of every "
        "run above --trace-above are kept, with each loader's batches: one JSON line "
        "each, its ms from the pass's first lease ('' for none)",
    )
    ap.add_argument("--trace-above", type=float, default=1.3, help="--torch: see --trace")
    ap.add_argument("--show", metavar="TRACE", help="print a kept trace and exit")
    a = ap.parse_args()
    if a.show:
        show(a.show)
        return 0
    common.install_signal_handlers()
    port, stop = common.redis_port_factory()
    if a.torch:
        try:
            torch_main(a, port)
        finally:
            stop()
        return 0
    step = a.task_ms / 1000
    rows = [
        ("no straggler", 1.0, True),
        ("straggler, backups off", a.slow, False),
        ("straggler, backups on", a.slow, True),
    ]
    results: dict[str, list[dict[str, float]]] = {}
    try:
        for label, slow, backups in rows:
            for r in range(a.repeat):
                res = trial(
                    port,
                    f"tail-{label.replace(' ', '').replace(',', '-')}-{r}",
                    a.trainers,
                    a.tasks,
                    step,
                    slow,
                    backups,
                )
                results.setdefault(label, []).append(res)
                print(
                    f"{label:24s} makespan {res['makespan_s']:.3f} s; backups "
                    f"{res['backups']:.0f}, revoked {res['revoked']:.0f}, stale acks "
                    f"{res['stale']:.0f}, duplicated task time {res['duplicated_s']:.3f} s",
                    flush=True,
                )
        base = statistics.median(x["makespan_s"] for x in results[rows[0][0]])
        for label, *_ in rows:
            spans = [x["makespan_s"] for x in results[label]]
            dup = sum(x["duplicated_s"] for x in results[label]) / len(spans)
            print(
                f"{label:24s} median {statistics.median(spans):.3f} s = "
                f"{statistics.median(spans) / base:.2f} x, worst {max(spans) / base:.2f} x; "
                f"duplicated task time {dup:.3f} s a pass",
                flush=True,
            )
    finally:
        stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
