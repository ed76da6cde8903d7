"""taskq's throughput as a share of the probe's, shape by shape (by hand; for A/B work).

Usage: .venv/bin/python bench/ratio.py [--seconds 3] [--repeat 1] [--shapes 1x1,1x4p1,...]

Where it sits: a quicker view of run.py's throughput rows. For each shape (tasks per call x
trainer processes; "p1" for prefetch 1, as in 1x4p1) it runs the probe and then taskq, each
against a fresh private redis-server, back to back, `--repeat` times, and prints both rates, the ratio (the goal is
>= 70 %), and taskq's server µs per task and client CPU per task. It also runs the probe's
"floor" variant (probe.FLOOR_LUA: the writes docs/design.md's data model makes per call, with
no logic) and prints its share of the probe: the most a design with that data model can
reach on this machine. Running the two next to
each other is what makes the ratio hold on a shared machine whose speed moves by ±20 %.
"""

from __future__ import annotations

import argparse
import statistics

import common
import probe
import taskq_rows

SHAPES = "1x1,1x4,1x16,16x1,16x4,16x16"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--shapes", default=SHAPES, help=f"default {SHAPES}")
    args = parser.parse_args()
    common.install_signal_handlers()
    print(
        "| tasks/call | procs | probe tasks/s | floor / probe | taskq tasks/s | taskq / probe "
        "| taskq server µs/task | taskq client µs/task |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for shape in args.shapes.split(","):
        size, _, prefetch = shape.partition("p")  # "1x4p1": prefetch 1
        batch, procs = (int(x) for x in size.split("x"))
        ratios, floors, rates, server, client = [], [], [], [], []
        for _ in range(args.repeat):
            with common.start_redis() as server_proc:
                p = probe.measure(server_proc.port, procs, batch, args.seconds)
            with common.start_redis() as server_proc:
                f = probe.measure(server_proc.port, procs, batch, args.seconds, floor=True)
            with common.start_redis() as server_proc:
                t = taskq_rows.measure_throughput(
                    server_proc.port, procs, batch, args.seconds, True, int(prefetch or 0)
                )
            calls = {k.removeprefix("cmdstat_"): v for k, v in t["stats"].items()}
            usec = sum(calls.get(k, {"usec": 0})["usec"] for k in ("evalsha", "fcall"))
            acked = t["tasks_per_s"] * args.seconds
            ratios.append(t["tasks_per_s"] / p["tasks_per_s"])
            floors.append(f["tasks_per_s"] / p["tasks_per_s"])
            rates.append((p["tasks_per_s"], t["tasks_per_s"]))
            server.append(usec / max(acked, 1))
            client.append(t["client_us"])
        print(
            f"| {batch}{' (prefetch ' + prefetch + ')' if prefetch else ''} | {procs} "
            f"| {statistics.median(r[0] for r in rates):,.0f} "
            f"| {statistics.median(floors):.0%} | {statistics.median(r[1] for r in rates):,.0f} "
            f"| {statistics.median(ratios):.0%} | {statistics.median(server):.0f} "
            f"| {statistics.median(client):.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
