"""taskq: a Redis-backed work queue that feeds data-set chunks to elastic ML trainers.

Public names only; see ``client.py`` (admin API) and ``trainer.py`` (the trainer client).
"""

from . import sharded_trainer  # noqa: F401 - sets the implementation behind Trainer(name)
from .client import Client, connect
from .errors import (
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
from .trainer import Trainer

__version__ = "0.1.0"

__all__ = [
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
