"""The shard set of a sharded job: its record, its layout, and how its shards' replies
combine into the whole job's (pure functions: jobs.py's ``ROUTES`` name them).

A sharded job ``NAME`` is S ordinary jobs ``NAME.s0`` .. (each its own hash tag, placed
so that they land on different masters of a cluster: ``place``) plus one record
(``keys.shard_set_key``): its shards, tasks, passes, whether the barrier advances by
itself, its incarnation. Global task ``i`` is task ``i // S`` of shard ``i % S``, so
every shard holds a stride sample of the data set. ``load`` reads the record (None: the
name is not a sharded job, which is how ``Client.job`` and ``Trainer`` tell the two
kinds apart); ``ShardedStatus`` is a sharded job's status, the sums of its shards' with
each shard's beside them (``sharded_status``); ``sharded_audit`` checks the shards agree.

Data flow: client.py (is a name sharded?), jobs.py (the job surface), trainer/ ->
shardset.py -> Redis (the record only).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.cluster import RedisCluster
from redis.crc import key_slot

from taskq import errors
from taskq.engine.connection import Connection, translate
from taskq.keys import JobKeys, shard_name, shard_set_key, shard_sets_index
from taskq.models import JobStatus

#: Hash tags tried per shard to reach the wanted master (1/M of them do; M masters).
PLACEMENT_TRIES = 1000


@dataclass(frozen=True)
class ShardSet:
    """The record of one sharded job.

    Attributes:
        name: the sharded job's name.
        shards: the shards' job names, shard ``k`` at index ``k``.
        tasks: tasks of the whole job at its create (global task ``i`` is in shard
            ``i % S``; appended tasks keep the rule, ``Job.append``, jobs.py).
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


def _waiting(s: JobStatus) -> bool:
    return s.state == "waiting" and s.reason == "manual_advance"


def all_dead(s: JobStatus) -> bool:
    """Shard ``s`` waits with no live task (every task dead at the caps)."""
    return s.state == "waiting" and s.reason == "all_dead"


def at_boundary(s: JobStatus) -> bool:
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


def combine_checkpoints(ckpt: str, recs: list[dict[str, Any]]) -> dict[str, Any]:
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


def sum_histograms(shards: Sequence[JobStatus]) -> dict[str, dict[str, Any]]:
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


def event_order(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return (int(ms or 0), int(seq or 0))


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


def stream_state(states: list[str | None]) -> str | None:
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


def sharded_status(
    sset: ShardSet, shards: list[JobStatus], masters: list[str | None]
) -> ShardedStatus:
    """The whole job's status from its shards' (shard ``k`` at index ``k``): the sums
    (counters and histograms summed, times the latest, the lowest unfinished pass), each
    shard's status in ``.shards``."""
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
        job=sset.name,
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
        histograms=sum_histograms(shards),
        oldest_lease_age_s=max(oldest) if oldest else None,
        lease_ages=ages,
        backlog=sum(s.backlog for s in shards),
        appended=sum(s.appended for s in shards),
        trimmed=sum(s.trimmed for s in shards),
        # a stream is open while any shard's is (a seal that died half-way)
        stream=stream_state([s.stream for s in shards]),
        oldest_unfinished_age_s=max(unfinished) if unfinished else None,
        shards=shards,
        masters=masters,
    )


def sharded_audit(
    sset: ShardSet, shard_audits: list[dict[str, Any]], now: list[JobStatus]
) -> dict[str, Any]:
    """The whole job's audit: every shard's (``shard_audits``) plus the pass agreement
    between them, ``now`` being the shards' statuses.

    Checks (besides each shard's own): ``shards_ok``; ``passes_agree``: every pass
    below the highest shard's pass is finished (completed or skipped) in every shard,
    i.e. no shard ever ran ahead of the barrier; ``shards_in_step``: now, every
    unfinished shard is at the highest pass, or one below it waiting at the boundary
    (a barrier step half-way, which the next step finishes), so no shard hands out a
    pass while another still runs an earlier one (a rewind to a cut that was not
    one); ``once_per_pass``: per finished pass, the done tasks of all shards plus
    the dead ones are the job's tasks.
    """
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
            if done + dead + skipped != (sum(sizes) if len(sizes) == len(ended) else sset.tasks):
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
        "job": sset.name,
        "shards": shard_audits,
        "passes": per_pass,
        "checks": checks,
        "ok": all(checks.values()),
    }
