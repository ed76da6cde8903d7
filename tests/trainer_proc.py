"""A trainer run as a real subprocess, for the signal, SIGKILL and skew tests.

Usage: trainer_proc.py URL JOB [--sleep S] [--prefetch K] [--log FILE] [--hold]
           [--heartbeat thread|process] [--worker-id ID]
Prints "LEASED <id>" (flushed) when it gets a task; with --hold it then sleeps until
signalled; each acked task is appended to --log as "<pass> <id> <token>".
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import taskq


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("job")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--prefetch", type=int, default=0)
    ap.add_argument("--log", default="")
    ap.add_argument("--hold", action="store_true")
    ap.add_argument("--heartbeat", default="thread")
    ap.add_argument("--worker-id", default=None)
    a = ap.parse_args()
    log = open(a.log, "a", buffering=1) if a.log else None
    with taskq.Trainer(a.job, url=a.url, prefetch=a.prefetch, heartbeat=a.heartbeat,
                       worker_id=a.worker_id) as trainer:
        helper = trainer._helper.proc.pid if trainer._helper else 0
        print(f"READY {os.getpid()} {helper}", flush=True)
        for task in trainer:
            print(f"LEASED {task.id}", flush=True)
            if a.hold:
                while True:
                    time.sleep(60)
            time.sleep(a.sleep)
            if log and not task.revoked.is_set():
                trainer.ack(task)  # explicit, so the log holds only counted acks
                log.write(f"{task.pass_no} {task.id} {task.token}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
