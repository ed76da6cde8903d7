"""Mixed jobs: made from source jobs, weights set from a stated slot, the sequence and
the per-source counts read back (docs/mixing.md).

A mixed job is a job of the engine whose tasks are its *slots* (the positions of a pass,
in order); its sources' tasks are copied at create into its chunks hash under their
*copy ids* (``copy_field``: source and task, 10 hex digits; the sources are read, never
written: each stays a job of its own), and the stored sequence of a pass says which copy
each slot is (the mix schedule, ``engine/lua/lib/mix.lua``; the reference is
``taskq.mix.pass_schedule``). Every verb of a plain job (lease, ack, fail, release,
expiry, reap, steal, revoke, retry, reset, checkpoint, rewind, audit) works on its slots
as on any job's tasks; a slot re-dispatched keeps its copy, since a slot once charged is
stored.

Data flow: jobs.create (``JobConfig.mix``) / the job's verbs (jobs.py ``Job``), which
cli/mix.py calls -> mix.py -> engine/transport.py (weights.lua) -> Redis; reads go to Redis
directly.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any, cast

from redis.client import NEVER_DECODE

from taskq import errors
from taskq.admin import shardset
from taskq.data import task_size
from taskq.engine.connection import Connection, translate
from taskq.engine.contract import Code
from taskq.integrity import decode_chunks
from taskq.keys import MIXSEQ_BLOCK
from taskq.keys import MetaField as F
from taskq.mix import Feed, MixSpec, check_mix
from taskq.models import JobConfig

#: Tasks read from a source per round trip at create (a multiple of SIZE_BLOCK).
READ_BATCH = 1024
#: A stored position's width: a copy id in hex (lib/mixseq.lua W).
ENTRY = 10
#: Tasks' sizes per field of ``mixsz`` (lib/mixrule.lua sizes_reader).
SIZE_BLOCK = 256


def copy_field(source: int, task: int) -> str:
    """The chunks hash's field of a mixed job's copy of task ``task`` of its source
    ``source`` (0-based, in the mix's order): copy id ``source * 2**32 + task`` in 10 hex
    digits, as the stored sequence holds it (lib/mix.lua)."""
    return f"{(source << 32) | task:010x}"


def copy_of(field: str | bytes) -> tuple[int, int]:
    """``(source, task)`` of a copy id (``copy_field``'s inverse)."""
    cid = int(field, 16)
    return cid >> 32, cid & 0xFFFFFFFF


def _appended(raw: str | None) -> int:
    """A count of a job's ``appended`` record (keys.APPENDED_FIELDS) as lib/meta.lua
    tasks_n reads it: 0 when missing, not a number or below 0 (the producer's credential
    writes the record: it never hides the job's own tasks)."""
    try:
        return max(0, int(raw or 0))
    except ValueError:
        return 0


def read_sources(
    conn: Connection, name: str, cfg: JobConfig
) -> tuple[tuple[list[str], int], list[str], MixSpec, dict[str, bytes] | None]:
    """What mixed job ``name`` (``cfg.mix``, checked by ``validate_config``) is made of:
    its sources' tasks, copied in the order of ``cfg.mix`` (``jobs.create`` stages them).

    Returns:
        ((the tasks' JSON, their chunks), each one's field (``copy_field``), the sources'
        spec, and when the weights count samples (``cfg.mix_by``) the tasks' sizes as the
        engine keeps them (``mixsz``: field ``"<source>:<block>"``, ``>I`` per task of
        the source from ``SIZE_BLOCK * block``), else None).

    Raises:
        InvalidInput: an unsuitable source (itself, an open stream, a sharded or a mixed job),
            or weights counting samples and a task whose size is not known (nothing
            written). JobNotFound: a source that does not exist. ConnectionLost.
    """
    mix = cast(dict[str, float], cfg.mix)
    sources = list(mix)
    weights = check_mix(mix)
    tasks: list[str] = []
    fields: list[str] = []
    sizes: list[int] = []
    packed: dict[str, bytes] | None = {} if cfg.mix_by == "samples" else None
    nchunks = 0
    streams: list[bool] = []
    for s, source in enumerate(sources):
        if source == name:
            raise errors.InvalidInput(f"mix: {name!r} cannot be its own source")
        if shardset.load(conn, source) is not None:
            raise errors.InvalidInput(f"mix: source {source!r} is a sharded job (not built)")
        keys = conn.keys(source)
        with translate(conn.url):
            pipe = conn.redis.pipeline(transaction=False)
            pipe.hmget(keys.meta, [F.N, F.STREAM, F.SHUFFLE, F.NCHUNKS, F.FEEDS])
            pipe.hmget(keys.appended, ["tasks", "chunks"])
            meta, appended = pipe.execute()
        if meta[0] is None:
            raise errors.JobNotFound(f"mix: source job {source!r} not found")
        if meta[1] == "open":
            _feed_from(conn, name, source, cfg, meta[4])
        streams.append(meta[1] == "open")
        if meta[2] == "m":
            raise errors.InvalidInput(f"mix: source {source!r} is itself a mixed job")
        # its tasks: the create's and the appended (lib/meta.lua tasks_n); a sealed stream
        # takes no more, any other job's later appends are not the mix's (read once)
        n = int(meta[0]) + _appended(appended[0])
        if n < 1 and cfg.on_exhausted in ("cycle", "stop") and not streams[-1]:  # (sealed, empty)
            raise errors.InvalidInput(
                f"mix: on_exhausted={cfg.on_exhausted} needs a task in every source "
                f"({source!r} has none)"
            )
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
            fields.extend(copy_field(s, i) for i in ids)
            if packed is not None:
                samples: list[int] = []
                for i, raw in zip(ids, got, strict=True):
                    size = task_size(decode_chunks(raw, keys.chunks, i))
                    if size is None or not 0 <= size < 2**32:
                        raise errors.InvalidInput(
                            f"mix: mix_by=samples, but task {i} of source {source!r} does "
                            f"not say its size (every chunk's rows / samples / records)"
                        )
                    samples.append(size)
                for b in range(start, start + len(samples), SIZE_BLOCK):
                    part = samples[b - start : b - start + SIZE_BLOCK]
                    packed[f"{s}:{b // SIZE_BLOCK}"] = struct.pack(f">{len(part)}I", *part)
        sizes.append(n)
        nchunks += int(meta[3] or meta[0]) + _appended(appended[1])
    if not tasks and not any(streams):
        raise errors.InvalidInput("mix: its sources have no task (sealed empty streams)")
    spec = MixSpec(
        tuple(sources),
        tuple(sizes),
        tuple(weights),
        cfg.on_exhausted,
        cfg.mix_by,
        tuple(streams) if any(streams) else (),
        cfg.max_debt if any(streams) else 0,
    )
    return (tasks, nchunks), fields, spec, packed


def _feed_from(conn: Connection, name: str, source: str, cfg: JobConfig, feeds: str | None) -> None:
    """Open stream ``source`` made a feed of mixed job ``name`` (its meta's ``feeds``, set
    before its tasks are read: an append to the source from then on is refused with where
    to append, append.lua), or refused with one line: under ``cycle`` or counting samples
    (a stream has no size to cycle over, a task not yet there no size to count), or when
    it feeds another mixed job that still mixes it (one mixed job per open stream)."""
    if cfg.on_exhausted == "cycle" or cfg.mix_by == "samples":
        raise errors.InvalidInput(
            f"mix: source {source!r} is an open stream: on_exhausted=cycle and "
            f"mix_by=samples need sources of fixed size (seal it first, or drop / stop)"
        )
    if feeds and feeds != name:
        with translate(conn.url):
            other = conn.redis.hget(conn.keys(feeds).meta, F.MIX)
        if other and source in MixSpec.from_json(other).sources:
            raise errors.InvalidInput(
                f"mix: source {source!r} feeds mixed job {feeds!r} already (an open stream "
                f"feeds one mixed job)"
            )
    with translate(conn.url):
        conn.redis.hset(conn.keys(source).meta, F.FEEDS, name)


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
        return weight_entries(conn.redis.zrange(conn.keys(name).mixlog, 0, -1))


def weight_entries(members: Iterable[str]) -> list[tuple[int, list[str]]]:
    """``weight_log`` of the weight log's members ``members`` (``mixlog``'s, or a test's
    that kept what a trim removed)."""
    rows = []
    for m in members:
        slot, seq, ws = m.split("|", 2)
        rows.append((int(seq), int(slot), ws.split(",")))
    rows.sort()
    return [(slot, ws) for _, slot, ws in rows]


def stores(conn: Connection, name: str, spec: MixSpec) -> list[int]:
    """Each source's tasks in mixed job ``name``: its size at create, or a stream source's
    store as its feed left it (``mixstore``, append.lua)."""
    if not any(spec.streams):
        return list(spec.sizes)
    with translate(conn.url):
        got = conn.redis.zmscore(conn.keys(name).mixstore, [str(i) for i in range(len(spec.sizes))])
    return [int(g) if g is not None else n for g, n in zip(got, spec.sizes, strict=True)]


def copies(conn: Connection, name: str) -> int:
    """The copies mixed job ``name`` holds (its chunks hash's fields): ``stores``, but for
    those a trim dropped (each source's trimmed acked positions, ``_trim``)."""
    spec = spec_of(conn, name)
    return sum(stores(conn, name, spec)) - sum(_trim(conn, name, spec)[1])


def feed_log(conn: Connection, name: str) -> list[Feed]:
    """Mixed job ``name``'s feed log (``mixfeed``, lib/mix.lua ``log_feed``): each stream
    source's store as a charge saw it, from a slot on, in the order logged (what
    ``taskq.mix.plan_pass`` takes as ``feed``)."""
    with translate(conn.url):
        return feed_entries(conn.redis.zrange(conn.keys(name).mixfeed, 0, -1))


def feed_entries(members: Iterable[str]) -> list[Feed]:
    """``feed_log`` of the feed log's members ``members`` (``mixfeed``'s, or a test's that
    kept what a trim removed)."""
    rows = []
    for m in members:
        slot, seq, source, tasks, sealed = m.split("|")
        rows.append((int(slot), int(seq), Feed(int(slot), int(source), int(tasks), sealed == "1")))
    rows.sort()
    return [f for _, _, f in rows]


def _state_counts(blob: bytes, k: int) -> tuple[int, int, list[int]]:
    """The pass, the positions charged and the tasks each source gave in them, from the
    state's packed form (lib/mixrule.lua: '>ddddd' scalars, then per source its tasks, the
    tasks it gave in the pass, ...)."""
    p, h = struct.unpack_from(">2d", blob)
    return int(p), int(h), list(struct.unpack_from(f">{k}I", blob, 40 + 4 * k))


def _state_debt(blob: bytes, k: int) -> list[int]:
    """Each source's debt at the state's high-water, from its packed form with stream
    sources (lib/mixrule.lua ``state_format``: its feed's part, ``>d`` the segment's tokens
    then per source ``>I`` its debt, its store, its flags, ends it)."""
    return list(struct.unpack_from(f">{k}I", blob, len(blob) - 12 * k))


def _state_life(blob: bytes, k: int, streams: bool) -> list[int]:
    """Each source's slots over the job's life before the state's pass (``cycle``; the
    packed form's ``>I`` per source after its weights, lib/mixrule.lua; with stream
    sources the feed's part follows: ``>d`` and three ``>I`` per source)."""
    return list(struct.unpack_from(f">{k}I", blob, len(blob) - 4 * k - (8 + 12 * k) * streams))


def _stored(conn: Connection, name: str, pass_no: int, start: int, end: int) -> list[str]:
    """The copy ids (``copy_field``) stored at positions ``start .. end - 1`` of pass
    ``pass_no``, read READ_BATCH at a time (a batch ends at its block's end too:
    lib/mixseq.lua, ``JobKeys.mixseq_block``)."""
    keys = conn.keys(name)
    out: list[str] = []
    at = start
    while at < end:
        block, off = divmod(at, MIXSEQ_BLOCK)
        upto = min(end, at + READ_BATCH, at - off + MIXSEQ_BLOCK)
        with translate(conn.url):
            raw = conn.redis.getrange(
                keys.mixseq_block(pass_no, block), ENTRY * off, ENTRY * (off + upto - at) - 1
            )
        out.extend(raw[ENTRY * k : ENTRY * k + ENTRY] for k in range(upto - at))
        at = upto
    return out


def _trim(conn: Connection, name: str, spec: MixSpec) -> tuple[int, list[int], list[int]]:
    """What the trim of mixed job ``name`` left (docs/mixing.md, "Trim"; only a mix fed by
    an open stream source, in its last pass, is trimmed): its watermark (the positions of
    the current pass below it have no copy any more), each source's acked positions trimmed
    (the ``mix`` hash's ``ta:<i>``, engine/lua/lib/mixtrim.lua) and the positions below the
    watermark set aside (dead or held by a checkpoint: their copies are kept; at most
    ``ASIDE_MAX``)."""
    if not any(spec.streams):
        return 0, [0] * len(spec.sources), []
    keys = conn.keys(name)
    with translate(conn.url):
        pipe = conn.redis.pipeline(transaction=False)
        pipe.hget(keys.meta, F.TRIM_W)
        pipe.hmget(keys.mix, [f"ta:{i}" for i in range(len(spec.sources))])
        pipe.zrange(keys.aside, 0, -1)
        w, ta, aside = pipe.execute()
    w = int(w or 0)
    return w, [int(c or 0) for c in ta], [int(t) for t in aside if int(t) < w]


def copies_at(conn: Connection, name: str, pass_no: int, positions: list[int]) -> list[str]:
    """The copy ids stored at ``positions`` of pass ``pass_no`` of mixed job ``name``, as
    stored (one round trip; a position not stored reads ``""``)."""
    keys = conn.keys(name)
    with translate(conn.url):
        pipe = conn.redis.pipeline(transaction=False)
        for t in positions:
            block, off = divmod(t, MIXSEQ_BLOCK)
            pipe.getrange(keys.mixseq_block(pass_no, block), ENTRY * off, ENTRY * off + ENTRY - 1)
        return pipe.execute() if positions else []


def _state(conn: Connection, name: str, spec: MixSpec, pass_no: int) -> dict[str, Any] | None:
    """The schedule of ``pass_no`` as far as leases reached (lib/mix.lua charges a page
    ahead of them; ``mix_charged``: in the current pass the cursor's reach and past the
    slots granted ahead of it, ``mixahead``, else 'd' as the pass was left): ``{"h": the
    first position after those handed out, "t": tasks each source gave in
    them, "life": each source's slots over the job's life before the pass (``cycle``; 0
    under the other rules), "high": the positions the state charged (its high-water, up to
    a page past "h"), "debt": each source's debt there (0 without stream sources)}``; None
    when nothing of it is kept."""
    keys = conn.keys(name)
    k = len(spec.sizes)
    with translate(conn.url):
        cur = conn.redis.execute_command("HMGET", keys.mix, "s", "kp", **{NEVER_DECODE: True})
        mixd, cursor, now = conn.redis.hmget(keys.meta, [F.MIXD, F.CURSOR, F.PASS])
        top = conn.redis.zrange(keys.mixahead, -1, -1)
    if not cur[0]:
        return None
    blob = cur[0]
    current = int(now or 0) == pass_no
    handed = max(int(mixd or 0) - pass_no * spec.stride, int(top[0]) + 1 if top else 0)
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
    debt = _state_debt(blob, k) if any(spec.streams) else [0] * k
    if current:
        handed = max(handed, int(cursor or 0))
    handed = max(0, min(handed, h))
    for field in _stored(conn, name, pass_no, handed, h):  # charged ahead, not handed out
        counts[copy_of(field)[0]] -= 1
    return {
        "h": handed,
        "t": counts,
        "life": _state_life(blob, k, any(spec.streams)),
        "high": h,
        "debt": debt,
    }


def pass_life(conn: Connection, name: str, pass_no: int) -> list[int] | None:
    """``cycle``: each source's slots over mixed job ``name``'s life before pass
    ``pass_no`` (what the engine keeps with the pass's state: the trimmed weight log cannot
    make it again), None when nothing of the pass is kept.

    Raises:
        JobNotFound. InvalidInput: not a mixed job.
    """
    st = _state(conn, name, spec_of(conn, name), pass_no)
    return None if st is None else list(st["life"])


def kept_passes(conn: Connection, name: str) -> set[int] | None:
    """The passes of mixed job ``name`` whose stored sequence is kept (a rewind to a cut in
    one of them replays it; lib/mixslot.lua ``mix_kept``), None when nothing was charged yet."""
    with translate(conn.url):
        blob, kp = conn.redis.execute_command(
            "HMGET", conn.keys(name).mix, "s", "kp", **{NEVER_DECODE: True}
        )
    if not blob:
        return None
    return {int(q) for q in (kp or b"").decode().split(",") if q}


def sequence(conn: Connection, name: str, pass_no: int | None = None) -> list[dict[str, Any]]:
    """What mixed job ``name`` handed out in a pass (default: the current one), slot by
    slot: ``{"slot", "pass", "position", "source", "source_task", "source_pass", "task",
    "repaid"}`` (``task`` the mixed job's task, which is the position; ``source_task`` the
    task's id in the source job; ``source_pass`` the source's pass it is of: the mixed
    pass, or under ``cycle`` the source's slot over the job's life div its tasks;
    ``repaid`` whether the slot repaid a stream source's debt: the engine records those,
    ``mixrepaid``). A pass whose sequence is no longer kept (docs/mixing.md: the last 3)
    has none. A mix fed by an open stream source that was trimmed: the current pass's rows
    start at the watermark (the positions below it are done and their copies gone;
    ``taskq mix export`` says where on stderr).

    Raises:
        JobNotFound. InvalidInput: not a mixed job.
    """
    spec = spec_of(conn, name)
    if pass_no is None:
        with translate(conn.url):
            pass_no = int(conn.redis.hget(conn.keys(name).meta, F.PASS) or 0)
    st = _state(conn, name, spec, pass_no)
    rows: list[dict[str, Any]] = []
    life = list(st["life"]) if st else [0] * len(spec.sizes)
    cycle = spec.on_exhausted == "cycle"
    handed = int(st["h"]) if st else 0
    with translate(conn.url):
        current = int(conn.redis.hget(conn.keys(name).meta, F.PASS) or 0) == pass_no
    start = min(handed, _trim(conn, name, spec)[0]) if current else 0
    repaid: set[int] = set()
    if any(spec.streams) and handed:
        first = pass_no * spec.stride
        with translate(conn.url):
            got = conn.redis.zrangebyscore(
                conn.keys(name).mixrepaid, first + start, first + handed - 1
            )
        repaid = {int(s) for s in got}
    for pos, field in enumerate(_stored(conn, name, pass_no, start, handed), start):
        source, task = copy_of(field)
        source_pass = life[source] // spec.sizes[source] if cycle else pass_no
        life[source] += 1
        rows.append(
            {
                "slot": pass_no * spec.stride + pos,
                "pass": pass_no,
                "position": pos,
                "source": spec.sources[source],
                "source_task": task,
                "source_pass": source_pass,
                "task": pos,
                "repaid": pass_no * spec.stride + pos in repaid,
            }
        )
    return rows


def task_fields(conn: Connection, name: str, ids: list[int]) -> list[str | None] | None:
    """Where the chunks of tasks ``ids`` of job ``name`` are in its chunks hash, None for
    a job that is not mixed (its task ids are the fields). A mixed job's task is a slot
    of its current pass: the copy its stored sequence holds there (``copy_field``; None
    for a slot not handed out yet, whose copy the schedule has not fixed).

    Raises:
        JobNotFound.
    """
    with translate(conn.url):
        inc, mix_json, pass_raw = conn.redis.hmget(conn.keys(name).meta, [F.INC, F.MIX, F.PASS])
    if inc is None:
        raise errors.JobNotFound(f"job {name!r} not found")
    if not mix_json:
        return None
    spec = MixSpec.from_json(mix_json)
    pass_no = int(pass_raw or 0)
    st = _state(conn, name, spec, pass_no)
    handed = int(st["h"]) if st else 0
    got = copies_at(conn, name, pass_no, [t if t >= 0 else 0 for t in ids])
    return [
        f if 0 <= t < handed and len(f) == ENTRY else None for t, f in zip(ids, got, strict=True)
    ]


def copy_sizes(conn: Connection, name: str, cache: dict[str, int | None]) -> dict[str, int | None]:
    """The samples of each copy of mixed job ``name`` (``copy_field`` -> ``task_size`` of
    its chunks, None when they do not say it), read once into ``cache`` (HSCAN pages,
    O(tasks): a mixed job's copies never change).

    Raises:
        CorruptData: a copy's chunks.
    """
    keys = conn.keys(name)
    with translate(conn.url):
        if len(cache) != int(conn.redis.hlen(keys.chunks)):
            cache.clear()
            for field, raw in conn.redis.hscan_iter(keys.chunks, count=1000):
                cache[field] = task_size(decode_chunks(raw, keys.chunks, field))
    return cache


def slot_copies(conn: Connection, name: str) -> dict[int, str] | None:
    """The copy (``copy_field``) of each slot of mixed job ``name``'s current pass handed
    out so far, by position (10 bytes a slot read); None for a job that is not mixed."""
    with translate(conn.url):
        mix_json, pass_raw = conn.redis.hmget(conn.keys(name).meta, [F.MIX, F.PASS])
    if not mix_json:
        return None
    spec = MixSpec.from_json(mix_json)
    pass_no = int(pass_raw or 0)
    st = _state(conn, name, spec, pass_no)
    return dict(enumerate(_stored(conn, name, pass_no, 0, int(st["h"]) if st else 0)))


def status(conn: Connection, name: str, cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """Mixed job ``name`` per source: its weight now, the tasks charged and acked in the
    current pass, the samples of those acked, its tasks, the pass, its debt; and the pass,
    the slots charged, the next slot, the slot the charge waits at.

    Args:
        conn: the engine's connection.
        name: the mixed job.
        cache: keep it between calls: the copies' sizes are read once (``copy_sizes``),
            later calls read the done bitmap (O(tasks / 8) bytes), the schedule's state
            and the pass's sequence handed out (10 bytes a slot). A trimmed mix (fed by an
            open stream source, docs/mixing.md "Trim") is read from its watermark up, plus
            each source's trimmed acked count and the positions set aside below it.

    Returns:
        ``{"job", "pass", "charged", "next_slot", "on_exhausted", "high_water",
        "waits_on", "sources": [{"source", "weight", "charged", "acked", "samples",
        "tasks", "pass", "debt"}]}``; a row's ``samples`` is None when a task of its
        source does not say its size (or once acked copies of it were trimmed: their sizes
        went with them), its ``pass`` the source pass its next slot takes a task of (the
        mixed pass but under ``cycle``: the source's slots over the job's life div its
        tasks), its ``debt`` the slots a stream source owes (deferred, not repaid yet; 0
        for a fixed source). The debts are as of the slots the schedule charged,
        ``high_water`` of them in the pass (the charge runs up to a page ahead of
        ``charged``, the slots handed out); ``waits_on`` is ``{"source", "slot"}`` when
        the charge stopped at slot ``p·N + high_water``, whose pick is a stream source
        with nothing in its store that owes ``max_debt`` already (the leases wait for its
        feed), else None.

    Raises:
        JobNotFound. InvalidInput: not a mixed job. CorruptData: a task's chunks.
    """
    spec = spec_of(conn, name)
    keys = conn.keys(name)
    sizes = copy_sizes(conn, name, {} if cache is None else cache.setdefault(name, {}))
    with translate(conn.url):
        pass_no = int(conn.redis.hget(keys.meta, F.PASS) or 0)
        done = conn.redis.execute_command("GET", keys.done, **{NEVER_DECODE: True}) or b""
    st = _state(conn, name, spec, pass_no)
    charged = int(st["h"]) if st else 0
    high = int(st["high"]) if st else 0
    slot = pass_no * spec.stride + charged
    weights = list(spec.weights)  # the ones in force at the next slot: the log says
    for at, ws in sorted(weight_log(conn, name), key=lambda e: e[0]):
        if at <= slot:
            weights = ws
    acked: list[list[str]] = [[] for _ in spec.sources]
    w, trimmed, aside = _trim(conn, name, spec)
    w = min(w, charged)
    window = zip(
        aside + list(range(w, charged)),
        copies_at(conn, name, pass_no, aside) + _stored(conn, name, pass_no, w, charged),
        strict=True,
    )
    for pos, field in window:
        if pos >> 3 < len(done) and done[pos >> 3] & (0x80 >> (pos & 7)):
            acked[copy_of(field)[0]].append(field)
    rows = []
    for i, (source, n) in enumerate(zip(spec.sources, stores(conn, name, spec), strict=True)):
        known = [sizes.get(f) for f in acked[i]] + [None] * min(1, trimmed[i])
        source_pass = pass_no
        if spec.on_exhausted == "cycle" and st:
            source_pass = (int(st["life"][i]) + int(st["t"][i])) // n
        rows.append(
            {
                "source": source,
                "weight": float(weights[i]),
                "charged": int(st["t"][i]) if st else 0,
                "acked": trimmed[i] + len(acked[i]),
                "samples": None if None in known else sum(k or 0 for k in known),
                "tasks": n,
                "pass": source_pass,
                "debt": int(st["debt"][i]) if st else 0,
            }
        )
    return {
        "job": name,
        "pass": pass_no,
        "charged": charged,
        "next_slot": slot,
        "on_exhausted": spec.on_exhausted,
        "high_water": high,
        "waits_on": _waits_on(conn, name, spec, pass_no * spec.stride + high) if st else None,
        "sources": rows,
    }


def _waits_on(conn: Connection, name: str, spec: MixSpec, high: int) -> dict[str, Any] | None:
    """``{"source", "slot"}`` when the charge of mixed job ``name`` waits at slot ``high``
    (its high-water: the ``mix`` hash's ``wait``, ``"<slot>|<source>"``, lib/mixfeed.lua
    ``charge_stream``), else None."""
    if not any(spec.streams):
        return None
    with translate(conn.url):
        raw = conn.redis.hget(conn.keys(name).mix, "wait")
    if not raw:
        return None
    slot, source = (int(v) for v in raw.split("|"))
    if slot != high:  # (the live state's wait, of another pass than the one read)
        return None
    return {"source": spec.sources[source], "slot": slot}
