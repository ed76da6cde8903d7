"""A trainer process reading a stream job through ``taskq.torch`` (tests/streams/test_streams.py).

Usage: torch_stream_proc.py URL JOB WORKERS LOG

Prints "READY" once its loader iterates, then trains (batches of 4, a 5 ms step) until
the stream is sealed and drained, writing each row the loop took to LOG as "<file> <line>"
and printing "DONE <state>".
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch_helpers import jsonl_reader, rows_of  # noqa: E402

import taskq.torch  # noqa: E402


def main() -> int:
    url, job, workers, log_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    ds = taskq.torch.TaskDataset(
        job, url=url, reader=jsonl_reader, shuffle=False, trainer_options={"worker_ttl": 2.0}
    )
    print("READY", flush=True)
    with (
        open(log_path, "a", buffering=1) as log,
        taskq.torch.DataLoader(ds, batch_size=4, num_workers=workers, tasks_ahead=2) as loader,
    ):
        for batch in loader:
            log.write("".join(f"{f} {i}\n" for f, i in rows_of(batch)))
            time.sleep(0.005)  # a training step
        print(f"DONE {loader.state}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
