"""The shard-set record of a sharded job, and the format of its status.

A sharded job (sharded.py) is S ordinary jobs plus one record (``keys.shard_set_key``):
its shards, tasks, passes, whether the barrier advances by itself, its incarnation.
``load`` reads it (None: the name is not a sharded job, which is how ``Client.job`` and
``Trainer`` tell the two kinds apart); ``ShardedStatus`` is a sharded job's status, the
sums of its shards' with each shard's beside them.

Data flow: client.py (is a name sharded?), jobs.py, sharded.py, trainer/core.py ->
shardset.py -> Redis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from taskq import errors
from taskq.engine.connection import Connection, translate
from taskq.keys import shard_set_key, shard_sets_index
from taskq.models import JobStatus


@dataclass(frozen=True)
class ShardSet:
    """The record of one sharded job.

    Attributes:
        name: the sharded job's name.
        shards: the shards' job names, shard ``k`` at index ``k``.
        tasks: tasks of the whole job at its create (global task ``i`` is in shard
            ``i % S``; appended tasks keep the rule, ``ShardedJob.append``).
        passes: passes to run, None for until cancelled.
        auto_advance: the barrier step advances by itself (else ``next_pass``).
        incarnation: new on every create.
        created_ms: when it was created (Unix ms; 0 if the record does not say).
    """

    name: str
    shards: list[str]
    tasks: int
    passes: int | None
    auto_advance: bool
    incarnation: str
    created_ms: int = 0

    def locate(self, task_id: int) -> tuple[str, int]:
        """(shard job name, task id in the shard) of global task ``task_id`` (one of the
        create's; an appended task's shard says whether it has it)."""
        if not 0 <= task_id < self.tasks:
            raise errors.InvalidInput(f"job {self.name}: no task {task_id} (0..{self.tasks - 1})")
        return self.shards[task_id % len(self.shards)], task_id // len(self.shards)

    def global_id(self, shard: str, task_id: int) -> int:
        """The global id of task ``task_id`` of ``shard``."""
        return task_id * len(self.shards) + self.shards.index(shard)


def load(conn: Connection, name: str) -> ShardSet | None:
    """The shard set of ``name``, or None when ``name`` is not a sharded job."""
    with translate(conn.url):
        raw = conn.redis.hgetall(shard_set_key(name, conn.prefix))
    if not raw:
        return None
    try:
        passes = int(raw["passes"])
        return ShardSet(
            name=name,
            shards=list(json.loads(raw["shards"])),
            tasks=int(raw["tasks"]),
            passes=None if passes < 0 else passes,
            auto_advance=raw["advance"] == "1",
            incarnation=raw["inc"],
            created_ms=int(raw.get("created_ms") or 0),
        )
    except (KeyError, ValueError) as e:
        raise errors.CorruptData(
            f"{shard_set_key(name, conn.prefix)}: not a shard set record ({e})"
        ) from e


def require(conn: Connection, name: str) -> ShardSet:
    """``load`` that raises ``JobNotFound`` for a name that is not a sharded job."""
    found = load(conn, name)
    if found is None:
        raise errors.JobNotFound(f"sharded job {name!r} not found")
    return found


def list_sets(conn: Connection) -> list[str]:
    """The sharded jobs' names, sorted."""
    with translate(conn.url):
        return sorted(conn.redis.smembers(shard_sets_index(conn.prefix)))


@dataclass
class ShardedStatus(JobStatus):
    """A sharded job as one: a ``JobStatus`` of sums (counters and histograms summed,
    times the latest, the lowest unfinished pass) plus each shard's own ``JobStatus``
    (``shards``) and its master on a cluster (``masters``)."""

    shards: list[JobStatus] = field(default_factory=list)
    masters: list[str | None] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The keys of ``JobStatus.as_dict`` (of the sums), plus ``shards``."""
        out = super().as_dict()
        out["shards"] = [
            {
                "job": s.job,
                "master": m,
                "state": s.state,
                "reason": s.reason,
                "pass": s.pass_no,
                "tasks": s.tasks,
                "todo": s.todo,
                "leased": s.leased,
                "done": s.done,
                "dead": s.dead,
                "workers": s.workers,
            }
            for s, m in zip(self.shards, self.masters, strict=True)
        ]
        return out
