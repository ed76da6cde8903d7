"""What one append page and one trim step cost per size, on a big job, from SLOWLOG: the
measure behind ``APPEND_MAX``, ``APPEND_BYTES`` and ``TRIM_MAX`` (engine/contract.py).

One job of N tasks (200,000 by default, tests/engine/test_slowlog.py's size). Each round
appends one page of every size (each chunk with an id, padded to the page's bytes) and
the same page again (every chunk a duplicate), then trims a stream of the follower's
shape (bench/worst_call.py's ``followed_stream``: 5,000 done tasks, each with
the follower's chunk id, a source per file) step by step at every size; the sizes are
interleaved, so the machine's load falls on each alike. SLOWLOG records every call
(threshold 0); the table is the median and the longest call per size, in ms, and the
median and the largest of the server's own CPU time per call (INFO cpu before and after
the call, less the INFO call's own: time the server was descheduled is not in it, so it
tells a call's cost from the machine's load, which SLOWLOG's wall time includes). A page
size smaller than the library's bound is sent as it is (the client's pages are cut
here); a larger one is refused by the script.

Usage: .venv/bin/python bench/page_sizes.py [--tasks N] [--rounds R] [--nice N]
(``TASKQ_TEST_SERVER=valkey-server`` for Valkey, as every bench here; ``--nice -10`` runs
the server at that priority, so that other processes on a shared machine rarely
deschedule it.)

Data flow: this script -> taskq.Client / taskq.Trainer -> Redis; SLOWLOG -> the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable

import taskq
from taskq.admin import jobs
from taskq.engine.contract import APPEND_BYTES, APPEND_MAX, TRIM_MAX

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worst_call import followed_stream  # noqa: E402

#: Tasks of the follower's stream trimmed at each size, a round.
FOLLOWED_TASKS = 20 * TRIM_MAX

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


def _server_cpu_ms(client: taskq.Client) -> float:
    """The server's CPU time so far (user + system, ms: getrusage, INFO cpu)."""
    info = client.redis.info("cpu")
    return 1000 * (float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))


#: [(verb, server CPU ms)] of the calls measured, each less the INFO call's own CPU.
CPU: list[tuple[str, float]] = []


def _cpu_of(client: taskq.Client, verb: str, call: Callable[[], object]) -> object:
    """Runs ``call`` (one script call) and notes the server's CPU time it took."""
    before = _server_cpu_ms(client)
    out = call()
    after = _server_cpu_ms(client)
    CPU.append((verb, after - before))
    return out


def _append_page(
    client: taskq.Client, job: str, chunks: int, size: int, tag: str, name: str
) -> list[float]:
    pad = "x" * max(0, size // chunks - 40)
    page = [{"i": i, "pad": pad} for i in range(chunks)]
    ids = [f"{tag}-{i}" for i in range(chunks)]
    jobs.APPEND_MAX, jobs.APPEND_BYTES = chunks, size  # one page of this size
    out = []
    try:
        for _ in range(2):  # new chunks, then the same ones again (duplicates)
            client.redis.slowlog_reset()
            _cpu_of(client, name, lambda: client.job(job).append(page, ids=ids))
            out.append(_worst(client, "append"))
    finally:
        jobs.APPEND_MAX, jobs.APPEND_BYTES = APPEND_MAX, APPEND_BYTES
    return out


def _trim_steps(client: taskq.Client, tasks: int, tag: str) -> list[float]:
    """Trims a follower's stream of FOLLOWED_TASKS done tasks (bench/worst_call.py's
    ``followed_stream``) in steps of ``tasks``; the longest call of each step (ms)."""
    stream = f"trim-{tag}"
    followed_stream(client, stream, FOLLOWED_TASKS)
    out = []
    for _ in range(FOLLOWED_TASKS // tasks):
        client.redis.slowlog_reset()
        reply = _cpu_of(
            client,
            f"trim {tasks} tasks",
            lambda: client.connection.run(stream, "trim", ["", tasks]),
        )
        assert int(reply[1]) == tasks, reply  # type: ignore[index]
        out.append(_worst(client, "trim"))
    client.delete_job(stream)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--nice", type=int, default=0, help="the server's priority (root: < 0)")
    a = ap.parse_args()
    import common

    rows: dict[str, list[float]] = {}
    with common.start_redis(
        ["--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000"]
    ) as server:
        try:
            common.prioritise(server, nice=a.nice)
        except PermissionError:
            print("page_sizes.py: --nice below 0 needs root (or CAP_SYS_NICE)", file=sys.stderr)
            return 2
        client = taskq.connect(f"redis://127.0.0.1:{server.port}/0")
        # the INFO call's own CPU time, taken off each call's
        base = []
        for _ in range(20):
            before = _server_cpu_ms(client)
            base.append(_server_cpu_ms(client) - before)
        info_ms = statistics.median(base)
        client.create_job("big", [{"i": i} for i in range(a.tasks)])
        version = (
            client.redis.info("server").get("valkey_version")
            or client.redis.info("server")["redis_version"]
        )
        for r in range(a.rounds):
            for chunks, size in APPEND_SIZES:
                name = f"append {chunks} chunks, {size // 1024} KiB"
                rows.setdefault(name, []).extend(
                    _append_page(client, "big", chunks, size, f"{r}-{chunks}-{size}", name)
                )
            for tasks in TRIM_SIZES:
                rows.setdefault(f"trim {tasks} tasks", []).extend(
                    _trim_steps(client, tasks, f"{r}-{tasks}")
                )
    load = os.getloadavg()[0]
    print(f"one call per size on a {a.tasks:,}-task job, server {version}, load {load:.1f} (ms)\n")
    print("| call | SLOWLOG median | SLOWLOG max | server CPU median | server CPU max |")
    print("|---|---:|---:|---:|---:|")
    for name, ms in rows.items():
        cpu = [max(0.0, c - info_ms) for v, c in CPU if v == name]
        print(
            f"| {name} | {statistics.median(ms):.2f} | {max(ms):.2f} "
            f"| {statistics.median(cpu):.2f} | {max(cpu):.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
