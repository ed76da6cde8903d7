"""A trainer subprocess that reads its task's samples with progress, for the SIGKILL test.

Usage: progress_proc.py URL JOB OUT
Leases one task, reads it with ``taskq.data.read_task(task.chunks, task.start)``, records
``trainer.progress(task, n)`` after every sample and appends each sample's ``i`` to OUT;
once 90 % of the task's samples are taken it prints "AT90 <task> <n>" (flushed) and
sleeps until killed.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import taskq  # noqa: E402
from taskq.data import read_task  # noqa: E402


def main() -> int:
    url, job, out = sys.argv[1:4]
    with taskq.Trainer(job, url=url) as trainer, open(out, "a", buffering=1) as log:
        task = trainer.lease(timeout=10)
        assert task is not None
        total = sum(int(c["rows"]) for c in task.chunks)
        n = task.start
        for row in read_task(task.chunks, task.start):
            log.write(f"{row['i']}\n")
            n += 1
            trainer.progress(task, n)
            if n >= 0.9 * total:
                print(f"AT90 {task.id} {n}", flush=True)
                while True:
                    time.sleep(1)  # holds at 90 % until SIGKILLed
    return 0


if __name__ == "__main__":
    sys.exit(main())
