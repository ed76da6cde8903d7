"""The admin API: ``Client``, the connection, job creation and the job index; every verb
of a job is the ``Job``'s (jobs.py): ``client.job(name).retry(...)``.

``Client`` is the connection (``client.connection``, engine/connection.py's ``Connection``:
the redis-py client, URL, key prefix, function library, job keys, ``run``; the client
itself shows what a user looks at: ``redis``, ``url``, ``prefix``, ``keys(job)``,
``ping()``), job creation (``create_job``: a
``JobConfig``, jobs.py's ``create``), the job index (``list_jobs``, ``repair_index``),
the Redis checks, and ``job(name)``: the job's handle, told plain or sharded here once,
by the shard-set record. The short forms ``client.VERB(name, ...)`` (``SHORT_FORMS``)
are generated from the surface, not written. The CLI calls ``job(name)``'s verbs and
makes no Redis calls of its own.

Data flow: CLI / user code -> client.py -> jobs.py (``Job``) -> engine/connection.py
(``run``) -> engine/transport.py -> Redis; reads -> stats.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from taskq.admin import jobs, stats
from taskq.admin.jobs import STAGING_BATCH as STAGING_BATCH
from taskq.admin.jobs import STAGING_TTL_S as STAGING_TTL_S
from taskq.admin.jobs import Job, check_name
from taskq.admin.shardset import load
from taskq.config import check_memory_policy, encode_tasks, validate_config
from taskq.engine.connection import Connection, translate
from taskq.keys import (
    JobKeys,
    job_from_meta_key,
    jobs_index,
    meta_pattern,
    shard_sets_index,
)
from taskq.models import JobConfig, JobStatus

__all__ = ["Client", "connect", "encode_tasks", "validate_config"]


class Client:
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
        self.connection = Connection(
            url,
            redis_client=redis_client,
            key_prefix=key_prefix,
            cluster=cluster,
            retries=retries,
            socket_timeout=socket_timeout,
            allow_eviction=allow_eviction,
        )

    # -- the connection: what a user looks at; the engine's side is ``self.connection``'s
    # -- (engine/connection.py) --
    @property
    def redis(self) -> Any:
        """The redis-py client: ``redis.Redis``, ``RedisCluster`` or a Sentinel master."""
        return self.connection.redis

    @property
    def url(self) -> str:
        """The Redis URL (``"<given client>"`` for a ``redis_client``)."""
        return self.connection.url

    @property
    def prefix(self) -> str:
        """The prefix of every taskq key (``TASKQ_PREFIX``), to find a job's keys in Redis."""
        return self.connection.prefix

    def keys(self, job: str) -> JobKeys:
        """The Redis keys of ``job`` (``JobKeys``: ``.meta``, ``.progress``, ``.script``, the
        keys a raw ``FCALL`` takes, ...), for looking at a job in Redis.

        Raises:
            InvalidInput: a bad name.
        """
        return self.connection.keys(job)

    def ping(self) -> None:
        """Raise ``ConnectionLost`` unless Redis answers."""
        self.connection.ping()

    def memory_policy(self) -> str | None:
        """Redis's ``maxmemory-policy`` (the worst of a cluster's nodes), or None when
        this user may not read it (INFO is an admin command under the ACLs of
        deploy/redis/acl.conf).

        Raises:
            ConnectionLost: Redis is unreachable.
        """
        with translate(self.url):
            return stats.memory_policy(self.redis)

    def check_memory_policy(self) -> None:
        """Refuse a Redis that may evict taskq's keys (unless ``allow_eviction``).

        Raises:
            InvalidConfig: the policy is readable and not ``noeviction``.
        """
        if not self.connection.allow_eviction:
            check_memory_policy(self.memory_policy(), self.url)

    # -- the job index ------------------------------------------------------------
    def list_jobs(self, sharded: bool = False) -> list[str]:
        """Names of the jobs in the index, sorted (a sharded job's shards are jobs there).

        Args:
            sharded: add the sharded jobs' own names (``taskq job list`` shows both).
        """
        with translate(self.url):
            prefix = self.connection.prefix
            names = set(self.redis.smembers(jobs_index(prefix)))
            if sharded:
                names |= set(self.redis.smembers(shard_sets_index(prefix)))
        return sorted(names)

    def repair_index(self) -> tuple[list[str], list[str]]:
        """Rebuild the job index from the jobs' meta keys (after an interrupted create
        or delete). Returns (added, removed)."""
        prefix = self.connection.prefix
        with translate(self.url):
            found = set()
            for key in self.redis.scan_iter(match=meta_pattern(prefix), count=1000):
                job = job_from_meta_key(key, prefix)
                if job:
                    found.add(job)
            listed = set(self.redis.smembers(jobs_index(prefix)))
            added, removed = sorted(found - listed), sorted(listed - found)
            if added:
                self.redis.sadd(jobs_index(prefix), *added)
            if removed:
                self.redis.srem(jobs_index(prefix), *removed)
        return added, removed

    # -- jobs -----------------------------------------------------------------------
    def job(self, name: str) -> Job:
        """The handle of job ``name`` (jobs.py): sharded when a shard-set record of that
        name exists, else plain; its verbs (status, audit, tasks, retry, next, reset,
        pause, resume, cancel, delete, replace, checkpoint, checkpoints, rewind, events,
        workers, append, seal, ...) work the same for both.

        Raises:
            InvalidInput: a bad name. ConnectionLost. CorruptData: an unreadable
            shard-set record.
        """
        check_name(name)
        return Job(self.connection, load(self.connection, name) or name)

    def create_job(
        self,
        name: str,
        chunks: Iterable[Any] = (),
        config: JobConfig | None = None,
        *,
        replace: bool = False,
        progress: Callable[[int, int], None] | None = None,
        **settings: Any,
    ) -> JobStatus:
        """Create (or replace) a job: validated first, staged, then flipped live at once.

        Args:
            name: job name, ``[A-Za-z0-9._-]{1,64}`` (a sharded job's: shorter,
                ``keys.MAX_SHARDED_NAME``).
            chunks: JSON-able chunk descriptors, in order (a stream's may be empty, a
                mixed job's, ``mix={source: weight}``, is: its tasks are its sources').
            config: the job's settings (``JobConfig``: every setting, documented there);
                the defaults when None.
            replace: replace an existing job (a new incarnation).
            progress: called with (tasks_written, total) while staging.
            settings: ``JobConfig`` fields over ``config``, e.g. ``passes=3``,
                ``shards=4`` (a ``ShardedStatus`` is returned), ``stream=True``,
                ``mix={"web": 0.5, "code": 0.5}`` (docs/mixing.md).

        Returns:
            The new job's status.

        Raises:
            InvalidInput: bad name, config or chunks, a setting ``JobConfig`` does not
                have (nothing written); InvalidConfig (a subclass) for a setting out of
                range or a Redis that may evict keys (see ``allow_eviction``).
            JobExists: the name is taken and ``replace`` is false (pass ``replace=True``).
            ConnectionLost: Redis is unreachable.
        """
        cfg = JobConfig.of(config, **settings)
        return jobs.create(self.connection, name, chunks, cfg, replace, progress)


#: The short forms ``client.SHORT(name, ...)``, each ``client.job(name).VERB(...)``
#: (generated below; new code calls the job's verb).
SHORT_FORMS = {
    **{
        v: v
        for v in (
            "status task tasks_page iter_tasks tasks workers events latest_events "
            "first_lease_ms audit retry revoke drain checkpoint checkpoints rewind "
            "advance_clock reap"
        ).split()
    },
    "delete_job": "delete",
    "cancel_job": "cancel",
    "pause_job": "pause",
    "resume_job": "resume",
    "next_pass": "next",
    "reset_pass": "reset",
}


def _short_form(short: str, verb: str) -> Callable[..., Any]:
    @functools.wraps(getattr(Job, verb))
    def call(self: Client, name: str, /, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.job(name), verb)(*args, **kwargs)

    call.__name__ = call.__qualname__ = short
    call.__doc__ = f"``client.job(name).{verb}(...)``: {getattr(Job, verb).__doc__}"
    return call


for _short, _verb in SHORT_FORMS.items():
    setattr(Client, _short, _short_form(_short, _verb))


def connect(url: str | None = None, **kwargs: Any) -> Client:
    """A ``Client`` for ``url`` (or ``TASKQ_REDIS_URL``, or the local default).

    Keyword arguments are those of ``Client``.
    """
    return Client(url, **kwargs)
