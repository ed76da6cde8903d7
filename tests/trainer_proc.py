"""A trainer run as a real subprocess, for the signal, SIGKILL and skew tests.

Usage: trainer_proc.py URL JOB [--sleep S] [--prefetch K] [--log FILE] [--hold]
           [--heartbeat thread|process] [--worker-id ID] [--worker-ttl S] [--ack-on-stdin]
           [--stamp]
Prints "LEASED <id>" (flushed) when it gets a task; with --hold it then sleeps until
signalled; with --ack-on-stdin it holds the task until a line arrives on stdin, acks it
and prints "ACKED <id>" or "ACK REFUSED <error>", then leaves; each acked task is
appended to --log as "<pass> <id> <token>" (with --stamp, then the wall-clock time of
the ack's return), an ack refused (the trainer declared lost meanwhile) is printed as
"ACK REFUSED <id>: <error>" and the loop goes on; "ENDED state=... draining=..." when
the loop ends.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import taskq
from taskq.testing import trainer_worker


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
    ap.add_argument("--worker-ttl", type=float, default=None)
    ap.add_argument("--ack-on-stdin", action="store_true")
    ap.add_argument("--stamp", action="store_true")
    a = ap.parse_args()
    log = open(a.log, "a", buffering=1) if a.log else None
    with taskq.Trainer(
        a.job,
        url=a.url,
        prefetch=a.prefetch,
        heartbeat=a.heartbeat,
        worker_id=a.worker_id,
        worker_ttl=a.worker_ttl,
    ) as trainer:
        helper = (
            trainer_worker(trainer).heartbeat.helper.proc.pid
            if trainer_worker(trainer).heartbeat.helper
            else 0
        )
        print(f"READY {os.getpid()} {helper}", flush=True)
        for task in trainer:
            print(f"LEASED {task.id}", flush=True)
            if a.ack_on_stdin:
                sys.stdin.readline()
                try:
                    trainer.ack(task)
                    print(f"ACKED {task.id}", flush=True)
                except taskq.TaskqError as e:
                    print(f"ACK REFUSED {type(e).__name__}: {e}", flush=True)
                return 0
            if a.hold:
                while True:
                    time.sleep(60)  # holds until killed
            time.sleep(a.sleep)  # the task's work (--sleep)
            if log and not task.revoked.is_set():
                try:
                    trainer.ack(task)  # explicit, so the log holds only counted acks
                except taskq.LeaseLost as e:
                    # declared lost meanwhile (silent past its ttl: a slot moving, a
                    # paused master): the task went to another trainer; this one
                    # re-registers and goes on, as the iterator does with its own acks
                    print(f"ACK REFUSED {task.id}: {e}", flush=True)
                    continue
                stamp = f" {time.time():.3f}" if a.stamp else ""
                log.write(f"{task.pass_no} {task.id} {task.token}{stamp}\n")
        # why the loop ended, for a test that sees this process leave early
        print(f"ENDED state={trainer.state} draining={trainer.draining}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
