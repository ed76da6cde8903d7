"""CPU time of one hot-path call, server and trainer, before and after a change (by hand).

Usage: .venv/bin/python bench/hot_call.py [--tasks 5000] [--rounds 3] [--before DIR]
           [--shapes '1/call prefetch 1|batches(16)'] [--commands]

Where it sits: the quick before/after check of the hot-path passes (bench/HISTORY.md), next
to `steady.py` (throughput, which a shared machine makes noisy) and `taskq_profile.py`
(the commands inside a call). One trainer in this process, its heartbeat off, drains
`--tasks` tasks after a warm-up against a private redis-server; printed per shape: the
server µs per FCALL and per task (INFO commandstats, after CONFIG RESETSTAT), the Redis
commands per FCALL, and the trainer's CPU µs per task (process time: nothing else runs in
the process). CPU times move far less with the machine's load than rates do. `--before
DIR` (a tree of an older commit: `git archive REV | tar -x -C DIR`) runs DIR's taskq in
alternating rounds with this tree's (or `--after DIR`'s: a snapshot, so this tree can change
while it runs); each figure is the least of its rounds.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from typing import Any

import common
import redis
from taskq_util import create_job, url_of

import taskq

WARMUP = 500
SHAPES = ("1/call prefetch 1", "1/call prefetch 0", "batches(16)")
INNER_SKIP = {"fcall", "fcall_ro", "function|load", "info", "config|resetstat", "blpop"}


def measure(shape: str, tasks: int) -> dict[str, Any]:
    """One shape against a fresh private redis-server, in this process."""
    with common.start_redis() as server:
        admin = redis.Redis(host=common.LOOPBACK, port=server.port)
        create_job(server.port, "hot", tasks + WARMUP + 200, passes=None)
        batch = 16 if shape.startswith("batches") else 1
        prefetch = int(shape.rsplit(" ", 1)[1]) if "prefetch" in shape else 0
        trainer = taskq.Trainer(
            "hot",
            url=url_of(server.port),
            prefetch=prefetch,
            heartbeat=False,
            handle_signals=False,
            worker_ttl=3600,  # no heartbeats, and lease / ack do not renew a worker
        )
        items: Iterator[Any] = iter(trainer) if batch == 1 else trainer.batches(batch)
        seen = 0
        while seen < WARMUP:
            got = next(items)
            seen += 1 if batch == 1 else len(got)
        held = 1 if batch == 1 else len(got)
        admin.config_resetstat()
        cpu = time.process_time()
        acked = 0
        while acked < tasks:
            got = next(items)
            acked += held
            held = 1 if batch == 1 else len(got)
        cpu = time.process_time() - cpu
        stats = {k.removeprefix("cmdstat_"): v for k, v in admin.info("commandstats").items()}
        trainer.close()
        admin.close()
    fcall = stats["fcall"]
    inner = {k: v for k, v in stats.items() if k not in INNER_SKIP}
    return {
        "shape": shape,
        "server_us_per_call": fcall["usec"] / fcall["calls"],
        "server_us_per_task": fcall["usec"] / acked,
        "commands_per_call": sum(v["calls"] for v in inner.values()) / fcall["calls"],
        "lua_us_per_call": (fcall["usec"] - sum(v["usec"] for v in inner.values()))
        / fcall["calls"],
        "trainer_us_per_task": cpu / acked * 1e6,
        "commands": {k: round(v["calls"] / fcall["calls"], 2) for k, v in inner.items()},
    }


def _round(code_dir: str, shapes: str, tasks: int) -> list[dict[str, Any]]:
    return common.json_rows_of(
        __file__, ["--one", "--shapes", shapes, "--tasks", str(tasks)], code_dir
    )


FIGURES = (
    ("server µs / FCALL", "server_us_per_call"),
    ("server µs / task", "server_us_per_task"),
    ("Lua's own µs / FCALL", "lua_us_per_call"),
    ("commands / FCALL", "commands_per_call"),
    ("trainer CPU µs / task", "trainer_us_per_task"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", default="")
    parser.add_argument(
        "--after", default="", help="a tree to run as 'after' instead of this one (a snapshot)"
    )
    parser.add_argument("--shapes", default="|".join(SHAPES))
    parser.add_argument("--commands", action="store_true", help="list the commands per call")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    common.install_signal_handlers()
    shapes = [s for s in args.shapes.split("|") if s]
    if args.one:
        for shape in shapes:
            print(json.dumps(measure(shape, args.tasks)), flush=True)
        return
    trees = (
        [("before", args.before), ("after", args.after)]
        if args.before
        else [("this tree", args.after)]
    )
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for _ in range(args.rounds):
        for label, code_dir in trees:
            for r in _round(code_dir, args.shapes, args.tasks):
                key = (label, r["shape"])
                old = best.setdefault(key, r)
                for _, f in FIGURES:
                    old[f] = min(old[f], r[f])
    print("| shape | figure | " + " | ".join(label for label, _ in trees) + " |")
    print("|---|---|" + "---:|" * len(trees))
    for shape in shapes:
        for name, f in FIGURES:
            cells = " | ".join(f"{best[(label, shape)][f]:.1f}" for label, _ in trees)
            print(f"| {shape} | {name} | {cells} |")
    if args.commands:
        for (label, shape), r in best.items():
            print(f"{label}, {shape}: {r['commands']}")


if __name__ == "__main__":
    main()
