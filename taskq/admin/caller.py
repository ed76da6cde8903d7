"""What the modules below the admin client use of it: ``Link``, ``Caller``, ``Job``, ``Admin``.

Four ``typing.Protocol`` s, so that no module below client.py imports it (no import
circle, also at type level): ``Link`` is one Redis connection, the job keys and ``run``
— one script call — which is all a trainer's wire needs; ``Caller`` is the engine's side
of a ``taskq.Client`` (a ``Link``, its function library, and the two client verbs the
engine modules call back: ``status`` and ``create_job``);
``Job`` is the verbs of one job's handle (``Client.job(name)``: jobs.py, sharded_job.py);
``Admin`` adds what the operating modules (exporter.py, reaper.py) read: the handle, the
job index, events, one reap step. ``taskq.Client`` (client.py) satisfies all four; a
test double may satisfy one.

Data flow: none at run time (types only): barrier.py, checkpoints.py, stats.py,
shardset.py, sharded*.py, jobs.py, protocol.py, exporter.py, reaper.py -> caller.py.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Any, Protocol

from taskq.engine.contract import PAGE_MAX
from taskq.engine.transport import Scripts
from taskq.keys import JobKeys
from taskq.models import AppendResult, JobStatus

#: What ``rewind`` takes: a checkpoint's id, or the record ``checkpoint`` returned.
CheckpointRef = str | dict[str, Any]


class Link(Protocol):
    """One connection and one script call: what a trainer's wire (trainer/protocol.py)
    calls through. ``taskq.Client`` and its connection part (``Client.caller``) both are
    one."""

    @property
    def redis(self) -> Any:
        """redis.Redis, RedisCluster or a Sentinel master (untyped replies)."""
        ...

    @property
    def url(self) -> str:
        """The URL, for error messages (``"<given client>"`` for a given one)."""
        ...

    def keys(self, job: str) -> JobKeys:
        """The keys of ``job`` (validates the name)."""
        ...

    def run(
        self,
        job: str,
        verb: str,
        args: Sequence[Any],
        extra_keys: Sequence[str] = (),
        passthrough: Container[int] = (),
    ) -> Any:
        """One operation's script on ``job``; negative codes raise, except
        ``passthrough`` ones."""
        ...


class Caller(Link, Protocol):
    """The engine's side of a ``taskq.Client``: its connection and one script call (a
    ``Link``), the key prefix, the function library, and two client verbs."""

    @property
    def prefix(self) -> str:
        """The key prefix of every taskq key."""
        ...

    @property
    def scripts(self) -> Scripts:
        """The function library on this connection (engine/transport.py)."""
        ...

    def status(self, name: str, summaries: int = 20) -> JobStatus:
        """A snapshot of job ``name`` (``Client.status``)."""
        ...

    def create_job(self, name: str, chunks: Iterable[Any], *args: Any, **settings: Any) -> Any:
        """Create (or replace) a job (``Client.create_job``)."""
        ...


class Job(Protocol):
    """The verbs of one job, plain or sharded (``Client.job(name)``).

    Task ids are the job's own: a sharded job's global ids (task ``i`` of the whole job).
    """

    client: Caller
    name: str

    @property
    def sharded(self) -> bool:
        """True for a job spread over shards."""
        ...

    def parts(self) -> list[str]:
        """The engine jobs it is made of: itself for a plain job, its shards for a
        sharded one (what a per-job ACL rule must cover)."""
        ...

    def status(self, summaries: int = 20) -> JobStatus: ...
    def audit(self) -> dict[str, Any]: ...
    def task(self, task_id: int, history: int = 20) -> dict[str, Any]: ...
    def tasks_page(
        self, state: str = "leased", cursor: str = "0", count: int = PAGE_MAX
    ) -> tuple[list[dict[str, Any]], str]: ...
    def tasks(
        self, state: str = "leased", limit: int = 100, details: bool = False
    ) -> list[dict[str, Any]]: ...
    def retry(self, task_ids: Sequence[int] | None = None) -> int: ...
    def revoke(self, task_id: int) -> bool: ...
    def next(self, expected_pass: int | None = None, force: bool = False) -> int: ...
    def reset(self, expected_pass: int | None = None) -> int: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def cancel(self) -> None: ...
    def delete(self) -> None: ...
    def replace(self, chunks: Iterable[Any], **settings: Any) -> JobStatus: ...
    # keep: checkpoints.DEFAULT_KEEP in both implementations
    def checkpoint(self, keep: int = ..., ckpt: str | None = None) -> dict[str, Any]: ...
    def checkpoints(self) -> list[dict[str, Any]]: ...
    def rewind(self, ckpt: CheckpointRef, once: bool = False, key: str = "") -> bool: ...
    def events(
        self, since: str = "-", count: int = 100, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, str]]]: ...
    def latest_events(self, kind: str, limit: int, scan: int = 1000) -> list[dict[str, str]]: ...
    def first_lease_ms(self) -> int | None: ...
    def workers(self) -> list[dict[str, Any]]: ...
    def drain(self, worker_id: str) -> None: ...
    def reap(
        self, budget: int = 1000, lock_ms: int = 2000, owner: str = ""
    ) -> tuple[int, bool, bool]: ...
    def advance_clock(self, ms: int, silent: bool = False) -> int: ...
    def append(
        self,
        chunks: Iterable[Any],
        ids: Sequence[str] | None = None,
        block: bool = True,
        timeout: float | None = None,
    ) -> AppendResult: ...
    def seal(self) -> int: ...
    def files_appended(self, file_keys: Sequence[str]) -> list[bool]: ...
    def file_appended(self, file_key: str, chunks: int) -> None: ...


class Admin(Caller, Protocol):
    """What the operating modules (exporter, reaper) use of a ``taskq.Client``."""

    def job(self, name: str) -> Job:
        """The handle of job ``name`` (``Client.job``)."""
        ...

    def list_jobs(self, sharded: bool = False) -> list[str]:
        """The job index, sorted (``Client.list_jobs``)."""
        ...

    def memory_policy(self) -> str | None:
        """Redis's ``maxmemory-policy``, None when unreadable."""
        ...

    def latest_events(
        self, name: str, kind: str, limit: int, scan: int = 1000
    ) -> list[dict[str, str]]:
        """The newest ``limit`` events of type ``kind`` (``Client.latest_events``)."""
        ...

    def reap(
        self, name: str, budget: int = 1000, lock_ms: int = 2000, owner: str = ""
    ) -> tuple[int, bool, bool]:
        """Reclaim expired leases of ``name`` once (``Client.reap``)."""
        ...
