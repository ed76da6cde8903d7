"""Read-only views of a job's tasks: the lease record, task rows, a task's detail and
history, the newest events of a type.

Reads never write; each is bounded (``EVENT_SCAN`` events at most for a history, one
pipeline for a task's detail). stats.py re-exports them beside the job's snapshot.

Data flow: jobs.py (through stats.py) -> stats_tasks.py -> Redis (reads only); it sees
the engine's ``Connection``.
"""

from __future__ import annotations

import json
from typing import Any

from taskq import errors
from taskq.admin.mix import task_fields
from taskq.engine.connection import Connection
from taskq.keys import MetaField as F
from taskq.mix import STRIDE


def parse_lease(record: str | None) -> dict[str, Any] | None:
    """A lease record (see lua/lib/leases.lua) as a dict, or None."""
    if not record:
        return None
    f = record.split("|")
    if f[0] == "L" and len(f) >= 9:
        return {
            "live": True,
            "worker": f[1],
            "worker_incarnation": f[2],
            "token": int(f[3]),
            "round": int(f[4]),
            "started": f[5] == "S",
            "since_ms": int(f[6]),
            "call": int(f[7]),
            "attempt": int(f[8]),
        }
    if f[0] == "E" and len(f) >= 6:
        return {
            "live": False,
            "worker": f[1],
            "worker_incarnation": f[2],
            "token": int(f[3]),
            "round": int(f[4]),
            "ended": {
                "A": "acked",
                "F": "failed",
                "R": "released",
                "X": "expired",
                "S": "stolen",
                "V": "revoked",
                "U": "split_undone",
            }.get(f[5], f[5]),
        }
    return None


def parse_tasks(rows: list[Any], state: str) -> list[dict[str, Any]]:
    """The rows of the peek script as dicts."""
    out = []
    for task_id, record, failures, attempts in rows:
        item: dict[str, Any] = {
            "id": int(task_id),
            "state": state,
            "failures": int(failures),
            "attempts": int(attempts),
        }
        lease = parse_lease(record) if state == "leased" else None
        if lease and lease["live"]:
            item.update(
                worker=lease["worker"],
                token=lease["token"],
                started=lease["started"],
                since_ms=lease["since_ms"],
                attempt=lease["attempt"],
            )
        out.append(item)
    return out


#: Events read (newest first) when looking for a task's history: bounded work per call.
EVENT_SCAN = 5000


#: The kinds a ``step`` entry (one per call: docs/design.md, "Events") lists, each as
#: ``<kind>`` (task ids), ``<kind>_tokens`` and, when more than EVENT_LIST_MAX were
#: listed, ``<kind>_count``.
STEP_KINDS = ("acked", "started", "leased", "reserved")


def step_parts(fields: dict[str, str]) -> list[dict[str, str]]:
    """A ``step`` entry as one event per kind it lists (``type`` the kind, ``tasks``,
    ``tokens``, ``count``, ``pass``, ``worker``); any other entry as itself."""
    if fields.get("type") != "step":
        return [fields]
    out = []
    for kind in STEP_KINDS:
        tasks = fields.get(kind)
        if tasks is None:
            continue
        part = {"type": kind, "pass": fields.get("pass", ""), "worker": fields.get("worker", "")}
        part["tasks"] = tasks
        part["tokens"] = fields.get(f"{kind}_tokens", "")
        part["count"] = fields.get(f"{kind}_count", str(len(tasks.split(","))))
        out.append(part)
    return out


def task_histories(
    conn: Connection, name: str, task_ids: list[int], per_task: int, scan: int = EVENT_SCAN
) -> dict[int, list[dict[str, Any]]]:
    """The latest ``per_task`` events of each task, oldest first, from the newest
    ``scan`` events of the stream (it is trimmed: older history is gone anyway). A
    ``step`` entry counts as one event per kind it lists the task under (``type`` the
    kind, with the task's ``token``)."""
    wanted = {str(t): int(t) for t in task_ids}
    out: dict[int, list[dict[str, Any]]] = {int(t): [] for t in task_ids}
    if not wanted or per_task <= 0:
        return out
    for event_id, fields in conn.redis.xrevrange(conn.keys(name).events, count=scan):
        ms = int(event_id.split("-")[0])
        if fields.get("type") != "step":
            ids = [fields["task"]] if "task" in fields else fields.get("tasks", "").split(",")
            for t in ids:
                if t in wanted and len(out[wanted[t]]) < per_task:
                    out[wanted[t]].append({"id": event_id, "ms": ms, **fields})
            continue
        # newest first: within the entry, the kinds in reverse of the order they came in
        for part in reversed(step_parts(fields)):
            tokens = part["tokens"].split(",")
            for i, t in enumerate(part["tasks"].split(",")):
                if t in wanted and len(out[wanted[t]]) < per_task:
                    one = {"type": part["type"], "pass": part["pass"], "worker": part["worker"]}
                    one["task"] = t
                    one["token"] = tokens[i] if i < len(tokens) else ""
                    out[wanted[t]].append({"id": event_id, "ms": ms, **one})
    for events in out.values():
        events.reverse()
    return out


def latest_of_type(
    conn: Connection, name: str, kind: str, limit: int, scan: int
) -> list[dict[str, str]]:
    """The newest ``limit`` events of type ``kind`` among the newest ``scan``, oldest
    first (what the reaper names after a tick)."""
    out: list[dict[str, str]] = []
    for _, fields in conn.redis.xrevrange(conn.keys(name).events, count=scan):
        if fields.get("type") == kind:
            out.append(fields)
            if len(out) >= limit:
                break
    out.reverse()
    return out


def last_error(history: list[dict[str, Any]]) -> str | None:
    """The error of the latest failure (or dead reason, or expiry) in a task's history."""
    for e in reversed(history):
        if e.get("type") == "failed":
            return str(e.get("error", ""))
        if e.get("type") == "expired":
            return f"lease expired ({e.get('reason', '?')})"
    return None


def add_details(conn: Connection, name: str, rows: list[dict[str, Any]]) -> None:
    """Add ``chunks`` and ``last_error`` to rows of ``parse_tasks`` (in place)."""
    ids = [row["id"] for row in rows]
    fields = task_fields(conn, name, ids) or [str(i) for i in ids]  # (a mixed job's slots)
    raw = conn.redis.hmget(conn.keys(name).chunks, [f or "" for f in fields])
    histories = task_histories(conn, name, ids, per_task=20)
    for row, chunks in zip(rows, raw, strict=True):
        try:
            row["chunks"] = json.loads(chunks) if chunks is not None else None
        except ValueError:
            row["chunks"] = None
        row["last_error"] = last_error(histories[row["id"]])


def pass_length(n: int, pass_no: int, mixe: str | None, mixh: str | None = None) -> int:
    """The tasks of the current pass: ``n``, or a mixed pass's length where its charge
    says (docs/mixing.md; the same rule as lib/meta.lua ``tasks_n``): where it reached a
    source's run-out under ``on_exhausted="stop"``, or every source's with a stream source
    (meta ``mixe``, the slot the pass ends before); while a stream source is open (``n``
    is then the stride ``taskq.mix.STRIDE``), the positions charged so far (meta ``mixh``).
    A ``mixe`` outside ``(pass_no * n, pass_no * n + n]`` (another pass's, or none) leaves
    the pass ``n``, or a stream's the positions charged.

    Args:
        n: the job's tasks (a mixed job's slots per pass).
        pass_no: the current pass.
        mixe: meta ``mixe`` as stored, None when absent.
        mixh: meta ``mixh`` as stored, None when absent (read only for a stream's pass).

    Returns:
        The number of tasks of the pass: ``0 < length <= n``; a stream's ``0 <= length``.
    """
    length = int(mixe or -1) - pass_no * n
    if 0 < length <= n or (n == STRIDE and length == 0):  # (a stream's pass may be empty)
        return length
    if n == STRIDE:  # a stream source open: the positions charged so far
        return max(0, min(n, int(mixh or 0) - pass_no * n))
    return n


def task_detail(conn: Connection, name: str, task_id: int, history: int = 20) -> dict[str, Any]:
    """One task: state, chunks, holder, failures, attempts, last error, recent events.

    Raises:
        JobNotFound: no such job. InvalidInput: no such task. CorruptData: unreadable.
    """
    keys = conn.keys(name)
    t = str(int(task_id))
    field = (task_fields(conn, name, [int(t)]) or [t])[0] or ""  # (a mixed job's slot)
    pipe = conn.redis.pipeline(transaction=False)
    pipe.hmget(keys.meta, ["inc", "n", "round", "state", "pass", "maxf", "maxa", F.MIXE, F.MIXH])
    pipe.hget(keys.appended, "tasks")  # (the tasks appended: keys.APPENDED_FIELDS)
    pipe.hget(keys.chunks, field)
    pipe.sismember(keys.dead, t)
    pipe.getbit(keys.done, int(t))
    pipe.hget(keys.leases, t)
    pipe.hmget(keys.counts, [f"f:{t}", f"a:{t}", f"s:{t}"])
    meta, appended, chunks, dead, done, record, counts = pipe.execute()
    inc, n, rnd, state, pass_no, maxf, maxa, mixe, mixh = meta
    if inc is None:
        raise errors.JobNotFound(f"job {name!r} not found (deleted or replaced)")
    ntasks = int(n or 0) + int(appended or 0)
    if not 0 <= int(t) < ntasks:
        raise errors.InvalidInput(f"job {name}: no task {t} (its tasks are 0-{ntasks - 1})")
    length = pass_length(ntasks, int(pass_no or 0), mixe, mixh)
    if int(t) >= length:  # (a mixed pass that stopped: the positions after are no tasks)
        raise errors.InvalidInput(
            f"job {name}: no task {t} in pass {pass_no}: "
            + (
                f"the pass ended at the stop after {length} tasks (0-{length - 1})"
                if int(ntasks) != STRIDE
                else f"its stream's pass has {length} tasks so far"
            )
        )
    lease = parse_lease(record)
    held = bool(lease and lease["live"] and lease["round"] == int(rnd or 0) and state == "running")
    task_state = (
        "dead"
        if dead
        else "leased"
        if held
        else "done"
        if done
        else "todo"
        if state == "running"
        else state
    )
    try:
        decoded = json.loads(chunks) if chunks is not None else None
    except ValueError as e:
        raise errors.CorruptData(f"{keys.chunks}: task {t} is not JSON") from e
    events = task_histories(conn, name, [int(t)], max(history, 20))[int(t)]
    return {
        "job": name,
        "id": int(t),
        "state": task_state,
        "pass": int(pass_no or 0),
        "chunks": decoded,
        "failures": int(counts[0] or 0),
        "max_failures": int(maxf or 0),
        "attempts": int(counts[1] or 0),
        "max_attempts": int(maxa or 0),
        "solo": counts[2] == "1",
        "lease": lease if held else None,
        "last_lease": lease if lease and not held else None,
        "last_error": last_error(events),
        "history": events[-history:] if history else [],
    }
