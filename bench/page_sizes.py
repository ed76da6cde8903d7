"""What one append page and one trim step cost per size, on a big job, from SLOWLOG: the
measure behind ``APPEND_MAX``, ``APPEND_BYTES`` and ``TRIM_MAX`` (engine/contract.py).

One job of N tasks (200,000 by default, tests/test_slowlog.py's size). Each round
appends one page of every size (each chunk with an id, padded to the page's bytes) and
the same page again (every chunk a duplicate), then trims a fresh one-pass stream whose
first tasks are done (each with its chunk id) by one step of every size; the sizes are
interleaved, so the machine's load falls on each alike. SLOWLOG records every call
(threshold 0); the table is the median and the longest call per size, in ms. A page
size smaller than the library's bound is sent as it is (the client's pages are cut
here); a larger one is refused by the script.

Usage: .venv/bin/python bench/page_sizes.py [--tasks N] [--rounds R]
(``TASKQ_TEST_SERVER=valkey-server`` for Valkey, as every bench here.)

Data flow: this script -> taskq.Client / taskq.Trainer -> Redis; SLOWLOG -> the table.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import taskq
from taskq.admin import jobs
from taskq.engine.contract import APPEND_BYTES, APPEND_MAX, TRIM_MAX

#: (chunks, bytes) of the append pages measured, and the trim steps (tasks).
APPEND_SIZES = [(APPEND_MAX, APPEND_BYTES), (APPEND_MAX // 2, APPEND_BYTES // 2)]
TRIM_SIZES = [TRIM_MAX, TRIM_MAX // 2]


def _worst(client: taskq.Client, verb: str) -> float:
    """The longest call of ``verb`` in SLOWLOG since the last reset (ms); resets it."""
    entries = client.redis.slowlog_get(100_000)
    client.redis.slowlog_reset()
    return max(
        (e["duration"] / 1000 for e in entries if f"_{verb}" in str(e["command"])), default=0
    )


def _append_page(client: taskq.Client, job: str, chunks: int, size: int, tag: str) -> list[float]:
    pad = "x" * max(0, size // chunks - 40)
    page = [{"i": i, "pad": pad} for i in range(chunks)]
    ids = [f"{tag}-{i}" for i in range(chunks)]
    jobs.APPEND_MAX, jobs.APPEND_BYTES = chunks, size  # one page of this size
    out = []
    try:
        for _ in range(2):  # new chunks, then the same ones again (duplicates)
            client.redis.slowlog_reset()
            client.job(job).append(page, ids=ids)
            out.append(_worst(client, "append"))
    finally:
        jobs.APPEND_MAX, jobs.APPEND_BYTES = APPEND_MAX, APPEND_BYTES
    return out


def _trim_step(client: taskq.Client, tasks: int, tag: str) -> float:
    stream = f"trim-{tag}"
    client.create_job(stream, [], stream=True, manual_clock=True, task_timeout=None)
    client.job(stream).append(
        [{"i": i} for i in range(tasks)], ids=[f"s-{i}" for i in range(tasks)]
    )
    t = taskq.Trainer(stream, client=client, worker_id="w", heartbeat=False, handle_signals=False)  # type: ignore[arg-type]
    while batch := t.lease_many(32, timeout=0):
        t.ack(batch)
    t.close()
    client.redis.slowlog_reset()
    passed = int(client.connection.run(stream, "trim", ["", tasks])[1])
    assert passed == tasks, passed
    worst = _worst(client, "trim")
    client.delete_job(stream)
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    sys.path.insert(0, __file__.rpartition("/")[0])
    import common

    rows: dict[str, list[float]] = {}
    with common.start_redis(
        ["--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000"]
    ) as server:
        client = taskq.connect(f"redis://127.0.0.1:{server.port}/0")
        client.create_job("big", [{"i": i} for i in range(a.tasks)])
        version = (
            client.redis.info("server").get("valkey_version")
            or client.redis.info("server")["redis_version"]
        )
        for r in range(a.rounds):
            for chunks, size in APPEND_SIZES:
                name = f"append {chunks} chunks, {size // 1024} KiB"
                rows.setdefault(name, []).extend(
                    _append_page(client, "big", chunks, size, f"{r}-{chunks}-{size}")
                )
            for tasks in TRIM_SIZES:
                rows.setdefault(f"trim {tasks} tasks", []).append(
                    _trim_step(client, tasks, f"{r}-{tasks}")
                )
    print(f"one call per size on a {a.tasks:,}-task job, server {version} (SLOWLOG, ms)\n")
    print("| call | median | max |")
    print("|---|---:|---:|")
    for name, ms in rows.items():
        print(f"| {name} | {statistics.median(ms):.2f} | {max(ms):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
