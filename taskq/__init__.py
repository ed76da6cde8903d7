"""taskq: a Redis-backed work queue that feeds data-set chunks to elastic ML trainers.

Public names only; see ``admin/client.py`` (admin API) and ``trainer/core.py`` (the trainer).
``taskq.torch`` (the PyTorch integration) is imported on first use, so ``import taskq``
alone never imports torch.
"""

import importlib
from types import ModuleType

from taskq.admin.client import Client, connect
from taskq.trainer.core import Trainer

from .errors import (
    AllTasksDead,
    BacklogFull,
    ConnectionLost,
    CorruptData,
    DataError,
    Draining,
    InvalidInput,
    JobCancelled,
    JobCompleted,
    JobExists,
    JobNotFound,
    LeaseLost,
    PassIncomplete,
    PassMismatch,
    RedisOutOfMemory,
    TaskqError,
    WorkerLost,
)
from .models import JobConfig, JobStatus, Task

__version__ = "0.1.0"


def __getattr__(name: str) -> ModuleType:
    """``taskq.torch`` after a plain ``import taskq`` (PEP 562): imported on first use.

    Raises:
        AttributeError: any other unknown name.
    """
    if name == "torch":
        # (not `from . import torch`: that asks this module for the attribute again)
        return importlib.import_module("taskq.torch")  # sets taskq.torch for later uses
    raise AttributeError(f"module 'taskq' has no attribute {name!r}")


__all__ = [
    "AllTasksDead",
    "BacklogFull",
    "Client",
    "ConnectionLost",
    "CorruptData",
    "DataError",
    "Draining",
    "InvalidInput",
    "JobCancelled",
    "JobCompleted",
    "JobConfig",
    "JobExists",
    "JobNotFound",
    "JobStatus",
    "LeaseLost",
    "PassIncomplete",
    "PassMismatch",
    "RedisOutOfMemory",
    "Task",
    "TaskqError",
    "Trainer",
    "WorkerLost",
    "connect",
    "__version__",
]
