"""A trainer process over a ``taskq.torch.DataLoader`` for the signal tests.

Usage: torch_sigterm_proc.py URL JOB WORKERS [--no-with]

Trains (batches of 4, a 20 ms step); the 10th step prints "STEPS 10" and lasts until a
signal ends the process (the batch is in the step: not taken yet). ``--no-with``: the loader is not in a ``with``
block (what SIGTERM does then rests on the interpreter's exit).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch_helpers import jsonl_reader  # noqa: E402

import taskq.torch  # noqa: E402


def main() -> int:
    url, job, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ds = taskq.torch.TaskDataset(job, url=url, reader=jsonl_reader, shuffle=False)
    loader = taskq.torch.DataLoader(ds, batch_size=4, num_workers=workers, tasks_ahead=4)
    steps = 0

    def train() -> None:
        nonlocal steps
        for _batch in loader:
            steps += 1
            if steps == 10:
                print(f"STEPS {steps}", flush=True)
                time.sleep(60)  # holds until signalled
            time.sleep(0.02)  # a training step

    if "--no-with" in sys.argv:
        train()
    else:
        with loader:
            train()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
