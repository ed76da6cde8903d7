"""The admin API: create, inspect, advance, retry, cancel and delete jobs.

The CLI calls this module and makes no Redis calls of its own; every state change is
one Lua script call (scripts.py), every read goes through stats.py.

``Client`` is built in parts: its connection and reads (``client_conn.py``), creating and
ending jobs (``client_jobs.py``), operating a running job: passes, tasks, checkpoints
(``client_ops.py``); this module has its construction, ``job(name)`` (the one place a
plain job and a sharded one are told apart: jobs.py) and ``connect``. Every method that
takes a job name is the job handle's verb.

Data flow: CLI / user code -> client.py -> jobs.py (the job's handle) -> scripts.py ->
Redis; reads -> stats.py.
"""

from __future__ import annotations

from typing import Any

# re-exported: the staging bounds are read from here (tests, bench)
from .client_jobs import STAGING_BATCH as STAGING_BATCH
from .client_jobs import STAGING_TTL_S as STAGING_TTL_S
from .client_ops import ClientOps
from .config import encode_tasks, validate_config
from .connection import check_given_client, make_redis
from .jobs import Job, open_job
from .keys import JobKeys, prefix
from .scripts import Scripts

__all__ = ["Client", "connect", "encode_tasks", "validate_config"]


class Client(ClientOps):
    """A connection to one Redis (or cluster) holding taskq jobs.

    Args:
        url: Redis URL; ``TASKQ_REDIS_URL`` or ``redis://127.0.0.1:6379/0`` by default.
        redis_client: an already configured redis-py client to use instead: a
            ``redis.Redis``, a ``RedisCluster`` or a Sentinel ``master_for`` client, built
            with ``decode_responses=True`` (taskq reads every reply as str). ``url``,
            ``cluster``, ``retries`` and ``socket_timeout`` are then the client's own
            business and are ignored.
        key_prefix: overrides ``TASKQ_PREFIX``.
        cluster: force the cluster client.
        retries: connection retries per command (bounded, exponential backoff).
        socket_timeout: seconds before a Redis call gives up on its answer.
        allow_eviction: let ``create_job`` run on a Redis whose maxmemory-policy may
            evict keys (it refuses by default: eviction silently drops leases).

    Raises:
        InvalidInput: a bad URL; a ``redis_client`` built without
            ``decode_responses=True``, an asyncio one, or not a redis-py client at all
            (refused here, before anything is sent).
        ConnectionLost: a cluster URL whose nodes cannot be reached.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        redis_client: Any = None,
        key_prefix: str | None = None,
        cluster: bool | None = None,
        retries: int = 6,
        socket_timeout: float = 10.0,
        allow_eviction: bool = False,
    ) -> None:
        self.allow_eviction = allow_eviction
        if redis_client is not None:
            check_given_client(redis_client)
            self.redis = redis_client
            self.url = "<given client>"
        else:
            self.redis, self.url = make_redis(
                url, retries=retries, socket_timeout=socket_timeout, cluster=cluster
            )
        self.prefix = key_prefix or prefix()
        self.scripts = Scripts(self.redis)
        self._keys: dict[str, JobKeys] = {}

    def job(self, name: str) -> Job:
        """The handle of job ``name``, plain or sharded, whose verbs (status, audit,
        tasks, retry, next, reset, pause, resume, cancel, delete, replace, checkpoint,
        checkpoints, rewind, events, workers) work the same for both (jobs.py). Every
        method of this class that takes a job name goes through it.

        Raises:
            InvalidInput: a bad name. ConnectionLost.
        """
        return open_job(self, name)


def connect(url: str | None = None, **kwargs: Any) -> Client:
    """A ``Client`` for ``url`` (or ``TASKQ_REDIS_URL``, or the local default).

    Keyword arguments are those of ``Client``.
    """
    return Client(url, **kwargs)
