"""Steady state, head to head: taskq next to BullMQ and the probe, best of alternating rounds.

Usage: .venv/bin/python bench/steady.py [--tasks 10000] [--rounds 3] [--parsers hiredis,python]
           [--before DIR]     (also run.py's `steady` section)

Where it sits: the like-with-like rows of the bench. `throughput.mjs` (BullMQ) and the
taskq/probe rows here all exclude start-up: every client first runs a warm-up (its
connections, registration, the first calls; BullMQ: the Worker's start and 2,000 jobs),
then the clock runs over `--tasks` tasks (>= 10,000) in closed loop. A round runs BullMQ,
then taskq and the probe once per redis-py parser (hiredis, the pure-Python one), each
parser in a fresh interpreter (`TASKQ_BENCH_PARSER=python` hides hiredis from redis-py
before it is imported) so probe and taskq always share one client stack. Rounds alternate
so that a shared machine's drift hits every row alike; a row's value is its best round,
and the ratios are also given per round (back to back, the steadier number).

`--before DIR` (a tree of an older commit: `git archive REV | tar -x -C DIR`) adds, per
parser, the same rounds with DIR's taskq first on PYTHONPATH: a change measured before
and after in one run, alternating.

Shapes (one process unless named): probe 1/call (1, 4 procs) and 16/call; taskq
`for task in trainer` at prefetch 1 (1, 4 procs) and prefetch 0, `trainer.batches(16)`,
and prefetch 16. The taskq rows carry the 'taskq / BullMQ' column: tasks/s over BullMQ's
one Worker at concurrency 1 (one task in flight) or 16 (batches and prefetch 16).
"""

from __future__ import annotations

import os
import sys

if os.environ.get("TASKQ_BENCH_PARSER") == "python":
    sys.modules["hiredis"] = None  # type: ignore[assignment]  # redis-py: no hiredis

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import common  # noqa: E402
import probe  # noqa: E402
import redis  # noqa: E402
from redis.utils import HIREDIS_AVAILABLE  # noqa: E402
from taskq_util import CTX, Children, create_job, redis_cpu_seconds, url_of  # noqa: E402

import taskq  # noqa: E402

SECTION = "steady"
WARMUP_TASKS = 1_000  # per client process, before the clock starts
# (label, kind, tasks per call, prefetch, processes); 16 in flight: batch 16 or prefetch 16
SHAPES = (
    ("probe 1/call, 1 proc", "probe", 1, 0, 1),
    ("probe 1/call, 4 proc", "probe", 1, 0, 4),
    ("probe 16/call, 1 proc", "probe", 16, 0, 1),
    ("taskq 1/call prefetch 1, 1 proc", "taskq", 1, 1, 1),
    ("taskq 1/call prefetch 1, 4 proc", "taskq", 1, 1, 4),
    ("taskq 1/call prefetch 0, 1 proc", "taskq", 1, 0, 1),
    ("taskq batches(16), 1 proc", "taskq", 16, 0, 1),
    ("taskq 1/call prefetch 16, 1 proc", "taskq", 1, 16, 1),
)
# taskq shape -> (probe shape, BullMQ concurrency it is compared with; None: no BullMQ
# row of that shape — one Worker process is not four trainer processes)
PEERS: dict[str, tuple[str, int | None]] = {
    "taskq 1/call prefetch 1, 1 proc": ("probe 1/call, 1 proc", 1),
    "taskq 1/call prefetch 1, 4 proc": ("probe 1/call, 4 proc", None),
    "taskq 1/call prefetch 0, 1 proc": ("probe 1/call, 1 proc", 1),
    "taskq batches(16), 1 proc": ("probe 16/call, 1 proc", 16),
    "taskq 1/call prefetch 16, 1 proc": ("probe 1/call, 1 proc", 16),
}


# -- one round of one parser, in this interpreter -------------------------------------------
def measure_shape(kind: str, batch: int, prefetch: int, processes: int, tasks: int) -> dict:
    """One shape against a fresh private redis-server: warm-up, then `tasks` tasks timed.

    Returns:
        {tasks_per_s, client_us (CPU per task, all threads), server_us_per_call,
        server_us_per_task, calls, problem}.
    """
    per_proc = -(-tasks // processes)
    with common.start_redis() as server:
        port = server.port
        admin = redis.Redis(host=common.LOOPBACK, port=port)
        target: Callable[..., None]
        args: tuple[Any, ...]
        if kind == "taskq":
            create_job(
                port, "steady", (per_proc + WARMUP_TASKS + 64) * processes + 1_000, passes=None
            )
            target, args = _taskq_child, (url_of(port), "steady", batch, prefetch)
        else:
            admin.delete(*probe.KEYS)
            sha = admin.script_load(probe.ACK_AND_LEASE_LUA)
            target, args = _probe_child, (port, sha, batch)
        warm, go, results = CTX.Queue(), CTX.Event(), CTX.Queue()
        with Children() as children:
            for _ in range(processes):
                children.start(target, *args, per_proc, warm, go, results)
            for _ in range(processes):
                warm.get(timeout=120)
            admin.config_resetstat()
            cpu_before = redis_cpu_seconds(port)
            go.set()
            reports = [results.get(timeout=300) for _ in range(processes)]
            redis_cpu = redis_cpu_seconds(port) - cpu_before
            stats = admin.info("commandstats")
            children.stop(grace_s=10)
        admin.close()
    acked = sum(r["acked"] for r in reports)
    window = max(r["ended"] for r in reports) - min(r["started"] for r in reports)
    calls = {k.removeprefix("cmdstat_"): v for k, v in stats.items()}
    script = calls.get("fcall") or calls.get("evalsha") or {"calls": 0, "usec": 0}
    stale = sum(r.get("stale", 0) for r in reports)
    return {
        "tasks_per_s": acked / window,
        "client_us": sum(r["cpu_s"] for r in reports) / max(acked, 1) * 1e6,
        "server_us_per_call": script["usec"] / max(script["calls"], 1),
        "server_us_per_task": script["usec"] / max(acked, 1),
        "redis_cpu": redis_cpu / window,
        "calls": script["calls"],
        "problem": f"CHECK FAILED: {stale} stale acks" if stale else "",
    }


def _taskq_child(url, job, batch, prefetch, tasks, warm, go, results) -> None:
    trainer = taskq.Trainer(job, url=url, prefetch=prefetch, handle_signals=False)
    items: Iterator[Any] = iter(trainer) if batch == 1 else trainer.batches(batch)
    seen = 0
    while seen < WARMUP_TASKS:
        got = next(items)
        seen += 1 if batch == 1 else len(got)
    held = 1 if batch == 1 else len(got)
    warm.put(os.getpid())
    go.wait()
    cpu, started = time.process_time(), time.time()
    acked = 0
    while acked < tasks:
        got = next(items)  # acks what was held, hands out the next
        acked += held
        held = 1 if batch == 1 else len(got)
    ended, cpu = time.time(), time.process_time() - cpu
    results.put({"acked": acked, "started": started, "ended": ended, "cpu_s": cpu})
    trainer.close()


def _probe_child(port, sha, batch, tasks, warm, go, results) -> None:
    client = redis.Redis(host=common.LOOPBACK, port=port)
    keys = probe.KEYS
    held: list = []
    stale = 0

    def call() -> int:
        nonlocal held, stale
        reply = client.evalsha(sha, len(keys), *keys, batch, *held)
        stale += reply[1]
        held = [item for task in reply[3:] for item in (task, reply[2])]
        return int(reply[0])

    seen = 0
    while seen < WARMUP_TASKS:
        seen += call()
    warm.put(os.getpid())
    go.wait()
    cpu, started = time.process_time(), time.time()
    acked = 0
    while acked < tasks:
        acked += call()
    ended, cpu = time.time(), time.process_time() - cpu
    results.put({"acked": acked, "started": started, "ended": ended, "cpu_s": cpu, "stale": stale})


def one_round(tasks: int, only: str = "") -> None:
    """Every shape (or those whose label holds a word of `only`) once in this
    interpreter; one JSON line per shape on stdout."""
    for label, kind, batch, prefetch, processes in SHAPES:
        if only and not any(word in label for word in only.split("|")):
            continue
        n = tasks * (4 if batch > 1 or prefetch > 1 else 1)  # fast shapes: a longer window
        result = measure_shape(kind, batch, prefetch, processes, n)
        print(json.dumps({"shape": label, "tasks": n, **result}), flush=True)


# -- the rounds, alternating ------------------------------------------------------------------
def _run_parser_round(parser: str, tasks: int, code_dir: str = "") -> list[dict]:
    return common.json_rows_of(
        __file__,
        ["--one-round", "--tasks", str(tasks)],
        code_dir,
        timeout=1800,
        TASKQ_BENCH_PARSER=parser,
    )


def _run_bullmq_round(tasks: int) -> dict[int, float]:
    from peers import bullmq_bench

    with common.start_redis() as server:
        lines, problem = bullmq_bench.run_node(
            [
                "throughput.mjs",
                "--port",
                str(server.port),
                "--jobs",
                str(tasks),
                "--warmup",
                "2000",
            ],
            timeout_s=600,
        )
    if problem or not lines:
        raise RuntimeError(f"BullMQ round: {problem or 'no result'}")
    return {r["concurrency"]: r["jobs_per_s"] for r in map(json.loads, lines) if "jobs_per_s" in r}


def run(
    recorder: common.Recorder,
    quick: bool,
    rounds: int = 3,
    tasks: int = 10_000,
    parsers: tuple[str, ...] = ("hiredis", "python"),
    before: str = "",
) -> None:
    """Adds the steady-state rows: BullMQ at concurrency 1 and 16, then per parser the
    probe and taskq shapes, each its best of `rounds` alternating rounds (and with
    `before`, a tree of older code, the same shapes on it, as "<parser>, before")."""
    from peers import bullmq_bench

    problem = bullmq_bench.prepare()
    if problem:
        recorder.add(SECTION, "all rows", None, "", f"skipped: {problem}")
        return
    if "hiredis" in parsers and not HIREDIS_AVAILABLE:
        recorder.add(
            SECTION,
            "hiredis rows",
            None,
            "",
            "skipped: hiredis not installed (pip install 'taskq-ml[fast]')",
        )
        parsers = tuple(p for p in parsers if p != "hiredis")
    bull: list[dict[int, float]] = []
    variants = [(p, p, "") for p in parsers]
    if before:
        variants = [v for p in parsers for v in ((f"{p}, before", p, before), (p, p, ""))]
    ours: dict[str, list[list[dict]]] = {label: [] for label, _, _ in variants}
    for k in range(rounds):
        print(f"  round {k + 1}/{rounds}: BullMQ", flush=True)
        bull.append(_run_bullmq_round(tasks))
        for label, parser, code_dir in variants:
            print(f"  round {k + 1}/{rounds}: taskq and probe, {label}", flush=True)
            ours[label].append(_run_parser_round(parser, tasks, code_dir))
    version = bullmq_bench.installed_version()
    best_bull = {c: max(r[c] for r in bull) for c in (1, 16)}
    for c in (1, 16):
        recorder.add(
            SECTION,
            f"BullMQ {version}, 1 Worker, concurrency {c}",
            best_bull[c],
            "jobs/s",
            f"best of {rounds}: "
            + ", ".join(f"{r[c]:,.0f}" for r in bull)
            + f"; {tasks} jobs after 2,000 warm-up, removeOnComplete",
        )
    for parser in ours:
        per_round = [{r["shape"]: r for r in rows} for rows in ours[parser]]
        for label, *_ in SHAPES:
            got = [rnd[label] for rnd in per_round if label in rnd]
            if not got:
                continue
            best = max(got, key=lambda r: r["tasks_per_s"])
            name = f"{label} [{parser}]"
            values = ", ".join(f"{r['tasks_per_s']:,.0f}" for r in got)
            note = (
                f"best of {len(got)}: {values}; {best['tasks']} tasks after warm-up; "
                f"client CPU {best['client_us']:.0f} µs/task, server "
                f"{best['server_us_per_call']:.0f} µs/call "
                f"({best['server_us_per_task']:.0f} µs/task), redis-server CPU "
                f"{best['redis_cpu']:.0%}"
            )
            vs_bull = None
            if label in PEERS:
                probe_label, conc = PEERS[label]
                mine = [rnd[label]["tasks_per_s"] for rnd in per_round]
                if all(probe_label in rnd for rnd in per_round):
                    probes = [rnd[probe_label]["tasks_per_s"] for rnd in per_round]
                    of_probe = [m / p for m, p in zip(mine, probes, strict=False)]
                    note += (
                        f"; {best['tasks_per_s'] / max(probes):.0%} of the best probe "
                        f"{probe_label} (per round {_pcts(of_probe)})"
                    )
                if conc is not None:
                    vs_bull = best["tasks_per_s"] / best_bull[conc]
                    back = [m / b[conc] for m, b in zip(mine, bull, strict=False)]
                    note += f"; vs BullMQ c{conc} per round {', '.join(f'{x:.2f}x' for x in back)}"
            if best["problem"]:
                note += f"; {best['problem']}"
            recorder.add(SECTION, name, best["tasks_per_s"], "tasks/s", note, vs_bullmq=vs_bull)


def _pcts(values: list[float]) -> str:
    return ", ".join(f"{v:.0%}" for v in values) + f" (median {statistics.median(values):.0%})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="timed tasks per row")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parsers", default="hiredis,python")
    parser.add_argument("--before", default="", help="a tree of older code to compare")
    parser.add_argument(
        "--shapes", default="", help="only shapes whose label has one of these |-separated words"
    )
    parser.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    common.install_signal_handlers()
    if args.shapes:
        os.environ["TASKQ_BENCH_SHAPES"] = args.shapes
    if args.one_round:
        want = os.environ.get("TASKQ_BENCH_PARSER", "hiredis")
        if (want == "hiredis") != HIREDIS_AVAILABLE:
            print(f"parser {want} asked, hiredis available: {HIREDIS_AVAILABLE}", file=sys.stderr)
            return 2
        one_round(args.tasks, os.environ.get("TASKQ_BENCH_SHAPES", ""))
        return 0
    recorder = common.Recorder()  # printed, not written: run.py writes latest.*
    run(recorder, True, args.rounds, args.tasks, tuple(args.parsers.split(",")), args.before)
    print(common.render_markdown({"rows": recorder.rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
