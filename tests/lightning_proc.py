"""A Lightning ``Trainer.fit`` over a ``taskq.torch.DataLoader``, for tests/frameworks/test_frameworks.py.

Usage: lightning_proc.py URL JOB LOG_DIR DEVICES [--every K] [--kill-at S] [--resume CKPT]
    [--batch-size B] [--ahead A]

The loader as a new user writes it: ``taskq.torch.DataLoader(ds, batch_size=B)``, no
flags, no callback, a loss not weighted by hand: the loader finds Lightning's ``fit``
and sets what it needs (taskq/torchdata/frameworks.py). ``--ahead A``: a contradicting
``ahead`` given by hand (refused at the first ``iter()``).

DDP on CPU (gloo) with DEVICES processes (Lightning's launcher starts the other ranks by
running this script again), a one-weight model, one pass per epoch (``max_epochs`` =
the job's passes). Every ``training_step`` appends ``{"step", "pass", "rows"}`` to
LOG_DIR/rank<r>.jsonl, flushed, before the step: the loop's own log of what it trained;
``on_train_batch_end`` appends the loss Lightning stepped on to LOG_DIR/loss<r>.jsonl.
``--every K``: Lightning's ``ModelCheckpoint`` every K optimizer steps into LOG_DIR/ckpt
(its checkpoint holds the loader's ``state_dict()``). ``--kill-at S``: every rank
SIGKILLs itself on entering step S (nothing of that step is trained). ``--resume``:
``fit(ckpt_path=CKPT)``: Lightning restores the loader's state (a rewind of the job).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch_helpers import dump_if_hung, framework_args, jsonl_reader, rows_of  # noqa: E402

import taskq  # noqa: E402
import taskq.torch  # noqa: E402


class Net(L.LightningModule):
    def __init__(self, loader: taskq.torch.DataLoader, log_dir: str, kill_at: int | None):
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)
        self.loader = loader
        self.log_dir = log_dir
        self.kill_at = kill_at

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        if self.kill_at is not None and self.global_step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        padding = self.loader.batch_is_padding
        entry = {
            "step": self.global_step,
            "epoch": self.current_epoch,
            "pass": self.loader.batch_pass,
            "rows": [] if padding else rows_of(batch),
            "padding": padding,
        }
        with open(os.path.join(self.log_dir, f"rank{self.global_rank}.jsonl"), "a") as f:
            f.write(json.dumps(entry) + "\n")
        # (a padding batch's loss is weighted by 0 by the loader's integration)
        return self.lin(batch["i"].float().unsqueeze(1)).pow(2).mean()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        entry = {"padding": self.loader.batch_is_padding, "loss": float(outputs["loss"])}
        with open(os.path.join(self.log_dir, f"loss{self.global_rank}.jsonl"), "a") as f:
            f.write(json.dumps(entry) + "\n")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-4)


def main() -> int:
    dump_if_hung()
    ap = framework_args()
    ap.add_argument("devices", type=int)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--ahead", type=int)
    a = ap.parse_args()
    passes = taskq.Client(a.url).status(a.job, summaries=0).passes
    ds = taskq.torch.TaskDataset(a.job, url=a.url, reader=jsonl_reader)
    # no flags: Lightning's loop fetches one batch ahead of its step, asks every rank
    # for the loader's state at a checkpoint, and its DDP needs every rank to step as
    # often as the others; the loader finds fit on its stack and sets all of it, the
    # SIGTERM handler and the padding batch's weight too (docs/frameworks.md)
    extra = {} if a.ahead is None else {"ahead": a.ahead}
    loader = taskq.torch.DataLoader(ds, batch_size=a.batch_size, num_workers=1, **extra)
    callbacks: list[L.Callback] = []
    if a.every:
        callbacks.append(
            ModelCheckpoint(
                dirpath=os.path.join(a.log_dir, "ckpt"),
                every_n_train_steps=a.every,
                save_top_k=-1,
            )
        )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=a.devices,
        strategy="ddp" if a.devices > 1 else "auto",
        max_epochs=passes,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(a.every),
    )
    trainer.fit(Net(loader, a.log_dir, a.kill_at), loader, ckpt_path=a.resume)
    loader.close()
    # DDP: the trainer (and the DDP-wrapped model it holds) goes first, then the process
    # group, both before the interpreter's exit (docs/frameworks.md, "Process groups")
    del trainer
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
