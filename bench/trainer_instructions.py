"""Instructions a trainer runs per task, counted by valgrind: the trainer's CPU, load-free.

Usage: .venv/bin/python bench/trainer_instructions.py [--before DIR] [--after DIR]
           [--tasks 4000] [--shapes 'p1|p0|b16|feeder']

Where it sits: the client-side twin of `server_instructions.py`. `hot_call.py` reads the
trainer's CPU time, which this shared 2-vCPU VM moves by ±30 % from one run to the next;
an instruction count moves by < 1 %. One trainer (heartbeat off, this process's taskq or
DIR's) drains tasks from a private redis-server under `valgrind --tool=cachegrind`; the
run is made twice, with a warm-up only and with `--tasks` more, and the difference is
divided by `--tasks`, so start-up and job creation cancel out. Shapes: `p1` is 1/call
prefetch 1, `p0` 1/call prefetch 0, `b16` is `batches(16)`, `feeder` the taskq.torch
feeder's steady call (`lease_many` acking 3 tasks, starting 3 reserved and leasing 3
reserved: its default `tasks_ahead` refilled half at a time; torch itself not loaded).
User-space instructions only: the two system calls per call (send, receive) are not in the
count, and they are ~20 % of the CPU time at 1/call.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

WARMUP_TASKS = 200
SHAPES = ("p1", "p0", "b16", "feeder")
#: the feeder shape's tasks per call (its default tasks_ahead 6, refilled half at a time)
FEED = 3


def one(tasks: int, shape: str, job_tasks: int) -> None:
    """Drain WARMUP_TASKS + tasks tasks of a job of job_tasks in this process (run under
    valgrind)."""
    import common
    from taskq_util import create_job, url_of

    import taskq

    with common.start_redis() as server:
        create_job(server.port, "hot", job_tasks, passes=None)
        trainer = taskq.Trainer(
            "hot",
            url=url_of(server.port),
            prefetch=1 if shape == "p1" else 0,
            heartbeat=False,
            handle_signals=False,
            worker_ttl=3600,  # no heartbeats, and lease / ack do not renew a worker
        )
        if shape in ("p1", "p0"):
            items = iter(trainer)
            for _ in range(WARMUP_TASKS + tasks):
                next(items)
        elif shape == "b16":
            batches = trainer.batches(16)
            for _ in range((WARMUP_TASKS + tasks) // 16):
                next(batches)
        else:
            reserved = trainer.lease_many(FEED, 0, reserve=True)
            started: list = []
            for _ in range((WARMUP_TASKS + tasks) // FEED):
                got = trainer.lease_many(FEED, 0, acks=started, starts=reserved, reserve=True)
                started, reserved = reserved, got
        trainer.close()


def count(code_dir: str, tasks: int, shape: str, job_tasks: int) -> int:
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
                "--job",
                str(job_tasks),
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
    parser.add_argument("--shapes", default="|".join(SHAPES))
    parser.add_argument("--one", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--job", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = [s for s in args.shapes.split("|") if s]
    if not shapes or set(shapes) - set(SHAPES):
        parser.error(f"--shapes: '|'-separated, of {', '.join(SHAPES)}")
    if not 0 < args.tasks <= 100_000 and args.one < 0:
        parser.error("--tasks must be in [1, 100000]")
    if args.one >= 0:
        one(args.one, shapes[0], args.job)
        return
    trees = (
        [("before", args.before), ("after", args.after)] if args.before else [("this", args.after)]
    )
    print("| shape | " + " | ".join(label for label, _ in trees) + " |")
    print("|---|" + "---:|" * len(trees))
    for shape in shapes:
        cells = []
        for _, code_dir in trees:
            # the same job in both runs (a little more than the longer drains), so its
            # creation cancels out
            job = WARMUP_TASKS + args.tasks + 2 * FEED
            per_task = (
                count(code_dir, args.tasks, shape, job) - count(code_dir, 0, shape, job)
            ) / args.tasks
            cells.append(f"{per_task / 1000:.1f} k")
        print(f"| {shape} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
