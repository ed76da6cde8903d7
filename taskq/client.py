"""The admin API: create, inspect, advance, retry, cancel and delete jobs.

The CLI calls this module and makes no Redis calls of its own; every state change is
one Lua script call (scripts.py), every read goes through stats.py.

Data flow: CLI / user code -> client.py -> scripts.py -> Redis; reads -> stats.py.
"""

from __future__ import annotations

import itertools
import math
import secrets
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from typing import Any

import redis

from . import checkpoints, errors, stats
from .config import check_memory_policy, encode_tasks, validate_config
from .connection import check_given_client, make_redis, translate
from .keys import (
    JobKeys,
    job_from_meta_key,
    jobs_index,
    meta_pattern,
    prefix,
    shard_set_key,
    valid_job_name,
)
from .keys import MetaField as F
from .models import JobConfig, JobStatus
from .scripts import MAX_RETRY, PAGE_MAX, Code, Scripts, raise_for

STAGING_TTL_S = 3600
STAGING_BATCH = 500  # fields per HSET while staging: each one a short command

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
        job_keys = self.keys(job)
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

    # -- jobs ---------------------------------------------------------------------
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
    ) -> JobStatus:
        """Create (or replace) a job: validated first, staged, then flipped live at once.

        Args:
            name: job name, ``[A-Za-z0-9._-]{1,64}``.
            chunks: JSON-able chunk descriptors, in order.
            chunks_per_task: chunks per task (the unit leased).
            passes: number of passes, or None to run until cancelled.
            worker_ttl: seconds of silence after which a worker is lost.
            heartbeat_interval: seconds between a trainer's heartbeats (< worker_ttl).
            task_timeout: "auto", seconds, or None for no cap on one lease's run time.
            max_failures: failures (fail, timeout) before a task is dead.
            max_attempts: started leases ending without an ack before a task is dead.
            shuffle: a seeded new order every pass.
            seed: the shuffle seed.
            auto_advance: start the next pass by itself (else wait for ``next_pass``).
            replace: replace an existing job (a new incarnation).
            manual_clock: tests only: the job's clock moves by ``advance_clock``.
            progress: called with (tasks_written, total) while staging.
            backup_leases: at the tail of a pass an idle trainer may take a backup lease
                of a task that has run longer than ``backup_factor`` x the job's median
                task time; the first ack wins (docs/trainers.md, "Tails"). Off by
                default: a backup does the task's work twice, which for a training loop
                means its samples twice in the pass.
            backup_factor: that k (> 1).
            shards: S > 1 spreads the job over S shards on different cluster masters,
                one pass for all (``sharded.create``; it returns a ``ShardedStatus``).

        Returns:
            The new job's status.

        Raises:
            InvalidInput: bad name, config or chunks (nothing written); InvalidConfig
                (a subclass) for a setting out of range or a Redis that may evict keys
                (see ``allow_eviction``).
            JobExists: the name is taken and ``replace`` is false (pass ``replace=True``).
            ConnectionLost: Redis is unreachable.
        """
        if shards != 1:
            from . import sharded

            return sharded.create(  # type: ignore[return-value]
                self,
                name,
                chunks,
                shards,
                chunks_per_task=chunks_per_task,
                passes=passes,
                auto_advance=auto_advance,
                replace=replace,
                worker_ttl=worker_ttl,
                heartbeat_interval=heartbeat_interval,
                task_timeout=task_timeout,
                max_failures=max_failures,
                max_attempts=max_attempts,
                shuffle=shuffle,
                seed=seed,
                manual_clock=manual_clock,
                backup_leases=backup_leases,
                backup_factor=backup_factor,
            )
        keys = self.keys(name)
        cfg = JobConfig(
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
            manual_clock=manual_clock,
        )
        validate_config(cfg)
        if (
            not isinstance(backup_factor, (int, float))
            or isinstance(backup_factor, bool)
            or not math.isfinite(backup_factor)
            or backup_factor <= 1
        ):
            raise errors.InvalidConfig(f"backup_factor must be a number > 1, got {backup_factor!r}")
        tasks, nchunks = encode_tasks(chunks, chunks_per_task)
        self.check_memory_policy()
        with translate(self.url):
            if not replace and self.redis.exists(keys.meta):
                raise errors.JobExists(f"job {name!r} exists")
        incarnation = secrets.token_hex(8)
        staging = keys.staging_chunks(incarnation)
        try:
            with translate(self.url):
                for start in range(0, len(tasks), STAGING_BATCH):
                    batch = tasks[start : start + STAGING_BATCH]
                    pipe = self.redis.pipeline(transaction=False)
                    pipe.hset(staging, mapping={str(start + i): t for i, t in enumerate(batch)})
                    pipe.expire(staging, STAGING_TTL_S)
                    pipe.execute()
                    if progress:
                        progress(start + len(batch), len(tasks))
            tt = (
                "auto"
                if task_timeout == "auto"
                else "none"
                if task_timeout is None
                else str(
                    int(float(task_timeout) * 1000)  # type: ignore[arg-type]
                )
            )
            meta = {
                F.INC: incarnation,
                F.STATE: "running",
                F.REASON: "",
                F.PASS: 0,
                F.PASSES: -1 if passes is None else passes,
                F.ROUND: 1,
                F.N: len(tasks),
                F.NCHUNKS: nchunks,
                F.CPT: chunks_per_task,
                F.TTL: int(worker_ttl * 1000),
                F.HBI: int(heartbeat_interval * 1000),
                F.TT: tt,
                F.MAXF: max_failures,
                F.MAXA: max_attempts,
                F.SHUFFLE: int(shuffle),
                F.SEED: seed % 65521,
                F.SEED_FULL: seed,
                F.ADVANCE: int(auto_advance),
                F.MCLOCK: int(manual_clock),
                F.CURSOR: 0,
                F.NDONE: 0,
                F.NLEASED: 0,
                F.NRESERVED: 0,
                F.OFFSET: 0,
                F.GEN: 0,
                F.EVMAX: 10000,
                F.AUTO_TT: 0,
                F.ACKED_JOB: 0,
                F.FSEQ: 0,
                F.BACKUP_K: backup_factor if backup_leases else 0,
            }
            args: list[Any] = [int(replace), len(tasks)]
            for k, v in meta.items():
                args += [k, v]
            self.run(name, "create", args, extra_keys=[staging])
        except BaseException:
            with translate(self.url):
                self.redis.unlink(staging)
            raise
        with translate(self.url):
            self.redis.sadd(jobs_index(self.prefix), name)
        return self.status(name)

    def status(self, name: str, summaries: int = 20) -> JobStatus:
        """A snapshot of ``name`` (O(1) in its number of tasks).

        Raises:
            JobNotFound: no such job.
        """
        with translate(self.url, self.keys(name), self.redis):
            return stats.snapshot(self, name, summaries=summaries)

    def list_jobs(self) -> list[str]:
        """Names of the jobs in the index, sorted."""
        with translate(self.url):
            return sorted(self.redis.smembers(jobs_index(self.prefix)))

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

    def delete_job(self, name: str) -> None:
        """Delete every key of ``name``; its trainers get ``JobNotFound``.

        Raises:
            JobNotFound: no such job.
        """
        try:
            self.run(name, "delete", [""])
        finally:
            with translate(self.url):
                if not self.redis.exists(self.keys(name).meta):
                    self.redis.srem(jobs_index(self.prefix), name)

    def cancel_job(self, name: str) -> None:
        """Cancel ``name``: every lease is revoked; trainers' loops end (a sharded job:
        every shard, ``sharded.cancel``).

        Raises:
            JobNotFound, JobCompleted.
        """
        if self._sharded(name):
            from . import sharded

            return sharded.cancel(self, name)
        self.run(name, "cancel", [""])

    def pause_job(self, name: str) -> None:
        """Pause ``name``: trainers get no new leases (they wait, without polling, as in
        a waiting state) and keep what they hold; acks and heartbeats go on. Passes may
        still end and start. Idempotent. A sharded job: every shard (sharded_admin.py).

        Raises:
            JobNotFound, JobCompleted, JobCancelled.
        """
        if self._sharded(name):
            from . import sharded_admin

            return sharded_admin.pause(self, name)
        self.run(name, "pause", [""])

    def resume_job(self, name: str) -> None:
        """End a pause: every waiting trainer is woken to lease again. Idempotent. A
        sharded job: every shard.

        Raises:
            JobNotFound.
        """
        if self._sharded(name):
            from . import sharded_admin

            return sharded_admin.resume(self, name)
        self.run(name, "resume", [""])

    def _sharded(self, name: str) -> bool:
        """True when ``name`` is a sharded job (its verbs act on every shard: cancel,
        pause, resume, checkpoint, checkpoints, rewind)."""
        if not valid_job_name(name):
            return False  # the plain path says what is wrong with the name
        with translate(self.url):
            return bool(self.redis.exists(shard_set_key(name, self.prefix)))

    # -- passes -------------------------------------------------------------------
    def next_pass(self, name: str, expected_pass: int | None = None, force: bool = False) -> int:
        """Start the next pass of a job waiting at a manual boundary.

        Args:
            expected_pass: the pass the caller believes current (compare-and-set);
                the current one when None.
            force: skip what is left of an incomplete pass (recorded as skipped).

        Returns:
            The pass number after the call.

        Raises:
            PassIncomplete: work left and no force. PassMismatch: ``expected_pass`` is not
            the current pass (the message says which is, and whether it moved on or was
            never reached). JobCompleted, JobCancelled, JobNotFound.
        """
        if expected_pass is None:
            expected_pass = self.status(name, summaries=0).pass_no
        try:
            reply = self.run(name, "advance", ["", expected_pass, int(force)])
        except errors.PassMismatch as e:
            raise errors.PassMismatch(self._mismatch(name, expected_pass)) from e
        _refuse_half_rewind(name, reply, 3)
        return int(reply[1])

    def _mismatch(self, name: str, expected: int) -> str:
        current = self.status(name, summaries=0).pass_no
        if expected > current:
            return (
                f"job {name}: pass {expected} is not reached yet (the current pass is "
                f"{current}); nothing changed"
            )
        return (
            f"job {name}: pass {expected} is over, the pass moved on to {current} "
            f"meanwhile; nothing changed"
        )

    def reset_pass(self, name: str, expected_pass: int | None = None) -> int:
        """Restart the current pass (a new attempt; its leases become stale).

        Returns:
            The pass restarted.

        Raises:
            PassMismatch: ``expected_pass`` is not the current pass. JobNotFound, ...
        """
        try:
            reply = self.run(name, "reset", ["", -1 if expected_pass is None else expected_pass])
        except errors.PassMismatch as e:
            assert expected_pass is not None
            raise errors.PassMismatch(self._mismatch(name, expected_pass)) from e
        _refuse_half_rewind(name, reply, 2)
        return int(reply[1])

    # -- tasks and workers --------------------------------------------------------
    def retry(self, name: str, task_ids: Sequence[int] | None = None) -> int:
        """Put dead tasks (all of them when ``task_ids`` is None) back at the front.

        Args:
            task_ids: the dead tasks to retry; each is checked first (read before the
                write), so a typo is an error rather than "0 retried".

        Returns:
            How many tasks were retried.

        Raises:
            InvalidInput: a task id that does not exist, or a task that is not dead
                (nothing retried). JobNotFound.
        """
        total = 0
        if task_ids:
            ids = sorted({int(t) for t in task_ids})
            for task_id in ids:
                state = self.task(name, task_id, history=0)["state"]
                if state != "dead":
                    raise errors.InvalidInput(
                        f"job {name}: task {task_id} is {state}, not "
                        f"dead; only dead tasks are retried (nothing "
                        f"retried)"
                    )
            for start in range(0, len(ids), MAX_RETRY):
                batch = ids[start : start + MAX_RETRY]
                reply = self.run(name, "retry", ["", len(batch), *batch])
                _refuse_half_rewind(name, reply, 3)
                total += int(reply[1])
            return total
        while True:
            reply = self.run(name, "retry", ["", 0])
            _refuse_half_rewind(name, reply, 3)
            total += int(reply[1])
            if int(reply[1]) == 0 or int(reply[2]) == 0:
                return total

    def revoke(self, name: str, task_id: int) -> bool:
        """Send one task's lease back to the front (nothing counted).

        Returns:
            True if revoked, False if the task is not leased.

        Raises:
            InvalidInput: no such task. JobNotFound.
        """
        self.task(name, task_id, history=0)  # no such task: an error, not "not leased"
        reply = self.run(name, "revoke", ["", int(task_id)])
        return int(reply[0]) == Code.OK

    def task(self, name: str, task_id: int, history: int = 20) -> dict[str, Any]:
        """One task of ``name``: state (todo, leased, done, dead), chunks, lease holder,
        failures, attempts, last error, and its latest ``history`` events.

        Raises:
            InvalidInput: no such task. JobNotFound, CorruptData.
        """
        with translate(self.url, self.keys(name), self.redis):
            return stats.task_detail(self, name, int(task_id), history=history)

    def drain(self, name: str, worker_id: str) -> None:
        """Ask a worker to finish its current task and leave."""
        self.run(name, "drain", ["", worker_id])

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
        if state not in ("todo", "leased", "done", "dead"):
            raise errors.InvalidInput(f"state must be todo, leased, done or dead, not {state!r}")
        if not 1 <= int(count) <= PAGE_MAX:
            raise errors.InvalidInput(f"count must be in [1, {PAGE_MAX}], got {count}")
        reply = self.run(name, "peek", [state, cursor, int(count)])
        return stats.parse_tasks(reply[1], state), str(reply[2])

    def iter_tasks(self, name: str, state: str = "leased") -> Iterator[dict[str, Any]]:
        """Every task of the current pass in ``state``, page by page (each page one
        bounded call; a task changing state meanwhile may be listed twice or missed)."""
        cursor = "0"
        while True:
            rows, cursor = self.tasks_page(name, state, cursor)
            yield from rows
            if cursor == "0":
                return

    def tasks(
        self, name: str, state: str = "leased", limit: int = 100, details: bool = False
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` tasks of the current pass in ``state`` (todo|leased|done|dead),
        read page by page (no call lists more than ``PAGE_MAX``).

        Args:
            details: add each task's ``chunks`` and ``last_error`` (from the newest
                events; bounded).
        """
        if int(limit) < 1:
            raise errors.InvalidInput(f"limit must be >= 1, got {limit}")
        rows = list(itertools.islice(self.iter_tasks(name, state), int(limit)))
        if details and rows:
            with translate(self.url, self.keys(name), self.redis):
                stats.add_details(self, name, rows)
        return rows

    def workers(self, name: str) -> list[dict[str, Any]]:
        """The registered workers of ``name`` with their lease counts."""
        with translate(self.url):
            return stats.workers(self, name)

    def events(
        self, name: str, since: str = "-", count: int = 100, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        """Events after ``since`` ("-" for the oldest kept), oldest first."""
        key = self.keys(name).events
        with translate(self.url):
            if block_ms is not None:
                start = "$" if since == "-" else since
                reply = self.redis.xread({key: start}, count=count, block=block_ms)
                return [(i, f) for _, entries in reply for i, f in entries]
            lo = since if since == "-" else "(" + since
            return list(self.redis.xrange(key, min=lo, max="+", count=count))

    def latest_events(
        self, name: str, kind: str, limit: int, scan: int = 1000
    ) -> list[dict[str, str]]:
        """The newest ``limit`` events of type ``kind`` among the newest ``scan`` events,
        oldest first (bounded)."""
        with translate(self.url, self.keys(name), self.redis):
            return stats.latest_of_type(self, name, kind, limit, scan)

    def first_lease_ms(self, name: str) -> int | None:
        """When pass 0's first lease was granted (server ms), if still in the events."""
        with translate(self.url, self.keys(name), self.redis):
            return stats.first_lease_ms(self, name)

    def audit(self, name: str) -> dict[str, Any]:
        """Per pass: done, dead, skipped, stale rejected, resets, longest lateness; and a
        check that the counters agree with the sets they count."""
        with translate(self.url, self.keys(name), self.redis):
            return stats.audit(self, name)

    # -- checkpoints (taskq/checkpoints.py) ----------------------------------------
    def checkpoint(
        self, name: str, keep: int = checkpoints.DEFAULT_KEEP, ckpt: str | None = None
    ) -> dict[str, Any]:
        """Record the job's position (pass, done set, progress, counters) under an id (a
        sharded job: one id over every shard, ``sharded_admin.checkpoint``).

        Args:
            keep: sealed checkpoints kept per job (the oldest beyond it go), 1-1000.
            ckpt: the id (default: a new time-ordered one).

        Returns:
            The checkpoint's record; ``record["id"]`` names it.

        Raises:
            InvalidInput, JobNotFound, JobCancelled; TaskqError while a rewind runs.
        """
        if self._sharded(name):
            from . import sharded_admin

            return sharded_admin.checkpoint(self, name, keep, ckpt)
        return checkpoints.checkpoint(self, name, keep, ckpt)

    def checkpoints(self, name: str) -> list[dict[str, Any]]:
        """The job's sealed checkpoints, oldest first.

        Raises:
            JobNotFound.
        """
        if self._sharded(name):
            from . import sharded_admin

            return sharded_admin.listing(self, name)
        return checkpoints.listing(self, name)

    def rewind(self, name: str, ckpt: str, once: bool = False, key: str = "") -> bool:
        """Put the job back to checkpoint ``ckpt`` (see ``checkpoints.rewind``; a sharded
        job: every shard, then the barrier step, ``sharded_admin.rewind``).

        Args:
            once: skip when the job's last rewind went to ``ckpt`` under the same ``key``
                (a restart's id), or without a key when nothing was acked since
                (restarted trainers loading the same state).
            key: see ``once``.

        Returns:
            True when rewound, False when ``once`` skipped it.

        Raises:
            InvalidInput (unknown checkpoint), JobNotFound, JobCancelled.
        """
        if self._sharded(name):
            from . import sharded_admin

            return sharded_admin.rewind(self, name, ckpt, once, key)
        return checkpoints.rewind(self, name, ckpt, once, key)

    def advance_clock(self, name: str, ms: int, silent: bool = False) -> int:
        """Tests only: move a manual-clock job's clock by ``ms``.

        Args:
            silent: the advance is not traffic (so the silence rule may apply).
        """
        reply = self.run(name, "clock", ["", int(ms), int(silent)])
        return int(reply[1])

    def reap(
        self, name: str, budget: int = 1000, lock_ms: int = 2000, owner: str = ""
    ) -> tuple[int, bool, bool]:
        """Reclaim expired leases of ``name`` once: at most ``min(budget, MAX_RECLAIM)``
        (one call stays short whatever the budget). Returns (reclaimed, more_left,
        locked_by_another_reaper)."""
        reply = self.run(name, "reap", ["", budget, lock_ms, owner or "reaper"])
        if int(reply[0]) == Code.LOCKED:
            return 0, False, True
        return int(reply[1]), bool(int(reply[2])), False


def _refuse_half_rewind(name: str, reply: Any, at: int) -> None:
    """Raise when a verb was refused because a rewind of the job is half done (its reply
    names the checkpoint at index ``at``)."""
    if int(reply[0]) == Code.LOCKED:
        ckpt = reply[at]
        raise errors.TaskqError(
            f"job {name}: a rewind to checkpoint {ckpt} is half done (its position is half "
            f"copied); finish it first with `taskq job rewind {name} {ckpt}`; nothing changed"
        )


def connect(url: str | None = None, **kwargs: Any) -> Client:
    """A ``Client`` for ``url`` (or ``TASKQ_REDIS_URL``, or the local default).

    Keyword arguments are those of ``Client``.
    """
    return Client(url, **kwargs)
