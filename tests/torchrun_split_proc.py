"""A rank of a real ``torchrun`` run over a job with tail splitting on (started by
tests/test_torchrun_split.py): DDP on gloo over a ``taskq.torch.DataLoader`` with 2
workers, batches of one sample, a loader ``seed`` per rank (a piece is read in its
task's order, which the job seeds), ``pass_end="local"`` and ``Join``, rank 0 slower than
rank 1 so a pass's tail splits rank 0's long task; appends ``<rank> <pass> <file> <line>``
per sample to ``LOG`` (argv: url, job, log path)."""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms import Join
from torch.nn.parallel import DistributedDataParallel

import taskq.torch


def main(url: str, job: str, log_path: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = taskq.torch.TaskDataset(job, url=url, seed=rank)  # the job seeds a task's order
    loader = taskq.torch.DataLoader(ds, batch_size=1, num_workers=2, pass_end="local")
    with open(log_path, "a", buffering=1) as log:
        while loader.state not in ("completed", "cancelled"):
            with Join([model]):
                for batch in loader:
                    model(batch["i"].float().unsqueeze(1)).pow(2).mean().backward()
                    opt.step()
                    opt.zero_grad()
                    f, i = int(batch["f"][0]), int(batch["i"][0])
                    log.write(f"{rank} {loader.batch_pass} {f} {i}\n")
                    time.sleep(0.04 if rank == 0 else 0.004)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
