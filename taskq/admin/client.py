"""The admin API: create, inspect, advance, retry, cancel and delete jobs.

The CLI calls this module and makes no Redis calls of its own; every state change is
one Lua script call (engine/transport.py), every read goes through stats.py.

``Client`` is a facade over parts that each own their state, composed here (no part
inherits from another): the connection (``Connection``, client_conn.py: the redis-py
client, URL, key prefix, function library, job keys, ``run``, the job index), the reads
(``Reads``, client_reads.py), the job's life (``Lifecycle``, client_jobs.py: create,
delete, cancel, pause, resume), the running job's verbs (``Operations``, client_ops.py:
passes, tasks, checkpoints, the clock, reaping) and the handles (``Handles``,
``open_job``, client_handles.py: the one place a plain job and a sharded one are told
apart). Every method that takes a job name is the job handle's verb; each method here
hands its call to its part, whose docstring it carries. A dropped client is freed at once
(the handles part holds it weakly: no reference cycle). The modules below see a
``Client`` through the Protocols of caller.py and import none of this.

Data flow: CLI / user code -> client.py -> client_*.py (the parts) -> client_handles.py
(the job's handle: jobs.py / sharded_job.py) -> engine/transport.py -> Redis; reads -> stats.py.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from taskq.admin import checkpoints
from taskq.admin.caller import Job
from taskq.admin.client_conn import Connection
from taskq.admin.client_handles import Handles, open_job
from taskq.admin.client_jobs import STAGING_BATCH as STAGING_BATCH
from taskq.admin.client_jobs import STAGING_TTL_S as STAGING_TTL_S
from taskq.admin.client_jobs import Lifecycle
from taskq.admin.client_ops import Operations
from taskq.admin.client_reads import Reads
from taskq.config import encode_tasks, validate_config
from taskq.engine.contract import PAGE_MAX
from taskq.engine.transport import Scripts
from taskq.keys import JobKeys
from taskq.models import JobStatus

__all__ = ["Client", "connect", "encode_tasks", "validate_config"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _doc(part_method: Callable[..., Any]) -> Callable[[_F], _F]:
    """The facade's method carries the docstring of the part's method it calls."""

    def carry(method: _F) -> _F:
        method.__doc__ = part_method.__doc__
        return method

    return carry


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
        self._conn = Connection(
            url,
            redis_client=redis_client,
            key_prefix=key_prefix,
            cluster=cluster,
            retries=retries,
            socket_timeout=socket_timeout,
            allow_eviction=allow_eviction,
        )
        handles = Handles(self)  # holds this client weakly: no reference cycle
        self._reads = Reads(handles.job)
        self._life = Lifecycle(self._conn, handles)
        self._ops = Operations(handles.job)

    # -- the connection (client_conn.py) ------------------------------------------
    @property
    def caller(self) -> Connection:
        """The connection part, which the engine's callers (a trainer's wire) call through
        directly: this facade's ``run`` would be one call more on every step."""
        return self._conn

    @property
    def redis(self) -> Any:
        """The redis-py client: ``redis.Redis``, ``RedisCluster`` or a Sentinel master."""
        return self._conn.redis

    @property
    def url(self) -> str:
        """The Redis URL (``"<given client>"`` for a ``redis_client``)."""
        return self._conn.url

    @property
    def prefix(self) -> str:
        """The prefix of every taskq key."""
        return self._conn.prefix

    @property
    def scripts(self) -> Scripts:
        """The function library on this connection (engine/transport.py)."""
        return self._conn.scripts

    @property
    def allow_eviction(self) -> bool:
        """Whether ``create_job`` runs on a Redis that may evict keys."""
        return self._conn.allow_eviction

    @_doc(Connection.keys)
    def keys(self, job: str) -> JobKeys:
        return self._conn.keys(job)

    @_doc(Connection.run)
    def run(
        self,
        job: str,
        verb: str,
        args: Sequence[Any],
        extra_keys: Sequence[str] = (),
        passthrough: Container[int] = (),
    ) -> Any:
        return self._conn.run(job, verb, args, extra_keys, passthrough)

    @_doc(Connection.ping)
    def ping(self) -> None:
        self._conn.ping()

    @_doc(Connection.memory_policy)
    def memory_policy(self) -> str | None:
        return self._conn.memory_policy()

    @_doc(Connection.check_memory_policy)
    def check_memory_policy(self) -> None:
        self._conn.check_memory_policy()

    @_doc(Connection.list_jobs)
    def list_jobs(self, sharded: bool = False) -> list[str]:
        return self._conn.list_jobs(sharded)

    @_doc(Connection.repair_index)
    def repair_index(self) -> tuple[list[str], list[str]]:
        return self._conn.repair_index()

    # -- the handles (client_handles.py) ------------------------------------------
    def job(self, name: str) -> Job:
        """The handle of job ``name``, plain or sharded, whose verbs (status, audit,
        tasks, retry, next, reset, pause, resume, cancel, delete, replace, checkpoint,
        checkpoints, rewind, events, workers) work the same for both (jobs.py,
        sharded_job.py). Every method of this class that takes a job name goes through
        it.

        Raises:
            InvalidInput: a bad name. ConnectionLost.
        """
        return open_job(self, name)

    # -- reading (client_reads.py) ------------------------------------------------
    @_doc(Reads.status)
    def status(self, name: str, summaries: int = 20) -> JobStatus:
        return self._reads.status(name, summaries)

    @_doc(Reads.task)
    def task(self, name: str, task_id: int, history: int = 20) -> dict[str, Any]:
        return self._reads.task(name, task_id, history)

    @_doc(Reads.tasks_page)
    def tasks_page(
        self, name: str, state: str = "leased", cursor: str = "0", count: int = PAGE_MAX
    ) -> tuple[list[dict[str, Any]], str]:
        return self._reads.tasks_page(name, state, cursor, count)

    @_doc(Reads.iter_tasks)
    def iter_tasks(self, name: str, state: str = "leased") -> Iterator[dict[str, Any]]:
        return self._reads.iter_tasks(name, state)

    @_doc(Reads.tasks)
    def tasks(
        self, name: str, state: str = "leased", limit: int = 100, details: bool = False
    ) -> list[dict[str, Any]]:
        return self._reads.tasks(name, state, limit, details)

    @_doc(Reads.workers)
    def workers(self, name: str) -> list[dict[str, Any]]:
        return self._reads.workers(name)

    @_doc(Reads.events)
    def events(
        self, name: str, since: str = "-", count: int = 100, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        return self._reads.events(name, since, count, block_ms)

    @_doc(Reads.latest_events)
    def latest_events(
        self, name: str, kind: str, limit: int, scan: int = 1000
    ) -> list[dict[str, str]]:
        return self._reads.latest_events(name, kind, limit, scan)

    @_doc(Reads.first_lease_ms)
    def first_lease_ms(self, name: str) -> int | None:
        return self._reads.first_lease_ms(name)

    @_doc(Reads.audit)
    def audit(self, name: str) -> dict[str, Any]:
        return self._reads.audit(name)

    # -- the job's life (client_jobs.py) ------------------------------------------
    @_doc(Lifecycle.create_job)
    def create_job(
        self,
        name: str,
        chunks: Iterable[Any],
        chunks_per_task: int = 1,
        passes: int | None = 1,
        worker_ttl: float = 5.0,
        heartbeat_interval: float = 1.0,
        task_timeout: float | str | None = "auto",
        max_failures: int = 3,
        max_attempts: int = 10,
        shuffle: bool = False,
        seed: int = 0,
        auto_advance: bool = True,
        replace: bool = False,
        manual_clock: bool = False,
        progress: Callable[[int, int], None] | None = None,
        backup_leases: bool = False,
        backup_factor: float = 2.0,
        shards: int = 1,
        split_tails: bool = False,
        stream: bool = False,
        max_backlog: int | None = None,
    ) -> JobStatus:
        return self._life.create_job(
            name,
            chunks,
            chunks_per_task=chunks_per_task,
            passes=passes,
            worker_ttl=worker_ttl,
            heartbeat_interval=heartbeat_interval,
            task_timeout=task_timeout,
            max_failures=max_failures,
            max_attempts=max_attempts,
            shuffle=shuffle,
            seed=seed,
            auto_advance=auto_advance,
            replace=replace,
            manual_clock=manual_clock,
            progress=progress,
            backup_leases=backup_leases,
            backup_factor=backup_factor,
            shards=shards,
            split_tails=split_tails,
            stream=stream,
            max_backlog=max_backlog,
        )

    @_doc(Lifecycle.delete_job)
    def delete_job(self, name: str) -> None:
        self._life.delete_job(name)

    @_doc(Lifecycle.cancel_job)
    def cancel_job(self, name: str) -> None:
        self._life.cancel_job(name)

    @_doc(Lifecycle.pause_job)
    def pause_job(self, name: str) -> None:
        self._life.pause_job(name)

    @_doc(Lifecycle.resume_job)
    def resume_job(self, name: str) -> None:
        self._life.resume_job(name)

    # -- the running job (client_ops.py) ------------------------------------------
    @_doc(Operations.next_pass)
    def next_pass(self, name: str, expected_pass: int | None = None, force: bool = False) -> int:
        return self._ops.next_pass(name, expected_pass, force)

    @_doc(Operations.reset_pass)
    def reset_pass(self, name: str, expected_pass: int | None = None) -> int:
        return self._ops.reset_pass(name, expected_pass)

    @_doc(Operations.retry)
    def retry(self, name: str, task_ids: Sequence[int] | None = None) -> int:
        return self._ops.retry(name, task_ids)

    @_doc(Operations.revoke)
    def revoke(self, name: str, task_id: int) -> bool:
        return self._ops.revoke(name, task_id)

    @_doc(Operations.drain)
    def drain(self, name: str, worker_id: str) -> None:
        self._ops.drain(name, worker_id)

    @_doc(Operations.checkpoint)
    def checkpoint(
        self, name: str, keep: int = checkpoints.DEFAULT_KEEP, ckpt: str | None = None
    ) -> dict[str, Any]:
        return self._ops.checkpoint(name, keep, ckpt)

    @_doc(Operations.checkpoints)
    def checkpoints(self, name: str) -> list[dict[str, Any]]:
        return self._ops.checkpoints(name)

    @_doc(Operations.rewind)
    def rewind(
        self, name: str, ckpt: str | dict[str, Any], once: bool = False, key: str = ""
    ) -> bool:
        return self._ops.rewind(name, ckpt, once, key)

    @_doc(Operations.advance_clock)
    def advance_clock(self, name: str, ms: int, silent: bool = False) -> int:
        return self._ops.advance_clock(name, ms, silent)

    @_doc(Operations.reap)
    def reap(
        self, name: str, budget: int = 1000, lock_ms: int = 2000, owner: str = ""
    ) -> tuple[int, bool, bool]:
        return self._ops.reap(name, budget, lock_ms, owner)


def connect(url: str | None = None, **kwargs: Any) -> Client:
    """A ``Client`` for ``url`` (or ``TASKQ_REDIS_URL``, or the local default).

    Keyword arguments are those of ``Client``.
    """
    return Client(url, **kwargs)
