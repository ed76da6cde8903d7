"""Creating a sharded job: its shards placed on different masters, its record, its shards.

``create`` (``Client.create_job(shards=S)``) checks everything first (name, settings,
chunks, S against the tasks, no job or shard in the way), places the S shard names so
that their slots fall on different masters of a cluster (``place``), writes the
shard-set record first (a create that dies half-way leaves a set naming its shards),
then creates each shard as a plain job back through the client (its ``create_job``),
each with a manual pass boundary, global task ``i`` in shard ``i % S``. A replace drops
the old shards no longer named. See docs/sharding.md.

Data flow: client_jobs.py -> sharded_create.py -> the client (a ``caller.Caller``: each
shard's ``create_job``), shardset.py (the record read back) -> Redis.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from collections.abc import Iterable
from typing import Any

from redis.cluster import RedisCluster
from redis.crc import key_slot

from taskq import errors
from taskq.admin.caller import Caller
from taskq.admin.jobs import PlainJob
from taskq.admin.shardset import ShardedStatus, load, status
from taskq.config import encode_tasks, validate_config
from taskq.engine.connection import translate
from taskq.keys import (
    MAX_SHARDED_NAME,
    JobKeys,
    shard_name,
    shard_set_key,
    shard_sets_index,
    valid_job_name,
)
from taskq.models import JobConfig

#: Hash tags tried per shard to reach the wanted master (1/M of them do; M masters).
PLACEMENT_TRIES = 1000


def place(client: Caller, name: str, shards: int) -> list[str]:
    """Shard names for ``name`` whose slots fall on different masters, round robin.

    On a cluster each shard ``k`` tries hash tags ``NAME.s<k>``, ``NAME.s<k>.1``, ...
    (the shard's job name is its tag) until the slot (CRC16, as ``CLUSTER KEYSLOT``) is
    served by master ``k mod M`` of the client's slot map (``CLUSTER SLOTS``), starting
    at a master picked by the name so that small sharded jobs do not all start on the
    same one. Re-sharding the cluster later moves slots, not jobs.

    Returns:
        The S names (``NAME.s<k>`` on a single Redis).
    """
    redis_client = client.redis
    if not isinstance(redis_client, RedisCluster) or shards == 1:
        return [shard_name(name, k) for k in range(shards)]
    with translate(client.url):
        masters = sorted(node.name for node in redis_client.get_primaries())
        first = key_slot(name.encode()) % len(masters)
        out = []
        for k in range(shards):
            want = masters[(first + k) % len(masters)]
            for attempt in range(PLACEMENT_TRIES):
                candidate = shard_name(name, k, attempt)
                meta = JobKeys(candidate, client.prefix).meta
                if redis_client.get_node_from_key(meta).name == want:
                    break
            out.append(candidate)
    return out


def create(
    client: Caller,
    name: str,
    chunks: Iterable[Any],
    shards: int,
    cfg: JobConfig,
    replace: bool = False,
    **backups: Any,
) -> ShardedStatus:
    """Create (or replace) sharded job ``name`` (``Client.create_job(shards=S)``).

    Args:
        name: ``[A-Za-z0-9._-]``, at most ``MAX_SHARDED_NAME`` characters.
        chunks, replace, backups: as ``Client.create_job`` (``backup_leases``,
            ``backup_factor``).
        shards: S >= 2; at most the number of tasks.
        cfg: the job's configuration, each shard's too, except ``auto_advance``: the
            barrier step starts the next pass by itself when it is set (else it waits
            for ``next_pass``, for every shard at once); the shards themselves wait.

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
    tasks, _ = encode_tasks(chunk_list, chunks_per_task)  # validates every chunk first
    if not 2 <= shards <= len(tasks):
        raise errors.InvalidInput(f"shards must be 2..{len(tasks)} (the tasks), got {shards}")
    old = load(client, name)
    with translate(client.url):
        plain = client.redis.exists(client.keys(name).meta)
    if plain:
        raise errors.JobExists(f"job {name!r} exists as a job of one shard")
    if old is not None and not replace:
        raise errors.JobExists(f"sharded job {name!r} exists")
    names = place(client, name, shards)
    with translate(client.url):
        taken = [
            s
            for s in names
            if (old is None or s not in old.shards) and client.redis.exists(client.keys(s).meta)
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
    key = shard_set_key(name, client.prefix)
    with translate(client.url):
        # the record first: a create that dies half-way leaves a set that names its
        # shards (status shows the missing ones; create --replace or delete cleans up)
        client.redis.delete(key)
        client.redis.hset(key, mapping=record)
        client.redis.sadd(shard_sets_index(client.prefix), name)
    for shard, shard_chunks in zip(names, per_shard, strict=True):
        client.create_job(
            shard,
            shard_chunks,
            **{**dataclasses.asdict(cfg), "auto_advance": False},
            replace=replace,
            **backups,
        )
    if old is not None:
        for stale in set(old.shards) - set(names):
            try:
                PlainJob(client, stale).delete()
            except errors.JobNotFound:
                pass
    return status(client, name)
