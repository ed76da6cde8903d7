"""A trainer process over a ``taskq.torch.DataLoader``, for the resume tests.

Usage: torch_resume_proc.py URL JOB OUT WORKERS [--stop N] [--ckpt K --ranks R --rank I
[--extra M]] [--state FILE --key KEY] [--shuffle] [--commit-at C]

Appends each taken batch's rows ("f i" lines) to OUT, flushed per step. ``--stop N``:
after N steps print "STOPPED" and sleep until killed. ``--ckpt K``: at step K every rank
sends what it took (``loader.sync()``), waits for all ``--ranks`` at a file barrier, and
rank 0 writes ``loader.state_dict()`` and the model's step count to OUT.ckpt; a line
"CKPT" marks the point in OUT; after M more steps it prints "STOPPED" and sleeps. At the end it prints "DONE <samples the model trained on>".
``--state FILE``: ``loader.load_state_dict`` of that checkpoint file first.
``--commit-at C``: the loader holds acks for ``commit()`` (``acks="commit"``), called
after step C (a line "COMMIT" marks the point in OUT) and at the end of each iteration;
an iteration that ended "exhausted" (it held uncommitted tasks) is followed by another.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch_helpers import jsonl_reader, rows_of  # noqa: E402

import taskq.torch  # noqa: E402
from taskq.testing import wait_until  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("job")
    ap.add_argument("out")
    ap.add_argument("workers", type=int)
    ap.add_argument("--stop", type=int)
    ap.add_argument("--ckpt", type=int)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--extra", type=int, default=3)
    ap.add_argument("--state")
    ap.add_argument("--key", default="")
    ap.add_argument("--shuffle", action="store_true")
    ap.add_argument("--commit-at", type=int)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    model.register_buffer("seen", torch.zeros((), dtype=torch.long))  # samples trained on
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ds = taskq.torch.TaskDataset(a.job, url=a.url, reader=jsonl_reader, shuffle=a.shuffle)
    acks = "taken" if a.commit_at is None else "commit"
    loader = taskq.torch.DataLoader(
        ds, batch_size=4, num_workers=a.workers, tasks_ahead=2, acks=acks
    )
    if a.state:
        saved = json.loads(Path(a.state).read_text())
        loader.load_state_dict(saved["data"], key=a.key)
        model.seen += saved["seen"]  # stands for load_state_dict of the model
    step = 0
    with open(a.out, "a", buffering=1) as out:
        # an iteration holding uncommitted tasks ends "exhausted" instead of waiting for
        # the pass end (docs/torch.md): commit, then iterate again for the late work
        while True:
            for batch in loader:
                x = batch["i"].float().unsqueeze(1)
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
                step += 1
                model.seen += len(x)
                out.write("".join(f"{f} {i}\n" for f, i in rows_of(batch)))
                if a.commit_at is not None and step == a.commit_at:
                    loader.commit()
                    out.write("COMMIT\n")
                if a.ckpt is not None and step == a.ckpt:
                    _checkpoint(a, loader, out, int(model.seen))
                if (a.stop is not None and step == a.stop) or (
                    a.ckpt is not None and step == a.ckpt + a.extra
                ):
                    print("STOPPED", flush=True)
                    while True:
                        time.sleep(1)  # holds until killed
                time.sleep(0.02)  # a training step
            loader.commit()
            if loader.state != "exhausted":
                break
    print(f"DONE {int(model.seen)}", flush=True)
    return 0


def _checkpoint(
    a: argparse.Namespace, loader: taskq.torch.DataLoader, out: object, seen: int
) -> None:
    loader.sync()  # what this rank took is acked and recorded before the checkpoint
    base = Path(a.out).parent
    (base / f"ready-{a.rank}").write_text(str(seen))
    assert wait_until(lambda: len(list(base.glob("ready-*"))) >= a.ranks, 120, 0.02)
    if a.rank == 0:
        state = loader.state_dict()
        # the data-parallel model's count: what every rank trained on (an allreduce)
        total = sum(int(p.read_text()) for p in base.glob("ready-*"))
        Path(a.out + ".ckpt").write_text(json.dumps({"data": state, "seen": total}))
    assert wait_until(lambda: list(base.glob("*.ckpt")), 120, 0.02)
    out.write("CKPT\n")  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
