"""The engine's contract with its callers: return codes, per-call bounds, the errors codes map to.

Python is the one source of truth: the library build (library.py) writes these codes and
bounds into the Lua text as literals, and every reply's code is mapped to the error
hierarchy (errors.py) here, in one table.

Data flow: library.py (build) and transport.py (calls) -> contract.py -> errors.py.
"""

from __future__ import annotations

import enum

from taskq import errors


class Code(enum.IntEnum):
    """Return codes of the scripts (first element of every reply)."""

    OK = 0
    NOTHING = 1
    PASS_DONE = 2
    DUP = 3
    STALE = 4
    STOLEN = 5
    DRAINING = 6
    LOCKED = 7
    NOT_LEASED = 8
    FULL = 9
    JOB_NOT_FOUND = -1
    JOB_EXISTS = -2
    INVALID = -3
    JOB_CANCELLED = -4
    JOB_COMPLETED = -5
    REREGISTER = -6
    PASS_MISMATCH = -7
    PASS_INCOMPLETE = -8
    WORKER_NOT_FOUND = -9


#: Bucket upper bounds (ms) of the histograms the scripts keep (task duration "dur",
#: re-dispatch lateness "late"); one more bucket is +Inf.
HIST_BOUNDS_MS: tuple[int, ...] = (
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1000,
    2500,
    5000,
    10000,
    30000,
    60000,
    300000,
    900000,
    3600000,
)

#: Bounds on what one call may do, so that no call keeps Redis busy for long whatever the
#: caller asks (docs/capacity.md has the worst call per verb they give). The scripts
#: refuse a larger request with INVALID (or, for the reaper's budget, do this much and
#: answer "more").
MAX_BATCH = 32  #: tasks one call acks, fails, releases, starts or leases (batches(k) <= this)
MAX_PREFETCH = 16  #: Trainer(prefetch=...): reserved tasks kept ahead (1 + prefetch <= MAX_BATCH)
MAX_HELD = 64  #: leases one worker incarnation may hold at once
MAX_LISTED = 4 * MAX_HELD  #: (task, token) pairs one heartbeat may list
MAX_RECLAIM = 32  #: leases one reap (or leave) call ends; the rest in the next calls
LAZY_RECLAIM = 8  #: leases a trainer's own call reclaims on the way
PAGE_MAX = 100  #: tasks one peek page lists
MAX_RETRY = 32  #: dead tasks one retry call puts back
EVENT_LIST_MAX = 16  #: tasks one leased / acked / reserved event lists (count has them all)
SUMMARIES_MAX = 1000  #: pass summaries the passes hash keeps in all (passes, resets, rewound)
DEAD_CHECK_MAX = 1000  #: dead tasks a pass's end checks against its done set in one call
CK_PAGE_BYTES = 65536  #: bytes of a bitmap one checkpoint page holds (8 x as many tasks)
#: bytes of the opaque policy blob a checkpoint may carry (a mixing policy's state)
POLICY_MAX = 65536
CK_PAGE_PAIRS = 2000  #: (task, samples) pairs of one checkpoint progress page (one scan step)
RW_WALK = 500  #: positions of the checkpoint's order one rewind walk step goes through
RW_MARK = 100  #: summaries one rewind mark step marks rewound
RW_DEAD_BYTES = 64  #: dead-bitmap bytes (8 x as many tasks) one rewind dead step restores
#: chunks one append call adds (a larger append goes in pages), and the bytes of their
#: JSON; tasks one trim call moves a stream's watermark over (their records go). Sized by
#: bench/page_sizes.py on Redis 7.0, Redis 8.2 and Valkey 8.0 (docs/capacity.md): a call
#: at its bounds takes 1-2.5 ms of the server's CPU (at most 3.6 ms), so that a loaded
#: machine stays under tests/engine/test_slowlog.py's 10 ms; 500 chunks and 256 KiB took
#: 10.9-18.6 ms on Redis 8.0.
APPEND_MAX = 128
APPEND_BYTES = 1 << 15
TRIM_MAX = 250
#: sources (files) whose appended-up-to record a job keeps: the last ones appended to
SOURCES_KEEP = 10_000
#: a stream's tasks below its watermark that keep their records (dead ones): trim.lua
ASIDE_MAX = 1000
MAX_SPLITS = 1000  #: tasks split in one pass attempt (a checkpoint's cut copies their records)

_LIMITS = (
    "MAX_BATCH",
    "MAX_PREFETCH",
    "MAX_HELD",
    "MAX_LISTED",
    "MAX_RECLAIM",
    "LAZY_RECLAIM",
    "PAGE_MAX",
    "MAX_RETRY",
    "EVENT_LIST_MAX",
    "SUMMARIES_MAX",
    "DEAD_CHECK_MAX",
    "CK_PAGE_BYTES",
    "POLICY_MAX",
    "CK_PAGE_PAIRS",
    "RW_WALK",
    "RW_MARK",
    "RW_DEAD_BYTES",
    "APPEND_MAX",
    "APPEND_BYTES",
    "TRIM_MAX",
    "MAX_SPLITS",
    "SOURCES_KEEP",
    "ASIDE_MAX",
)

#: The most top-level locals the built library's chunk may have, and upvalues any of its
#: functions may have: Lua 5.1 stops loading at 200 and 60; the build refuses well before.
_ERRORS: dict[Code, tuple[type[errors.TaskqError], str]] = {
    Code.JOB_NOT_FOUND: (errors.JobNotFound, "job {job!r} not found (deleted or replaced)"),
    Code.JOB_EXISTS: (errors.JobExists, "job {job!r} exists (use replace=True / --replace)"),
    Code.INVALID: (errors.InvalidInput, "job {job!r}: invalid request"),
    Code.JOB_CANCELLED: (errors.JobCancelled, "job {job!r} was cancelled"),
    Code.JOB_COMPLETED: (errors.JobCompleted, "job {job!r} is completed"),
    Code.REREGISTER: (errors.WorkerLost, "job {job!r}: this worker was declared lost"),
    Code.PASS_MISMATCH: (errors.PassMismatch, "job {job!r}: the pass moved on meanwhile"),
    Code.PASS_INCOMPLETE: (
        errors.PassIncomplete,
        "job {job!r}: the current pass has work left (use force to skip it)",
    ),
    Code.WORKER_NOT_FOUND: (errors.InvalidInput, "job {job!r}: no such worker"),
}


#: The parts of the library, in the order they are joined: each uses only what the parts
#: before it (and the generated constants) define.
def raise_for(code: int, job: str, detail: str = "") -> None:
    """Raise the error a (negative) return code stands for; return for others."""
    try:
        c = Code(code)
    except ValueError as e:
        raise errors.TaskqError(f"job {job!r}: unknown script reply code {code}") from e
    if c in _ERRORS:
        cls, msg = _ERRORS[c]
        text = msg.format(job=job)
        raise cls(f"{text}: {detail}" if detail else text)


#: Keys no hot call (lease, ack, heartbeat, progress) touches: the library reads them as
#: ``KC[i]`` (the call's KEYS table, ``i`` written at build) rather than as a local each,
#: keeping the chunk's locals well under Lua's 200. The Lua text still says ``K_CKPT``.
