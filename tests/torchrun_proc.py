"""A rank of a real ``torchrun`` run (started by tests/torchdata/test_torchrun_stop.py): DDP on gloo
over a ``taskq.torch.DataLoader`` with 2 workers, slow steps, ``pass_end="local"`` and
``Join``; appends ``<rank> <pid> <file> <line>`` per sample taken to ``LOG`` (argv: url,
job, log path)."""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms import Join
from torch.nn.parallel import DistributedDataParallel
from torch_helpers import jsonl_reader, rows_of

import taskq


def main(url: str, job: str, log_path: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = taskq.torch.TaskDataset(job, url=url, reader=jsonl_reader, seed=rank)
    loader = taskq.torch.DataLoader(ds, batch_size=2, num_workers=2, pass_end="local")
    with open(log_path, "a", buffering=1) as log:
        while loader.state not in ("completed", "cancelled"):
            with Join([model]):
                for batch in loader:
                    model(batch["i"].float().unsqueeze(1)).pow(2).mean().backward()
                    opt.step()
                    opt.zero_grad()
                    log.write("".join(f"{rank} {os.getpid()} {f} {i}\n" for f, i in rows_of(batch)))
                    time.sleep(0.1)  # a training step
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
