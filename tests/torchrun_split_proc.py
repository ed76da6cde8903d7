"""A rank of a real ``torchrun`` run over a job with tail splitting on (started by
tests/torchdata/test_torchrun_split.py): DDP on gloo over a ``taskq.torch.DataLoader`` with 2
workers, batches of one sample, a loader ``seed`` per rank (a piece is read in its
task's order, which the job seeds), ``pass_end="local"`` and ``Join``, rank 0 slower than
rank 1 so a pass's tail splits rank 0's long task; appends ``<rank> <pass> <file> <line>``
per sample to ``LOG`` (argv: url, job, log path).

With ``--ckpt PATH`` (the crash and relaunch test): a launch that finds PATH loads it
first (``loader.load_state_dict``: the job rewinds once for this launch); one that does
not, at its first pass's end, has each rank ``sync()``, meet at a barrier, rank 0 write
``state_dict()`` to PATH and a line ``CKPT`` to the log; ``--crash-after C`` makes rank 1
exit (code 3, no cleanup: a crash) after C batches past the checkpoint or the load, and
the agent then ends rank 0. Log lines carry ``--launch`` as a first field."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms import Join
from torch.nn.parallel import DistributedDataParallel

import taskq.torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("job")
    ap.add_argument("log")
    ap.add_argument("--ckpt")
    ap.add_argument("--crash-after", type=int)
    ap.add_argument("--launch", type=int, default=0)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = taskq.torch.TaskDataset(a.job, url=a.url, seed=rank)  # the job seeds a task's order
    loader = taskq.torch.DataLoader(ds, batch_size=1, num_workers=2, pass_end="local")
    resumed = bool(a.ckpt and os.path.exists(a.ckpt))
    if resumed:
        loader.load_state_dict(json.loads(Path(a.ckpt).read_text()))
    since = 0  # batches past the checkpoint or the load
    prefix = f"{a.launch} " if a.ckpt else ""
    with open(a.log, "a", buffering=1) as log:
        while loader.state not in ("completed", "cancelled"):
            with Join([model]):
                for batch in loader:
                    model(batch["i"].float().unsqueeze(1)).pow(2).mean().backward()
                    opt.step()
                    opt.zero_grad()
                    f, i = int(batch["f"][0]), int(batch["i"][0])
                    log.write(f"{prefix}{rank} {loader.batch_pass} {f} {i}\n")
                    time.sleep(0.04 if rank == 0 else 0.004)  # a training step; rank 0 the slower
                    if a.crash_after is not None and (resumed or since > 0):
                        since += 1
                        if rank == 1 and since >= a.crash_after:
                            os._exit(3)
            if a.ckpt and not resumed and since == 0:
                loader.sync()
                dist.barrier()
                if rank == 0:
                    Path(a.ckpt).write_text(json.dumps(loader.state_dict()))
                    log.write("CKPT\n")
                dist.barrier()
                since = 1
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
