"""A sharded job: one job spread over S ordinary jobs (its shards), one pass for all.

A job lives in one hash slot, so one job is served by one Redis core. A sharded job
``NAME`` is S ordinary jobs ``NAME.s0`` .. (each its own hash tag, placed so that they
land on different masters of a cluster: ``place``) plus a small record of the set
(shardset.py, ``keys.shard_set_key``). Global task ``i`` is task ``i // S`` of shard
``i % S``, so every shard holds a stride sample of the data set.

``ShardedJob`` is what ``Client.job(name)`` returns for one: it holds the record it was
opened with and one ``PlainJob`` per shard, and implements every verb of ``caller.Job``
itself, each a sequence of single-slot calls (no script can span slots). Rows of tasks,
workers and events name their ``shard``.

The shards run with a manual pass boundary: a shard whose pass ``p`` is complete waits.
The barrier step (``ShardedJob.advance``) reads every shard and, once all wait at ``p``,
advances each by ``next(expected_pass=p)``; a shard already at ``p+1`` answers
``PassMismatch``, which is success, so the step is safe to repeat by anyone: a trainer
that finds its pass done everywhere (trainer/sharded.py), the reaper (``advance_all``),
``taskq pass next``. A shard left waiting behind one that moved on (a step that died
half-way) is advanced first. The step runs under the barrier lock (barrier.py), which a
checkpoint holds while it takes its cut across the shards, so no pass moves under a cut;
the cut is also checked (every shard's pass and attempt read before and after) and
taken again when one moved all the same. See docs/sharding.md.

Data flow: client.py (``Client.job``, ``create_job(shards=S)``) / trainer/sharded.py /
ops/reaper.py -> sharded.py -> jobs.py (``PlainJob`` per shard), shardset.py (the
record), barrier.py -> Redis.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
import json
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from redis.cluster import RedisCluster
from redis.crc import key_slot

from taskq import errors
from taskq.admin import checkpoints
from taskq.admin.barrier import ADMIN_WAIT_S, STEP_LOCK_MS, barrier_lock
from taskq.admin.jobs import (
    CheckpointRef,
    PlainJob,
    _check_append,
    check_chunk_id,
    check_limit,
    check_page,
    checkpoint_id,
    config_of,
    iter_tasks,
)
from taskq.admin.jobs import create as create_plain
from taskq.admin.shardset import ShardedStatus, ShardSet, list_sets, load, require
from taskq.config import encode_tasks, validate_config
from taskq.engine.connection import Connection, translate
from taskq.engine.contract import PAGE_MAX
from taskq.keys import (
    MAX_SHARDED_NAME,
    JobKeys,
    shard_name,
    shard_set_key,
    shard_sets_index,
    valid_job_name,
)
from taskq.models import AppendResult, FollowRecord, JobConfig, JobStatus, SealResult

log = logging.getLogger("taskq.sharded")

#: How often ``events(block_ms=...)`` looks at the shards' streams while it waits (no
#: one blocking read spans slots).
EVENTS_POLL_S = 0.1
#: Hash tags tried per shard to reach the wanted master (1/M of them do; M masters).
PLACEMENT_TRIES = 1000
#: The shard-set record's field prefix of a sealed sharded checkpoint.
CKPT_FIELD = "ckpt."
#: Tries at a cut before a checkpoint gives up (the passes moved under every one).
CUT_ATTEMPTS = 3
#: The barrier lock's lifetime while a cut is taken or restored; renewed per shard.
CUT_LOCK_MS = 30_000
#: How long a checkpoint or rewind waits for a barrier step to let go of the lock.
CUT_WAIT_S = 10.0


def _waiting(s: JobStatus) -> bool:
    return s.state == "waiting" and s.reason == "manual_advance"


def all_dead(s: JobStatus) -> bool:
    """Shard ``s`` waits with no live task (every task dead at the caps)."""
    return s.state == "waiting" and s.reason == "all_dead"


def _at_boundary(s: JobStatus) -> bool:
    """Shard ``s`` has nothing left in its pass: complete, or every task of it dead (a
    plain job's pass ends once its live tasks are done; one without any waits
    ``all_dead``, and so does a sharded job only when every shard has none)."""
    return _waiting(s) or all_dead(s)


def combine(sset: ShardSet, shards: Sequence[JobStatus]) -> tuple[str, str, int]:
    """(state, reason, pass) of the whole job from its shards' statuses.

    Cancelled if any shard is; completed when all are; paused if any unfinished shard
    is (a pause or resume that stopped half-way shows); waiting when every unfinished
    shard waits: ``all_dead`` when none of them has a live task (a plain job's rule),
    else ``barrier`` (the next step advances them) or ``manual_advance`` (for
    ``next``); else running. A shard with no live task while others have some has
    finished its pass. The pass is the lowest unfinished shard's.
    """
    live = [s for s in shards if s.state != "completed"]
    pass_no = min((s.pass_no for s in live), default=max(s.pass_no for s in shards))
    if any(s.state == "cancelled" for s in shards):
        return "cancelled", "", pass_no
    if not live:
        return "completed", "", pass_no
    if any(s.state == "paused" for s in live):  # a pause (or resume) half-way counts
        return "paused", "", pass_no
    if any(s.state == "running" for s in live):
        return "running", "", pass_no
    if all(s.reason == "all_dead" for s in shards):  # a completed shard had live tasks
        return "waiting", "all_dead", pass_no
    return "waiting", "barrier" if sset.auto_advance else "manual_advance", pass_no


class ShardedJob:
    """A sharded job (``Client.job(name)`` of one): the ``caller.Job`` verbs over every
    shard, plus the barrier step (``advance``).

    Args:
        connection: the engine's connection.
        sset: the job's shard-set record (shardset.py).
    """

    sharded = True

    def __init__(self, connection: Connection, sset: ShardSet) -> None:
        self.connection = connection
        self.name = sset.name
        self.sset = sset
        self.shards = [PlainJob(connection, s) for s in sset.shards]

    def __repr__(self) -> str:
        return f"ShardedJob({self.name!r}, shards={len(self.shards)})"

    def parts(self) -> list[str]:
        """The shards' job names, shard ``k`` at index ``k``."""
        return list(self.sset.shards)

    def _of(self, task_id: int) -> tuple[PlainJob, int]:
        task_id = int(task_id)
        if 0 <= task_id < self.sset.tasks:
            shard_name, local = self.sset.locate(task_id)
            return self.shards[self.sset.shards.index(shard_name)], local
        # past the create's tasks: an appended one if its shard has that many
        count = len(self.shards)
        shard = self.shards[task_id % count]
        if task_id < 0 or task_id // count >= shard.status(summaries=0).tasks:
            raise errors.InvalidInput(f"job {self.name}: no task {task_id}")
        return shard, task_id // count

    def _globalize(self, shard: PlainJob, row: dict[str, Any]) -> dict[str, Any]:
        """A shard's task row with the task's global id (``shard_task``: its id there)."""
        local = int(row["id"])
        gid = self.sset.global_id(shard.name, local)
        return {**row, "id": gid, "shard": shard.name, "shard_task": local}

    def shard_statuses(self) -> list[JobStatus]:
        """Every shard's status, shard ``k`` at index ``k``.

        Raises:
            JobNotFound: a shard is missing.
        """
        return [s.status(summaries=0) for s in self.shards]

    # -- reading ------------------------------------------------------------------
    def samples(self, cache: dict[str, Any] | None = None) -> tuple[int, int | None]:
        """The shards' ``samples`` summed (``PlainJob.samples``); ``(0, None)`` when a
        shard's task sizes are unknown."""
        cache = {} if cache is None else cache
        finished, total = 0, 0
        for shard in self.shards:
            f, t = shard.samples(cache)
            if t is None:
                return 0, None
            finished, total = finished + f, total + t
        return finished, total

    def status(self, summaries: int = 20) -> ShardedStatus:
        """The sums (counters and histograms summed, times the latest, the lowest
        unfinished pass), each shard's status in ``.shards`` (a ``ShardedStatus``).

        Raises:
            JobNotFound: a shard is missing.
        """
        sset = self.sset
        shards = self.shard_statuses()
        state, reason, pass_no = combine(sset, shards)
        counters: dict[str, int] = {}
        for s in shards:
            for k, v in s.counters.items():  # a time (``*_ms``) is the latest, a count sums
                counters[k] = (
                    max(counters.get(k, 0), v) if k.endswith("_ms") else counters.get(k, 0) + v
                )
        ages: dict[str, int] = {}
        for s in shards:
            for k, v in s.lease_ages.items():
                ages[k] = ages.get(k, 0) + v
        oldest = [s.oldest_lease_age_s for s in shards if s.oldest_lease_age_s is not None]
        at_pass = [s for s in shards if s.pass_no == pass_no]
        unfinished = [
            s.oldest_unfinished_age_s for s in shards if s.oldest_unfinished_age_s is not None
        ]
        return ShardedStatus(
            job=self.name,
            state=state,
            reason=reason,
            pass_no=pass_no,
            passes=sset.passes,
            tasks=sum(s.tasks for s in shards),
            todo=sum(s.todo for s in shards),
            leased=sum(s.leased for s in shards),
            reserved=sum(s.reserved for s in shards),
            done=sum(s.done for s in shards),
            dead=sum(s.dead for s in shards),
            workers=sum(s.workers for s in shards),
            incarnation=sset.incarnation,
            config={
                **shards[0].config,
                "max_backlog": sum(s.config.get("max_backlog") or 0 for s in shards) or None,
                "passes": sset.passes,
                "auto_advance": sset.auto_advance,
                "shards": len(shards),
            },
            counters=counters,
            pass_started_ms=min([s.pass_started_ms for s in at_pass] or [0]),
            created_ms=sset.created_ms or min(s.created_ms for s in shards),
            now_ms=max(s.now_ms for s in shards),
            pass_attempt=max((s.pass_attempt for s in at_pass), default=0),
            histograms=_sum_histograms(shards),
            oldest_lease_age_s=max(oldest) if oldest else None,
            lease_ages=ages,
            backlog=sum(s.backlog for s in shards),
            appended=sum(s.appended for s in shards),
            trimmed=sum(s.trimmed for s in shards),
            # a stream is open while any shard's is (a seal that died half-way)
            stream=_stream_state([s.stream for s in shards]),
            oldest_unfinished_age_s=max(unfinished) if unfinished else None,
            shards=shards,
            masters=[self._master(s) for s in self.shards],
        )

    def _master(self, shard: PlainJob) -> str | None:
        redis_client = self.connection.redis
        if not isinstance(redis_client, RedisCluster):
            return None
        return str(redis_client.get_node_from_key(shard.keys.meta).name)

    def audit(self) -> dict[str, Any]:
        """Every shard's audit plus the pass agreement between them.

        Checks (besides each shard's own): ``shards_ok``; ``passes_agree``: every pass
        below the highest shard's pass is finished (completed or skipped) in every shard,
        i.e. no shard ever ran ahead of the barrier; ``shards_in_step``: now, every
        unfinished shard is at the highest pass, or one below it waiting at the boundary
        (a barrier step half-way, which the next step finishes), so no shard hands out a
        pass while another still runs an earlier one (a rewind to a cut that was not
        one); ``once_per_pass``: per finished pass, the done tasks of all shards plus
        the dead ones are the job's tasks.
        """
        sset = self.sset
        shard_audits = [s.audit() for s in self.shards]
        now = self.shard_statuses()
        finished: dict[int, dict[str, dict[str, Any]]] = {}
        for a in shard_audits:
            for rec in a["passes"]:  # the latest round of each pass wins
                if rec.get("rewound"):  # an attempt a rewind undid: history, not the record
                    continue
                finished.setdefault(int(rec["pass"]), {})[a["job"]] = rec
        top = max(a["pass"] for a in shard_audits)
        per_pass = []
        agree = once = True
        for p in sorted(finished):
            recs = finished[p]
            ended = {j: r for j, r in recs.items() if r.get("state") in ("completed", "skipped")}
            if p < top and len(ended) != len(sset.shards):
                agree = False
            if len(ended) == len(sset.shards):
                done = sum(int(r.get("done") or 0) for r in ended.values())
                dead = sum(int(r.get("dead") or 0) for r in ended.values())
                skipped = sum(int(r.get("skipped") or 0) for r in ended.values())
                # the pass's tasks: each shard's live and dead ones as its summary says
                # (appends grow a shard), else the create's count (older summaries)
                sizes = [
                    int(r["live"]) + int(r.get("dead") or 0)
                    for r in ended.values()
                    if r.get("live") is not None
                ]
                if done + dead + skipped != (
                    sum(sizes) if len(sizes) == len(ended) else sset.tasks
                ):
                    once = False
                per_pass.append(
                    {
                        "pass": p,
                        "done": done,
                        "dead": dead,
                        "skipped": skipped,
                        "stale": sum(int(r.get("stale") or 0) for r in ended.values()),
                    }
                )
        top_now = max(s.pass_no for s in now)
        in_step = all(
            s.state in ("completed", "cancelled")
            or s.pass_no == top_now
            or (
                s.pass_no == top_now - 1
                and s.state == "waiting"
                and s.reason in ("manual_advance", "all_dead")
            )
            for s in now
        )
        checks = {
            "shards_ok": all(a["ok"] for a in shard_audits),
            "passes_agree": agree,
            "shards_in_step": in_step,
            "once_per_pass": once,
        }
        return {
            "job": self.name,
            "shards": shard_audits,
            "passes": per_pass,
            "checks": checks,
            "ok": all(checks.values()),
        }

    def task(self, task_id: int, history: int = 20) -> dict[str, Any]:
        """Global task ``task_id``: its shard's view of it, with its global id.

        Raises:
            InvalidInput: no such task.
        """
        shard, local = self._of(task_id)
        return self._globalize(shard, shard.task(local, history))

    def tasks_page(
        self, state: str = "leased", cursor: str = "0", count: int = PAGE_MAX
    ) -> tuple[list[dict[str, Any]], str]:
        """One page of one shard's tasks in ``state`` (global ids); the cursor
        ``"<shard index>:<its cursor>"`` goes on through the shards, ``"0"`` at the end.

        Raises:
            InvalidInput: a bad state, cursor or count.
        """
        check_page(state, count)
        k, _, inner = cursor.partition(":") if cursor != "0" else ("0", "", "0")
        if not k.isdigit() or int(k) >= len(self.shards) or not inner:
            raise errors.InvalidInput(f"job {self.name}: bad cursor {cursor[:40]!r}")
        shard = self.shards[int(k)]
        rows, nxt = shard.tasks_page(state, inner, count)
        if nxt != "0":
            nxt = f"{k}:{nxt}"
        elif int(k) + 1 < len(self.shards):
            nxt = f"{int(k) + 1}:0"
        return [self._globalize(shard, r) for r in rows], nxt

    def tasks(
        self, state: str = "leased", limit: int = 100, details: bool = False
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` tasks of the current pass in ``state``, shard after shard."""
        limit = check_limit(limit)
        if not details:
            return list(itertools.islice(iter_tasks(self, state), limit))
        rows: list[dict[str, Any]] = []
        for shard in self.shards:
            if len(rows) >= limit:
                break
            part = shard.tasks(state, limit - len(rows), details=True)
            rows += [self._globalize(shard, r) for r in part]
        return rows

    def events(
        self, since: str = "-", count: int = 100, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        """Every shard's events after ``since``, merged by id (each names its ``shard``;
        ids are the shards' own, in time order across masters whose clocks agree).
        ``block_ms`` waits for new ones, looking every ``EVENTS_POLL_S``."""
        if block_ms is None:
            return self._merged(since, count)
        start = self._newest() if since == "-" else since
        deadline = time.monotonic() + block_ms / 1000.0
        while True:
            got = self._merged(start, count)
            if got or time.monotonic() >= deadline:
                return got
            time.sleep(EVENTS_POLL_S)

    def _newest(self) -> str:
        """The newest event id over the shards (where a wait for new ones starts)."""
        redis_client = self.connection.redis
        with translate(self.connection.url):
            newest = [redis_client.xrevrange(s.keys.events, count=1) for s in self.shards]
        ids = [e[0][0] for e in newest if e]
        return max(ids, key=_event_order) if ids else "0-0"

    def _merged(self, since: str, count: int) -> list[tuple[str, dict[str, str]]]:
        parts = [
            [(i, {**f, "shard": s.name}) for i, f in s.events(since, count)] for s in self.shards
        ]
        merged = heapq.merge(*parts, key=lambda e: _event_order(e[0]))
        return list(itertools.islice(merged, count))

    def latest_events(self, kind: str, limit: int, scan: int = 1000) -> list[dict[str, str]]:
        """The newest ``limit`` events of ``kind`` over the shards, oldest first."""
        rows = [
            {**e, "shard": s.name} for s in self.shards for e in s.latest_events(kind, limit, scan)
        ]
        rows.sort(key=lambda e: _event_order(str(e.get("id", "0-0"))))
        return rows[-limit:] if limit > 0 else []

    def first_lease_ms(self) -> int | None:
        """The earliest of the shards' first leases."""
        found = [ms for ms in (s.first_lease_ms() for s in self.shards) if ms is not None]
        return min(found) if found else None

    def workers(self) -> list[dict[str, Any]]:
        """Every shard's registered workers (a trainer shows once per shard it is on),
        each row naming its ``shard``."""
        return [{**w, "shard": s.name} for s in self.shards for w in s.workers()]

    # -- passes: the barrier ------------------------------------------------------
    def advance(self, manual: bool = False, wait_s: float = 0.0) -> int | None:
        """The barrier step: safe to run any time, by anyone, any number of times at once.

        It runs under the barrier lock (barrier.py): while another step or a
        checkpoint's cut holds it, this one does nothing (returns None; the next idle
        round, the reaper or the holder itself moves the passes).

        First every shard waiting at a pass below the highest shard's is advanced (an
        earlier step advanced some shards and died). Then, when every unfinished shard
        waits at the same pass ``p`` (its pass complete, or none of its tasks live while
        another shard has live ones) and the job advances by itself (or ``manual``), each
        is advanced with ``expected_pass=p``. A job none of whose tasks is live waits
        (``all_dead``), as a plain job does, until a retry.

        Args:
            manual: advance at a manual boundary too (``next``).
            wait_s: how long to wait for the lock when another holds it.

        Returns:
            The pass advanced to, or None when nothing was ready (or the lock was held).

        Raises:
            JobNotFound: a shard is missing. ConnectionLost.
        """
        with barrier_lock(self.connection, self.name, "step", STEP_LOCK_MS, wait_s) as held:
            if held is None:
                return None
            return self._step(manual)

    def _step(self, manual: bool = False) -> int | None:
        """The barrier step's moves (``advance``), for a caller holding the barrier lock."""
        shards = self.shard_statuses()
        if any(s.state == "cancelled" for s in shards):
            for s in shards:  # a cancel that died half-way: finish it
                if s.state not in ("cancelled", "completed"):
                    self._cancel_shard(s.job)
            return None
        top = max(s.pass_no for s in shards)
        moved = None
        for s in shards:
            if _at_boundary(s) and s.pass_no < top:
                self._advance_shard(s, s.pass_no)
                moved = top
        live = [s for s in shards if s.state != "completed"]
        if (
            moved is None
            and live
            and (self.sset.auto_advance or manual)
            and all(_at_boundary(s) and s.pass_no == top for s in live)
            and not all(all_dead(s) for s in shards)  # a completed shard had live tasks
        ):
            for s in live:
                self._advance_shard(s, top)
            moved = top + 1
        return moved

    def _advance_shard(self, s: JobStatus, expected: int, force: bool = False) -> None:
        """``next`` on one shard; a shard that moved on already (a repeated step) or
        finished is success. A shard with no live task only moves with ``force`` (it skips
        nothing: no task of it is live, none is leased)."""
        try:
            PlainJob(self.connection, s.job).next(
                expected_pass=expected, force=force or all_dead(s)
            )
        except (errors.PassMismatch, errors.JobCompleted):
            pass

    def next(self, expected_pass: int | None = None, force: bool = False) -> int:
        """Start the next pass of every shard (``Client.next_pass``; under the barrier
        lock, waiting ``ADMIN_WAIT_S`` for it).

        Raises:
            PassIncomplete: a shard has work left and no force. PassMismatch,
            JobCompleted, JobCancelled, JobNotFound; TaskqError: a checkpoint or rewind
            holds the barrier.
        """
        name = self.name
        with barrier_lock(self.connection, name, "step", STEP_LOCK_MS, ADMIN_WAIT_S) as held:
            if held is None:
                raise errors.TaskqError(
                    f"job {name}: a checkpoint or rewind holds the barrier (over "
                    f"{ADMIN_WAIT_S:g} s); nothing changed, try again"
                )
            st = self.status()
            if st.state == "completed":
                raise errors.JobCompleted(f"job {name!r} is completed")
            if st.state == "cancelled":
                raise errors.JobCancelled(f"job {name!r} was cancelled")
            if expected_pass is not None and expected_pass != st.pass_no:
                raise errors.PassMismatch(
                    f"job {name}: the current pass is {st.pass_no}, not {expected_pass}; "
                    f"nothing changed"
                )
            if force:
                for s in st.shards:
                    if s.state != "completed" and s.pass_no == st.pass_no:
                        self._advance_shard(s, s.pass_no, force=True)
                self._step()
                return self.status().pass_no
            moved = self._step(manual=True)
            if moved is not None:
                return moved
            left = [
                f"{s.job} (todo {s.todo}, leased {s.leased})"
                for s in st.shards
                if not _at_boundary(s) and s.state != "completed"
            ]
            if not left:
                raise errors.PassIncomplete(
                    f"job {name}: no task of pass {st.pass_no} is live (all dead); retry them "
                    "(taskq tasks retry) or --force"
                )
            raise errors.PassIncomplete(
                f"job {name}: pass {st.pass_no} has work left in {', '.join(left)}; "
                f"--force skips it"
            )

    def reset(self, expected_pass: int | None = None) -> int:
        """Restart the current pass in every shard (its leases become stale).

        Raises:
            PassMismatch: ``expected_pass`` is not the current pass. JobNotFound, ...
        """
        st = self.status()
        if expected_pass is not None and expected_pass != st.pass_no:
            raise errors.PassMismatch(
                f"job {self.name}: the current pass is {st.pass_no}, not {expected_pass}; "
                f"nothing changed"
            )
        for s in st.shards:
            if s.state != "completed" and s.pass_no == st.pass_no:
                try:
                    PlainJob(self.connection, s.job).reset(expected_pass=st.pass_no)
                except errors.PassMismatch:
                    pass
        return st.pass_no

    # -- tasks and workers --------------------------------------------------------
    def retry(self, task_ids: Sequence[int] | None = None) -> int:
        """Retry dead tasks (global ids; all when None) in every shard."""
        if not task_ids:
            return sum(s.retry() for s in self.shards)
        by_shard: dict[PlainJob, list[int]] = {}
        for t in task_ids:
            shard, local = self._of(t)
            by_shard.setdefault(shard, []).append(local)
        return sum(shard.retry(ids) for shard, ids in by_shard.items())

    def revoke(self, task_id: int) -> bool:
        """Send global task ``task_id``'s lease back to its shard's front."""
        shard, local = self._of(task_id)
        return shard.revoke(local)

    def drain(self, worker_id: str) -> None:
        """Ask a worker to finish and leave, on every shard it is registered on.

        Raises:
            InvalidInput: no shard has such a worker.
        """
        found = False
        for shard in self.shards:
            if any(w["id"] == worker_id for w in shard.workers()):
                shard.drain(worker_id)
                found = True
        if not found:
            raise errors.InvalidInput(f"job {self.name}: no worker {worker_id!r}")

    def reap(
        self, budget: int = 1000, lock_ms: int = 2000, owner: str = ""
    ) -> tuple[int, bool, bool]:
        """One reap of every shard: (reclaimed in all, more left in any, any locked)."""
        results = [s.reap(budget, lock_ms, owner) for s in self.shards]
        return (
            sum(r[0] for r in results),
            any(r[1] for r in results),
            any(r[2] for r in results),
        )

    def advance_clock(self, ms: int, silent: bool = False) -> int:
        """Tests only: move every shard's manual clock by ``ms`` (the first's new time)."""
        return [s.advance_clock(ms, silent) for s in self.shards][0]

    # -- the job's life -----------------------------------------------------------
    def pause(self) -> None:
        """Pause every unfinished shard (no new leases anywhere; held ones are kept).

        Raises:
            JobCompleted, JobCancelled: the job as a whole is. JobNotFound.
        """
        self._each_live(lambda job: job.pause())

    def resume(self) -> None:
        """Resume every unfinished shard (their waiting trainers lease again).

        Raises:
            JobCompleted, JobCancelled: the job as a whole is. JobNotFound.
        """
        self._each_live(lambda job: job.resume())

    def _each_live(self, act: Callable[[PlainJob], None]) -> None:
        """``act`` on every unfinished shard (idempotent per shard)."""
        states = [s.state for s in self.shard_statuses()]
        if "cancelled" in states:
            raise errors.JobCancelled(f"job {self.name!r} was cancelled")
        if all(st == "completed" for st in states):
            raise errors.JobCompleted(f"job {self.name!r} is completed")
        for shard, st in zip(self.shards, states, strict=True):
            if st != "completed":
                try:
                    act(shard)
                except errors.JobCompleted:
                    pass  # completed since the read: nothing to pause there

    def _cancel_shard(self, shard: str) -> None:
        try:
            PlainJob(self.connection, shard).cancel()
        except (errors.JobCancelled, errors.JobCompleted):
            pass

    def cancel(self) -> None:
        """Cancel every shard (idempotent per shard; the barrier step finishes a cancel
        that died half-way).

        Raises:
            JobCompleted: every shard was completed already. JobNotFound.
        """
        shards = self.shard_statuses()
        if all(s.state == "completed" for s in shards):
            raise errors.JobCompleted(f"job {self.name!r} is completed")
        for s in shards:
            if s.state not in ("cancelled", "completed"):
                self._cancel_shard(s.job)

    def delete(self) -> None:
        """Delete every shard and the record (shards already gone are skipped).

        Raises:
            JobNotFound: no such sharded job (any more).
        """
        conn = self.connection
        require(conn, self.name)
        for shard in self.shards:
            try:
                shard.delete()
            except errors.JobNotFound:
                pass
        with translate(conn.url):
            conn.redis.delete(shard_set_key(self.name, conn.prefix))
            conn.redis.srem(shard_sets_index(conn.prefix), self.name)

    def replace(self, chunks: Iterable[Any], **settings: Any) -> JobStatus:
        """Create the job again from ``chunks`` (a new incarnation), over as many shards
        as now unless ``shards=`` says otherwise."""
        shards = settings.pop("shards", len(self.shards))
        if shards == 1:
            raise errors.InvalidInput(
                f"job {self.name!r} is a sharded job: replace it with shards >= 2, or "
                f"delete it first to make a job of one shard of that name"
            )
        cfg, extras = config_of(settings)
        extras.pop("progress", None)
        return create(self.connection, self.name, chunks, shards, cfg, replace=True, **extras)

    # -- checkpoints: one cut across the shards -----------------------------------
    def _position(self) -> list[tuple[int, int, bool]]:
        """What a cut must not see move: each shard's (pass, pass attempt, finished)."""
        return [
            (st.pass_no, st.pass_attempt, st.state in ("completed", "cancelled"))
            for st in self.shard_statuses()
        ]

    def _moved(self, before: list[Any], after: list[Any]) -> bool:
        """True when a shard's pass moved between ``before`` and ``after`` (``_position``).

        A shard that completed the job's last pass meanwhile has not: the last pass has
        no barrier (each shard completes by itself), so its part, taken before or after,
        is one of the same cut.
        """
        passes = self.sset.passes
        last = None if passes is None else passes - 1
        for (b_pass, b_attempt, b_end), (a_pass, a_attempt, a_end) in zip(
            before, after, strict=True
        ):
            if (b_pass, b_attempt, b_end) == (a_pass, a_attempt, a_end):
                continue
            if a_end and not b_end and b_pass == last and a_pass in (last, passes):
                continue
            return True
        return False

    def _free_id(self, ckpt: str, attempt: int) -> str:
        """The shards' checkpoint id for cut ``attempt`` of ``ckpt``: one no shard holds
        yet (sealed or half-written by an attempt that died or was refused), so no shard's
        part of the cut is an older one."""
        redis_client = self.connection.redis
        for k in itertools.count(attempt):
            candidate = ckpt if k == 0 else f"{ckpt[:58]}.r{k}"
            with translate(self.connection.url):
                taken = any(redis_client.hexists(s.keys.ckpt, candidate) for s in self.shards)
            if not taken:
                return candidate
        raise AssertionError("unreachable")

    def checkpoint(
        self, keep: int = checkpoints.DEFAULT_KEEP, ckpt: str | None = None
    ) -> dict[str, Any]:
        """Checkpoint every shard as one cut, then list it in the shard-set record.

        The cut is taken under the barrier lock: no barrier step moves a pass while it is
        taken. Every shard's (pass, attempt) is read before and after; if any moved all
        the same (a lock that expired, a pass reset), the cut is refused and taken again
        under a new id for the shards (``<id>.r<k>``, recorded in the sharded record), up
        to ``CUT_ATTEMPTS`` times.

        Args:
            keep: sealed checkpoints kept (per shard, and in the record), 1-1000.
            ckpt: the id (default: a new time-ordered one); an id already listed is
                returned as it is.

        Returns:
            The sharded checkpoint: ``id``, ``pass`` (the lowest shard's), ``done`` and
            ``unfinished`` (sums), ``job_state`` (the shards' if they agree, else
            ``mixed``), ``sealed_ms`` (the last shard's), ``shard_ids`` (shard -> its
            checkpoint's id) and ``shards`` (each shard's record).

        Raises:
            InvalidInput: bad keep or id. JobNotFound, JobCancelled; TaskqError while a
            rewind runs, or when the passes moved under every attempt.
        """
        conn, name = self.connection, self.name
        if not isinstance(keep, int) or isinstance(keep, bool) or not 1 <= keep <= 1000:
            raise errors.InvalidInput(f"keep must be an integer 1-1000, got {keep!r}")
        ckpt = checkpoint_id(name, ckpt or checkpoints.new_id())
        key = shard_set_key(name, conn.prefix)
        with translate(conn.url):
            listed = conn.redis.hget(key, CKPT_FIELD + ckpt)
        if listed is not None:
            done: dict[str, Any] = json.loads(listed)
            return done
        # the shards keep a few more than the record: a refused attempt's parts count there
        shard_keep = min(1000, keep + CUT_ATTEMPTS)
        for attempt in range(CUT_ATTEMPTS):
            with barrier_lock(conn, name, "checkpoint", CUT_LOCK_MS, CUT_WAIT_S) as keep_lock:
                if keep_lock is None:
                    continue  # a barrier step holds it past the wait: try again
                shard_id = self._free_id(ckpt, attempt)
                before = self._position()
                recs = []
                for shard in self.shards:
                    recs.append(shard.checkpoint(keep=shard_keep, ckpt=shard_id))
                    keep_lock()
                if self._moved(before, self._position()) or not keep_lock():
                    log.warning(
                        "job %s: checkpoint %s: a pass moved during the cut; again", name, ckpt
                    )
                    continue
            out = _combine_checkpoints(ckpt, recs)
            out["shard_ids"] = dict.fromkeys(self.sset.shards, shard_id)
            with translate(conn.url):
                conn.redis.hset(key, CKPT_FIELD + ckpt, json.dumps(out))
                ids = sorted(f for f in conn.redis.hkeys(key) if f.startswith(CKPT_FIELD))
                if len(ids) > keep:  # ids are time-ordered: the oldest go, as per shard
                    conn.redis.hdel(key, *ids[: len(ids) - keep])
            # a step refused while the cut held the lock is not left to the trainers' next
            # idle round (seconds away, at a pass's tail): the cut's taker runs it now
            self.advance()
            return out
        raise errors.TaskqError(
            f"job {name!r}: checkpoint {ckpt}: the passes moved (or a barrier step held the "
            f"lock) during {CUT_ATTEMPTS} attempts at one cut; try again"
        )

    # -- appending: spread over the shards -------------------------------------------
    def append(
        self,
        chunks: Iterable[Any],
        ids: Sequence[str] | None = None,
        block: bool = True,
        timeout: float | None = None,
        source: str | None = None,
    ) -> AppendResult:
        """Add chunks as new tasks, spread over the shards (``PlainJob.append`` on each,
        docs/streams.md): a chunk with an id goes to the shard its id hashes to (``shard_of_id``: so a
        retried append finds the id where it went the first time and skips it); chunks
        without ids go a task at a time in turn, from where the job's layout stands
        (global task ``i`` in shard ``i % S`` while every append is without ids).

        Everything is checked before the first write. ``block`` and ``timeout`` as for a
        plain job, each shard against its own ``max_backlog`` (the job's divided among
        them); ``timeout`` bounds the whole call. ``source`` (with ids only: the ids
        decide each chunk's shard, the same every time) is recorded on each shard for
        its part of the source.

        Returns:
            The tasks added, chunks skipped, the lowest new task's global id, the backlog
            summed over the shards.

        Raises:
            InvalidInput, BacklogFull, JobNotFound, JobCancelled: as ``PlainJob.append``
            (a BacklogFull names the shard; the shards before it took their part).
        """
        encoded, id_list = _check_append(self.name, chunks, ids)
        if source is not None:
            check_chunk_id(self.name, -1, source, "source")
            if id_list is None:
                raise errors.InvalidInput(
                    f"job {self.name}: a sharded job's append names a source only with ids "
                    f"(they place each chunk on its shard, the same every time)"
                )
        if not encoded:
            return AppendResult(0, 0, None, self.status().backlog)
        decoded = [json.loads(text) for text in encoded]
        count = len(self.shards)
        parts: list[list[int]] = [[] for _ in range(count)]
        if id_list is not None:
            for k, chunk_id in enumerate(id_list):
                parts[shard_of_id(chunk_id, count)].append(k)
        else:
            now = self.shard_statuses()
            cpt = int(now[0].config.get("chunks_per_task") or 1)
            base = sum(st.tasks for st in now)
            for k in range(len(encoded)):
                parts[(base + k // cpt) % count].append(k)
        deadline = None if timeout is None else time.monotonic() + timeout
        added = skipped = 0
        firsts: list[int] = []
        for shard, part in zip(self.shards, parts, strict=True):
            if not part:
                continue
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            got = shard.append(
                [decoded[k] for k in part],
                None if id_list is None else [id_list[k] for k in part],
                block=block,
                timeout=left,
                source=source,
            )
            added += got.tasks
            skipped += got.skipped
            if got.first_task is not None:
                firsts.append(self.sset.global_id(shard.name, got.first_task))
        return AppendResult(added, skipped, min(firsts, default=None), self.status().backlog)

    def seal(self) -> SealResult:
        """Close the stream on every shard (idempotent): the job completes once all
        appended is done everywhere. Returns the tasks the stream holds in all
        (``already_sealed``: every shard was sealed before)."""
        sealed = [shard.seal() for shard in self.shards]
        return SealResult(sum(sealed), all(s.already_sealed for s in sealed))

    def set_weights(self, weights: Mapping[str, object], at: int | None = None) -> int:
        """Refused: a sharded job is not a mixed job (docs/mixing.md)."""
        raise errors.InvalidInput(f"job {self.name!r} is sharded, not a mixed job")

    def mix_sequence(self, pass_no: int | None = None) -> list[dict[str, Any]]:
        """Refused: a sharded job is not a mixed job (docs/mixing.md)."""
        raise errors.InvalidInput(f"job {self.name!r} is sharded, not a mixed job")

    def mix_status(self) -> dict[str, Any]:
        """Refused: a sharded job is not a mixed job (docs/mixing.md)."""
        raise errors.InvalidInput(f"job {self.name!r} is sharded, not a mixed job")

    def trim(self, steps: int = 8) -> int:
        """Up to ``steps`` bounded trim steps on every shard (``PlainJob.trim``); the tasks
        the watermarks passed."""
        return sum(shard.trim(steps) for shard in self.shards)

    def files_appended(self, file_keys: Sequence[str]) -> list[bool]:
        """A follower's record of whole files (``taskq job follow``): kept on shard 0."""
        return self.shards[0].files_appended(file_keys)

    def file_appended(self, file_key: str, chunks: int) -> None:
        """Record a file appended whole (on shard 0, as ``files_appended`` reads it)."""
        self.shards[0].file_appended(file_key, chunks)

    def follow_record(self) -> FollowRecord:
        """The follower's record (``PlainJob.follow_record``), kept on shard 0."""
        return self.shards[0].follow_record()

    def forget_files(self, watermark: tuple[float, str] | None, file_keys: Sequence[str]) -> None:
        """Move the follower's watermark on shard 0 (``PlainJob.forget_files``)."""
        self.shards[0].forget_files(watermark, file_keys)

    def checkpoints(self) -> list[dict[str, Any]]:
        """The sharded job's sealed checkpoints, oldest first.

        Raises:
            JobNotFound: no such sharded job (any more).
        """
        conn = self.connection
        require(conn, self.name)
        with translate(conn.url):
            raw = conn.redis.hgetall(shard_set_key(self.name, conn.prefix))
        return [json.loads(raw[f]) for f in sorted(raw) if f.startswith(CKPT_FIELD)]

    def checkpoint_record(self, ckpt: str) -> dict[str, Any]:
        """One sharded checkpoint's record.

        Raises:
            InvalidInput: no such checkpoint (never made, unfinished or dropped).
        """
        conn = self.connection
        with translate(conn.url):
            raw = conn.redis.hget(shard_set_key(self.name, conn.prefix), CKPT_FIELD + ckpt)
        if raw is None:
            raise errors.InvalidInput(
                f"job {self.name!r}: no checkpoint {ckpt!r} (see `taskq job checkpoints "
                f"{self.name}`)"
            )
        rec: dict[str, Any] = json.loads(raw)
        return rec

    def rewind(self, ckpt: CheckpointRef, once: bool = False, key: str = "") -> bool:
        """Put every shard back to its part of the cut ``ckpt`` (its id or its record),
        then run the barrier step, all under the barrier lock; after it every unfinished
        shard is at the same pass.

        Args:
            once, key: as ``Client.rewind``, per shard.

        Returns:
            True when some shard was rewound, False when ``once`` found all already there.

        Raises:
            InvalidInput: no such checkpoint. JobNotFound, JobCancelled. TaskqError:
            another rewind took over a shard meanwhile, or a barrier step held the lock.
        """
        name = self.name
        ckpt = checkpoint_id(name, ckpt)
        ids: dict[str, str] = self.checkpoint_record(ckpt).get("shard_ids") or {}
        with barrier_lock(self.connection, name, "rewind", CUT_LOCK_MS, CUT_WAIT_S) as keep_lock:
            if keep_lock is None:
                raise errors.TaskqError(
                    f"job {name!r}: a barrier step or checkpoint holds the barrier (over "
                    f"{CUT_WAIT_S:g} s); nothing rewound, try again"
                )
            moved = []
            for shard in self.shards:
                moved.append(shard.rewind(ids.get(shard.name, ckpt), once=once, key=key))
                keep_lock()
            self._step()  # a cut that straddled a half-done step: finish it
        live = [s for s in self.shard_statuses() if s.state != "completed"]
        if len({s.pass_no for s in live}) > 1:
            raise errors.TaskqError(
                f"job {name!r}: rewound to {ckpt}, but the shards are at passes "
                f"{sorted({s.pass_no for s in live})}; run `taskq pass next {name}` or "
                f"rewind again"
            )
        return any(moved)


def _combine_checkpoints(ckpt: str, recs: list[dict[str, Any]]) -> dict[str, Any]:
    states = {r.get("job_state") for r in recs}
    return {
        "id": ckpt,
        "pass": min(int(r["pass"]) for r in recs),
        "done": sum(int(r.get("done") or 0) for r in recs),
        "unfinished": sum(int(r.get("unfinished") or 0) for r in recs),
        "job_state": states.pop() if len(states) == 1 else "mixed",
        "sealed_ms": max(int(r.get("sealed_ms") or 0) for r in recs) or int(time.time() * 1000),
        "shards": recs,
    }


def _sum_histograms(shards: Sequence[JobStatus]) -> dict[str, dict[str, Any]]:
    """The shards' histograms bucket by bucket (their bounds are the same:
    engine/contract.py)."""
    out: dict[str, dict[str, Any]] = {}
    for s in shards:
        for name, h in s.histograms.items():
            if name not in out:
                out[name] = {**h, "counts": list(h["counts"]), "sum_s": h.get("sum_s", 0.0)}
                continue
            acc = out[name]
            acc["counts"] = [a + b for a, b in zip(acc["counts"], h["counts"], strict=True)]
            acc["sum_s"] = acc.get("sum_s", 0.0) + h.get("sum_s", 0.0)
            for k, v in h.items():
                if k not in ("counts", "sum_s", "bounds_s") and isinstance(v, (int, float)):
                    acc[k] = acc.get(k, 0) + v
    return out


def _event_order(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return (int(ms or 0), int(seq or 0))


def advance_all(conn: Connection) -> dict[str, int]:
    """The barrier step for every sharded job in the index (for a reaper's tick): a job
    whose trainers all died at a pass boundary moves on without them.

    Returns:
        Sharded job -> the pass it advanced to, for those that moved.
    """
    moved = {}
    for name in list_sets(conn):
        try:
            to = ShardedJob(conn, require(conn, name)).advance()
        except errors.JobNotFound:
            continue  # deleted meanwhile, or a shard missing (status shows which)
        if to is not None:
            moved[name] = to
    return moved


# -- creating one ----------------------------------------------------------------------
def place(conn: Connection, name: str, shards: int) -> list[str]:
    """Shard names for ``name`` whose slots fall on different masters, round robin.

    On a cluster each shard ``k`` tries hash tags ``NAME.s<k>``, ``NAME.s<k>.1``, ...
    (the shard's job name is its tag) until the slot (CRC16, as ``CLUSTER KEYSLOT``) is
    served by master ``k mod M`` of the client's slot map (``CLUSTER SLOTS``), starting
    at a master picked by the name so that small sharded jobs do not all start on the
    same one. Re-sharding the cluster later moves slots, not jobs.

    Returns:
        The S names (``NAME.s<k>`` on a single Redis).
    """
    redis_client = conn.redis
    if not isinstance(redis_client, RedisCluster) or shards == 1:
        return [shard_name(name, k) for k in range(shards)]
    with translate(conn.url):
        masters = sorted(node.name for node in redis_client.get_primaries())
        first = key_slot(name.encode()) % len(masters)
        out = []
        for k in range(shards):
            want = masters[(first + k) % len(masters)]
            for attempt in range(PLACEMENT_TRIES):
                candidate = shard_name(name, k, attempt)
                meta = JobKeys(candidate, conn.prefix).meta
                if redis_client.get_node_from_key(meta).name == want:
                    break
            out.append(candidate)
    return out


def create(
    conn: Connection,
    name: str,
    chunks: Iterable[Any],
    shards: int,
    cfg: JobConfig,
    replace: bool = False,
    stream: bool = False,
    max_backlog: int | None = None,
    **backups: Any,
) -> ShardedStatus:
    """Create (or replace) sharded job ``name`` (``Client.create_job(shards=S)``).

    Everything is checked first (name, settings, chunks, S against the tasks, no job or
    shard in the way); the shard-set record is written first (a create that dies
    half-way leaves a set naming its shards: status shows the missing ones, create
    --replace or delete cleans up), then each shard is created as a plain job with a
    manual pass boundary, global task ``i`` in shard ``i % S``. A replace drops the old
    shards no longer named.

    Args:
        name: ``[A-Za-z0-9._-]``, at most ``MAX_SHARDED_NAME`` characters.
        chunks, replace, backups: as ``Client.create_job`` (``backup_leases``,
            ``backup_factor``).
        shards: S >= 2; at most the number of tasks (a stream's: any, it may start empty).
        stream: every shard a stream (appends spread over them, ``ShardedJob.append``).
        max_backlog: the job's, divided among the shards (each gets ``ceil(max / S)``).
        cfg: the job's configuration, each shard's too, except ``auto_advance``: the
            barrier step starts the next pass by itself when it is set (else it waits
            for ``next``, for every shard at once); the shards themselves wait.

    Returns:
        The new job's status.

    Raises:
        InvalidInput: a bad name, shard count, config or chunks (nothing written).
        JobExists: a job or sharded job of that name exists and ``replace`` is false.
        ConnectionLost: Redis is unreachable.
    """
    if not valid_job_name(name) or len(name) > MAX_SHARDED_NAME:
        raise errors.InvalidInput(
            f"bad sharded job name {name!r}: use 1-{MAX_SHARDED_NAME} of A-Z a-z 0-9 . _ -"
        )
    validate_config(cfg)
    chunks_per_task, passes = cfg.chunks_per_task, cfg.passes
    chunk_list = list(chunks)
    # validates every chunk first
    tasks, _ = encode_tasks(chunk_list, chunks_per_task) if chunk_list or not stream else ([], 0)
    if stream and (not isinstance(shards, int) or shards < 2):
        raise errors.InvalidInput(f"shards must be an integer >= 2, got {shards!r}")
    if not stream and not 2 <= shards <= len(tasks):
        raise errors.InvalidInput(f"shards must be 2..{len(tasks)} (the tasks), got {shards}")
    if max_backlog is not None and (
        isinstance(max_backlog, bool) or not isinstance(max_backlog, int) or max_backlog < 1
    ):
        raise errors.InvalidConfig(f"max_backlog must be an integer >= 1, got {max_backlog!r}")
    old = load(conn, name)
    with translate(conn.url):
        plain = conn.redis.exists(conn.keys(name).meta)
    if plain:
        raise errors.JobExists(f"job {name!r} exists as a job of one shard")
    if old is not None and not replace:
        raise errors.JobExists(f"sharded job {name!r} exists")
    names = place(conn, name, shards)
    with translate(conn.url):
        taken = [
            s
            for s in names
            if (old is None or s not in old.shards) and conn.redis.exists(conn.keys(s).meta)
        ]
    if taken:
        raise errors.JobExists(f"job {taken[0]!r} exists: it would be a shard of {name!r}")
    # global task i -> shard i % S: each shard's chunks regroup into the same tasks
    per_shard: list[list[Any]] = [[] for _ in range(shards)]
    for i in range(len(tasks)):
        per_shard[i % shards].extend(chunk_list[i * chunks_per_task : (i + 1) * chunks_per_task])
    record = {
        "shards": json.dumps(names),
        "tasks": len(tasks),
        "passes": -1 if passes is None else passes,
        "advance": int(cfg.auto_advance),
        "inc": secrets.token_hex(8),
        "created_ms": int(time.time() * 1000),
    }
    key = shard_set_key(name, conn.prefix)
    with translate(conn.url):
        # the record first: a create that dies half-way leaves a set that names its shards
        conn.redis.delete(key)
        conn.redis.hset(key, mapping=record)
        conn.redis.sadd(shard_sets_index(conn.prefix), name)
    shard_cfg = dataclasses.replace(cfg, auto_advance=False)
    per_max = None if max_backlog is None else -(-max_backlog // shards)
    for shard, shard_chunks in zip(names, per_shard, strict=True):
        create_plain(
            conn,
            shard,
            shard_chunks,
            shard_cfg,
            replace=replace,
            stream=stream,
            max_backlog=per_max,
            **backups,
        )
    if old is not None:
        for stale in set(old.shards) - set(names):
            try:
                PlainJob(conn, stale).delete()
            except errors.JobNotFound:
                pass
    return ShardedJob(conn, require(conn, name)).status()


def _stream_state(states: list[str | None]) -> str | None:
    """A sharded job's stream state from its shards': "open" while any is."""
    if not any(states):
        return None
    return "open" if "open" in states else "sealed"


def shard_of_id(chunk_id: str, shards: int) -> int:
    """The shard an appended chunk's id goes to: always the same for an id, spread evenly
    (BLAKE2b: CRC-32 sent the ids ``k0``..``k3`` all to one shard of two, its low bits
    following the last character's)."""
    digest = hashlib.blake2b(chunk_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards
