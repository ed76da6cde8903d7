"""The handles part of ``Client``: ``open_job``, the one place a plain job and a sharded
one are told apart.

``Client.job(name)`` (client.py) is ``open_job(client, name)``: a ``ShardedJob``
(sharded_job.py) when a shard-set record of that name exists, else a ``PlainJob``
(jobs.py); both are ``caller.Job``. Every other ``Client`` method taking a job name,
every CLI command, the exporter and the trainers' probe go through that handle.

Data flow: client.py -> client_handles.py -> shardset.py (the record) -> jobs.py /
sharded_job.py (the handle) -> Redis.
"""

from __future__ import annotations

from . import shardset
from .caller import Caller, Job
from .jobs import PlainJob, check_name
from .sharded_job import ShardedJob


def open_job(client: Caller, name: str) -> Job:
    """The handle of ``name``: plain or sharded (a shard-set record of that name).

    Raises:
        InvalidInput: a bad name. ConnectionLost. CorruptData: an unreadable shard-set
        record.
    """
    check_name(name)
    sset = shardset.load(client, name)
    if sset is None:
        return PlainJob(client, name)
    return ShardedJob(client, sset)
