"""Mixed jobs: made from source jobs, weights set from a stated slot, the sequence and
the per-source counts read back (docs/mixing.md).

A mixed job is a plain job of the engine: its tasks are its sources' tasks, copied at
create (the sources are read, never written: each stays a job of its own), and its pass
order is the mix schedule (``engine/lua/lib/mix.lua``; the reference is
``taskq.mix.pass_schedule``). Every verb of a plain job (lease, ack, fail, release,
expiry, reap, steal, revoke, retry, reset, checkpoint, rewind, audit) works on it as on
any job; a task re-dispatched keeps its slot, since a slot once charged is stored.

Data flow: jobs.create (``JobConfig.mix``) / the job's verbs (jobs.py ``Job``), which
cli/mix.py calls -> mix.py -> engine/transport.py (weights.lua) -> Redis; reads go to Redis
directly.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, cast

from redis.client import NEVER_DECODE

from taskq import errors
from taskq.admin import shardset
from taskq.data import task_size
from taskq.engine.connection import Connection, translate
from taskq.engine.contract import Code
from taskq.integrity import decode_chunks
from taskq.keys import MetaField as F
from taskq.mix import MixSpec, check_mix
from taskq.models import JobConfig

#: Tasks read from a source per round trip at create.
READ_BATCH = 1000
#: Passes whose sequence a mixed job keeps (lib/mix.lua KEEP).
KEEP_PASSES = 3


def read_sources(
    conn: Connection, name: str, cfg: JobConfig
) -> tuple[tuple[list[str], int], MixSpec, bytes | None]:
    """What mixed job ``name`` (``cfg.mix``, checked by ``validate_config``) is made of:
    its sources' tasks, copied in the order of ``cfg.mix`` (``jobs.create`` stages them).

    Returns:
        ((the tasks' JSON, their chunks), the sources' spec, and when the weights count
        samples (``cfg.mix_by``) the tasks' sizes as the engine keeps them (``mixsz``:
        ``>I`` per task, in the mixed job's order), else None).

    Raises:
        InvalidInput: an unsuitable source (itself, a stream, a sharded or a mixed job),
            or weights counting samples and a task whose size is not known (nothing
            written). JobNotFound: a source that does not exist. ConnectionLost.
    """
    mix = cast(dict[str, float], cfg.mix)
    sources = list(mix)
    weights = check_mix(mix)
    tasks: list[str] = []
    sizes: list[int] = []
    samples: list[int] | None = [] if cfg.mix_by == "samples" else None
    nchunks = 0
    for source in sources:
        if source == name:
            raise errors.InvalidInput(f"mix: {name!r} cannot be its own source")
        if shardset.load(conn, source) is not None:
            raise errors.InvalidInput(f"mix: source {source!r} is a sharded job (not built)")
        keys = conn.keys(source)
        with translate(conn.url):
            meta = conn.redis.hmget(keys.meta, [F.N, F.STREAM, F.SHUFFLE, F.NCHUNKS])
        if meta[0] is None:
            raise errors.JobNotFound(f"mix: source job {source!r} not found")
        if meta[1]:
            raise errors.InvalidInput(f"mix: source {source!r} is a stream (not built)")
        if meta[2] == "m":
            raise errors.InvalidInput(f"mix: source {source!r} is itself a mixed job")
        n = int(meta[0])
        for start in range(0, n, READ_BATCH):
            ids = list(range(start, min(n, start + READ_BATCH)))
            with translate(conn.url):
                got = conn.redis.hmget(keys.chunks, ids)
            missing = [i for i, raw in zip(ids, got, strict=True) if raw is None]
            if missing:
                raise errors.InvalidInput(
                    f"mix: source {source!r} has no chunks for task {missing[0]} (trimmed?)"
                )
            tasks.extend(got)
            if samples is not None:
                for i, raw in zip(ids, got, strict=True):
                    size = task_size(decode_chunks(raw, keys.chunks, i))
                    if size is None or not 0 <= size < 2**32:
                        raise errors.InvalidInput(
                            f"mix: mix_by=samples, but task {i} of source {source!r} does "
                            f"not say its size (every chunk's rows / samples / records)"
                        )
                    samples.append(size)
        sizes.append(n)
        nchunks += int(meta[3] or n)
    spec = MixSpec(tuple(sources), tuple(sizes), tuple(weights), cfg.on_exhausted, cfg.mix_by)
    packed = None if samples is None else struct.pack(f">{len(samples)}I", *samples)
    return (tasks, nchunks), spec, packed


def spec_of(conn: Connection, name: str) -> MixSpec:
    """The sources of mixed job ``name``.

    Raises:
        JobNotFound. InvalidInput: not a mixed job.
    """
    with translate(conn.url):
        raw = conn.redis.hmget(conn.keys(name).meta, [F.INC, F.MIX])
    if raw[0] is None:
        raise errors.JobNotFound(f"job {name!r} not found")
    if not raw[1]:
        raise errors.InvalidInput(f"job {name!r} is not a mixed job")
    return MixSpec.from_json(raw[1])


def set_weights(
    conn: Connection, name: str, weights: Mapping[str, object], at: int | None = None
) -> int:
    """Weights of mixed job ``name`` from slot ``at`` on (None: the first slot not charged
    yet); one call, leases in flight untouched.

    Returns:
        The slot from which they hold: ``at`` when it is not charged yet, else the first
        slot that is not.

    Raises:
        InvalidInput: not a mixed job, a source missing or unknown, a bad weight or slot.
        JobNotFound, JobCancelled.
    """
    spec = spec_of(conn, name)
    ws = spec.weight_list(weights)
    if at is not None and (isinstance(at, bool) or not isinstance(at, int) or at < 0):
        raise errors.InvalidInput(f"at: a slot is an integer >= 0, got {at!r}")
    reply = conn.run(name, "weights", ["", ",".join(ws), -1 if at is None else at])
    code = int(reply[0])
    if code == Code.JOB_CANCELLED:
        raise errors.JobCancelled(f"job {name!r} is cancelled")
    return int(reply[1])


def weight_log(conn: Connection, name: str) -> list[tuple[int, list[str]]]:
    """The weight changes kept, ``(slot, weights)`` in the order they were logged (the
    create's weights are ``spec_of(...).weights``, before them)."""
    with translate(conn.url):
        members = conn.redis.zrange(conn.keys(name).mixlog, 0, -1)
    rows = []
    for m in members:
        slot, seq, ws = m.split("|", 2)
        rows.append((int(seq), int(slot), ws.split(",")))
    rows.sort()
    return [(slot, ws) for _, slot, ws in rows]


def _state_counts(blob: bytes, k: int) -> tuple[int, int, list[int]]:
    """The pass, the positions charged and the tasks each source gave in them, from the
    state's packed form (lib/mix.lua: '>ddddd' scalars, then per source its tasks, the
    tasks it gave in the pass, ...)."""
    p, h = struct.unpack_from(">2d", blob)
    return int(p), int(h), list(struct.unpack_from(f">{k}I", blob, 40 + 4 * k))


def _state(conn: Connection, name: str, spec: MixSpec, pass_no: int) -> dict[str, Any] | None:
    """The schedule of ``pass_no`` as far as leases reached (lib/mix.lua charges a page
    ahead of them): ``{"h": positions handed out, "t": tasks each source gave in them}``;
    None when nothing of it is kept."""
    keys = conn.keys(name)
    k = len(spec.sizes)
    with translate(conn.url):
        cur = conn.redis.execute_command("HMGET", keys.mix, "s", "kp", **{NEVER_DECODE: True})
        mixd = conn.redis.hget(keys.meta, F.MIXD)
    if not cur[0]:
        return None
    blob = cur[0]
    handed = int(mixd or 0) - pass_no * spec.total
    if _state_counts(blob, k)[0] != pass_no:
        if str(pass_no) not in (cur[1] or b"").decode().split(","):
            return None
        with translate(conn.url):
            blob, d = conn.redis.execute_command(
                "HMGET", keys.mix, f"s:{pass_no}", f"d:{pass_no}", **{NEVER_DECODE: True}
            )
        if not blob:
            return None
        handed = int(d or 0)
    _, h, counts = _state_counts(blob, k)
    handed = max(0, min(handed, h))
    if handed < h:  # the page charged ahead: not handed out yet
        key = getattr(keys, f"mixseq{pass_no % KEEP_PASSES}")
        with translate(conn.url):
            raw = conn.redis.getrange(key, 8 * handed, 8 * h - 1)
        for k in range(h - handed):
            counts[spec.sources.index(spec.source_of(int(raw[8 * k : 8 * k + 8], 16)))] -= 1
    return {"h": handed, "t": counts}


def kept_passes(conn: Connection, name: str) -> set[int] | None:
    """The passes of mixed job ``name`` whose stored sequence is kept (a rewind to a cut in
    one of them replays it; lib/mix.lua ``mix_kept``), None when nothing was charged yet."""
    with translate(conn.url):
        blob, kp = conn.redis.execute_command(
            "HMGET", conn.keys(name).mix, "s", "kp", **{NEVER_DECODE: True}
        )
    if not blob:
        return None
    return {int(q) for q in (kp or b"").decode().split(",") if q}


def sequence(conn: Connection, name: str, pass_no: int | None = None) -> list[dict[str, Any]]:
    """What mixed job ``name`` charged in a pass (default: the current one), slot by slot:
    ``{"slot", "pass", "position", "source", "source_task", "task"}`` (``task`` the mixed
    job's id, ``source_task`` the id in the source job). A pass whose sequence is no longer
    kept (docs/mixing.md: the last 3) has none.

    Raises:
        JobNotFound. InvalidInput: not a mixed job.
    """
    spec = spec_of(conn, name)
    keys = conn.keys(name)
    if pass_no is None:
        with translate(conn.url):
            pass_no = int(conn.redis.hget(keys.meta, F.PASS) or 0)
    st = _state(conn, name, spec, pass_no)
    charged = int(st["h"]) if st else 0
    offsets = spec.offsets
    rows: list[dict[str, Any]] = []
    key = getattr(keys, f"mixseq{pass_no % KEEP_PASSES}")
    for start in range(0, charged, READ_BATCH):
        end = min(charged, start + READ_BATCH)
        with translate(conn.url):
            raw = conn.redis.getrange(key, 8 * start, 8 * end - 1)
        for k in range(end - start):
            task = int(raw[8 * k : 8 * k + 8], 16)
            source = spec.source_of(task)
            rows.append(
                {
                    "slot": pass_no * spec.total + start + k,
                    "pass": pass_no,
                    "position": start + k,
                    "source": source,
                    "source_task": task - offsets[spec.sources.index(source)],
                    "task": task,
                }
            )
    return rows


def status(conn: Connection, name: str, cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """Mixed job ``name`` per source: its weight now, the tasks charged and acked in the
    current pass, the samples of those acked, its tasks, the pass; and the pass, the slots
    charged, the next slot.

    Args:
        conn: the engine's connection.
        name: the mixed job.
        cache: keep it between calls: the tasks' sizes are read once (HSCAN pages,
            O(tasks); a mixed job's tasks never change), later calls read the done
            bitmap (O(tasks / 8) bytes) and the schedule's state.

    Returns:
        ``{"job", "pass", "charged", "next_slot", "on_exhausted", "sources": [{"source",
        "weight", "charged", "acked", "samples", "tasks", "pass"}]}``; a row's
        ``samples`` is None when a task of its source does not say its size.

    Raises:
        JobNotFound. InvalidInput: not a mixed job. CorruptData: a task's chunks.
    """
    spec = spec_of(conn, name)
    keys = conn.keys(name)
    sizes = {} if cache is None else cache.setdefault(name, {})
    with translate(conn.url):
        pass_no = int(conn.redis.hget(keys.meta, F.PASS) or 0)
        if len(sizes) != spec.total:
            sizes.clear()
            for field, raw in conn.redis.hscan_iter(keys.chunks, count=1000):
                sizes[int(field)] = task_size(decode_chunks(raw, keys.chunks, field))
        done = conn.redis.execute_command("GET", keys.done, **{NEVER_DECODE: True}) or b""
    st = _state(conn, name, spec, pass_no)
    charged = int(st["h"]) if st else 0
    slot = pass_no * spec.total + charged
    weights = list(spec.weights)  # the ones in force at the next slot: the log says
    for at, ws in sorted(weight_log(conn, name), key=lambda e: e[0]):
        if at <= slot:
            weights = ws
    rows = []
    for i, (source, n, off) in enumerate(zip(spec.sources, spec.sizes, spec.offsets, strict=True)):
        acked = [
            t
            for t in range(off, off + n)
            if t >> 3 < len(done) and done[t >> 3] & (0x80 >> (t & 7))
        ]
        known = [sizes.get(t) for t in acked]
        rows.append(
            {
                "source": source,
                "weight": float(weights[i]),
                "charged": int(st["t"][i]) if st else 0,
                "acked": len(acked),
                "samples": None if None in known else sum(k or 0 for k in known),
                "tasks": n,
                "pass": pass_no,
            }
        )
    return {
        "job": name,
        "pass": pass_no,
        "charged": charged,
        "next_slot": slot,
        "on_exhausted": spec.on_exhausted,
        "sources": rows,
    }
