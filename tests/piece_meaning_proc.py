"""A ``taskq.torch`` training process for tests/torchdata/test_piece_meaning.py.

Usage: piece_meaning_proc.py URL JOB OUT

Trains with the default ``TaskDataset`` (``shuffle=True``, ``read_task`` as its reader),
batches of 10, no worker processes. After each step it appends the ids of the step's
samples (``{"i": id}`` records) to OUT, one line per step; the 6th step prints "READY"
and lasts until a signal ends the process (that batch is in the step: not taken, not
written).
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import taskq.torch  # noqa: E402


def main() -> int:
    url, job, out = sys.argv[1], sys.argv[2], sys.argv[3]
    ds = taskq.torch.TaskDataset(job, url=url)
    loader = taskq.torch.DataLoader(ds, batch_size=10, num_workers=0, collate_fn=list)
    with loader, open(out, "a", buffering=1) as f:
        for step, batch in enumerate(loader, 1):
            if step == 6:
                print("READY", flush=True)
                time.sleep(60)  # holds until killed
            f.write(json.dumps([s["i"] for s in batch]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
