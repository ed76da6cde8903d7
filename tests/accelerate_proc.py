"""accelerate's ``Accelerator`` loop over a ``taskq.torch.DataLoader``, for
tests/frameworks/test_frameworks.py.

Usage: accelerate_proc.py URL JOB LOG_DIR [--every K] [--kill-at S] [--resume DIR]
           [--no-flags [--plain-backward]]

``accelerator.prepare(model, optimizer, loader)`` as accelerate's docs show (under
``torchrun``: DDP over gloo, torch's ``Join`` for the ranks' uneven steps), a one-weight
model, one pass per epoch (the job's passes). Every step appends ``{"step", "pass",
"rows"}`` to LOG_DIR/rank<r>.jsonl before it trains: the loop's own log. ``--every K``:
``accelerator.save_state(LOG_DIR/ckpt/step<N>)`` after every K-th step (it holds the
loader's ``state_dict()``). ``--kill-at S``: SIGKILL on entering step S. ``--resume DIR``:
``accelerator.load_state(DIR)`` (a rewind of the job) and the step count from DIR's name.
``--no-flags``: the loader as a new user makes it (``DataLoader(ds, batch_size=4)``), no
``Join``: the loader finds the ``Accelerator`` that prepared it and steps the ranks evenly,
a padding batch's loss x 0 in ``accelerator.backward``; each entry then also says
``"padding"`` (``loader.batch_pass`` is None) and ``"grad"``, the sum of |d loss / d
output| of the model's layer as backward ran (0 for a loss weighted 0).
``--plain-backward``: ``loss.backward()`` instead of ``accelerator.backward(loss)`` (a loop
that weighs nothing).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from torch.distributed.algorithms import Join  # noqa: E402
from torch_helpers import dump_if_hung, framework_args, jsonl_reader, rows_of  # noqa: E402

import taskq  # noqa: E402
import taskq.torch  # noqa: E402


def main() -> int:
    dump_if_hung()
    ap = framework_args()
    ap.add_argument("--no-flags", action="store_true")
    ap.add_argument("--plain-backward", action="store_true")
    a = ap.parse_args()
    passes = taskq.Client(a.url).status(a.job, summaries=0).passes
    accelerator = Accelerator(cpu=True)
    ds = taskq.torch.TaskDataset(a.job, url=a.url, reader=jsonl_reader)
    # pass_end="local": the ranks step unevenly under Join (below). save_state asks every
    # rank for the loader's state: the loader finds accelerate calling and makes it
    # collective (rank 0 checkpoints every rank's steps): taskq/torchdata/frameworks.py
    if a.no_flags:
        loader = taskq.torch.DataLoader(ds, batch_size=4, num_workers=1)
    else:
        loader = taskq.torch.DataLoader(ds, batch_size=4, num_workers=1, pass_end="local")
    model = torch.nn.Linear(1, 1)
    grads: list[float] = []
    model.register_full_backward_hook(
        lambda _m, _gin, gout: grads.append(float(gout[0].abs().sum()))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    assert prepared is loader  # passed through: taskq's loader stays in charge
    step = 0
    if a.resume:
        accelerator.load_state(a.resume)
        step = int(os.path.basename(a.resume).removeprefix("step"))
    log = os.path.join(a.log_dir, f"rank{accelerator.process_index}.jsonl")
    for _ in range(passes):
        # the ranks step unevenly (each takes the tasks it leases): torch's Join, as for
        # DDP (accelerate's join_uneven_inputs does nothing on CPU); a no-op on one process
        join = accelerator.num_processes > 1 and not a.no_flags
        with Join([model]) if join else contextlib.nullcontext():
            for batch in loader:
                if a.kill_at is not None and step == a.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                with open(log, "a") as f:
                    entry = {"step": step, "pass": loader.batch_pass, "rows": rows_of(batch)}
                    f.write(json.dumps(entry) + "\n")
                loss = model(batch["i"].float().unsqueeze(1)).pow(2).mean()
                if a.plain_backward:
                    loss.backward()
                else:
                    accelerator.backward(loss)
                if a.no_flags:
                    entry = {"step": step, "padding": loader.batch_pass is None}
                    entry["grad"] = grads[-1]
                    with open(log.replace(".jsonl", ".grad"), "a") as f:
                        f.write(json.dumps(entry) + "\n")
                optimizer.step()
                optimizer.zero_grad()
                step += 1
                if a.every and step % a.every == 0:
                    accelerator.save_state(os.path.join(a.log_dir, "ckpt", f"step{step}"))
    loader.close()
    # the order docs/frameworks.md ("Process groups") gives: left to the interpreter's
    # exit, gloo's threads can abort a rank ("terminate called without an active
    # exception", exit -6: seen once in CI with this script)
    del model, optimizer
    gc.collect()
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
