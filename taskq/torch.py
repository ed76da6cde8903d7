"""PyTorch integration: ``TaskDataset`` and the ``DataLoader`` that acks what the loop took.

    ds = taskq.torch.TaskDataset("pretrain", transform=tokenize)
    loader = taskq.torch.DataLoader(ds, batch_size=32, num_workers=4)
    for epoch in range(3):
        for batch in loader:        # ends when the pass is complete for everyone
            step(batch)

``DataLoader(..., acks="commit")`` holds acks and progress until ``loader.commit()``
(a restart from the last checkpoint repeats nothing committed).

Training loop -> taskq.torch -> readers (in DataLoader workers) + one trainer per process
(in the main process). See docs/torch.md; the code is in ``taskq/torchdata/``.
"""

from .torchdata.dataset import TaskDataset, default_reader
from .torchdata.loader import DataLoader
from .torchdata.signals import leave_on_sigterm

__all__ = ["DataLoader", "TaskDataset", "default_reader", "leave_on_sigterm"]
