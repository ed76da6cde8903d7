"""Pause, resume, checkpoint and rewind of a sharded job: every shard, as one.

Each verb is a sequence of single-slot calls, one (or one checkpoint's or rewind's
bounded steps) per shard, each through the shard's ``PlainJob`` (jobs.py). A pause or
resume is idempotent per shard. A checkpoint is one cut across every shard: it is taken
under the barrier lock (``sharded.barrier_lock``), so no barrier step moves a pass
while it is taken, and every shard's (pass, attempt) is read before and after; a cut
under which one moved all the same is refused and taken again under a new id for the
shards. It is listed only once every shard's part is sealed, in the shard-set record
(field ``ckpt.<id>``, with the shards' ids); then the taker runs the barrier step, one
a trainer may have been refused meanwhile. A rewind, under the same lock, puts every
shard back to its part of the cut, then runs the barrier step (which finishes a
boundary a step that died half-way had straddled), so every shard ends at the same
pass. See docs/sharding.md.

Data flow: sharded_job.py (the sharded job's handle) -> sharded_admin.py -> jobs.py
(``PlainJob`` per shard) -> Redis; -> sharded.py (the barrier lock and step).
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from taskq import errors
from taskq.admin import checkpoints, sharded
from taskq.admin.caller import Caller
from taskq.admin.jobs import PlainJob, checkpoint_id
from taskq.admin.shardset import ShardSet, require, shard_status
from taskq.engine.connection import translate
from taskq.keys import shard_set_key

log = logging.getLogger("taskq.sharded")

#: The shard-set record's field prefix of a sealed sharded checkpoint.
CKPT_FIELD = "ckpt."


def pause(client: Caller, name: str) -> None:
    """Pause every unfinished shard (no new leases anywhere; held ones are kept).

    Raises:
        JobCompleted, JobCancelled: the job as a whole is. JobNotFound.
    """
    _each_live(client, require(client, name), lambda job: job.pause())


def resume(client: Caller, name: str) -> None:
    """Resume every unfinished shard (their waiting trainers lease again).

    Raises:
        JobCompleted, JobCancelled: the job as a whole is. JobNotFound.
    """
    _each_live(client, require(client, name), lambda job: job.resume())


def _each_live(client: Caller, sset: ShardSet, act: Callable[[PlainJob], None]) -> None:
    states = [shard_status(client, s).state for s in sset.shards]
    if "cancelled" in states:
        raise errors.JobCancelled(f"job {sset.name!r} was cancelled")
    if all(st == "completed" for st in states):
        raise errors.JobCompleted(f"job {sset.name!r} is completed")
    for shard, st in zip(sset.shards, states, strict=True):
        if st != "completed":
            try:
                act(PlainJob(client, shard))
            except errors.JobCompleted:
                pass  # completed since the read: nothing to pause there


#: Tries at a cut before a checkpoint gives up (the passes moved under every one).
CUT_ATTEMPTS = 3
#: The barrier lock's lifetime while a cut is taken or restored; renewed per shard.
CUT_LOCK_MS = 30_000
#: How long a checkpoint or rewind waits for a barrier step to let go of the lock.
CUT_WAIT_S = 10.0


def _position(client: Caller, sset: ShardSet) -> list[tuple[int, int, bool]]:
    """What a cut must not see move: each shard's (pass, pass attempt, finished)."""
    out = []
    for shard in sset.shards:
        st = shard_status(client, shard)
        out.append((st.pass_no, st.pass_attempt, st.state in ("completed", "cancelled")))
    return out


def _moved(sset: ShardSet, before: list[Any], after: list[Any]) -> bool:
    """True when a shard's pass moved between ``before`` and ``after`` (``_position``).

    A shard that completed the job's last pass meanwhile has not: the last pass has no
    barrier (each shard completes by itself), so its part, taken before or after, is
    one of the same cut.
    """
    last = None if sset.passes is None else sset.passes - 1
    for (b_pass, b_attempt, b_end), (a_pass, a_attempt, a_end) in zip(before, after, strict=True):
        if (b_pass, b_attempt, b_end) == (a_pass, a_attempt, a_end):
            continue
        if a_end and not b_end and b_pass == last and a_pass in (last, sset.passes):
            continue
        return True
    return False


def _free_id(client: Caller, sset: ShardSet, ckpt: str, attempt: int) -> str:
    """The shards' checkpoint id for cut ``attempt`` of ``ckpt``: one no shard holds
    yet (sealed or half-written by an attempt that died or was refused), so no shard's
    part of the cut is an older one."""
    for k in itertools.count(attempt):
        candidate = ckpt if k == 0 else f"{ckpt[:58]}.r{k}"
        with translate(client.url):
            taken = any(
                client.redis.hexists(client.keys(shard).ckpt, candidate) for shard in sset.shards
            )
        if not taken:
            return candidate
    raise AssertionError("unreachable")


def checkpoint(
    client: Caller, name: str, keep: int = checkpoints.DEFAULT_KEEP, ckpt: str | None = None
) -> dict[str, Any]:
    """Checkpoint every shard as one cut, then list it in the shard-set record.

    The cut is taken under the barrier lock (``sharded.barrier_lock``): no barrier step
    moves a pass while it is taken. Every shard's (pass, attempt) is read before and
    after; if any moved all the same (a lock that expired, a pass reset), the cut is
    refused and taken again under a new id for the shards (``<id>.r<k>``, recorded in
    the sharded record), up to ``CUT_ATTEMPTS`` times.

    Args:
        keep: sealed checkpoints kept (per shard, and in the record), 1-1000.
        ckpt: the id (default: a new time-ordered one); an id already listed is returned
            as it is.

    Returns:
        The sharded checkpoint: ``id``, ``pass`` (the lowest shard's), ``done`` and
        ``unfinished`` (sums), ``job_state`` (the shards' if they agree, else
        ``mixed``), ``sealed_ms`` (the last shard's), ``shard_ids`` (shard -> its
        checkpoint's id) and ``shards`` (each shard's record).

    Raises:
        InvalidInput: bad keep or id. JobNotFound, JobCancelled; TaskqError while a
        rewind runs, or when the passes moved under every attempt.
    """
    sset = require(client, name)
    if not isinstance(keep, int) or isinstance(keep, bool) or not 1 <= keep <= 1000:
        raise errors.InvalidInput(f"keep must be an integer 1-1000, got {keep!r}")
    ckpt = checkpoint_id(name, ckpt or checkpoints.new_id())
    key = shard_set_key(name, client.prefix)
    with translate(client.url):
        listed = client.redis.hget(key, CKPT_FIELD + ckpt)
    if listed is not None:
        done: dict[str, Any] = json.loads(listed)
        return done
    # the shards keep a few more than the record: a refused attempt's parts count there
    shard_keep = min(1000, keep + CUT_ATTEMPTS)
    for attempt in range(CUT_ATTEMPTS):
        with sharded.barrier_lock(client, name, "checkpoint", CUT_LOCK_MS, CUT_WAIT_S) as keep_lock:
            if keep_lock is None:
                continue  # a barrier step holds it past the wait: try again
            shard_id = _free_id(client, sset, ckpt, attempt)
            before = _position(client, sset)
            recs = []
            for shard in sset.shards:
                recs.append(PlainJob(client, shard).checkpoint(keep=shard_keep, ckpt=shard_id))
                keep_lock()
            if _moved(sset, before, _position(client, sset)) or not keep_lock():
                log.warning("job %s: checkpoint %s: a pass moved during the cut; again", name, ckpt)
                continue
        out = _combine(ckpt, recs)
        out["shard_ids"] = dict.fromkeys(sset.shards, shard_id)
        with translate(client.url):
            client.redis.hset(key, CKPT_FIELD + ckpt, json.dumps(out))
            ids = sorted(f for f in client.redis.hkeys(key) if f.startswith(CKPT_FIELD))
            if len(ids) > keep:  # ids are time-ordered: the oldest go, as per shard
                client.redis.hdel(key, *ids[: len(ids) - keep])
        # a step refused while the cut held the lock is not left to the trainers' next
        # idle round (seconds away, at a pass's tail): the cut's taker runs it now
        sharded.advance(client, name, sset=sset)
        return out
    raise errors.TaskqError(
        f"job {name!r}: checkpoint {ckpt}: the passes moved (or a barrier step held the "
        f"lock) during {CUT_ATTEMPTS} attempts at one cut; try again"
    )


def _combine(ckpt: str, recs: list[dict[str, Any]]) -> dict[str, Any]:
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


def listing(client: Caller, name: str) -> list[dict[str, Any]]:
    """The sharded job's sealed checkpoints, oldest first.

    Raises:
        JobNotFound: no such sharded job.
    """
    require(client, name)
    with translate(client.url):
        raw = client.redis.hgetall(shard_set_key(name, client.prefix))
    return [json.loads(raw[f]) for f in sorted(raw) if f.startswith(CKPT_FIELD)]


def get(client: Caller, name: str, ckpt: str) -> dict[str, Any]:
    """One sharded checkpoint.

    Raises:
        InvalidInput: no such checkpoint (never made, unfinished or dropped). JobNotFound.
    """
    require(client, name)
    with translate(client.url):
        raw = client.redis.hget(shard_set_key(name, client.prefix), CKPT_FIELD + ckpt)
    if raw is None:
        raise errors.InvalidInput(
            f"job {name!r}: no checkpoint {ckpt!r} (see `taskq job checkpoints {name}`)"
        )
    rec: dict[str, Any] = json.loads(raw)
    return rec


def rewind(client: Caller, name: str, ckpt: str, once: bool = False, key: str = "") -> bool:
    """Put every shard back to its part of the cut ``ckpt``, then run the barrier step,
    all under the barrier lock; after it every unfinished shard is at the same pass.

    Args:
        once, key: as ``Client.rewind``, per shard.

    Returns:
        True when some shard was rewound, False when ``once`` found all already there.

    Raises:
        InvalidInput: no such checkpoint. JobNotFound, JobCancelled. TaskqError: another
        rewind took over a shard meanwhile, or a barrier step held the lock.
    """
    sset = require(client, name)
    rec = get(client, name, ckpt)
    ids: dict[str, str] = rec.get("shard_ids") or {}
    with sharded.barrier_lock(client, name, "rewind", CUT_LOCK_MS, CUT_WAIT_S) as keep_lock:
        if keep_lock is None:
            raise errors.TaskqError(
                f"job {name!r}: a barrier step or checkpoint holds the barrier (over "
                f"{CUT_WAIT_S:g} s); nothing rewound, try again"
            )
        moved = []
        for shard in sset.shards:
            moved.append(PlainJob(client, shard).rewind(ids.get(shard, ckpt), once=once, key=key))
            keep_lock()
        sharded.step(client, sset)  # a cut that straddled a half-done step: finish it
    live = [s for s in (shard_status(client, x) for x in sset.shards) if s.state != "completed"]
    if len({s.pass_no for s in live}) > 1:
        raise errors.TaskqError(
            f"job {name!r}: rewound to {ckpt}, but the shards are at passes "
            f"{sorted({s.pass_no for s in live})}; run `taskq pass next {name}` or rewind again"
        )
    return any(moved)
