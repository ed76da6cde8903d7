"""taskq: a Redis-backed work queue that feeds data-set chunks to elastic ML trainers.

Public names only; see ``admin/client.py`` (admin API) and ``trainer/core.py`` (the trainer).
"""

from taskq.admin.client import Client, connect
from taskq.trainer.core import Trainer

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
