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

Usage: .venv/bin/python bench/tail.py [--trainers 8] [--tasks 160] [--task-ms 100]
           [--slow 10] [--repeat 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trainers", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=160)
    ap.add_argument("--task-ms", type=float, default=100.0)
    ap.add_argument("--slow", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    common.install_signal_handlers()
    port, stop = common.redis_port_factory()
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
