"""A sharded-job trainer run as a real subprocess, for the SIGKILL / SIGTERM tests.

Usage: sharded_proc.py URL JOB [--sleep S] [--log FILE] [--stamp]
Prints "READY <pid>" once registered; each task acked is appended to --log as
"<pass> <global id>" after its ack landed (with --stamp, then the wall-clock time).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import taskq
from taskq import LeaseLost


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("job")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--log", default="")
    ap.add_argument("--stamp", action="store_true")
    a = ap.parse_args()
    log = open(a.log, "a", buffering=1) if a.log else None
    with taskq.Trainer(a.job, url=a.url, idle_wait=0.2) as trainer:
        print(f"READY {os.getpid()}", flush=True)
        for task in trainer:
            time.sleep(a.sleep)  # the task's work (--sleep)
            if not task.revoked.is_set():
                try:
                    trainer.ack(task)  # explicit, so the log holds only counted acks
                except LeaseLost:
                    continue  # declared lost meanwhile (a paused master): not counted
                if log:
                    stamp = f" {time.time():.3f}" if a.stamp else ""
                    log.write(f"{task.pass_no} {trainer.global_id(task)}{stamp}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
