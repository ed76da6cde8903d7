"""The admin API: create, inspect, advance, retry, cancel and delete jobs.

The CLI calls this module and makes no Redis calls of its own; every state change is
one Lua script call (scripts.py), every read goes through stats.py.

Data flow: CLI / user code -> client.py -> scripts.py -> Redis; reads -> stats.py.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Callable, Container, Iterable, Sequence
from typing import Any

from . import errors, stats
from .connection import make_redis, translate
from .keys import JobKeys, job_from_meta_key, jobs_index, meta_pattern, prefix, valid_job_name
from .keys import MetaField as F
from .models import JobConfig, JobStatus
from .scripts import Code, Scripts, raise_for

STAGING_TTL_S = 3600
STAGING_BATCH = 2000


def validate_config(cfg: JobConfig) -> None:
    """Raise ``InvalidInput`` for a config the engine cannot run."""

    def bad(msg: str) -> None:
        raise errors.InvalidInput(msg)

    if not isinstance(cfg.chunks_per_task, int) or cfg.chunks_per_task < 1:
        bad(f"chunks_per_task must be an integer >= 1, got {cfg.chunks_per_task!r}")
    if cfg.passes is not None and (not isinstance(cfg.passes, int) or cfg.passes < 1):
        bad(f"passes must be an integer >= 1 or None, got {cfg.passes!r}")
    for name in ("worker_ttl", "heartbeat_interval"):
        v = getattr(cfg, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            bad(f"{name} must be a number, got {v!r}")
        if v <= 0:
            bad(f"{name} must be positive, got {v!r}")
    if cfg.heartbeat_interval >= cfg.worker_ttl:
        bad(
            f"heartbeat_interval ({cfg.heartbeat_interval}) must be shorter than "
            f"worker_ttl ({cfg.worker_ttl})"
        )
    tt = cfg.task_timeout
    if not (tt is None or tt == "auto"):
        if not isinstance(tt, (int, float)) or isinstance(tt, bool) or not math.isfinite(tt):
            bad(f"task_timeout must be 'auto', None or seconds, got {tt!r}")
        elif tt <= 0:
            bad(f"task_timeout must be positive, got {tt!r}")
    for name in ("max_failures", "max_attempts"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            bad(f"{name} must be an integer >= 1, got {v!r}")
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool):
        bad(f"seed must be an integer, got {cfg.seed!r}")


def encode_tasks(chunks: Iterable[Any], chunks_per_task: int) -> tuple[list[str], int]:
    """Group chunks into tasks and encode each as a JSON list; validates every chunk.

    Returns:
        (the tasks' JSON, the number of chunks).

    Raises:
        InvalidInput: a chunk is not JSON-serialisable, or there are none.
    """
    tasks: list[str] = []
    group: list[str] = []
    count = 0
    for i, chunk in enumerate(chunks):
        count += 1
        try:
            group.append(json.dumps(chunk, separators=(",", ":"), allow_nan=False))
        except (TypeError, ValueError) as e:
            raise errors.InvalidInput(f"chunk {i} is not JSON: {e}") from e
        if len(group) == chunks_per_task:
            tasks.append("[" + ",".join(group) + "]")
            group = []
    if group:
        tasks.append("[" + ",".join(group) + "]")
    if not tasks:
        raise errors.InvalidInput("a job needs at least one chunk")
    return tasks, count


class Client:
    """A connection to one Redis (or cluster) holding taskq jobs.

    Args:
        url: Redis URL; ``TASKQ_REDIS_URL`` or ``redis://127.0.0.1:6379/0`` by default.
        redis_client: an already configured redis-py client to use instead.
        key_prefix: overrides ``TASKQ_PREFIX``.
        cluster: force the cluster client.
        retries: connection retries per command (bounded, exponential backoff).
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
    ) -> None:
        if redis_client is not None:
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
                raise errors.InvalidInput(
                    f"bad job name {job!r}: use 1-64 of A-Z a-z 0-9 . _ -"
                )
            self._keys[job] = JobKeys(job, self.prefix)
        return self._keys[job]

    def run(self, job: str, verb: str, args: Sequence[Any], extra_keys: Sequence[str] = (),
            passthrough: Container[int] = ()) -> Any:
        """Run one operation's script on ``job``; negative codes raise their error, except
        those in ``passthrough``, which the caller handles from the reply."""
        job_keys = self.keys(job)
        keys: list[Any] = job_keys.all_bytes + [k.encode() for k in extra_keys]
        with translate(self.url, job_keys, self.redis):
            reply = self.scripts.call(verb, keys, list(args))
        code = int(reply[0])
        if code not in passthrough:
            raise_for(code, job)
        return reply

    def ping(self) -> None:
        """Raise ``ConnectionLost`` unless Redis answers."""
        with translate(self.url):
            self.redis.ping()

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
        backup_leases: bool = True,
        backup_factor: float = 3.0,
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
                task time; the first ack wins (docs/trainers.md, "Tails").
            backup_factor: that k (> 1).

        Returns:
            The new job's status.

        Raises:
            InvalidInput: bad name, config or chunks (nothing written).
            JobExists: the name is taken and ``replace`` is false.
            ConnectionLost: Redis is unreachable.
        """
        keys = self.keys(name)
        cfg = JobConfig(
            chunks_per_task=chunks_per_task, passes=passes, worker_ttl=worker_ttl,
            heartbeat_interval=heartbeat_interval, task_timeout=task_timeout,
            max_failures=max_failures, max_attempts=max_attempts, shuffle=shuffle,
            seed=seed, auto_advance=auto_advance, manual_clock=manual_clock,
        )
        validate_config(cfg)
        if (not isinstance(backup_factor, (int, float)) or isinstance(backup_factor, bool)
                or not math.isfinite(backup_factor) or backup_factor <= 1):
            raise errors.InvalidInput(f"backup_factor must be a number > 1, got "
                                      f"{backup_factor!r}")
        tasks, nchunks = encode_tasks(chunks, chunks_per_task)
        with translate(self.url):
            if not replace and self.redis.exists(keys.meta):
                raise errors.JobExists(f"job {name!r} exists (use replace=True / --replace)")
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
            tt = "auto" if task_timeout == "auto" else "none" if task_timeout is None else str(
                int(float(task_timeout) * 1000)  # type: ignore[arg-type]
            )
            meta = {
                F.INC: incarnation, F.STATE: "running", F.REASON: "", F.PASS: 0,
                F.PASSES: -1 if passes is None else passes, F.ROUND: 1, F.N: len(tasks),
                F.NCHUNKS: nchunks, F.CPT: chunks_per_task,
                F.TTL: int(worker_ttl * 1000), F.HBI: int(heartbeat_interval * 1000), F.TT: tt,
                F.MAXF: max_failures, F.MAXA: max_attempts, F.SHUFFLE: int(shuffle),
                F.SEED: seed % 65521, F.SEED_FULL: seed, F.ADVANCE: int(auto_advance),
                F.MCLOCK: int(manual_clock), F.CURSOR: 0, F.NDONE: 0, F.NLEASED: 0,
                F.NRESERVED: 0, F.OFFSET: 0, F.GEN: 0, F.EVMAX: 10000, F.AUTO_TT: 0,
                F.ACKED_JOB: 0, F.FSEQ: 0, F.BACKUP_K: backup_factor if backup_leases else 0,
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
        """Cancel ``name``: every lease is revoked; trainers' loops end.

        Raises:
            JobNotFound, JobCompleted.
        """
        self.run(name, "cancel", [""])

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
            PassIncomplete: work left and no force. PassMismatch: another advancer won.
            JobCompleted, JobCancelled, JobNotFound.
        """
        if expected_pass is None:
            expected_pass = self.status(name, summaries=0).pass_no
        reply = self.run(name, "advance", ["", expected_pass, int(force)])
        return int(reply[1])

    def reset_pass(self, name: str, expected_pass: int | None = None) -> int:
        """Restart the current pass (a new attempt; its leases become stale)."""
        reply = self.run(name, "reset", ["", -1 if expected_pass is None else expected_pass])
        return int(reply[1])

    # -- tasks and workers --------------------------------------------------------
    def retry(self, name: str, task_ids: Sequence[int] | None = None) -> int:
        """Put dead tasks (all of them when ``task_ids`` is None) back at the front.

        Returns:
            How many tasks were retried.
        """
        total = 0
        if task_ids:
            for start in range(0, len(task_ids), 1000):
                ids = [int(t) for t in task_ids[start : start + 1000]]
                reply = self.run(name, "retry", ["", len(ids), *ids])
                total += int(reply[1])
            return total
        while True:
            reply = self.run(name, "retry", ["", 0])
            total += int(reply[1])
            if int(reply[1]) == 0 or int(reply[2]) == 0:
                return total

    def revoke(self, name: str, task_id: int) -> bool:
        """Send one task's lease back to the front (nothing counted). False if not leased."""
        reply = self.run(name, "revoke", ["", int(task_id)])
        return int(reply[0]) == Code.OK

    def drain(self, name: str, worker_id: str) -> None:
        """Ask a worker to finish its current task and leave."""
        self.run(name, "drain", ["", worker_id])

    def tasks(self, name: str, state: str = "leased", limit: int = 100) -> list[dict[str, Any]]:
        """Up to ``limit`` tasks of the current pass in ``state`` (todo|leased|done|dead)."""
        if state not in ("todo", "leased", "done", "dead"):
            raise errors.InvalidInput(f"state must be todo, leased, done or dead, not {state!r}")
        reply = self.run(name, "peek", [state, int(limit)])
        return stats.parse_tasks(reply[1], state)

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

    def audit(self, name: str) -> dict[str, Any]:
        """Per pass: done, dead, skipped, stale rejected, resets, longest lateness; and a
        check that the counters agree with the sets they count."""
        with translate(self.url, self.keys(name), self.redis):
            return stats.audit(self, name)

    def advance_clock(self, name: str, ms: int, silent: bool = False) -> int:
        """Tests only: move a manual-clock job's clock by ``ms``.

        Args:
            silent: the advance is not traffic (so the silence rule may apply).
        """
        reply = self.run(name, "clock", ["", int(ms), int(silent)])
        return int(reply[1])

    def reap(self, name: str, budget: int = 1000, lock_ms: int = 2000, owner: str = "") -> tuple[
        int, bool, bool
    ]:
        """Reclaim expired leases of ``name`` once (bounded). Returns (reclaimed,
        more_left, locked_by_another_reaper)."""
        reply = self.run(name, "reap", ["", budget, lock_ms, owner or "reaper"])
        if int(reply[0]) == Code.LOCKED:
            return 0, False, True
        return int(reply[1]), bool(int(reply[2])), False


def connect(url: str | None = None, **kwargs: Any) -> Client:
    """A ``Client`` for ``url`` (or ``TASKQ_REDIS_URL``, or the local default).

    Keyword arguments are those of ``Client``.
    """
    return Client(url, **kwargs)
