"""A trainer process over a ``taskq.torch.DataLoader`` for the signal tests.

Usage: torch_sigterm_proc.py URL JOB WORKERS [--no-with] [--on-a-thread]

Trains (batches of 4, a 20 ms step); the 10th step prints "STEPS 10" and lasts until a
signal ends the process (the batch is in the step: not taken yet). ``--no-with``: the loader is not in a ``with``
block (what SIGTERM does then rests on the interpreter's exit). ``--on-a-thread``: the
10th step also sends the process's SIGTERM to a thread other than the main one, 0.5 s in
(where the kernel puts a process's signal when the main thread has one pending, say a
stopped worker's SIGCHLD).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
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
                if "--on-a-thread" in sys.argv:
                    threading.Thread(target=_sigterm_on_this_thread, daemon=True).start()
                time.sleep(60)  # holds until signalled
            time.sleep(0.02)  # a training step

    if "--no-with" in sys.argv:
        train()
    else:
        with loader:
            train()
    print("DONE", flush=True)
    return 0


def _sigterm_on_this_thread() -> None:
    time.sleep(0.5)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())
