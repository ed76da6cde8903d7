"""A ``Client``'s connection and reads: keys, the one script call, status, tasks, events.

``ClientConnection`` is the base of ``Client`` (client.py): the job keys, ``run`` (one
Lua script call with its errors raised), the Redis checks (``ping``, the
``maxmemory-policy``), ``job(name)`` (the job's handle, jobs.py: plain or sharded is
decided there) and the reads by job name (status, task pages, workers, events, audit),
each through the handle. The writes are built on it: creating and ending jobs
(client_jobs.py), passes, tasks and checkpoints (client_ops.py).

Data flow: client.py / client_jobs.py / client_ops.py -> client_conn.py -> scripts.py ->
Redis; reads -> stats.py.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Sequence
from typing import Any

import redis

from . import errors, stats
from .config import check_memory_policy
from .connection import translate
from .jobs import Job, iter_tasks
from .keys import JobKeys, jobs_index, shard_sets_index, valid_job_name
from .models import JobStatus
from .scripts import PAGE_MAX, Code, Scripts, raise_for


class ClientConnection:
    """The connection and reading part of ``Client`` (built by ``Client.__init__``)."""

    redis: Any
    url: str
    prefix: str
    scripts: Scripts
    allow_eviction: bool
    _keys: dict[str, JobKeys]

    # -- plumbing -----------------------------------------------------------------
    def keys(self, job: str) -> JobKeys:
        """The keys of ``job`` (validates the name)."""
        if job not in self._keys:
            if not valid_job_name(job):
                raise errors.InvalidInput(f"bad job name {job!r}: use 1-64 of A-Z a-z 0-9 . _ -")
            self._keys[job] = JobKeys(job, self.prefix)
        return self._keys[job]

    def run(
        self,
        job: str,
        verb: str,
        args: Sequence[Any],
        extra_keys: Sequence[str] = (),
        passthrough: Container[int] = (),
    ) -> Any:
        """Run one operation's script on ``job``; negative codes raise their error, except
        those in ``passthrough``, which the caller handles from the reply."""
        job_keys = self._keys.get(job) or self.keys(job)
        # the job's own key list as it is (one list per job: the constant part of the
        # call is packed once per list, scripts.py), a new one only with extra keys
        keys: list[Any] = (
            job_keys.all_bytes
            if not extra_keys
            else job_keys.all_bytes + [k.encode() for k in extra_keys]
        )
        try:
            reply = self.scripts.call(verb, keys, args if isinstance(args, list) else list(args))
        except redis.exceptions.RedisError as e:
            # translated only when it happens: the context manager's enter and exit cost
            # a few µs on every call of a trainer's hot path (bench/README.md)
            with translate(self.url, job_keys, self.redis):
                raise e
        code = int(reply[0])
        if code < 0 and code not in passthrough:
            raise_for(
                code,
                job,
                reply[1]
                if code == Code.INVALID and len(reply) > 1 and isinstance(reply[1], str)
                else "",
            )
        return reply

    def ping(self) -> None:
        """Raise ``ConnectionLost`` unless Redis answers."""
        with translate(self.url):
            self.redis.ping()

    def memory_policy(self) -> str | None:
        """Redis's ``maxmemory-policy`` (the worst of a cluster's nodes), or None when
        this user may not read it (INFO is an admin command under the ACLs of
        deploy/redis/acl.conf).

        Raises:
            ConnectionLost: Redis is unreachable.
        """
        with translate(self.url):
            return stats.memory_policy(self)

    def check_memory_policy(self) -> None:
        """Refuse a Redis that may evict taskq's keys (unless ``allow_eviction``).

        Raises:
            InvalidConfig: the policy is readable and not ``noeviction``.
        """
        if not self.allow_eviction:
            check_memory_policy(self.memory_policy(), self.url)

    def job(self, name: str) -> Job:
        """The handle of job ``name`` (defined by ``Client``, client.py)."""
        raise NotImplementedError  # pragma: no cover - Client's

    # -- reading ------------------------------------------------------------------
    def status(self, name: str, summaries: int = 20) -> JobStatus:
        """A snapshot of ``name`` (O(1) in its number of tasks; a sharded job: the sums,
        each shard's status in ``.shards``).

        Raises:
            JobNotFound: no such job.
        """
        return self.job(name).status(summaries)

    def list_jobs(self, sharded: bool = False) -> list[str]:
        """Names of the jobs in the index, sorted (a sharded job's shards are jobs there).

        Args:
            sharded: add the sharded jobs' own names (``taskq job list`` shows both).
        """
        with translate(self.url):
            names = set(self.redis.smembers(jobs_index(self.prefix)))
            if sharded:
                names |= set(self.redis.smembers(shard_sets_index(self.prefix)))
        return sorted(names)

    def task(self, name: str, task_id: int, history: int = 20) -> dict[str, Any]:
        """One task of ``name``: state (todo, leased, done, dead), chunks, lease holder,
        failures, attempts, last error, and its latest ``history`` events (a sharded
        job: ``task_id`` is the task's id in the whole job).

        Raises:
            InvalidInput: no such task. JobNotFound, CorruptData.
        """
        return self.job(name).task(task_id, history)

    def tasks_page(
        self, name: str, state: str = "leased", cursor: str = "0", count: int = PAGE_MAX
    ) -> tuple[list[dict[str, Any]], str]:
        """One page of the tasks of the current pass in ``state`` (one bounded call).

        Args:
            name: the job.
            state: todo | leased | done | dead.
            cursor: "0" for the first page, then the cursor the last page returned.
            count: the most rows of this page, 1..``PAGE_MAX`` (a page may hold fewer and
                still not be the last one, as SCAN's do).

        Returns:
            (rows, next cursor); the listing is complete when the cursor is "0".

        Raises:
            InvalidInput: a bad state, cursor or count. JobNotFound.
        """
        return self.job(name).tasks_page(state, cursor, count)

    def iter_tasks(self, name: str, state: str = "leased") -> Iterator[dict[str, Any]]:
        """Every task of the current pass in ``state``, page by page (each page one
        bounded call; a task changing state meanwhile may be listed twice or missed)."""
        return iter_tasks(self.job(name), state)

    def tasks(
        self, name: str, state: str = "leased", limit: int = 100, details: bool = False
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` tasks of the current pass in ``state`` (todo|leased|done|dead),
        read page by page (no call lists more than ``PAGE_MAX``).

        Args:
            details: add each task's ``chunks`` and ``last_error`` (from the newest
                events; bounded).
        """
        return self.job(name).tasks(state, limit, details)

    def workers(self, name: str) -> list[dict[str, Any]]:
        """The registered workers of ``name`` with their lease counts (a sharded job:
        every shard's, each row naming its ``shard``)."""
        return self.job(name).workers()

    def events(
        self, name: str, since: str = "-", count: int = 100, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        """Events after ``since`` ("-" for the oldest kept), oldest first."""
        return self.job(name).events(since, count, block_ms)

    def latest_events(
        self, name: str, kind: str, limit: int, scan: int = 1000
    ) -> list[dict[str, str]]:
        """The newest ``limit`` events of type ``kind`` among the newest ``scan`` events,
        oldest first (bounded)."""
        return self.job(name).latest_events(kind, limit, scan)

    def first_lease_ms(self, name: str) -> int | None:
        """When pass 0's first lease was granted (server ms), if still in the events."""
        return self.job(name).first_lease_ms()

    def audit(self, name: str) -> dict[str, Any]:
        """Per pass: done, dead, skipped, stale rejected, resets, longest lateness; and a
        check that the counters agree with the sets they count (a sharded job: every
        shard's, and whether the shards agree)."""
        return self.job(name).audit()
