"""Where a taskq ack+lease call spends the server's time, next to the probe's (by hand only).

Usage: .venv/bin/python bench/taskq_profile.py [--seconds 3]

Where it sits: a diagnostic beside `taskq_rows.py` (not a section of run.py). For 1 and 16
tasks per call it drives one trainer process (and then the probe's script) against a fresh
private redis-server after CONFIG RESETSTAT, and prints per script call: the Redis commands
run inside it (calls and µs, from INFO commandstats) and the rest of EVALSHA's time, which
is the Lua interpreter's own work (parsing records, building strings and tables).
"""

from __future__ import annotations

import argparse

import common
import probe
import redis
import taskq_rows

# The probe's script runs by EVALSHA (loaded with SCRIPT LOAD); DEL clears between runs.
OUTSIDE = taskq_rows.OUTSIDE | {"evalsha", "script|load", "del"}


def table(title: str, stats: dict, tasks: int) -> str:
    """A markdown table of the commands inside the script calls, per call."""
    calls = {k.removeprefix("cmdstat_"): v for k, v in stats.items()}
    # taskq calls its Function library (FCALL); the probe is one EVALSHA script
    evalsha = calls.get("fcall") or calls["evalsha"]
    per = evalsha["calls"]
    inner = {k: v for k, v in calls.items() if k not in OUTSIDE}
    inner_us = sum(v["usec"] for v in inner.values())
    lines = [
        f"{title}: {per} calls, {evalsha['usec'] / per:.0f} µs per call, "
        f"{evalsha['usec'] / max(tasks, 1):.1f} µs per task; "
        f"{sum(v['calls'] for v in inner.values()) / per:.1f} commands per call",
        "",
        "| command | calls per call | µs per call | share of the call's time |",
        "|---|---:|---:|---:|",
    ]
    for name, v in sorted(inner.items(), key=lambda kv: -kv[1]["usec"]):
        lines.append(
            f"| {name} | {v['calls'] / per:.2f} | {v['usec'] / per:.1f} "
            f"| {v['usec'] / evalsha['usec']:.0%} |"
        )
    rest = evalsha["usec"] - inner_us
    lines.append(f"| (Lua itself) | | {rest / per:.1f} | {rest / evalsha['usec']:.0%} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    common.install_signal_handlers()
    try:
        for batch in (1, 16):
            with common.start_redis() as server:
                result = taskq_rows.measure_throughput(server.port, 1, batch, args.seconds, True)
                tasks = int(result["tasks_per_s"] * args.seconds)
                print(table(f"taskq {batch}/call, 1 proc", result["stats"], tasks))
            with common.start_redis() as server:
                admin = redis.Redis(host=common.LOOPBACK, port=server.port)
                admin.config_resetstat()
                got = probe.measure(server.port, 1, batch, args.seconds)
                print(
                    table(f"probe {batch}/call, 1 proc", admin.info("commandstats"), got["acked"])
                )
                admin.close()
    finally:
        common.stop_all_servers()


if __name__ == "__main__":
    main()
