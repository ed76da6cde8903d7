"""Reading what Redis holds defensively: bad data becomes ``CorruptData`` naming the key.

A key under the taskq prefix may hold something taskq did not write (a hand edit, a
foreign tool, a half-restored backup). Nothing here repairs it; the point is one clear
error that names the key, instead of a ``JSONDecodeError`` or a bare ``WRONGTYPE``.

Data flow: connection.translate / trainer/core.py / stats.py -> integrity.py (reads only).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from . import errors
from .keys import JOB_KEYS, JobKeys

#: The Redis type of every job key (``TYPE`` reply); ``none`` (absent) is always fine.
EXPECTED_TYPES: dict[str, str] = {
    "meta": "hash",
    "chunks": "hash",
    "done": "string",
    "dead": "set",
    "deadbits": "string",
    "front": "zset",
    "leases": "hash",
    "owned": "zset",
    "deadlines": "zset",
    "reserved": "zset",
    "started": "zset",
    "workers": "zset",
    "winfo": "hash",
    "waiting": "zset",
    "counts": "hash",
    "passes": "hash",
    "passidx": "zset",
    "hist": "hash",
    "events": "stream",
    "wake": "list",
    "bcast0": "list",
    "bcast1": "list",
    "clock": "string",
    "lock": "string",
    "progress": "hash",
    "ckpts": "zset",
    "ckpt": "hash",
    "ckprog": "hash",
    "appids": "hash",
    "appidx": "hash",
    "appends": "zset",
    "follow": "hash",
    "mix": "hash",
    "mixlog": "zset",
    # (a mixed job's sequence blocks, keys.JobKeys.mixseq_block, are not job keys: their
    # number grows with the pass. Strings, written and read by lib/mixseq.lua only; one of
    # another type fails the lease's GETRANGE, reported as a key of the job holding a type
    # taskq does not write: engine/connection.py _wrong_type_message)
    "mixdead": "set",
    "mixahead": "zset",
    "mixsz": "hash",
    "mixstore": "zset",
    "mixfeed": "zset",
    "mixrepaid": "zset",
    "sources": "hash",
    "srcseq": "zset",
    "aside": "zset",
    "appended": "hash",
}
assert set(EXPECTED_TYPES) == set(JOB_KEYS), "integrity.EXPECTED_TYPES drifted from keys.JOB_KEYS"


_DECODER = json.JSONDecoder()


def _loads(raw: Any) -> Any:
    """``json.loads(raw)``, the same values and the same errors, without its wrapper on the
    common case: a str that starts with the value and ends with it is parsed by the default
    decoder's scanner alone (``raw_decode``); anything else (surrounding whitespace, extra
    data, an error, bytes) goes through ``json.loads``. A trainer decodes one chunk list
    per task; ``json.loads``'s two whitespace scans and frames cost twice the parse.

    (orjson was measured too: it reads integers past 64 bits as floats, and the check that
    sends those elsewhere costs what it saves: bench/HISTORY.md, "Hot-path pass 3".)
    """
    if type(raw) is str:
        try:
            value, end = _DECODER.raw_decode(raw)
        except ValueError:
            pass  # json.loads raises the error (or accepts leading whitespace)
        else:
            if end == len(raw):
                return value
    return json.loads(raw)


def decode_chunks(raw: Any, key: str, task_id: Any) -> list[Any]:
    """The chunk list of one task, from the JSON stored in the job's chunks hash.

    Args:
        raw: the stored value.
        key: the chunks hash (named in the error).
        task_id: the field (named in the error).

    Returns:
        The task's chunks (a JSON list).

    Raises:
        CorruptData: the value is not a JSON list.
    """
    try:
        chunks = _loads(raw)
    except (TypeError, ValueError) as e:
        raise errors.CorruptData(
            f"{key} field {task_id}: task chunks are not JSON ({e}); "
            "the value was not written by taskq"
        ) from e
    if not isinstance(chunks, list):
        raise errors.CorruptData(
            f"{key} field {task_id}: task chunks must be a JSON list, got {type(chunks).__name__}"
        )
    return chunks


def wrong_type_keys(redis_client: Any, job_keys: JobKeys) -> list[tuple[str, str, str]]:
    """The job keys whose Redis type is not the one taskq writes.

    Every key of a job shares one hash tag, so one pipeline serves a cluster too.

    Returns:
        (key, actual type, expected type) for each mismatch, in ``JOB_KEYS`` order.
    """
    pipe = redis_client.pipeline(transaction=False)
    for key in job_keys.all:
        pipe.type(key)
    found = []
    for name, key, actual in zip(JOB_KEYS, job_keys.all, pipe.execute(), strict=True):
        if isinstance(actual, bytes):
            actual = actual.decode()
        if actual not in ("none", EXPECTED_TYPES[name]):
            found.append((key, actual, EXPECTED_TYPES[name]))
    return found


def progress_check(redis_client: Any, job_keys: JobKeys, limit: int = 10000) -> dict[str, Any]:
    """The audit's view of the progress hash (docs/resume.md): tasks with recorded
    progress in this pass attempt, and whether any of them is done (an ack removes a
    task's progress, so none should be).

    Args:
        redis_client: the client's redis.
        job_keys: the job's keys.
        limit: the most entries read (HSCAN pages); the rest is not checked.

    Returns:
        ``{"tasks": n, "samples": recorded samples summed over the entries read,
        "checked": entries read, "done_with_progress": [task ids]}``.

    Raises:
        CorruptData: an entry is not a task id with a number of samples.
    """
    entries: list[tuple[int, int]] = []
    for field, value in redis_client.hscan_iter(job_keys.progress, count=1000):
        try:
            entries.append((int(field), int(value)))
        except (TypeError, ValueError) as e:
            raise errors.CorruptData(
                f"{job_keys.progress} field {field!r}: {value!r} is not a task's progress "
                f"(task id -> samples); the value was not written by taskq"
            ) from e
        if len(entries) >= limit:
            break
    pipe = redis_client.pipeline(transaction=False)
    for task, _ in entries:
        pipe.getbit(job_keys.done, task)
    bits = pipe.execute() if entries else []
    return {
        "tasks": int(redis_client.hlen(job_keys.progress)),
        "samples": sum(n for _, n in entries),
        "checked": len(entries),
        "done_with_progress": [t for (t, _), b in zip(entries, bits, strict=True) if b],
    }


def tasks_check(redis_client: Any, job_keys: JobKeys, tasks: int, trimmed: int) -> bool:
    """The job's size (meta's ``n`` plus the appended record's ``tasks``:
    ``keys.APPENDED_FIELDS``, which a producer's credential may write) against its
    descriptors: its last task has one (unless trimmed) and no task past it has. Two
    ``HEXISTS``.

    Args:
        redis_client: a redis-py client.
        job_keys: the job's keys.
        tasks: the job's tasks, as its status counts them.
        trimmed: a stream's watermark (the tasks below it have no descriptor any more).

    Returns:
        True when they agree.
    """
    pipe = redis_client.pipeline(transaction=False)
    pipe.hexists(job_keys.chunks, str(tasks - 1))
    pipe.hexists(job_keys.chunks, str(tasks))
    last, past = pipe.execute()
    return bool((tasks == 0 or tasks - 1 < trimmed or last) and not past)


def dead_check(redis_client: Any, job_keys: JobKeys, limit: int = 100000) -> dict[str, Any]:
    """The audit's view of the dead set against the done set and the dead bitmap: no
    dead task is done (a dead task is in no set of the pass), and the bitmap a checkpoint
    copies holds exactly the set's members. Read in pages (SSCAN, pipelined GETBITs).

    Args:
        redis_client: the client's redis.
        job_keys: the job's keys.
        limit: the most members read; the rest is not checked.

    Returns:
        ``{"dead": set size, "checked": members read, "done": [dead ids found done],
        "not_in_bitmap": [dead ids whose bit is clear], "bitmap": the bitmap's count}``.

    Raises:
        CorruptData: a member is not a task id.
    """
    members: list[int] = []
    for m in redis_client.sscan_iter(job_keys.dead, count=1000):
        try:
            members.append(int(m))
        except (TypeError, ValueError) as e:
            raise errors.CorruptData(
                f"{job_keys.dead} member {m!r} is not a task id; the value was not written by taskq"
            ) from e
        if len(members) >= limit:
            break
    found_done: list[int] = []
    missing: list[int] = []
    for i in range(0, len(members), 1000):
        page = members[i : i + 1000]
        pipe = redis_client.pipeline(transaction=False)
        for task in page:
            pipe.getbit(job_keys.done, task)
            pipe.getbit(job_keys.deadbits, task)
        bits = pipe.execute()
        for k, task in enumerate(page):
            if bits[2 * k]:
                found_done.append(task)
            if not bits[2 * k + 1]:
                missing.append(task)
    pipe = redis_client.pipeline(transaction=False)
    pipe.scard(job_keys.dead)
    pipe.bitcount(job_keys.deadbits)
    size, in_bitmap = pipe.execute()
    return {
        "dead": int(size),
        "checked": len(members),
        "done": sorted(found_done),
        "not_in_bitmap": sorted(missing),
        "bitmap": int(in_bitmap),
    }


def split_check(
    redis_client: Any,
    job_keys: JobKeys,
    round_id: Any,
    size_of: Callable[[list[Any]], int | None],
    running: tuple[Any, bool] | None = None,
    fields: Callable[[list[int]], list[str | None] | None] | None = None,
) -> dict[str, Any]:
    """The audit's view of one pass attempt's split tasks (docs/design.md, "Tail
    splitting"): a split task's pieces are ``[0, m)`` (the head) and ``[m, n)`` (the tail)
    of its split record, so each sample is in one piece; a task is done exactly when both
    pieces are acked, and ``n`` is the task's size where its chunks say it. The pieces are
    the record of the attempt's work: a split task keeps its record whatever happens to it
    (death, retry, completion, a rewind), each piece's progress stays within it, a dead
    task's pieces are leased by nobody, and while the attempt runs every piece not acked
    of a live task is reachable (leased, or waiting in the front or among the orphans).
    A gap (done with a piece not acked, pieces that end short of the task, a record lost,
    a piece nobody can lease) or an overlap (a piece's progress past its end, a piece
    acked and not counted) is reported. The list of the attempt's splits is bounded
    (``MAX_SPLITS``).

    Args:
        redis_client: the client's redis.
        job_keys: the job's keys.
        round_id: the pass attempt (the round its pieces are recorded under) whose splits
            are checked; the list of another attempt is not read.
        size_of: a task's samples from its chunks, None when they do not say
            (``taskq.data.task_size``).
        running: while the attempt runs, (the current round, whether the order's cursor
            is at its end): what makes a lease current and a head reachable only through
            a lease or the front; None: no lease is current (an ended attempt).
        fields: the chunks hash's fields of tasks (a mixed job's slots: their copies,
            admin/mix.py ``task_fields``); None, or None returned: the task ids.

    Returns:
        ``{"tasks": split tasks of the attempt, "acked": of which both pieces acked,
        "bad": [{"task": id, "why": text}]}``.

    Raises:
        CorruptData: a split task's chunks are not taskq's.
    """
    raw = redis_client.hget(job_keys.leases, "s:all")
    if isinstance(raw, bytes):
        raw = raw.decode()
    rnd, _, body = (raw or "").partition("|")
    if raw is None or rnd != str(round_id):
        return {"tasks": 0, "acked": 0, "bad": []}
    tasks = [int(t) for t in body.split()]
    orph = redis_client.hget(job_keys.leases, "s:orph")
    if isinstance(orph, bytes):
        orph = orph.decode()
    o_round, _, o_body = (orph or "").partition("|")
    orphans = {int(t) for t in o_body.split()} if o_round == str(round_id) else set()
    where = (fields(tasks) if fields and tasks else None) or [str(t) for t in tasks]
    pipe = redis_client.pipeline(transaction=False)
    for task, field in zip(tasks, where, strict=True):
        pipe.hget(job_keys.leases, f"s:{task}")
        pipe.getbit(job_keys.done, task)
        pipe.sismember(job_keys.dead, task)
        pipe.hget(job_keys.chunks, field or "")
        pipe.hget(job_keys.progress, task)
        pipe.hget(job_keys.leases, task)
        pipe.hget(job_keys.leases, f"b:{task}")
        pipe.zscore(job_keys.front, task)
    replies = pipe.execute() if tasks else []

    def current(lease: Any) -> bool:
        if running is None or lease is None:
            return False
        if isinstance(lease, bytes):
            lease = lease.decode()
        f = lease.split("|")
        return f[0] == "L" and len(f) > 4 and f[4] == str(running[0])

    bad: list[dict[str, Any]] = []
    acked = 0
    for k, task in enumerate(tasks):
        rec, done, dead, chunks, prog, head_l, tail_l, front = replies[8 * k : 8 * k + 8]
        if chunks is None:
            continue  # trimmed (a stream's done tasks below its watermark)
        if isinstance(rec, bytes):
            rec = rec.decode()
        if rec is None:
            bad.append({"task": task, "why": "split, and its pieces' record is gone"})
            continue
        parts = rec.split("|")
        if len(parts) != 7 or parts[0] != str(round_id):
            bad.append({"task": task, "why": f"split record {rec!r} is not of this attempt"})
            continue
        try:
            m, n, tp = int(parts[1]), int(parts[2]), int(parts[5])
        except ValueError:
            bad.append({"task": task, "why": f"split record {rec!r} is not taskq's"})
            continue
        head, tail, confirmed = parts[3] == "1", parts[4] == "1", parts[6] == "1"
        acked += head and tail
        why = []
        if not 0 <= m <= n:
            why.append(f"pieces [0, {m}) and [{m}, {n}) do not partition the task")
        size = size_of(decode_chunks(chunks, job_keys.chunks, task))
        if size is not None and n != size:
            why.append(f"pieces end at {n}, the task has {size} samples")
        if done and not (head and tail):
            why.append(f"done with a piece not acked (head {head}, tail {tail})")
        if not done and not dead and head and tail:
            why.append("both pieces acked, the task not done")
        if confirmed and prog is not None and int(prog) > m:
            why.append(f"the head's progress {int(prog)} is past its end {m}: read twice")
        if not m <= tp <= n:
            why.append(f"the tail's progress {tp} is outside its piece [{m}, {n})")
        if confirmed and m >= n and not tail:
            why.append("an empty tail not acked: the task can never be done")
        if dead and (current(head_l) or current(tail_l)):
            why.append("dead, and a piece of it leased")
        if running is not None and not done and not dead and not why:
            if not tail and confirmed and not current(tail_l) and task not in orphans:
                why.append(f"its tail [{tp}, {n}) is neither leased nor waiting: unreachable")
            if not head and running[1] and not current(head_l) and front is None:
                why.append(f"its head [.., {m}) is neither leased nor waiting: unreachable")
        if why:
            bad.append({"task": task, "why": "; ".join(why)})
    return {"tasks": len(tasks), "acked": acked, "bad": bad}
