"""The connection part of ``Client``: Redis, the key prefix, the function library, the keys.

``Connection`` owns what every other part calls through: the redis-py client (built from
a URL, or given), the URL (for messages), the key prefix, the function library on that
connection (engine/transport.py), the job keys (one ``JobKeys`` per job, kept), and ``run`` (one
Lua script call with its errors raised); the Redis checks (``ping``, the
``maxmemory-policy``) and the job index (``list_jobs``, ``repair_index``). It knows no
job handle: the reads (client_reads.py), the job's life (client_jobs.py) and the running
job's verbs (client_ops.py) are the other parts, composed by ``Client`` (client.py).

Data flow: client.py (and every part through it) -> client_conn.py -> engine/transport.py ->
Redis.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

from taskq import errors
from taskq.admin import stats
from taskq.config import check_memory_policy
from taskq.engine.connection import REDIS_ERRORS, check_given_client, make_redis, translate
from taskq.engine.contract import Code, raise_for
from taskq.engine.transport import Scripts
from taskq.keys import (
    JobKeys,
    job_from_meta_key,
    jobs_index,
    meta_pattern,
    prefix,
    shard_sets_index,
    valid_job_name,
)


class Connection:
    """The connection part of ``Client`` (its arguments are ``Client``'s)."""

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
        self.redis: Any
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
        # the job's own key list as it is (the constant part of the call is packed once
        # per verb and key list, engine/transport.py), a new one only with extra keys
        keys: list[Any] = (
            job_keys.script_bytes
            if not extra_keys
            else job_keys.script_bytes + [k.encode() for k in extra_keys]
        )
        try:
            reply = self.scripts.call(verb, keys, args if isinstance(args, list) else list(args))
        except REDIS_ERRORS as e:
            # translated only when it happens: the context manager's enter and exit cost
            # a few µs on every call of a trainer's hot path (bench/HISTORY.md)
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
            return stats.memory_policy(self.redis)

    def check_memory_policy(self) -> None:
        """Refuse a Redis that may evict taskq's keys (unless ``allow_eviction``).

        Raises:
            InvalidConfig: the policy is readable and not ``noeviction``.
        """
        if not self.allow_eviction:
            check_memory_policy(self.memory_policy(), self.url)

    # -- the job index --------------------------------------------------------------
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

    def repair_index(self) -> tuple[list[str], list[str]]:
        """Rebuild the job index from the jobs' meta keys (after an interrupted create
        or delete). Returns (added, removed)."""
        with translate(self.url):
            found = set()
            for key in self.redis.scan_iter(match=meta_pattern(self.prefix), count=1000):
                job = job_from_meta_key(key, self.prefix)
                if job:
                    found.add(job)
            listed = set(self.redis.smembers(jobs_index(self.prefix)))
            added, removed = sorted(found - listed), sorted(listed - found)
            if added:
                self.redis.sadd(jobs_index(self.prefix), *added)
            if removed:
                self.redis.srem(jobs_index(self.prefix), *removed)
        return added, removed
