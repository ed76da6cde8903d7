"""transformers' ``Trainer`` over a ``taskq.torch.DataLoader``, for tests/frameworks/test_frameworks.py.

Usage: hf_trainer_proc.py URL JOB LOG_DIR MAX_STEPS [--every K] [--kill-at S] [--resume CKPT]
    [--no-flags | --no-callback]

A one-weight ``torch.nn.Module`` (no hub download) and ``get_train_dataloader`` returning
taskq's loader. By default the user code of older docs: ``get_resumed_dataloader``
returning the loader as it is and ``ignore_data_skip=True`` (the loader resumes by its
state, not by skipping batches), a ``TrainerCallback`` saving ``loader.state_dict()``
into every checkpoint directory and ``loader.load_state_dict`` before
``train(resume_from_checkpoint=CKPT)``. ``--no-flags``: none of it (the loader's
integration keeps its state in the Trainer's checkpoints and loads it on resume:
taskq/torchdata/frameworks.py). ``--no-callback``: the no-skip code without the callback
and the load (a user who forgot them). Every step appends ``{"step", "pass", "rows", "padding"}`` to LOG_DIR/rank<r>.jsonl
before it trains, and the loss it trained on to LOG_DIR/loss<r>.jsonl. ``--kill-at S``: SIGKILL on entering step S. Under ``torchrun`` (RANK
set) the Trainer runs DDP on gloo; the loader, made without flags, finds the Trainer and
steps evenly (a rank out first steps on repeats, their loss x 0 by the loader) and
checkpoints collectively (every rank's ``on_save`` asks for its state, rank 0 writes it).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch_helpers import dump_if_hung, framework_args, jsonl_reader, rows_of  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

import taskq  # noqa: E402
import taskq.torch  # noqa: E402

STATE = "taskq_loader.pt"


class Net(torch.nn.Module):
    def __init__(self, loader: taskq.torch.DataLoader, log: str, kill_at: int | None):
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)
        self.loader, self.log, self.kill_at, self.step = loader, log, kill_at, 0

    def forward(self, f: torch.Tensor, i: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.kill_at is not None and self.step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        padding = self.loader.batch_is_padding
        entry = {
            "step": self.step,
            "pass": self.loader.batch_pass,
            "rows": [] if padding else rows_of({"f": f, "i": i}),
            "padding": padding,
        }
        with open(self.log, "a") as out:
            out.write(json.dumps(entry) + "\n")
        self.step += 1
        loss = self.lin(i.float().unsqueeze(1)).pow(2).mean()
        # a padding batch (a repeat, to step beside the other ranks): the loader's
        # integration weights the loss compute_loss returns by 0
        return {"loss": loss}


class LoaderState(TrainerCallback):
    """The loader's state beside the Trainer's own in every checkpoint directory."""

    def __init__(self, loader: taskq.torch.DataLoader) -> None:
        self.loader = loader

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        loader_state = self.loader.state_dict()  # collective: every rank is here
        if state.is_world_process_zero:
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}", STATE)
            torch.save(loader_state, path)


class TaskqTrainer(Trainer):
    def __init__(self, loader: taskq.torch.DataLoader, loss_log: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.taskq_loader = loader
        self.loss_log = loss_log

    def training_step(self, model: Any, inputs: Any, *args: Any, **kw: Any) -> Any:
        # the loss the step trained on (after the loader's weighting of a padding batch)
        loss = super().training_step(model, inputs, *args, **kw)
        entry = {"padding": self.taskq_loader.batch_is_padding, "loss": float(loss)}
        with open(self.loss_log, "a") as out:
            out.write(json.dumps(entry) + "\n")
        return loss

    def get_train_dataloader(self) -> Any:
        return self.taskq_loader


class SkipNothingTrainer(TaskqTrainer):
    def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
        return dataloader  # the loader's state says where the pass resumes


def main() -> int:
    dump_if_hung()
    ap = framework_args()
    ap.add_argument("max_steps", type=int)
    form = ap.add_mutually_exclusive_group()
    form.add_argument("--no-flags", action="store_true")
    form.add_argument("--no-callback", action="store_true")
    a = ap.parse_args()
    user_code = not (a.no_flags or a.no_callback)
    ds = taskq.torch.TaskDataset(a.job, url=a.url, reader=jsonl_reader)
    # no flags: the loader finds the Trainer when it iterates (even_steps, pass_end,
    # the padding's weight over several ranks) and when on_save asks for its state
    # (collective over several ranks): taskq/torchdata/frameworks.py
    loader = taskq.torch.DataLoader(ds, batch_size=4, num_workers=1)
    rank = int(os.environ.get("RANK", "0"))
    model = Net(loader, os.path.join(a.log_dir, f"rank{rank}.jsonl"), a.kill_at)
    if a.resume:
        model.step = int(a.resume.rsplit("-", 1)[1])  # the log's step numbers go on
    if a.resume and user_code:
        loader.load_state_dict(torch.load(os.path.join(a.resume, STATE), weights_only=False))
    targs = TrainingArguments(
        output_dir=os.path.join(a.log_dir, "ckpt"),
        max_steps=a.max_steps,  # the loader has no length
        per_device_train_batch_size=4,
        learning_rate=1e-4,
        save_strategy="steps" if a.every else "no",
        save_steps=a.every or 500,
        ignore_data_skip=not a.no_flags,
        report_to=[],
        use_cpu=True,
        logging_strategy="no",
        disable_tqdm=True,
    )
    loss_log = os.path.join(a.log_dir, f"loss{rank}.jsonl")
    trainer = (TaskqTrainer if a.no_flags else SkipNothingTrainer)(
        loader,
        loss_log,
        model=model,
        args=targs,
        callbacks=[LoaderState(loader)] if user_code else [],
    )
    trainer.train(resume_from_checkpoint=a.resume)
    loader.close()
    # torchrun: the DDP-wrapped model goes first, then the process group, both before the
    # interpreter's exit (left to it, a rank aborted: "terminate called without an active
    # exception"; with the group destroyed first, a rank hung in the model's teardown)
    accelerator = trainer.accelerator
    del trainer, model
    gc.collect()
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
