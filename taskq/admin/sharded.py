"""Sharded jobs: one job spread over S ordinary jobs (its shards), one pass for all.

A job lives in one hash slot, so one job is served by one Redis core. A sharded job
``NAME`` is S ordinary jobs ``NAME.s0`` .. (each its own hash tag, placed so that they
land on different masters of a cluster) plus a small record of the set
(``keys.shard_set_key``). Global task ``i`` is task ``i // S`` of shard ``i % S``, so
every shard holds a stride sample of the data set.

The shards run with a manual pass boundary: a shard whose pass ``p`` is complete waits.
The barrier step (``advance``) is a sequence of single-slot calls, each safe to repeat
(no script can span slots): it reads every shard and, once all wait at ``p``, advances
each by ``next_pass(shard, expected_pass=p)``; a shard already at ``p+1`` answers
``PassMismatch``, which is success. A shard left waiting behind one that moved on (the
step died half-way) is advanced first, whoever runs the next step: a trainer that finds
its pass done everywhere (``trainer/sharded.py``), the reaper, or ``taskq pass next``.
See docs/sharding.md.

The record and the read side (status, audit) are ``shardset.py``'s, creating one
(``create``, ``place``) ``sharded_create.py``'s, each re-exported here.

Data flow: sharded_job.py / sharded_take.py / reaper.py -> sharded.py (the barrier step,
passes, cancel, retry, delete) -> jobs.py (one ``PlainJob`` per shard) -> Redis;
trainer/sharded.py -> sharded.py (``advance``, ``load``).
"""

from __future__ import annotations

from collections.abc import Sequence

from taskq import errors
from taskq.admin.barrier import ADMIN_WAIT_S, STEP_LOCK_MS, barrier_lock
from taskq.admin.caller import Caller
from taskq.admin.jobs import PlainJob
from taskq.admin.sharded_create import create, place
from taskq.admin.shardset import (
    ShardedStatus,
    ShardSet,
    audit,
    combine,
    list_sets,
    load,
    require,
    shard_status,
    status,
)
from taskq.engine.connection import translate
from taskq.keys import shard_set_key, shard_sets_index
from taskq.models import JobStatus

__all__ = [
    "ShardSet",
    "ShardedStatus",
    "advance",
    "advance_all",
    "all_dead",
    "audit",
    "barrier_lock",
    "cancel",
    "combine",
    "create",
    "delete",
    "list_sets",
    "load",
    "next_pass",
    "place",
    "require",
    "reset_pass",
    "retry",
    "status",
    "step",
]


def _waiting(s: JobStatus) -> bool:
    return s.state == "waiting" and s.reason == "manual_advance"


def _at_boundary(s: JobStatus) -> bool:
    """Shard ``s`` has nothing left in its pass: complete, or every task of it dead (a
    plain job's pass ends once its live tasks are done; one without any waits
    ``all_dead``, and so does a sharded job only when every shard has none)."""
    return _waiting(s) or all_dead(s)


def all_dead(s: JobStatus) -> bool:
    """Shard ``s`` waits with no live task (every task dead at the caps)."""
    return s.state == "waiting" and s.reason == "all_dead"


def _advance_shard(client: Caller, s: JobStatus, expected: int, force: bool = False) -> None:
    """``next_pass`` on one shard; a shard that moved on already (a repeated step) or
    finished is success. A shard with no live task only moves with ``force`` (it skips
    nothing: no task of it is live, none is leased)."""
    try:
        PlainJob(client, s.job).next(expected_pass=expected, force=force or all_dead(s))
    except (errors.PassMismatch, errors.JobCompleted):
        pass


def advance(
    client: Caller,
    name: str,
    manual: bool = False,
    sset: ShardSet | None = None,
    wait_s: float = 0.0,
) -> int | None:
    """The barrier step: safe to run any time, by anyone, any number of times at once.

    It runs under the barrier lock (``barrier_lock``): while another step or a
    checkpoint's cut holds it, this one does nothing (returns None; the next idle round,
    the reaper or the holder itself moves the passes).

    First every shard waiting at a pass below the highest shard's is advanced (an earlier
    step advanced some shards and died). Then, when every unfinished shard waits at the
    same pass ``p`` (its pass complete, or none of its tasks live while another shard has
    live ones) and the job advances by itself (or ``manual``), each is advanced with
    ``expected_pass=p``. A job none of whose tasks is live waits (``all_dead``), as a
    plain job does, until a retry.

    Args:
        manual: advance at a manual boundary too (``next_pass``).
        sset: the shard set, when the caller has it.
        wait_s: how long to wait for the lock when another holds it.

    Returns:
        The pass advanced to, or None when nothing was ready (or the lock was held).

    Raises:
        JobNotFound: no such sharded job or shard. ConnectionLost.
    """
    sset = sset or require(client, name)
    with barrier_lock(client, name, "step", STEP_LOCK_MS, wait_s) as held:
        if held is None:
            return None
        return step(client, sset, manual)


def step(client: Caller, sset: ShardSet, manual: bool = False) -> int | None:
    """The barrier step's moves (``advance``), for a caller holding the barrier lock."""
    shards = [shard_status(client, s) for s in sset.shards]
    if any(s.state == "cancelled" for s in shards):
        for s in shards:  # a cancel that died half-way: finish it
            if s.state not in ("cancelled", "completed"):
                _cancel_shard(client, s.job)
        return None
    top = max(s.pass_no for s in shards)
    moved = None
    for s in shards:
        if _at_boundary(s) and s.pass_no < top:
            _advance_shard(client, s, s.pass_no)
            moved = top
    live = [s for s in shards if s.state != "completed"]
    if (
        moved is None
        and live
        and (sset.auto_advance or manual)
        and all(_at_boundary(s) and s.pass_no == top for s in live)
        and not all(all_dead(s) for s in shards)  # a completed shard had live tasks
    ):
        for s in live:
            _advance_shard(client, s, top)
        moved = top + 1
    return moved


def next_pass(
    client: Caller, name: str, expected_pass: int | None = None, force: bool = False
) -> int:
    """Start the next pass of every shard (``taskq pass next`` on a sharded job).

    Args:
        expected_pass: the pass the caller believes current (compare-and-set).
        force: skip what is left of the pass in every shard.

    Returns:
        The pass after the call.

    Raises:
        PassIncomplete: a shard has work left and no force. PassMismatch, JobCompleted,
        JobCancelled, JobNotFound.
    """
    sset = require(client, name)
    with barrier_lock(client, name, "step", STEP_LOCK_MS, ADMIN_WAIT_S) as held:
        if held is None:
            raise errors.TaskqError(
                f"job {name}: a checkpoint or rewind holds the barrier (over "
                f"{ADMIN_WAIT_S:g} s); nothing changed, try again"
            )
        return _next_pass(client, sset, expected_pass, force)


def _next_pass(client: Caller, sset: ShardSet, expected_pass: int | None, force: bool) -> int:
    name = sset.name
    st = status(client, name, sset)
    if st.state == "completed":
        raise errors.JobCompleted(f"job {name!r} is completed")
    if st.state == "cancelled":
        raise errors.JobCancelled(f"job {name!r} was cancelled")
    if expected_pass is not None and expected_pass != st.pass_no:
        raise errors.PassMismatch(
            f"job {name}: the current pass is {st.pass_no}, not {expected_pass}; nothing changed"
        )
    if force:
        for s in st.shards:
            if s.state != "completed" and s.pass_no == st.pass_no:
                _advance_shard(client, s, s.pass_no, force=True)
        step(client, sset)
        return status(client, name, sset).pass_no
    moved = step(client, sset, manual=True)
    if moved is None:
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
            f"job {name}: pass {st.pass_no} has work left in {', '.join(left)}; --force skips it"
        )
    return moved


def _cancel_shard(client: Caller, shard: str) -> None:
    try:
        PlainJob(client, shard).cancel()
    except (errors.JobCancelled, errors.JobCompleted):
        pass


def cancel(client: Caller, name: str) -> None:
    """Cancel every shard (idempotent per shard; the barrier step finishes a cancel that
    died half-way).

    Raises:
        JobCompleted: every shard was completed already. JobNotFound.
    """
    sset = require(client, name)
    shards = [shard_status(client, s) for s in sset.shards]
    if all(s.state == "completed" for s in shards):
        raise errors.JobCompleted(f"job {name!r} is completed")
    for s in shards:
        if s.state not in ("cancelled", "completed"):
            _cancel_shard(client, s.job)


def reset_pass(client: Caller, name: str, expected_pass: int | None = None) -> int:
    """Restart the current pass in every shard (its leases become stale).

    Raises:
        PassMismatch: ``expected_pass`` is not the current pass. JobNotFound, ...
    """
    st = status(client, name)
    if expected_pass is not None and expected_pass != st.pass_no:
        raise errors.PassMismatch(
            f"job {name}: the current pass is {st.pass_no}, not {expected_pass}; nothing changed"
        )
    for s in st.shards:
        if s.state != "completed" and s.pass_no == st.pass_no:
            try:
                PlainJob(client, s.job).reset(expected_pass=st.pass_no)
            except errors.PassMismatch:
                pass
    return st.pass_no


def retry(client: Caller, name: str, task_ids: Sequence[int] | None = None) -> int:
    """Retry dead tasks (global ids) in every shard; as ``Client.retry``."""
    sset = require(client, name)
    if not task_ids:
        return sum(PlainJob(client, s).retry() for s in sset.shards)
    by_shard: dict[str, list[int]] = {}
    for t in task_ids:
        shard, local = sset.locate(int(t))
        by_shard.setdefault(shard, []).append(local)
    return sum(PlainJob(client, shard).retry(ids) for shard, ids in by_shard.items())


def delete(client: Caller, name: str) -> None:
    """Delete every shard and the record (shards already gone are skipped).

    Raises:
        JobNotFound: no such sharded job.
    """
    sset = require(client, name)
    for shard in sset.shards:
        try:
            PlainJob(client, shard).delete()
        except errors.JobNotFound:
            pass
    with translate(client.url):
        client.redis.delete(shard_set_key(name, client.prefix))
        client.redis.srem(shard_sets_index(client.prefix), name)


def advance_all(client: Caller) -> dict[str, int]:
    """The barrier step for every sharded job in the index (for a reaper's tick): a job
    whose trainers all died at a pass boundary moves on without them.

    Returns:
        Sharded job -> the pass it advanced to, for those that moved.
    """
    moved = {}
    for name in list_sets(client):
        try:
            to = advance(client, name)
        except errors.JobNotFound:
            continue  # deleted meanwhile, or a shard missing (status shows which)
        if to is not None:
            moved[name] = to
    return moved
