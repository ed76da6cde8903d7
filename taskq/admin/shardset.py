"""The read side of sharded jobs: the shard-set record and the job's status and audit.

A sharded job (``sharded.py``) is S ordinary jobs plus one record (``keys.shard_set_key``);
this module reads the record and sums the shards' statuses and audits into one view,
with each shard's detail beside it.

Data flow: client_handles.py (is a name sharded?), sharded_job.py, sharded.py, trainer/sharded.py
-> shardset.py -> stats.py (each shard's status and audit, a shard being a plain job) ->
Redis.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.cluster import RedisCluster

from taskq import errors
from taskq.admin import stats
from taskq.admin.caller import Caller
from taskq.engine.connection import translate
from taskq.keys import shard_set_key, shard_sets_index
from taskq.models import JobStatus


@dataclass(frozen=True)
class ShardSet:
    """The record of one sharded job.

    Attributes:
        name: the sharded job's name.
        shards: the shards' job names, shard ``k`` at index ``k``.
        tasks: tasks of the whole job (global task ``i`` is in shard ``i % S``).
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
        """(shard job name, task id in the shard) of global task ``task_id``."""
        if not 0 <= task_id < self.tasks:
            raise errors.InvalidInput(f"job {self.name}: no task {task_id} (0..{self.tasks - 1})")
        return self.shards[task_id % len(self.shards)], task_id // len(self.shards)

    def global_id(self, shard: str, task_id: int) -> int:
        """The global id of task ``task_id`` of ``shard``."""
        return task_id * len(self.shards) + self.shards.index(shard)


def load(client: Caller, name: str) -> ShardSet | None:
    """The shard set of ``name``, or None when ``name`` is not a sharded job."""
    with translate(client.url):
        raw = client.redis.hgetall(shard_set_key(name, client.prefix))
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
            f"{shard_set_key(name, client.prefix)}: not a shard set record ({e})"
        ) from e


def require(client: Caller, name: str) -> ShardSet:
    """``load`` that raises ``JobNotFound`` for a name that is not a sharded job."""
    found = load(client, name)
    if found is None:
        raise errors.JobNotFound(f"sharded job {name!r} not found")
    return found


def list_sets(client: Caller) -> list[str]:
    """The sharded jobs' names, sorted."""
    with translate(client.url):
        return sorted(client.redis.smembers(shard_sets_index(client.prefix)))


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


def _master(client: Caller, shard: str) -> str | None:
    if not isinstance(client.redis, RedisCluster):
        return None
    return str(client.redis.get_node_from_key(client.keys(shard).meta).name)


def combine(sset: ShardSet, shards: Sequence[JobStatus]) -> tuple[str, str, int]:
    """(state, reason, pass) of the whole job from its shards' statuses.

    Cancelled if any shard is; completed when all are; paused if any unfinished shard
    is (a pause or resume that stopped half-way shows); waiting when every unfinished
    shard waits: ``all_dead`` when none of them has a live task (a plain job's rule),
    else ``barrier`` (the next step advances them) or ``manual_advance`` (for
    ``next_pass``); else running. A shard with no live task while others have some has
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


def shard_status(client: Caller, shard: str) -> JobStatus:
    """One shard's status (a shard is a plain job: no look for a shard set)."""
    with translate(client.url, client.keys(shard), client.redis):
        status: JobStatus = stats.snapshot(client, shard, summaries=0)
    return status


def status(client: Caller, name: str, sset: ShardSet | None = None) -> ShardedStatus:
    """Every shard's status and their sums.

    Raises:
        JobNotFound: no such sharded job, or one of its shards is missing.
    """
    sset = sset or require(client, name)
    shards = [shard_status(client, s) for s in sset.shards]
    state, reason, pass_no = combine(sset, shards)
    first = shards[0]
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
    at_pass = [s.pass_started_ms for s in shards if s.pass_no == pass_no] or [0]
    return ShardedStatus(
        job=name,
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
            **first.config,
            "passes": sset.passes,
            "auto_advance": sset.auto_advance,
            "shards": len(shards),
        },
        counters=counters,
        pass_started_ms=min(at_pass),
        created_ms=sset.created_ms or min(s.created_ms for s in shards),
        now_ms=max(s.now_ms for s in shards),
        pass_attempt=max(s.pass_attempt for s in shards if s.pass_no == pass_no)
        if any(s.pass_no == pass_no for s in shards)
        else 0,
        histograms=_sum_histograms(shards),
        oldest_lease_age_s=max(oldest) if oldest else None,
        lease_ages=ages,
        backlog=sum(s.backlog for s in shards),
        shards=shards,
        masters=[_master(client, s) for s in sset.shards],
    )


def _sum_histograms(shards: Sequence[JobStatus]) -> dict[str, dict[str, Any]]:
    """The shards' histograms bucket by bucket (their bounds are the same: engine/contract.py)."""
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


def shard_audit(client: Caller, shard: str) -> dict[str, Any]:
    """One shard's own audit (a plain job's)."""
    with translate(client.url, client.keys(shard), client.redis):
        return stats.audit(client, shard)


def audit(client: Caller, name: str) -> dict[str, Any]:
    """Every shard's audit plus the pass agreement between them.

    Checks (besides each shard's own): ``shards_ok``; ``passes_agree``: every pass below
    the highest shard's pass is finished (completed or skipped) in every shard, i.e. no
    shard ever ran ahead of the barrier; ``shards_in_step``: now,
    every unfinished shard is at the highest pass, or one below it waiting at the
    boundary (a barrier step half-way, which the next step finishes), so no shard hands
    out a pass while another still runs an earlier one (a rewind to a cut that was not
    one); ``once_per_pass``: per finished pass, the done tasks of all shards plus the
    dead ones are the job's tasks.
    """
    sset = require(client, name)
    shard_audits = [shard_audit(client, s) for s in sset.shards]
    now = [shard_status(client, s) for s in sset.shards]
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
            if done + dead + skipped != sset.tasks:
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
        "job": name,
        "shards": shard_audits,
        "passes": per_pass,
        "checks": checks,
        "ok": all(checks.values()),
    }
