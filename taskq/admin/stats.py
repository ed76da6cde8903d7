"""Read-only views of a job: status snapshots, task and worker lists, the audit.

Reads never write. ``snapshot`` is one read-only script call, O(1) in the number of
tasks; the exporter and ``taskq job status`` use it. The reads of tasks (rows, a task's
detail and history, the lease record) are stats_tasks.py's, re-exported here.

Data flow: jobs.py / client.py / checkpoints.py -> stats.py (-> stats_tasks.py) ->
Redis (reads only); it calls through the engine's ``Connection``.
"""

from __future__ import annotations

import json
from typing import Any

import redis
from redis.client import NEVER_DECODE
from redis.cluster import RedisCluster

from taskq import errors, integrity
from taskq.admin import inputwait_view, mix

# the task reads, re-exported: stats.task_detail, stats.parse_lease, ...
from taskq.admin.stats_tasks import EVENT_SCAN as EVENT_SCAN
from taskq.admin.stats_tasks import add_details as add_details
from taskq.admin.stats_tasks import last_error as last_error
from taskq.admin.stats_tasks import latest_of_type as latest_of_type
from taskq.admin.stats_tasks import parse_lease as parse_lease
from taskq.admin.stats_tasks import parse_tasks as parse_tasks
from taskq.admin.stats_tasks import pass_length
from taskq.admin.stats_tasks import task_detail as task_detail
from taskq.admin.stats_tasks import task_histories as task_histories
from taskq.data import task_size
from taskq.engine.connection import Connection
from taskq.engine.contract import HIST_BOUNDS_MS, raise_for
from taskq.keys import MetaField as F
from taskq.mix import MixSpec

LEASE_AGE_BOUNDS_S = (1, 10, 60, 300, 1800)

COUNTERS = {
    "leased": F.C_LEASED,
    "acked": F.C_ACKED,
    "failed": F.C_FAILED,
    "released": F.C_RELEASED,
    "expired_worker_lost": F.C_EXP_WL,
    "expired_task_timeout": F.C_EXP_TT,
    "stale": F.C_STALE,
    "dead": F.C_DEAD,
    "stolen": F.C_STOLEN,
    "revoked": F.C_REVOKED,
    "forged": F.C_FORGED,
    "backups": F.C_BACKUPS,
    "splits": F.C_SPLITS,
}


def _pairs(flat: list[Any]) -> dict[str, str]:
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


def _int(meta: dict[str, str], field: str, key: str = "") -> int:
    try:
        return int(float(meta.get(field, 0) or 0))
    except ValueError as e:
        raise errors.CorruptData(f"{key}: field {field!r} is not a number") from e


def histogram(hist: dict[str, str], name: str, meta_sum: str | None = None) -> dict[str, Any]:
    """A histogram kept by the scripts, in seconds: bounds, per-bucket counts, sum, count.

    Args:
        hist: the job's ``hist`` hash (``<name>:<bucket>`` -> count).
        name: the histogram, ``dur`` or ``late``.
        meta_sum: its sum in ms, the meta field the scripts keep it in (``dur_sum`` /
            ``late_sum``); None when absent.

    Returns:
        ``bounds_s``, ``counts`` (one more than the bounds: +Inf), ``sum_s``, ``count``.
        The count is the buckets' sum; the sum adds ``<name>:sum`` of the hash, where a
        job created by an older version kept it (it stays there, no longer written).
    """
    counts = [int(hist.get(f"{name}:{i}", 0)) for i in range(1, len(HIST_BOUNDS_MS) + 2)]
    total_ms = float(meta_sum or 0) + float(hist.get(f"{name}:sum", 0) or 0)
    return {
        "bounds_s": [b / 1000.0 for b in HIST_BOUNDS_MS],
        "counts": counts,
        "sum_s": total_ms / 1000.0,
        "count": sum(counts),
    }


def _mix_of(raw: str) -> dict[str, float]:
    spec = MixSpec.from_json(raw)
    return {s: float(w) for s, w in zip(spec.sources, spec.weights, strict=True)}


def snapshot(conn: Connection, name: str, summaries: int = 20) -> Any:
    """The ``JobStatus`` of ``name``.

    Raises:
        JobNotFound: no such job. CorruptData: its meta hash cannot be read.
    """
    from taskq.models import JobStatus

    keys = conn.keys(name)
    reply = conn.scripts.call("stats", keys.script, list(LEASE_AGE_BOUNDS_S))
    raise_for(int(reply[0]), name)
    meta = _pairs(reply[1])
    if F.INC not in meta or F.N not in meta:
        raise errors.CorruptData(f"{keys.meta}: not a taskq job (fields missing)")
    dead, alive = int(reply[2]), int(reply[3])
    now_ms, jnow_ms = int(reply[4]), int(reply[5])
    hist = _pairs(reply[6])
    older = [int(x) for x in reply[7]]
    oldest = reply[8]
    n = _int(meta, F.N, keys.meta)
    if meta.get(F.SHUFFLE) == "m":  # a mixed pass that stopped, or a stream's: its charge says
        n = pass_length(n, _int(meta, F.PASS), meta.get(F.MIXE), meta.get(F.MIXH))
    done = _int(meta, F.NDONE, keys.meta)
    leased = _int(meta, F.NLEASED, keys.meta)
    state = meta.get(F.STATE, "")
    if state == "running" and meta.get(F.PAUSED) == "1":
        state = "paused"  # running, but no new leases until resumed
    if state in ("completed", "cancelled"):
        leased = 0
    # (and a split task's tail piece waiting beside its leased head: lib/pieces.lua)
    beside = int(reply[9]) if len(reply) > 9 and state not in ("completed", "cancelled") else 0
    todo = max(0, n - dead - done - leased) + beside if state != "cancelled" else 0
    passes = _int(meta, F.PASSES, keys.meta)
    pass_no = _int(meta, F.PASS, keys.meta)
    tt = meta.get(F.TT, "auto")
    config = {
        "chunks": _int(meta, F.NCHUNKS),
        "chunks_per_task": _int(meta, F.CPT),
        "passes": None if passes < 0 else passes,
        "worker_ttl": _int(meta, F.TTL) / 1000.0,
        "heartbeat_interval": _int(meta, F.HBI) / 1000.0,
        "task_timeout": tt if tt in ("auto",) else None if tt == "none" else int(tt) / 1000.0,
        "auto_task_timeout_s": _int(meta, F.AUTO_TT) / 1000.0 or None,
        "max_failures": _int(meta, F.MAXF),
        "max_attempts": _int(meta, F.MAXA),
        "shuffle": meta.get(F.SHUFFLE) == "1",
        "seed": _int(meta, F.SEED_FULL),
        "auto_advance": meta.get(F.ADVANCE) == "1",
        "manual_clock": meta.get(F.MCLOCK) == "1",
        "split_tails": meta.get(F.SPLIT, "1") != "0",
        "shuffle_samples": meta.get(F.SORDER) == "shuffled",
        "backup_leases": _int(meta, F.BACKUP_K) > 0,
        # a mixed job's sources and first weights (docs/mixing.md), else None
        "mix": _mix_of(meta[F.MIX]) if meta.get(F.MIX) else None,
    }
    counters = {k: _int(meta, f) for k, f in COUNTERS.items()}
    counters["last_ack_ms"] = _int(meta, F.LAST_ACK)
    counters["last_pass_ms"] = _int(meta, F.LAST_PASS_MS)
    lease_ages = {str(b): c for b, c in zip(LEASE_AGE_BOUNDS_S, older, strict=True)}
    status = JobStatus(
        job=name,
        state=state,
        reason=meta.get(F.REASON, ""),
        pass_no=pass_no,
        passes=None if passes < 0 else passes,
        tasks=n,
        todo=todo,
        leased=leased,
        done=done,
        dead=dead,
        workers=alive,
        incarnation=meta[F.INC],
        config=config,
        counters=counters,
        pass_started_ms=_int(meta, F.PSTART),
        created_ms=_int(meta, F.CREATED),
        now_ms=now_ms,
        pass_attempt=_int(meta, F.P_RESETS),
        reserved=_int(meta, F.NRESERVED) if state in ("running", "paused") else 0,
        histograms={
            "task_duration": histogram(hist, "dur", meta.get(F.DUR_SUM)),
            "redispatch_lateness": histogram(hist, "late", meta.get(F.LATE_SUM)),
        },
        oldest_lease_age_s=(jnow_ms - int(float(oldest))) / 1000.0 if oldest else None,
        lease_ages=lease_ages,
        input=inputwait_view.summary(meta, now_ms),
        backlog=todo + leased,
        appended=_int(meta, F.C_APPENDED),
        trimmed=_int(meta, F.TRIM_W),
        stream=meta.get(F.STREAM) or None,
    )
    config["max_backlog"] = _int(meta, F.MAX_BACKLOG) or None
    if state not in ("completed", "cancelled") and todo + leased > 0:
        since = _oldest_unfinished_ms(conn, keys, n, _int(meta, F.CREATED))
        if since is not None:
            since = max(since, status.pass_started_ms)
            status.oldest_unfinished_age_s = max(0.0, (now_ms - since) / 1000.0)
    if summaries > 0:
        fields = [str(p) for p in range(max(0, pass_no - summaries + 1), pass_no + 1)]
        raw = conn.redis.hmget(keys.passes, fields)
        status.summaries = [json.loads(r) for r in raw if r]
    return status


def _oldest_unfinished_ms(conn: Connection, keys: Any, n: int, created_ms: int) -> int | None:
    """When the lowest-numbered task not done in this pass was appended (the create's
    time for a task it made), or None when every task is done. Two reads: the done
    bitmap's first clear bit (BITPOS, at most n / 8 bytes) and the append that made it
    (the ``appends`` zset, scored by each append's first task)."""
    redis_client = conn.redis
    task = int(redis_client.bitpos(keys.done, 0))
    if task < 0 or task >= n:
        return None
    made = redis_client.zrevrangebyscore(keys.appends, task, "-inf", start=0, num=1)
    if not made:
        return created_ms
    return int(str(made[0]).split(":")[1])


def _server_time(conn: Connection, key: str) -> tuple[int, int]:
    """TIME of the server holding ``key`` (a cluster refuses TIME in a pipeline, and
    another master's clock is not the job's)."""
    redis_client = conn.redis
    if isinstance(redis_client, RedisCluster):
        node = redis_client.get_node_from_key(key)
        sec, usec = redis_client.execute_command("TIME", target_nodes=node)
    else:
        sec, usec = redis_client.time()
    return int(sec), int(usec)


def workers(conn: Connection, name: str) -> list[dict[str, Any]]:
    """Registered workers: id, host, pid, joined, last heartbeat age, leases held."""
    keys = conn.keys(name)
    pipe = conn.redis.pipeline(transaction=False)
    pipe.hmget(keys.meta, [F.MCLOCK, F.OFFSET, F.INC])
    pipe.get(keys.clock)
    pipe.hgetall(keys.winfo)
    pipe.zrange(keys.workers, 0, 9999, withscores=True)
    (mclock, offset, inc), clock, infos, ranked = pipe.execute()
    sec, usec = _server_time(conn, keys.meta)
    if inc is None:
        raise errors.JobNotFound(f"job {name!r} not found (deleted or replaced)")
    now = int(clock or 0) if mclock == "1" else int(sec) * 1000 + int(usec) // 1000
    jnow = now - int(offset or 0)
    deadlines = dict(ranked)
    pipe = conn.redis.pipeline(transaction=False)
    rows = []
    for worker, info in sorted(infos.items()):
        f = info.split("|")
        if len(f) < 6:
            raise errors.CorruptData(f"{keys.winfo}: field {worker!r} is not a worker record")
        winc, ttl_ms, joined, host, pid, drain = f[0], int(f[1]), int(f[2]), f[3], f[4], f[5]
        m = f"{worker}|{winc}"
        deadline = deadlines.get(m)
        pipe.zlexcount(keys.owned, f"[{m}|", f"({m}|\xff")
        rows.append(
            {
                "id": worker,
                "incarnation": winc,
                "host": host,
                "pid": int(pid or 0),
                "joined_ms": joined,
                "ttl_s": ttl_ms / 1000.0,
                "last_heartbeat_age_s": None
                if deadline is None
                else round((jnow - (deadline - ttl_ms)) / 1000.0, 3),
                "alive": deadline is not None and deadline >= jnow,
                "draining": drain == "1",
            }
        )
    for row, held in zip(rows, pipe.execute(), strict=True):
        row["leases"] = int(held)
    return rows


def memory_policy(redis_client: Any) -> str | None:
    """``maxmemory-policy`` from INFO memory (the worst of a cluster's nodes), or None
    when this user may not run INFO."""
    try:
        info = redis_client.info("memory")
    except redis.exceptions.NoPermissionError:
        return None
    except redis.exceptions.ResponseError as e:
        if "NOPERM" in str(e) or "unknown command" in str(e):
            return None
        raise
    nodes = [info] if "maxmemory_policy" in info else list(info.values())
    policies = {
        str(n.get("maxmemory_policy"))
        for n in nodes
        if isinstance(n, dict) and n.get("maxmemory_policy")
    }
    if not policies:
        return None
    unsafe = sorted(policies - {"noeviction"})
    return unsafe[0] if unsafe else "noeviction"


def first_lease_ms(conn: Connection, name: str, scan: int = 1000) -> int | None:
    """When pass 0's first lease was granted, from the oldest events (None once the
    stream was trimmed past it, or before any lease): pass 0 starts when the job is
    created, so its duration would otherwise count the wait for the first trainer."""
    entries = conn.redis.xrange(conn.keys(name).events, count=scan)
    if not entries or entries[0][1].get("type") != "job_created":
        return None
    for event_id, fields in entries:
        granted = "leased" in fields or "reserved" in fields
        if fields.get("type") == "step" and granted and fields.get("pass", "0") == "0":
            return int(event_id.split("-")[0])
    return None


def audit(conn: Connection, name: str) -> dict[str, Any]:
    """Per-pass records and the checks of docs/design.md's invariants (``taskq job audit``),
    meaningful in every state: while a pass runs, after it ended (the acked set of an
    ended attempt is the live tasks) and after a rewind. Every completed pass attempt
    whose summary says what its sets held (``acked``, ``live``) is checked too."""
    keys = conn.keys(name)
    status = snapshot(conn, name, summaries=0)
    raw = conn.redis.hgetall(keys.passes)
    passes = sorted((json.loads(v) for v in raw.values()), key=lambda s: (s["pass"], s["round"]))
    pipe = conn.redis.pipeline(transaction=False)
    pipe.bitcount(keys.done)
    pipe.zcard(keys.reserved)
    pipe.zcard(keys.started)
    pipe.scard(keys.dead)
    bits, reserved, started, dead = pipe.execute()
    rewinding = status.state == "waiting" and status.reason == "rewinding"
    live = status.tasks - status.dead
    dead_view = integrity.dead_check(conn.redis, keys)
    # a pass attempt ended complete (the job waits for `pass next`, or is completed):
    # its acked set is the live tasks, by membership
    ended = status.state == "completed" or (
        status.state == "waiting" and status.reason == "manual_advance"
    )
    checks = {
        "done_matches_bitmap": status.state == "cancelled" or rewinding or bits == status.done,
        "leased_matches_indexes": status.state not in ("running", "paused")
        or status.leased == reserved + started,
        "dead_matches_set": dead == status.dead,
        # the tasks counted (the appended ones in their own record) are the descriptors
        "tasks_match_descriptors": integrity.tasks_check(
            conn.redis, keys, status.tasks, status.trimmed
        )
        if status.config.get("mix") is None
        # (a mixed job's copies, one a task of its sources; a pass may stop before)
        else int(conn.redis.hlen(keys.chunks)) == mix.copies(conn, name),
        "done_within_live": status.done <= live,
        # no task both done and dead; the dead bitmap (what a checkpoint copies) the set
        "no_dead_task_done": not dead_view["done"],
        "dead_bitmap_matches_set": not dead_view["not_in_bitmap"]
        and dead_view["bitmap"] == dead_view["dead"],
        "ended_attempt_acked_every_live_task": not ended or (bits == live and bits == status.done),
        "completed_attempts_acked_every_live_task": all(
            s.get("acked", s["done"]) == s.get("live", s["done"]) == s["done"]
            and not s.get("dead_done")
            for s in passes
            if s.get("state") == "completed" and not s.get("rewound") and "acked" in s
        ),
    }
    progress = integrity.progress_check(conn.redis, keys)  # docs/resume.md
    checks["no_progress_on_done"] = not progress["done_with_progress"]
    # the split tasks of the attempt the done set belongs to (an ended one's, or the
    # running one's): pieces partition each task, done exactly when both are acked
    # (the round its pieces are recorded under: the completed attempt's, which a retry
    # reopens, or the current one)
    rnd, sround, cursor = conn.redis.hmget(keys.meta, F.ROUND, F.SROUND, F.CURSOR)
    attempt = sround or rnd
    running = None
    if status.state in ("running", "paused"):
        running = (rnd, int(cursor or 0) >= status.tasks)
    splits = {"tasks": 0, "acked": 0, "bad": []}
    if status.state != "cancelled" and not rewinding and attempt is not None:
        splits = integrity.split_check(
            conn.redis,
            keys,
            attempt,
            task_size,
            running,
            lambda ids: mix.task_fields(conn, name, ids),
        )
    checks["split_tasks_partitioned"] = not splits["bad"]
    return {
        "job": name,
        "state": status.state,
        "pass": status.pass_no,
        "passes": [
            {
                k: s.get(k)
                for k in (
                    "pass",
                    "round",
                    "state",
                    "done",
                    "dead",
                    "skipped",
                    "stale",
                    "resets",
                    "max_lateness_ms",
                    "expired",
                    "started_ms",
                    "ended_ms",
                    "resumed",
                    "resumed_samples",
                    "reread_samples",
                    "rewound",
                    "acked",
                    "live",
                    "dead_done",
                )
            }
            for s in passes
        ],
        "first_lease_ms": first_lease_ms(conn, name),
        "current": {
            "pass": status.pass_no,
            "done": status.done,
            "leased": status.leased,
            "todo": status.todo,
            "dead": status.dead,
        },
        "counters": status.counters,
        "progress": progress,
        "dead": dead_view,
        "splits": splits,
        "checks": checks,
        "ok": all(checks.values()),
    }


#: the sizes of one engine job's tasks, as ``samples`` keeps them between calls: task id
#: -> samples (None: unknown); a mixed job's copies' by copy id (admin/mix.py copy_sizes)
TaskSizes = dict[Any, "int | None"]


def samples(conn: Connection, name: str, sizes: TaskSizes) -> tuple[int, int | None]:
    """Samples of the current pass attempt finished over every trainer, and the pass's
    samples (``loader.progress()``'s global figure in samples; docs/torch.md).

    Finished: every sample of a task done or dead, and the samples recorded as taken of
    the tasks being read (the progress hash). The pass's samples: the tasks' sizes as
    their chunks say them (``taskq.data.task_size``), read once into ``sizes`` (HSCAN
    pages) and again only when the number of tasks changed (a stream's appends and trims).
    A task split at the pass's tail counts its head's progress until both pieces are
    acked. Reads only: the done and dead bitmaps, the progress hash (one entry per
    task being read), the chunks hash's length.

    Args:
        conn: the engine's connection.
        name: the engine job (a shard of a sharded job is one).
        sizes: the sizes read by an earlier call (updated here).

    Returns:
        ``(finished, total)``; ``(0, None)`` when a task's size is unknown (a chunk that
        does not say its size: the figure is then in tasks only).

    Raises:
        CorruptData: a task's chunks or progress were not written by taskq.
    """
    keys = conn.keys(name)
    r = conn.redis
    copies = mix.slot_copies(conn, name)  # a mixed job's tasks are slots (docs/mixing.md)
    if copies is not None:
        mix.copy_sizes(conn, name, sizes)
    elif int(r.hlen(keys.chunks)) != len(sizes):
        sizes.clear()
        for field, raw in r.hscan_iter(keys.chunks, count=1000):
            sizes[int(field)] = task_size(integrity.decode_chunks(raw, keys.chunks, field))
    known = list(sizes.values())
    if not known or None in known:
        return 0, None
    total = sum(n for n in known if n is not None)
    if copies is not None:  # (drop: each copy once a pass; a slot's size is its copy's)
        sizes = {slot: sizes.get(f) for slot, f in copies.items()}
    # the bitmaps as bytes (the connection decodes replies: not these)
    done = r.execute_command("GET", keys.done, **{NEVER_DECODE: True}) or b""
    dead = r.execute_command("GET", keys.deadbits, **{NEVER_DECODE: True}) or b""

    def finished_bit(task: int) -> bool:
        i, bit = task >> 3, 0x80 >> (task & 7)
        return bool((i < len(done) and done[i] & bit) or (i < len(dead) and dead[i] & bit))

    finished = sum(n or 0 for task, n in sizes.items() if finished_bit(task))
    for field, value in r.hscan_iter(keys.progress, count=1000):
        task = int(field)
        if not finished_bit(task):
            finished += min(int(value), sizes.get(task) or 0)
    return finished, total
