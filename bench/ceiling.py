"""Physical ceiling: how many tiny EVALSHA calls this machine's Redis runs per second.

Where it sits: the first rows of the table. `redis-benchmark` (C, 16 connections) drives
`EVALSHA <sha> 1 k` of a one-line script (`INCR KEYS[1]`) against a private redis-server,
unpipelined (-P 1) and pipelined (-P 16). No Python client can beat these numbers; every
queue row below is read against them.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess

import common

SECTION = "ceiling"
TINY_SCRIPT = "return redis.call('INCR', KEYS[1])"


def run(recorder: common.Recorder, quick: bool) -> None:
    """Adds the two EVALSHA ceiling rows (requests/s) to the recorder."""
    if shutil.which("redis-benchmark") is None:
        recorder.add(SECTION, "EVALSHA INCR, -P 1", None, "calls/s", "redis-benchmark not on PATH")
        return
    requests = 200_000 if quick else 1_000_000
    with common.start_redis() as server:
        client = server.client()
        sha = client.script_load(TINY_SCRIPT)
        client.close()
        for pipeline in (1, 16):
            rate = benchmark_evalsha(server.port, sha, requests, pipeline)
            recorder.add(
                SECTION,
                f"EVALSHA INCR, -P {pipeline}",
                rate,
                "calls/s",
                f"redis-benchmark -c 16 -n {requests}",
            )


def benchmark_evalsha(port: int, sha: str, requests: int, pipeline: int) -> float | None:
    """Runs redis-benchmark EVALSHA against 127.0.0.1:port; returns requests/s or None.

    Bounded by a 300 s subprocess timeout.
    """
    argv = [
        "redis-benchmark", "-h", common.LOOPBACK, "-p", str(port),
        "-n", str(requests), "-c", "16", "-P", str(pipeline), "--csv",
        "evalsha", sha, "1", "k",
    ]  # fmt: skip
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    except (subprocess.SubprocessError, OSError):
        return None
    return parse_csv_rps(out.stdout)


def parse_csv_rps(text: str) -> float | None:
    """Reads the requests/s of the first data row of `redis-benchmark --csv` output."""
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[0] not in ("test", ""):
            try:
                return float(row[1])
            except ValueError:
                continue
    return None
