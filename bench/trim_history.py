"""Whether a trim step costs more as a stream's history grows: the server's CPU per call
of `append`, `ack` and `trim` over a long stream fed as `taskq job follow` feeds it.

Usage: .venv/bin/python bench/trim_history.py [--tasks 1000000] [--every 100000]
(``TASKQ_TEST_SERVER=valkey-server`` for Valkey, as every bench here.)

Where it sits: beside page_sizes.py (one call per size on a fresh stream); this one runs
a one-pass stream job (`max_backlog` 10,000) through the calls a week of `job follow`
makes, in rounds: 100 files of 100 one-record chunks appended (each chunk with the
follower's id, each file a source and its record in the follow hash: the shape of
bench/worst_call.py's ``followed_stream``), then one trainer leases and acks them in batches of 32, then the reaper's trim
steps (TRIM_MAX each) drop them. Every ``--every`` tasks it prints the server's CPU time
per call of each kind over those rounds (INFO cpu: user + system, which does not count
the time the server was descheduled, so a loaded machine moves it little, unlike
SLOWLOG's wall time) and `used_memory`. A step whose cost grows with the history shows
as a rising trim column.

Data flow: this script -> taskq.Client / taskq.Trainer -> Redis; INFO cpu -> the rows.
"""

from __future__ import annotations

import argparse
import os
import sys

import common

import taskq
from taskq.engine.contract import MAX_BATCH, TRIM_MAX

#: Files of a round, and records (one chunk, one task each) of a file.
FILES, RECORDS = 100, 100


def _cpu_us(client: taskq.Client) -> float:
    info = client.redis.info("cpu")
    return 1e6 * (float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1_000_000)
    ap.add_argument("--every", type=int, default=100_000)
    a = ap.parse_args()
    with common.start_redis() as server:
        client = taskq.connect(f"redis://{common.LOOPBACK}:{server.port}/0")
        info = client.redis.info("server")
        version = info.get("valkey_version") or info["redis_version"]
        client.create_job("s", [], stream=True, passes=1, max_backlog=FILES * RECORDS)
        handle = client.job("s")
        trainer = taskq.Trainer("s", client=client, worker_id="w", handle_signals=False)
        spent = {"append": [0.0, 0], "lease+ack": [0.0, 0], "trim": [0.0, 0]}
        print(f"server {version}: server CPU per call (µs), over the last {a.every:,} tasks")
        f = 0
        while f * RECORDS < a.tasks:
            c0 = _cpu_us(client)
            for _ in range(FILES):
                path = f"/data/streams/events/2026-12-06/part-{f:07d}.jsonl"
                key = f"{path}|{24 * RECORDS}|1796532000.123456"
                chunks = [{"path": path, "offset": 24 * i, "length": 24} for i in range(RECORDS)]
                handle.append(chunks, ids=[f"{key}#{i}" for i in range(RECORDS)], source=key)
                handle.file_appended(key, RECORDS)
                f += 1
            c1 = _cpu_us(client)
            acks = 0
            while batch := trainer.lease_many(MAX_BATCH, timeout=0):
                trainer.ack(batch)
                acks += 1
            c2 = _cpu_us(client)
            steps = 1
            while int(client.connection.run("s", "trim", ["", TRIM_MAX])[1]) == TRIM_MAX:
                steps += 1
            c3 = _cpu_us(client)
            for kind, us, calls in (
                ("append", c1 - c0, FILES),
                ("lease+ack", c2 - c1, 2 * acks),  # a lease call and an ack call a batch
                ("trim", c3 - c2, steps),
            ):
                spent[kind][0] += us
                spent[kind][1] += calls
            if (f * RECORDS) % a.every == 0:
                row = ", ".join(f"{k} {us / max(1, n):,.0f}" for k, (us, n) in spent.items())
                mem = int(client.redis.info("memory")["used_memory"]) / 2**20
                load = os.getloadavg()[0]
                print(
                    f"  {f * RECORDS:>10,} tasks: {row}; used_memory {mem:.1f} MiB; load {load:.1f}"
                )
                spent = {k: [0.0, 0] for k in spent}
        trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
