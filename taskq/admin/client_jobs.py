"""The lifecycle part of ``Client``: create (staged, then flipped live), delete, cancel,
pause and resume.

``Lifecycle`` writes a job's life: every setting is checked before the first write
(config.py), the chunks are staged in pipelined batches and made live by one ``create``
script call (``shards=S``: sharded_create.py, which creates each shard back through
the client). Delete, cancel, pause and resume are the job handle's verbs (jobs.py,
sharded_job.py), plain or sharded. It owns no state: the connection part's, the handles'.

Data flow: client.py -> client_jobs.py -> client_conn.py (``run``) -> engine/transport.py ->
Redis; -> sharded_create.py; -> the job's handle (client_handles.py).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterable
from typing import Any

from taskq import errors
from taskq.admin import sharded_create
from taskq.admin.client_conn import Connection
from taskq.admin.client_handles import Handles
from taskq.config import encode_tasks, validate_config
from taskq.engine.connection import translate
from taskq.keys import MetaField as F
from taskq.keys import jobs_index
from taskq.models import JobConfig, JobStatus

STAGING_TTL_S = 3600
STAGING_BATCH = 500  # fields per HSET while staging: each one a short command


class Lifecycle:
    """The job-lifecycle part of ``Client``.

    Args:
        conn: the connection part (keys, ``run``, the memory-policy check).
        handles: the handles part: a job's handle, and the whole client as the engine
            modules see it (``sharded_create.create`` creates each shard through it).
    """

    def __init__(self, conn: Connection, handles: Handles) -> None:
        self._conn = conn
        self._handles = handles
        self._open = handles.job

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
        split_tails: bool = False,
        stream: bool = False,
        max_backlog: int | None = None,
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
                one pass for all (``sharded_create.create``; it returns a ``ShardedStatus``).
            split_tails: at the tail of a pass an idle trainer may take the unread end of
                a started task running long (its holder's lease then ends there); each
                sample is still read once. Needs the task's size, which a holder sends
                with its progress (docs/design.md, "Tail splitting"). Off by default
                until a split is accounted by every verb (checkpoint, rewind, retry,
                timeout, steal, a Redis rollback, the DDP pass end).
            stream: a job whose data keeps arriving (``chunks`` may be empty): its pass
                does not end while the stream is open, trainers with nothing to lease
                wait for ``append``; ``seal`` closes it (docs/streams.md).
            max_backlog: an ``append`` that would leave more tasks not done than this
                waits or is refused (None: no bound).

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
        )
        if shards != 1 and (stream or max_backlog is not None):
            raise errors.InvalidConfig(
                "a stream job (or one with max_backlog) is one shard: drop shards= or stream="
            )
        if shards != 1:
            return sharded_create.create(  # type: ignore[return-value]
                self._handles.client,
                name,
                chunks,
                shards,
                cfg,
                replace=replace,
                backup_leases=backup_leases,
                backup_factor=backup_factor,
            )
        conn = self._conn
        keys = conn.keys(name)
        validate_config(cfg)
        if (
            not isinstance(backup_factor, (int, float))
            or isinstance(backup_factor, bool)
            or not math.isfinite(backup_factor)
            or backup_factor <= 1
        ):
            raise errors.InvalidConfig(f"backup_factor must be a number > 1, got {backup_factor!r}")
        if max_backlog is not None and (
            isinstance(max_backlog, bool) or not isinstance(max_backlog, int) or max_backlog < 1
        ):
            raise errors.InvalidConfig(f"max_backlog must be an integer >= 1, got {max_backlog!r}")
        if stream:
            chunks = list(chunks)
            tasks, nchunks = encode_tasks(chunks, chunks_per_task) if chunks else ([], 0)
        else:
            tasks, nchunks = encode_tasks(chunks, chunks_per_task)
        conn.check_memory_policy()
        if self._open(name).sharded:  # no plain job beside a sharded one of that name
            raise errors.JobExists(
                f"job {name!r} exists as a sharded job (replace it with shards >= 2, or "
                f"delete it first)"
            )
        with translate(conn.url):
            if not replace and conn.redis.exists(keys.meta):
                raise errors.JobExists(f"job {name!r} exists")
        incarnation = secrets.token_hex(8)
        staging = keys.staging_chunks(incarnation)
        try:
            with translate(conn.url):
                for start in range(0, len(tasks), STAGING_BATCH):
                    batch = tasks[start : start + STAGING_BATCH]
                    pipe = conn.redis.pipeline(transaction=False)
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
                F.SPLIT: 1 if cfg.split_tails else 0,
                F.PN: len(tasks),
                F.STREAM: "open" if stream else "",
                F.MAX_BACKLOG: max_backlog or 0,
            }
            args: list[Any] = [int(replace), len(tasks)]
            for k, v in meta.items():
                args += [k, v]
            conn.run(name, "create", args, extra_keys=[staging])
        except BaseException:
            with translate(conn.url):
                conn.redis.unlink(staging)
            raise
        with translate(conn.url):
            conn.redis.sadd(jobs_index(conn.prefix), name)
        return self._open(name).status()

    def delete_job(self, name: str) -> None:
        """Delete every key of ``name`` (a sharded job: every shard and its record); its
        trainers get ``JobNotFound``.

        Raises:
            JobNotFound: no such job.
        """
        self._open(name).delete()

    def cancel_job(self, name: str) -> None:
        """Cancel ``name``: every lease is revoked; trainers' loops end (a sharded job:
        every shard).

        Raises:
            JobNotFound, JobCompleted.
        """
        self._open(name).cancel()

    def pause_job(self, name: str) -> None:
        """Pause ``name``: trainers get no new leases (they wait, without polling, as in
        a waiting state) and keep what they hold; acks and heartbeats go on. Passes may
        still end and start. Idempotent. A sharded job: every shard.

        Raises:
            JobNotFound, JobCompleted, JobCancelled.
        """
        self._open(name).pause()

    def resume_job(self, name: str) -> None:
        """End a pause: every waiting trainer is woken to lease again. Idempotent. A
        sharded job: every shard.

        Raises:
            JobNotFound.
        """
        self._open(name).resume()
