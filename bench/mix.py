"""Server instructions per task of a mixed job against the same tasks unmixed (callgrind,
one run; docs/mixing.md).

Usage: .venv/bin/python bench/mix.py [--calls 200] [--shapes 'prefetch 1,batches(16)']
           [--sources 3,64] [--weights 500]

Where it sits: beside `server_instructions.py`, whose callgrind'ed redis-server, counter
reset and dump it reuses: one trainer (no heartbeat) warms up on the job, the counters are
zeroed, `--calls` calls of the shape run, and the instructions over the tasks handed out
are printed in thousands. Rows: the plain job (the tasks of every source in one job, the
seeded permutation off, as a mixed job's own order is its schedule), then a mixed job of
the same tasks from 3 and from 64 sources (weights 1, 2, 3, ...). The mixed job's cost
is the schedule's charge (O(sources) table operations per task), its state read and
written once per lease call, and one SETRANGE of the stored sequence per task: no extra
round trip. Needs valgrind with callgrind_control. `--weights N`: instead, N `set_weights`
calls on a mixed job of 64 sources on a plain redis-server (wall clock, one run: the goal
is >= 10 changes/s while trainers lease).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_instructions import _commands, _server, _total  # noqa: E402


def measure(sources: int, shape: str, calls: int, keep: str = "") -> dict[str, float]:
    """Thousands of instructions per task and per FCALL of `shape` on a job of
    `calls * 16 + 2000` tasks: plain (sources 0) or mixed from `sources` jobs."""
    import taskq

    d = tempfile.mkdtemp(prefix="taskq-mix-cg-")
    out = os.path.join(d, "cg.out")
    server, port, admin = _server(d, out)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        client = taskq.connect(url)
        total = calls * 16 + 2_000
        if sources == 0:
            client.create_job("cg", [{"i": i} for i in range(total)], passes=None)
        else:
            per = -(-total // sources)
            for s in range(sources):
                client.create_job(f"src{s}", [{"s": s, "i": i} for i in range(per)])
            client.create_job("cg", mix={f"src{s}": s + 1 for s in range(sources)}, passes=None)
        batch = 16 if shape.startswith("batches") else 1
        prefetch = int(shape.split()[1]) if shape.startswith("prefetch") else 0
        trainer = taskq.Trainer(
            "cg", url=url, prefetch=prefetch, heartbeat=False, handle_signals=False, worker_ttl=3600
        )
        items = iter(trainer) if batch == 1 else trainer.batches(batch)
        for _ in range(100):
            next(items)
        admin.config_resetstat()
        subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True)
        for _ in range(calls):
            next(items)
        subprocess.run(["callgrind_control", "-d", str(server.pid)], capture_output=True)
        fcalls, others = _commands(admin)
        trainer.close()
        instr = _total(out, keep)
        return {"task": instr / (calls * batch) / 1000, "call": instr / fcalls / 1000}
    finally:
        server.terminate()
        server.wait()


def weight_changes(n: int) -> float:
    """`set_weights` calls per second on a mixed job of 64 sources (a plain redis-server;
    a trainer leasing between the changes)."""
    import taskq
    from taskq.devserver import RedisServer

    server = RedisServer()
    try:
        client = taskq.connect(server.url)
        for s in range(64):
            client.create_job(f"src{s}", [{"s": s, "i": i} for i in range(100)])
        client.create_job("mix", mix={f"src{s}": 1 for s in range(64)}, passes=None)
        job = client.job("mix")
        with taskq.Trainer("mix", client=client) as trainer:  # (heartbeats: a slow run)
            start = time.perf_counter()
            for k in range(n):
                job.set_weights({f"src{s}": (s + k) % 7 + 1 for s in range(64)})
                trainer.ack(trainer.lease(timeout=1))
            return n / (time.perf_counter() - start)
    finally:
        server.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--shapes", default="prefetch 1,batches(16)")
    parser.add_argument("--sources", default="3,64")
    parser.add_argument("--weights", type=int, default=0)
    args = parser.parse_args()
    if args.weights:
        print(f"set_weights with a lease between: {weight_changes(args.weights):.0f} changes/s")
        return
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    kinds = [0] + [int(s) for s in args.sources.split(",") if s.strip()]
    print("| shape | job | k instr / task | per FCALL | vs plain |")
    print("|---|---|---:|---:|---:|")
    for shape in shapes:
        plain = 0.0
        for sources in kinds:
            g = measure(sources, shape, args.calls)
            plain = plain or g["task"]
            label = "plain" if sources == 0 else f"mixed, {sources} sources"
            print(
                f"| {shape} | {label} | {g['task']:.0f} | {g['call']:.0f} | "
                f"{100 * (g['task'] / plain - 1):+.1f} % |",
                flush=True,
            )


if __name__ == "__main__":
    main()
