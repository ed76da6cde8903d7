"""Long form of chaos scenario 7: many seeded random schedules, each ending with the audit.

By hand, never in CI (minutes per dozen seeds)::

    .venv/bin/python bench/chaos_random_long.py --seeds 20            # seeds 1..20
    .venv/bin/python bench/chaos_random_long.py --seed 1234 --seed 7  # just these
    .venv/bin/python bench/chaos_random_long.py --seeds 50 --duration 40 --tasks 60 \\
        --passes 10 --max-live 10 --out bench/results/chaos_random_long.json

Each seed gets its own redis-server (AOF, everysec) on a free loopback port, a loopback
TCP proxy, a reaper subprocess and forked trainers, exactly as
``tests/chaos/test_chaos_redis.py::test_random_schedule_ends_with_a_clean_audit`` (whose
``plan``/``RandomRun``/``random_scenario`` it runs with bigger sizes). A failing seed
prints its schedule and timeline; the run goes on and exits 1 at the end.

Data flow: this script -> tests/chaos/test_chaos_redis.py (rig, schedule) -> tests/chaos.py ->
trainers -> taskq -> Redis.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The long form runs the tests' own chaos scenarios (tests/chaos_rig.py) at full size, so it
# imports them; servers come from taskq.devserver, nothing else of tests/ is needed.
sys.path.insert(0, str(ROOT / "tests"))

from chaos_rig import Rig, random_scenario  # noqa: E402

from taskq.devserver import RedisServer  # noqa: E402


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, object]:
    """One seed on a fresh server; returns a result row (``ok`` False on any failure)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"taskq-chaos-{seed}-"))
    server = RedisServer(aof=True)
    rig = Rig(server, workdir, f"chaos-long-{seed}-{os.getpid()}")
    started = time.monotonic()
    row: dict[str, object] = {"seed": seed}
    try:
        result = random_scenario(
            rig,
            seed,
            duration_s=args.duration,
            n=args.tasks,
            passes=args.passes,
            finish_timeout=args.finish_timeout,
            max_live=args.max_live,
        )
        row.update(
            ok=True,
            acked=result["acked"],
            stale=result["stale"],
            dead=result["dead"],
            duplicates=result["duplicates"],
            max_lateness_ms=result["max_lateness_ms"],
            schedule_entries=len(result["schedule"]),
        )
    except Exception as e:  # noqa: BLE001 - a failing seed is reported, the run goes on
        traceback.print_exc()
        row.update(ok=False, error=f"{type(e).__name__}: {e}"[:2000], workdir=str(workdir))
    finally:
        rig.close()
        server.cleanup()
    row["seconds"] = round(time.monotonic() - started, 1)
    if row["ok"]:
        shutil.rmtree(workdir, ignore_errors=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10, help="run seeds start..start+N-1")
    ap.add_argument("--start", type=int, default=1)
    ap.add_argument(
        "--seed",
        type=int,
        action="append",
        default=[],
        help="run this seed (repeat); overrides --seeds",
    )
    ap.add_argument("--duration", type=float, default=30.0, help="schedule length (s)")
    ap.add_argument("--tasks", type=int, default=60)
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--max-live", type=int, default=8, help="trainers at once at most")
    ap.add_argument("--finish-timeout", type=float, default=180.0)
    ap.add_argument("--out", default="", help="write the rows as JSON here")
    args = ap.parse_args()
    seeds = args.seed or list(range(args.start, args.start + args.seeds))
    rows = []
    for seed in seeds:
        row = run_seed(seed, args)
        rows.append(row)
        print(json.dumps(row), flush=True)
    failed = [r["seed"] for r in rows if not r["ok"]]
    print(
        f"{len(rows) - len(failed)}/{len(rows)} seeds passed"
        + (f"; failed: {failed}" if failed else ""),
        flush=True,
    )
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
