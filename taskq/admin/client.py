"""The admin API: create, inspect, advance, retry, cancel and delete jobs.

``Client`` is the connection (engine/connection.py's ``Connection``: the redis-py client,
URL, key prefix, function library, job keys, ``run``), job creation (``create_job``: a
plain job is jobs.py's ``create``, a sharded one sharded.py's), the job index
(``list_jobs``, ``repair_index``), the Redis checks, and ``job(name)``: the job's handle,
a ``PlainJob`` (jobs.py) or a ``ShardedJob`` (sharded.py), told apart here once, by the
shard-set record. Every other method takes a job name and is one call of its handle's
verb (``caller.Job``), kept as the public API; the verbs themselves are written in the
handles only. The CLI calls this module and makes no Redis calls of its own.

Data flow: CLI / user code -> client.py -> the job's handle (jobs.py / sharded.py) ->
engine/connection.py (``run``) -> engine/transport.py -> Redis; reads -> stats.py.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from typing import Any

from taskq import errors
from taskq.admin import checkpoints, jobs, sharded, stats
from taskq.admin.caller import Job
from taskq.admin.jobs import STAGING_BATCH as STAGING_BATCH
from taskq.admin.jobs import STAGING_TTL_S as STAGING_TTL_S
from taskq.admin.jobs import PlainJob, check_name, iter_tasks
from taskq.admin.mix import read_sources
from taskq.admin.shardset import load
from taskq.config import check_memory_policy, encode_tasks, validate_config
from taskq.engine.connection import Connection, translate
from taskq.engine.contract import PAGE_MAX
from taskq.engine.transport import Scripts
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

    # -- the connection -----------------------------------------------------------
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
        """The prefix of every taskq key."""
        return self.connection.prefix

    @property
    def scripts(self) -> Scripts:
        """The function library on this connection (engine/transport.py)."""
        return self.connection.scripts

    @property
    def allow_eviction(self) -> bool:
        """Whether ``create_job`` runs on a Redis that may evict keys."""
        return self.connection.allow_eviction

    def keys(self, job: str) -> JobKeys:
        """The keys of ``job`` (validates the name)."""
        return self.connection.keys(job)

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
        return self.connection.run(job, verb, args, extra_keys, passthrough)

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
        if not self.allow_eviction:
            check_memory_policy(self.memory_policy(), self.url)

    # -- the job index ------------------------------------------------------------
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

    # -- jobs -----------------------------------------------------------------------
    def job(self, name: str) -> Job:
        """The handle of job ``name``: a ``ShardedJob`` (sharded.py) when a shard-set
        record of that name exists, else a ``PlainJob`` (jobs.py); their verbs (status,
        audit, tasks, retry, next, reset, pause, resume, cancel, delete, replace,
        checkpoint, checkpoints, rewind, events, workers, ...: ``caller.Job``) work the
        same for both. Every method of this class that takes a job name calls it.

        Raises:
            InvalidInput: a bad name. ConnectionLost. CorruptData: an unreadable
            shard-set record.
        """
        check_name(name)
        sset = load(self.connection, name)
        if sset is None:
            return PlainJob(self.connection, name)
        return sharded.ShardedJob(self.connection, sset)

    def create_job(
        self,
        name: str,
        chunks: Iterable[Any] = (),
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
        split_tails: bool = True,
        stream: bool = False,
        max_backlog: int | None = None,
        mix: Mapping[str, float] | None = None,
        on_exhausted: str = "drop",
        shuffle_samples: bool = False,
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
                one pass for all (sharded.py's ``create``; it returns a ``ShardedStatus``).
            split_tails: at the tail of a pass an idle trainer may take the unread end of
                a started task running long (its holder's lease then ends there); each
                sample is still read once. Needs the task's size, which a holder sends
                with its progress (docs/design.md, "Tail splitting"). On by default.
            stream: a job whose data keeps arriving (``chunks`` may be empty): its pass
                does not end while the stream is open, trainers with nothing to lease
                wait for ``append``; ``seal`` closes it (docs/streams.md). With
                ``shards``: every shard a stream, appends spread over them.
            max_backlog: an ``append`` that would leave more tasks not done than this
                waits or is refused (None: no bound); with ``shards``, divided among them.
            mix: a mixed job (docs/mixing.md): ``{source job: weight}``; its tasks are the
                sources' (copied, ``chunks`` empty), its order the weighted schedule.
            on_exhausted: a mixed job's source run out in a pass: ``drop`` (the others'
                weights renormalise from that slot).
            shuffle_samples: the samples inside each task in a permutation fixed by
                ``seed``, the pass and the task (``taskq.data.sample_order``), the same
                for every reader: taskq.torch and ``taskq.data.read_task(task)`` apply
                it (a reader of its own must too: ``task.order``). False (the default):
                the chunks' order, which every reader reads alike (docs/design.md,
                "Sample order").

        Returns:
            The new job's status.

        Raises:
            InvalidInput: bad name, config or chunks (nothing written); InvalidConfig
                (a subclass) for a setting out of range or a Redis that may evict keys
                (see ``allow_eviction``).
            JobExists: the name is taken and ``replace`` is false (pass ``replace=True``).
            ConnectionLost: Redis is unreachable.
        """
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
            split_tails=split_tails,
            shuffle_samples=shuffle_samples,
        )
        if mix is not None:
            if shards != 1 or stream or list(chunks):
                raise errors.InvalidInput(
                    "a mixed job takes its tasks from its sources: no chunks, shards or stream"
                )
            check_name(name)
            encoded, spec = read_sources(self.connection, name, mix, cfg, replace, on_exhausted)
            return jobs.create(
                self.connection, name, (), cfg, replace, progress, encoded=encoded, mix=spec
            )
        if shards != 1:
            return sharded.create(
                self.connection,
                name,
                chunks,
                shards,
                cfg,
                replace,
                stream=stream,
                max_backlog=max_backlog,
                backup_leases=backup_leases,
                backup_factor=backup_factor,
            )
        return jobs.create(
            self.connection,
            name,
            chunks,
            cfg,
            replace,
            progress,
            backup_leases,
            backup_factor,
            stream=stream,
            max_backlog=max_backlog,
        )

    # -- each a verb of the job's handle (caller.Job) --------------------------------
    def status(self, name: str, summaries: int = 20) -> JobStatus:
        """A snapshot of ``name`` (O(1) in its number of tasks; a sharded job: the sums,
        each shard's status in ``.shards``).

        Raises:
            JobNotFound: no such job.
        """
        return self.job(name).status(summaries)

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

    def delete_job(self, name: str) -> None:
        """Delete every key of ``name`` (a sharded job: every shard and its record); its
        trainers get ``JobNotFound``.

        Raises:
            JobNotFound: no such job.
        """
        self.job(name).delete()

    def cancel_job(self, name: str) -> None:
        """Cancel ``name``: every lease is revoked; trainers' loops end (a sharded job:
        every shard).

        Raises:
            JobNotFound, JobCompleted.
        """
        self.job(name).cancel()

    def pause_job(self, name: str) -> None:
        """Pause ``name``: trainers get no new leases (they wait, without polling, as in
        a waiting state) and keep what they hold; acks and heartbeats go on. Passes may
        still end and start. Idempotent. A sharded job: every shard.

        Raises:
            JobNotFound, JobCompleted, JobCancelled.
        """
        self.job(name).pause()

    def resume_job(self, name: str) -> None:
        """End a pause: every waiting trainer is woken to lease again. Idempotent. A
        sharded job: every shard.

        Raises:
            JobNotFound.
        """
        self.job(name).resume()

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
        return self.job(name).next(expected_pass, force)

    def reset_pass(self, name: str, expected_pass: int | None = None) -> int:
        """Restart the current pass (a new attempt; its leases become stale).

        Returns:
            The pass restarted.

        Raises:
            PassMismatch: ``expected_pass`` is not the current pass. JobNotFound, ...
        """
        return self.job(name).reset(expected_pass)

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
        return self.job(name).retry(task_ids)

    def revoke(self, name: str, task_id: int) -> bool:
        """Send one task's lease back to the front (nothing counted).

        Returns:
            True if revoked, False if the task is not leased.

        Raises:
            InvalidInput: no such task. JobNotFound.
        """
        return self.job(name).revoke(task_id)

    def drain(self, name: str, worker_id: str) -> None:
        """Ask a worker to finish its current task and leave."""
        self.job(name).drain(worker_id)

    def checkpoint(
        self, name: str, keep: int = checkpoints.DEFAULT_KEEP, ckpt: str | None = None
    ) -> dict[str, Any]:
        """Record the job's position (pass, done set, progress, counters) under an id (a
        sharded job: one id over every shard, ``ShardedJob.checkpoint``).

        Args:
            keep: sealed checkpoints kept per job (the oldest beyond it go), 1-1000.
            ckpt: the id (default: a new time-ordered one).

        Returns:
            The checkpoint's record; ``record["id"]`` names it (``rewind`` takes either).

        Raises:
            InvalidInput, JobNotFound, JobCancelled; TaskqError while a rewind runs.
        """
        return self.job(name).checkpoint(keep, ckpt)

    def checkpoints(self, name: str) -> list[dict[str, Any]]:
        """The job's sealed checkpoints, oldest first.

        Raises:
            JobNotFound.
        """
        return self.job(name).checkpoints()

    def rewind(
        self, name: str, ckpt: str | dict[str, Any], once: bool = False, key: str = ""
    ) -> bool:
        """Put the job back to checkpoint ``ckpt`` (see ``checkpoints.rewind``; a sharded
        job: every shard to the same cut, ``ShardedJob.rewind``).

        Args:
            ckpt: the checkpoint's id, or the record ``checkpoint`` returned.
            once: skip when the job's last rewind went to ``ckpt`` under the same ``key``
                (a restart's id), or without a key when nothing was acked since
                (restarted trainers loading the same state).
            key: see ``once``.

        Returns:
            True when rewound, False when ``once`` skipped it.

        Raises:
            InvalidInput (unknown checkpoint), JobNotFound, JobCancelled.
        """
        return self.job(name).rewind(ckpt, once, key)

    def advance_clock(self, name: str, ms: int, silent: bool = False) -> int:
        """Tests only: move a manual-clock job's clock by ``ms``.

        Args:
            silent: the advance is not traffic (so the silence rule may apply).
        """
        return self.job(name).advance_clock(ms, silent)

    def reap(
        self, name: str, budget: int = 1000, lock_ms: int = 2000, owner: str = ""
    ) -> tuple[int, bool, bool]:
        """Reclaim expired leases of ``name`` once: at most ``min(budget, MAX_RECLAIM)``
        (one call stays short whatever the budget). Returns (reclaimed, more_left,
        locked_by_another_reaper)."""
        return self.job(name).reap(budget, lock_ms, owner)


def connect(url: str | None = None, **kwargs: Any) -> Client:
    """A ``Client`` for ``url`` (or ``TASKQ_REDIS_URL``, or the local default).

    Keyword arguments are those of ``Client``.
    """
    return Client(url, **kwargs)
