"""The handles part of ``Client``: a job's handle by name, plain or sharded, told apart in
this one place.

``open_job(client, name)`` is a ``ShardedJob`` (sharded_job.py) when a shard-set record
of that name exists, else a ``PlainJob`` (jobs.py); both are ``caller.Job``.
``Client.job(name)`` calls it; so does ``Handles``, the part the other parts open
handles through: it holds the client by a weak reference (the client holds its parts;
no reference cycle keeps a dropped client and its connections alive). Every ``Client``
method taking a job name, every CLI command, the exporter and the trainers' probe go
through a handle.

Data flow: client.py / client_reads.py / client_jobs.py / client_ops.py ->
client_handles.py -> shardset.py (the record) -> jobs.py / sharded_job.py (the handle)
-> Redis.
"""

from __future__ import annotations

import weakref

from taskq.admin import shardset
from taskq.admin.caller import Caller, Job
from taskq.admin.jobs import PlainJob, check_name
from taskq.admin.sharded_job import ShardedJob


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


class Handles:
    """The handles part of ``Client``: the client it belongs to (weakly) and ``job``.

    Args:
        client: the whole client, as the engine modules see it.
    """

    def __init__(self, client: Caller) -> None:
        self._client = weakref.ref(client)

    @property
    def client(self) -> Caller:
        """The client (alive while one of its methods runs)."""
        client = self._client()
        if client is None:  # pragma: no cover - a part outliving its client
            raise ReferenceError("the taskq.Client of this part is gone")
        return client

    def job(self, name: str) -> Job:
        """The handle of job ``name`` (``open_job``)."""
        return open_job(self.client, name)
