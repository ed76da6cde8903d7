"""Server instructions per task of a mixed job against the same tasks unmixed (callgrind,
one run; docs/mixing.md).

Usage: .venv/bin/python bench/mix.py [--calls 200] [--shapes 'prefetch 1,batches(16)']
           [--sources 3,64] [--mix-by tasks|samples] [--weights 500]

Where it sits: beside `server_instructions.py`, whose callgrind'ed redis-server, counter
reset and dump it reuses: one trainer (no heartbeat) warms up on the job, the counters are
zeroed, `--calls` calls of the shape run, and the instructions over the tasks handed out
are printed in thousands: the whole server's, and those inside the FCALLs (`fcallCommand`
inclusive, what the comparison uses: the server's cron work per wall-clock tick moves the
whole count with the machine's load). Rows: the plain job, then a mixed job of the same
tasks (chunk for chunk) from 3 and from 64 sources (weights 1, 2, 3, ...); `--mix-by
samples`: the weights count samples (each chunk says its records, 1 to 50; the plain job
has the same chunks). `--keep DIR`
keeps each dump. Needs valgrind with callgrind_control and callgrind_annotate. `--weights
N`: instead, N `set_weights` calls on a mixed job of 64 sources on a plain redis-server
(wall clock, one run: the goal is >= 10 changes/s while trainers lease).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_instructions import _batch, _server, _total, _window  # noqa: E402


def measure(
    sources: int, shape: str, calls: int, keep: str = "", by: str = "tasks"
) -> dict[str, float]:
    """Thousands of instructions per task and per FCALL of `shape` on a job of
    `calls * 16 + 2000` tasks: plain (sources 0) or mixed from `sources` jobs, its weights
    counting `by` (tasks or samples)."""
    import taskq

    d = tempfile.mkdtemp(prefix="taskq-mix-cg-")
    out = os.path.join(d, "cg.out")
    server, port, admin = _server(d, out)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        client = taskq.connect(url)
        total = calls * 16 + 2_000
        # the same tasks, chunk for chunk, plain (sources 0) or mixed from 3
        per = -(-total // max(sources, 3))
        chunks: list[dict[str, object]] = [
            {"s": s, "i": i} for s in range(max(sources, 3)) for i in range(per)
        ]
        if by == "samples":  # (sizes the create reads: a lines chunk's records)
            chunks = [
                {
                    "format": "lines",
                    "path": f"/x/{c['s']}/{c['i']}",
                    "offset": 0,
                    "length": 1,
                    "records": k % 50 + 1,
                }
                for k, c in enumerate(chunks)
            ]
        if sources == 0:
            client.create_job("cg", chunks, passes=None)
        else:
            for s in range(sources):
                client.create_job(f"src{s}", chunks[s * per : (s + 1) * per])
            mix = {f"src{s}": s + 1 for s in range(sources)}
            client.create_job("cg", mix=mix, mix_by=by, passes=None)
        fcalls, others = _window(server, admin, url, shape, calls)
        dump = keep or os.path.join(d, "kept.cg")
        instr = _total(out, dump)
        own = _inside_fcalls(dump)
        return {
            "task": instr / (calls * _batch(shape)) / 1000,
            "call": instr / fcalls / 1000,
            "own": own / (calls * _batch(shape)) / 1000,
        }
    finally:
        server.terminate()
        server.wait()


def _inside_fcalls(dump: str) -> int:
    """Instructions inside the FCALLs (``fcallCommand``, inclusive) of a callgrind dump:
    the server's own work outside them (serverCron's memory stats, per wall-clock tick, so
    the more the slower a run) moves by +-40k a task between runs under load."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--auto=no", dump],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        if ":fcallCommand " in line:
            return int(line.split()[0].replace(",", ""))
    raise SystemExit(f"{dump}: no fcallCommand in the dump")


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
    parser.add_argument("--mix-by", default="tasks", choices=("tasks", "samples"))
    parser.add_argument("--weights", type=int, default=0)
    parser.add_argument("--keep", default="", help="keep each dump as DIR/<shape>-<sources>.cg")
    args = parser.parse_args()
    if args.weights:
        print(f"set_weights with a lease between: {weight_changes(args.weights):.0f} changes/s")
        return
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    kinds = [0] + [int(s) for s in args.sources.split(",") if s.strip()]
    print("| shape | job | k instr / task | inside FCALLs / task | vs plain (inside) |")
    print("|---|---|---:|---:|---:|")
    for shape in shapes:
        plain = 0.0
        for sources in kinds:
            keep = ""
            if args.keep:
                keep = os.path.join(args.keep, f"{shape.replace(' ', '')}-{sources}.cg")
            g = measure(sources, shape, args.calls, keep, args.mix_by)
            plain = plain or g["own"]
            label = "plain" if sources == 0 else f"mixed, {sources} sources, by {args.mix_by}"
            print(
                f"| {shape} | {label} | {g['task']:.0f} | {g['own']:.0f} | "
                f"{100 * (g['own'] / plain - 1):+.1f} % |",
                flush=True,
            )


if __name__ == "__main__":
    main()
