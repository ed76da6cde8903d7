"""One training step of the compose demo: `taskq work demo -- python demo_step.py`.

Where it sits: `taskq work` leases a task, starts this script with the task's JSON on
stdin, and acks the task when the script exits 0 (a non-zero exit fails it). It stands
in for a real trainer's step: it reads the chunks it was given and pretends to train.
"""

from __future__ import annotations

import json
import sys
import time

SECONDS_PER_CHUNK = 0.5


def main() -> int:
    """Read the task from stdin, sleep per chunk, print one line.

    Returns:
        The process exit status: 0 (the task is acked).
    """
    task = json.load(sys.stdin)
    chunks = task.get("chunks", []) if isinstance(task, dict) else task
    time.sleep(SECONDS_PER_CHUNK * max(1, len(chunks)))
    task_id = task.get("id", task.get("task_id", "?")) if isinstance(task, dict) else "?"
    print(f"demo_step: task {task_id}: {len(chunks)} chunk(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
