"""Instructions a trainer runs per task, counted by valgrind: the trainer's CPU, load-free.

Usage: .venv/bin/python bench/trainer_instructions.py [--before DIR] [--after DIR]
           [--tasks 4000] [--shapes 'p1|b16']

Where it sits: the client-side twin of `server_instructions.py`. `hot_call.py` reads the
trainer's CPU time, which this shared 2-vCPU VM moves by ±30 % from one run to the next;
an instruction count moves by < 1 %. One trainer (heartbeat off, this process's taskq or
DIR's) drains tasks from a private redis-server under `valgrind --tool=cachegrind`; the
run is made twice, with a warm-up only and with `--tasks` more, and the difference is
divided by `--tasks`, so start-up and job creation cancel out. Shapes: `p1` is 1/call
prefetch 1, `b16` is `batches(16)`. User-space instructions only: the two system calls per
call (send, receive) are not in the count, and they are ~20 % of the CPU time at 1/call.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

WARMUP_TASKS = 200
JOB_TASKS = 30_000  # the same job in both runs, so its creation cancels out


def one(tasks: int, shape: str) -> None:
    """Drain WARMUP_TASKS + tasks tasks in this process (run under valgrind)."""
    import common
    from taskq_util import create_job, url_of

    import taskq

    with common.start_redis() as server:
        create_job(server.port, "hot", JOB_TASKS, passes=None)
        trainer = taskq.Trainer(
            "hot",
            url=url_of(server.port),
            prefetch=1 if shape == "p1" else 0,
            heartbeat=False,
            handle_signals=False,
            worker_ttl=3600,  # no heartbeats, and lease / ack do not renew a worker
        )
        if shape == "p1":
            items = iter(trainer)
            for _ in range(WARMUP_TASKS + tasks):
                next(items)
        else:
            batches = trainer.batches(16)
            for _ in range((WARMUP_TASKS + tasks) // 16):
                next(batches)
        trainer.close()


def count(code_dir: str, tasks: int, shape: str) -> int:
    """Instructions of one run of `one` under cachegrind (code_dir first on the path)."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    if code_dir:
        env["PYTHONPATH"] = os.pathsep.join([code_dir, env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=cachegrind",
                "--cache-sim=no",
                f"--cachegrind-out-file={tmp}/cg.out",
                sys.executable,
                __file__,
                "--one",
                str(tasks),
                "--shapes",
                shape,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    m = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode != 0 or m is None:
        raise RuntimeError(f"valgrind run failed: {out.stderr[-800:]}")
    return int(m.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="")
    parser.add_argument("--after", default="", help="a tree to count instead of this one")
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--shapes", default="p1|b16")
    parser.add_argument("--one", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 0 < args.tasks <= JOB_TASKS - WARMUP_TASKS and args.one < 0:
        parser.error(f"--tasks must be in [1, {JOB_TASKS - WARMUP_TASKS}]")
    shapes = [s for s in args.shapes.split("|") if s]
    if args.one >= 0:
        one(args.one, shapes[0])
        return
    trees = (
        [("before", args.before), ("after", args.after)] if args.before else [("this", args.after)]
    )
    print("| shape | " + " | ".join(label for label, _ in trees) + " |")
    print("|---|" + "---:|" * len(trees))
    for shape in shapes:
        cells = []
        for _, code_dir in trees:
            per_task = (count(code_dir, args.tasks, shape) - count(code_dir, 0, shape)) / args.tasks
            cells.append(f"{per_task / 1000:.1f} k")
        print(f"| {shape} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
