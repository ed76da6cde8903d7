"""The long form of the chaos scenarios (issue 7): full sizes, by hand, never in CI.

Scenario 1 (scale up, scale down, kill) at 10 -> 30 -> 3 trainers by default, repeated
``--rounds`` times, each round ending with the audit of ``tests/chaos.py``; then the
poison-task scenario with more trainers. Starts its own redis-server on a free loopback
port (or uses ``--url``) and stops it and every trainer at the end.

    .venv/bin/python bench/chaos_long.py [--rounds 3] [--first 10 --peak 30 --last 3]
        [--tasks 1000 --passes 3 --step 0.05 --ttl 5 --hbi 1] [--url URL] [--out FILE]

Prints one JSON line per round and exits 1 if any round broke a bound.

Data flow: chaos_long.py -> tests/chaos.py (forked trainers, reaper subprocess, audit)
-> taskq -> Redis.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The long form runs the tests' own chaos scenarios (tests/chaos.py) at full size, so it
# imports them; servers come from taskq.devserver, nothing else of tests/ is needed.
sys.path.insert(0, str(ROOT / "tests"))

from chaos import (  # noqa: E402
    POISON_KILL,
    POISON_RAISE,
    Fleet,
    ReaperProc,
    audit_job,
    scale_up_down_kill,
)

import taskq  # noqa: E402
from taskq.devserver import RedisServer  # noqa: E402


def round_scale(
    client: taskq.Client, url: str, job: str, log_dir: Path, a: argparse.Namespace
) -> dict[str, Any]:
    """One round of scenario 1 at full size; adds ``ok`` and ``problems``."""
    s = scale_up_down_kill(
        client,
        url,
        job,
        log_dir,
        tasks=a.tasks,
        passes=a.passes,
        first=a.first,
        peak=a.peak,
        last=a.last,
        step_s=a.step,
        up_at=a.tasks // 5,
        down_at=a.tasks + a.tasks // 5,
        ttl_s=a.ttl,
        hbi_s=a.hbi,
        timeout_s=600,
    )
    problems = []
    if s["acked"] != a.tasks * a.passes or s["dead"]:
        problems.append(f"acked {s['acked']} dead {s['dead']}")
    if s["max_kill_wait_s"] is not None and s["max_kill_wait_s"] > a.ttl + a.margin:
        problems.append(f"a SIGKILLed trainer's task waited {s['max_kill_wait_s']} s")
    if s["max_term_wait_s"] is not None and s["max_term_wait_s"] > a.margin:
        problems.append(f"a SIGTERMed trainer's task waited {s['max_term_wait_s']} s")
    if s["max_lateness_ms"] > a.margin * 1000:
        problems.append(f"re-dispatch lateness {s['max_lateness_ms']} ms")
    if s["unaccounted_leases"]:
        problems.append(f"{s['unaccounted_leases']} leases ended no counted way")
    return {
        "scenario": "scale",
        "runtime_s": s["runtime_s"],
        "tail_s": s["tail_s"],
        "max_kill_wait_s": s["max_kill_wait_s"],
        "max_term_wait_s": s["max_term_wait_s"],
        "max_lateness_ms": s["max_lateness_ms"],
        "acked": s["acked"],
        "duplicates": s["duplicates"],
        "stale": s["stale"],
        "counters": s["counters"],
        "ok": not problems,
        "problems": problems,
    }


def round_poison(
    client: taskq.Client, url: str, job: str, log_dir: Path, a: argparse.Namespace
) -> dict[str, Any]:
    """Poison tasks (one kills its trainer, one raises) among ``a.tasks`` with
    ``a.peak`` trainers respawned as they die."""
    max_attempts, max_failures = 4, 3
    chunks: list[Any] = [{"i": i} for i in range(a.tasks)]
    kill_id, raise_id = a.tasks // 3, 2 * a.tasks // 3
    chunks[kill_id], chunks[raise_id] = POISON_KILL, POISON_RAISE
    client.create_job(
        job,
        chunks=chunks,
        passes=a.passes,
        worker_ttl=a.ttl,
        heartbeat_interval=a.hbi,
        task_timeout=None,
        max_attempts=max_attempts,
        max_failures=max_failures,
    )
    began = time.monotonic()
    with (
        Fleet(url, job, log_dir, step_s=a.step) as fleet,
        ReaperProc(url, interval=0.2, jobs=[job], log_path=log_dir / "reaper.log"),
    ):
        fleet.spawn(a.peak)
        limit = a.peak + max_attempts + max_failures
        deadline = time.monotonic() + 600
        while client.status(job, summaries=0).state != "completed":
            if time.monotonic() > deadline:
                raise AssertionError("the poison stalled the job")
            if len(fleet.alive()) < a.peak and len(fleet.trainers) < limit:
                fleet.spawn(1)
            time.sleep(0.05)
        fleet.join_all(60)
        codes = [t.exitcode for t in fleet.trainers]
        s = audit_job(client, job, fleet.logs(), expect_dead={kill_id, raise_id})
    problems = []
    if codes.count(-signal.SIGKILL) != max_attempts or codes.count(1) != max_failures:
        problems.append(f"exit codes {codes}")
    return {
        "scenario": "poison",
        "runtime_s": round(time.monotonic() - began, 2),
        "acked": s["acked"],
        "dead": s["dead"],
        "counters": s["counters"],
        "ok": not problems,
        "problems": problems,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="use this Redis (default: start a redis-server)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--first", type=int, default=10)
    ap.add_argument("--peak", type=int, default=30)
    ap.add_argument("--last", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--step", type=float, default=0.05, help="seconds per task body")
    ap.add_argument("--ttl", type=float, default=5.0, help="the job's worker_ttl")
    ap.add_argument("--hbi", type=float, default=1.0, help="the job's heartbeat_interval")
    ap.add_argument(
        "--margin",
        type=float,
        default=2.0,
        help="seconds allowed on top of the ttl for a re-dispatch",
    )
    ap.add_argument("--no-poison", action="store_true", help="skip the poison round")
    ap.add_argument("--out", help="also write the JSON lines here")
    a = ap.parse_args()
    server = None if a.url else RedisServer(aof=True)
    url = a.url or server.url  # type: ignore[union-attr]
    client = taskq.connect(url)
    work = Path(tempfile.mkdtemp(prefix="taskq-chaos-long-"))
    results = []
    ok = True
    try:
        plan = [("scale", round_scale)] * a.rounds
        if not a.no_poison:
            plan.append(("poison", round_poison))
        for k, (name, fn) in enumerate(plan):
            job = f"chaos-long-{os.getpid()}-{k}-{name}"
            try:
                row = fn(client, url, job, work / job, a)
            except AssertionError as e:
                row = {"scenario": name, "ok": False, "problems": [str(e)[:2000]]}
            row["round"] = k
            results.append(row)
            ok = ok and row["ok"]
            print(json.dumps(row), flush=True)
            client.delete_job(job)
    finally:
        if server is not None:
            server.cleanup()
    if a.out:
        Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in results))
    print(f"logs in {work}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
