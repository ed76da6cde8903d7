"""Pause, resume, checkpoint and rewind of a sharded job: every shard, as one.

Each verb is a sequence of single-slot calls through the public ``Client`` API, one (or
one checkpoint's or rewind's bounded steps) per shard, and each is safe to repeat: a
pause or resume is idempotent per shard; a checkpoint uses the same id in every shard
(a shard whose checkpoint of that id is sealed returns it as it is) and is listed only
once every shard's is sealed, in the shard-set record (field ``ckpt.<id>``); a rewind
puts every shard back to its checkpoint of that id, then runs the barrier step, which
finishes a pass boundary that the checkpoint straddled (some shards taken before the
step, some after). See docs/sharding.md.

Data flow: client.py (pause_job / resume_job / checkpoint / checkpoints / rewind on a
sharded name), cli -> sharded_admin.py -> client.py (per shard) -> Redis;
-> sharded.py (the barrier step).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from . import checkpoints, errors, sharded
from .connection import translate
from .keys import shard_set_key
from .shardset import ShardSet, require

if TYPE_CHECKING:
    from .client import Client

#: The shard-set record's field prefix of a sealed sharded checkpoint.
CKPT_FIELD = "ckpt."


def pause(client: Client, name: str) -> None:
    """Pause every unfinished shard (no new leases anywhere; held ones are kept).

    Raises:
        JobCompleted, JobCancelled: the job as a whole is. JobNotFound.
    """
    _each_live(client, require(client, name), client.pause_job)


def resume(client: Client, name: str) -> None:
    """Resume every unfinished shard (their waiting trainers lease again).

    Raises:
        JobCompleted, JobCancelled: the job as a whole is. JobNotFound.
    """
    _each_live(client, require(client, name), client.resume_job)


def _each_live(client: Client, sset: ShardSet, act: Any) -> None:
    states = [client.status(s, summaries=0).state for s in sset.shards]
    if "cancelled" in states:
        raise errors.JobCancelled(f"job {sset.name!r} was cancelled")
    if all(st == "completed" for st in states):
        raise errors.JobCompleted(f"job {sset.name!r} is completed")
    for shard, st in zip(sset.shards, states, strict=True):
        if st != "completed":
            try:
                act(shard)
            except errors.JobCompleted:
                pass  # completed since the read: nothing to pause there


def checkpoint(
    client: Client, name: str, keep: int = checkpoints.DEFAULT_KEEP, ckpt: str | None = None
) -> dict[str, Any]:
    """Checkpoint every shard under one id, then list it in the shard-set record.

    Args:
        keep: sealed checkpoints kept (per shard, and in the record), 1-1000.
        ckpt: the id (default: a new time-ordered one); repeating an id finishes a
            checkpoint that died half-way, or returns the sealed one.

    Returns:
        The sharded checkpoint: ``id``, ``pass`` (the lowest shard's), ``done`` and
        ``unfinished`` (sums), ``job_state`` (the shards' if they agree, else
        ``mixed``), ``sealed_ms`` (the last shard's) and ``shards`` (each shard's record).

    Raises:
        InvalidInput: bad keep or id. JobNotFound, JobCancelled; TaskqError while a
        rewind runs.
    """
    sset = require(client, name)
    ckpt = ckpt or checkpoints.new_id()
    recs = [client.checkpoint(shard, keep=keep, ckpt=ckpt) for shard in sset.shards]
    out = _combine(ckpt, recs)
    key = shard_set_key(name, client.prefix)
    with translate(client.url):
        client.redis.hset(key, CKPT_FIELD + ckpt, json.dumps(out))
        listed = sorted(f for f in client.redis.hkeys(key) if f.startswith(CKPT_FIELD))
        if len(listed) > keep:  # ids are time-ordered: the oldest go, as per shard
            client.redis.hdel(key, *listed[: len(listed) - keep])
    return out


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


def listing(client: Client, name: str) -> list[dict[str, Any]]:
    """The sharded job's sealed checkpoints, oldest first.

    Raises:
        JobNotFound: no such sharded job.
    """
    require(client, name)
    with translate(client.url):
        raw = client.redis.hgetall(shard_set_key(name, client.prefix))
    return [json.loads(raw[f]) for f in sorted(raw) if f.startswith(CKPT_FIELD)]


def get(client: Client, name: str, ckpt: str) -> dict[str, Any]:
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


def rewind(client: Client, name: str, ckpt: str, once: bool = False, key: str = "") -> bool:
    """Put every shard back to its checkpoint ``ckpt``, then run the barrier step.

    Args:
        once, key: as ``Client.rewind``, per shard.

    Returns:
        True when some shard was rewound, False when ``once`` found all already there.

    Raises:
        InvalidInput: no such checkpoint. JobNotFound, JobCancelled. TaskqError: another
        rewind took over a shard meanwhile.
    """
    sset = require(client, name)
    get(client, name, ckpt)
    moved = [client.rewind(shard, ckpt, once=once, key=key) for shard in sset.shards]
    sharded.advance(client, name, sset=sset)
    return any(moved)
