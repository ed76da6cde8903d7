"""A Lightning ``Trainer.fit`` over a ``taskq.torch.DataLoader``, for tests/test_frameworks.py.

Usage: lightning_proc.py URL JOB LOG_DIR DEVICES [--every K] [--kill-at S] [--resume CKPT]

DDP on CPU (gloo) with DEVICES processes (Lightning's launcher starts the other ranks by
running this script again), a one-weight model, one pass per epoch (``max_epochs`` =
the job's passes). Every ``training_step`` appends ``{"step", "pass", "rows"}`` to
LOG_DIR/rank<r>.jsonl, flushed, before the step: the loop's own log of what it trained.
``--every K``: Lightning's ``ModelCheckpoint`` every K optimizer steps into LOG_DIR/ckpt
(its checkpoint holds the loader's ``state_dict()``). ``--kill-at S``: every rank
SIGKILLs itself on entering step S (nothing of that step is trained). ``--resume``:
``fit(ckpt_path=CKPT)``: Lightning restores the loader's state (a rewind of the job).
"""

from __future__ import annotations

import argparse
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
from torch_helpers import dump_if_hung, jsonl_reader, rows_of  # noqa: E402

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
        loss = self.lin(batch["i"].float().unsqueeze(1)).pow(2).mean()
        # even_steps: a padding batch steps beside the other ranks, training nothing
        return loss * 0 if padding else loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-4)


class TaskqSigterm(L.Callback):
    """SIGTERM as taskq's loader handles it (``SystemExit(143)`` in the loop, everything
    released at once) instead of Lightning's handler, whose DDP protocol broadcasts from
    inside the handler and can leave the ranks waiting on each other: docs/frameworks.md."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        taskq.torch.leave_on_sigterm()


def main() -> int:
    dump_if_hung()
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("job")
    ap.add_argument("log_dir")
    ap.add_argument("devices", type=int)
    ap.add_argument("--every", type=int)
    ap.add_argument("--kill-at", type=int)
    ap.add_argument("--resume")
    a = ap.parse_args()
    passes = taskq.Client(a.url).status(a.job, summaries=0).passes
    ds = taskq.torch.TaskDataset(a.job, url=a.url, reader=jsonl_reader)
    # Lightning's loop fetches one batch ahead of its step (ahead=1), asks every rank
    # for the loader's state at a checkpoint (collective=True), and its DDP needs every
    # rank to step as often as the others (even_steps=True): docs/frameworks.md
    loader = taskq.torch.DataLoader(
        ds,
        batch_size=4,
        num_workers=int(os.environ.get("LT_WORKERS", "1")),
        pass_end="local",
        ahead=int(os.environ.get("LT_AHEAD", "1")),
        collective=True,
        even_steps=os.environ.get("LT_EVEN", "1") == "1",
    )
    callbacks: list[L.Callback] = [TaskqSigterm()]
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
