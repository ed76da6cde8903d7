"""Builds taskq's Redis Function library, one function per operation, and calls it.

Each ``lua/verb.lua`` opens with a ``#!lua`` line (``flags=no-writes`` for the read-only
ones, ``flags=allow-oom`` for those that only free or set a flag, so an operator can still
cancel, delete or pause a job on a Redis out of memory; one flag per verb) and a KEYS /
ARGV / returns header; its ``-- KEYS:`` line says which keys it takes:
``the job's keys (keys.JOB_KEYS)``, then ``+ name, ...`` for any extra one (create's
staging hash), and that is the number of keys a call must pass (checked here). The
library is, in this order: the generated constants (the ``K_*`` key locals in the order of
``keys.JOB_KEYS``, the ``C`` table of return codes, the per-call bounds ``MAX_BATCH`` ...,
the histogram bounds), the parts
``lua/lib/*.lua`` joined in the order of ``LIB_PARTS``, the generated ``begin()``, then each
verb's body registered as the function ``taskq_<version>_<verb>``, which calls
``begin(KEYS)`` first. ``F.<NAME>`` in any of them is replaced by the name of the meta field
``keys.MetaField.<NAME>`` (a literal, so no lookup at run time); an unknown name is refused.
Python stays the one source of truth for codes, bounds, key names and meta field names.
Every verb checks its whole ARGV first (``lib/args.lua``) and answers ``INVALID`` with the
name of the bad argument before its first write: Redis does not roll a script back.

Why a Function library and not one EVALSHA script per operation: a library is compiled
and its definitions built once, at ``FUNCTION LOAD``; a script re-creates every local
function it defines on every call. That cost is small, not the largest one: bench/README.md
measured a closure at ~0.09 µs, so the ~53 closures of the old per-call prelude came to
~5 µs of a ~200 µs call (the library saved about 10 % of a call in all). The price is
that state kept in the library's locals lives across calls: every top-level local of a
part that is not a function is declared ``-- per call``, ``begin()`` is generated from
those declarations and resets each of them at the start of every call, and a top-level
local without the marker is refused (``_begin``).

The library's name carries a hash of its text, so clients of two taskq versions can share
a server during an upgrade; a client loads its library when the server answers "function
not found" (a new server, FUNCTION FLUSH, a new cluster master). Libraries persist and
replicate like data. Loading needs ``FUNCTION LOAD``, which deploy/redis/acl.conf gives
the admin role only: whoever may load a library may replace one, and every role's calls
would run the replacement. The semantics the scripts implement are in docs/design.md.

Data flow: client.py / trainer.py / reaper.py / stats.py -> scripts.py (FCALL) -> Redis.
"""

from __future__ import annotations

import enum
import hashlib
import re
from importlib import resources
from typing import Any

import redis

from . import errors
from .keys import JOB_KEYS, META_FIELDS


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
    5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 900000,
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

_LIMITS = ("MAX_BATCH", "MAX_PREFETCH", "MAX_HELD", "MAX_LISTED", "MAX_RECLAIM",
           "LAZY_RECLAIM", "PAGE_MAX", "MAX_RETRY", "EVENT_LIST_MAX")

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
LIB_PARTS: tuple[str, ...] = (
    "meta.lua", "args.lua", "events.lua", "call.lua", "leases.lua", "passes.lua", "workers.lua",
    "progress.lua", "dispatch.lua",
)

_NAME_RE = re.compile(r"^([a-z]+)\.lua$")
_KEYS_RE = re.compile(
    r"^-- KEYS: the job's keys \(keys\.JOB_KEYS\)(?: \+ ([a-z_]+(?:, [a-z_]+)*))?(?:$| )", re.M
)
_TOP_LOCAL_RE = re.compile(r"^local\s+(?!function\b)(.*)$", re.M)
_PER_CALL_RE = re.compile(r"^([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*=\s*(.*?)\s*--\s*per call\b")
_FIELD_RE = re.compile(r"\bF\.([A-Za-z_]\w*)")


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


def _generated() -> str:
    """Definitions made from Python's constants: the K_* keys, the codes, the histogram."""
    names = [f"K_{name.upper()}" for name in JOB_KEYS]
    codes = ", ".join(f"{c.name} = {int(c)}" for c in Code)
    bounds = ", ".join(map(str, HIST_BOUNDS_MS))
    lines = [
        f"local {', '.join(names)}",
        "-- the keys of the job a call is about (called by begin())",
        "local function set_keys(keys)",
        f"  {', '.join(names)} = unpack(keys, 1, {len(names)})",
        "end",
        f"local C = {{{codes}}}",
        *(f"local {name} = {globals()[name]}" for name in _LIMITS),
        f"local HIST_BOUNDS = {{{bounds}}}",
        "local function hist_bucket(ms)",
    ]
    for i, bound in enumerate(HIST_BOUNDS_MS, 1):
        lines.append(f"  if ms <= {bound} then return '{i}' end")
    lines += [f"  return '{len(HIST_BOUNDS_MS) + 1}'", "end"]
    return "\n".join(lines) + "\n"


def _begin(parts: dict[str, str]) -> str:
    """``begin(keys)``, made from the per-call state the library parts declare.

    A library's locals outlive a call, so every top-level ``local`` of a part that is not a
    function must be per-call state, declared on one line ending in ``-- per call``:
    ``begin()`` assigns each declaration's initial value again, so no call sees the last
    one's. A top-level local without the marker is refused (it could not be reset).

    Args:
        parts: file name -> text of each library part.

    Returns:
        The Lua source of ``begin``.

    Raises:
        TaskqError: a top-level local that is neither a function nor marked per call.
    """
    resets = []
    for file, text in parts.items():
        for decl in _TOP_LOCAL_RE.findall(text):
            m = _PER_CALL_RE.match(decl)
            if not m:
                raise errors.TaskqError(
                    f"lib/{file}: top-level `local {decl.strip()}` is not a function and not "
                    f"marked `-- per call` (begin() could not reset it)"
                )
            resets.append(f"  {m.group(1)} = {m.group(2)}")
    return "\n".join([
        "-- Every function of the library starts here: the keys of this call's job, and every",
        "-- piece of per-call state back to its start (generated from the `-- per call` lines).",
        "local function begin(keys)",
        "  set_keys(keys)",
        *resets,
        "end",
    ]) + "\n"


def _fields(file: str, text: str) -> str:
    """``text`` with every ``F.NAME`` replaced by the meta field's name, quoted."""

    def name(m: re.Match[str]) -> str:
        if m.group(1) not in META_FIELDS:
            raise errors.TaskqError(f"{file}: F.{m.group(1)} is not in keys.MetaField")
        return f"'{META_FIELDS[m.group(1)]}'"

    return _FIELD_RE.sub(name, text)


def _nkeys(file: str, text: str) -> int:
    """The number of KEYS a verb takes, from its ``-- KEYS:`` header line."""
    m = _KEYS_RE.search(text)
    if not m:
        raise errors.TaskqError(
            f"{file}: needs a header line `-- KEYS: the job's keys (keys.JOB_KEYS)`, "
            f"with `+ name, ...` for any extra key"
        )
    return len(JOB_KEYS) + (len(m.group(1).split(",")) if m.group(1) else 0)


def _build() -> tuple[str, str, dict[str, tuple[str, int, bool]]]:
    """(library name, library source, {verb: (function name, number of keys, read-only)})."""
    pkg = resources.files("taskq") / "lua"
    parts = {file: _fields(f"lib/{file}", (pkg / "lib" / file).read_text())
             for file in LIB_PARTS}
    lib = "".join(f"-- lib/{file}\n{text}" for file, text in parts.items()) + _begin(parts)
    verbs: list[tuple[str, int, str, str]] = []
    for entry in sorted(pkg.iterdir(), key=lambda p: p.name):
        m = _NAME_RE.match(entry.name)
        if not m or not entry.is_file():
            continue
        verb = m.group(1)
        first, _, body = entry.read_text().partition("\n")
        if not first.startswith("#!lua"):
            raise errors.TaskqError(f"{entry.name}: must open with a #!lua line")
        flags = first.partition("flags=")[2].split()
        verbs.append((verb, _nkeys(entry.name, body), ",".join(flags[:1]),
                      _fields(entry.name, body)))
    text = _generated() + lib + "".join(
        f"\nredis.register_function{{function_name = '%FN%{verb}', "
        f"flags = {{{', '.join(repr(f) for f in flags.split(',') if f)}}}, "
        f"callback = function(KEYS, ARGV)\nbegin(KEYS)\n{body}\nend}}\n"
        for verb, _, flags, body in verbs
    )
    version = hashlib.sha1(text.encode()).hexdigest()[:12]
    name = f"taskq_{version}"
    source = f"#!lua name={name}\n" + text.replace("%FN%", f"{name}_")
    functions = {verb: (f"{name}_{verb}", nkeys, "no-writes" in flags)
                 for verb, nkeys, flags, _ in verbs}
    return name, source, functions


LIBRARY, SOURCE, _FUNCTIONS = _build()
VERBS = tuple(sorted(_FUNCTIONS))


class Scripts:
    """The operations, called on one Redis connection (FCALL; the library is loaded on
    first need)."""

    def __init__(self, redis_client: Any) -> None:
        self._redis = redis_client

    def load(self) -> None:
        """Load the library (REPLACE: the same name always holds the same text)."""
        self._redis.function_load(SOURCE, replace=True)

    def call(self, verb: str, keys: list[str] | list[bytes], args: list[Any]) -> Any:
        """Run one operation.

        Args:
            verb: the operation (``lease``, ``ack``, ...).
            keys: its KEYS (checked against the file's N).
            args: its ARGV.

        Returns:
            The function's raw reply (a list whose first element is a ``Code``).
        """
        name, nkeys, read_only = _FUNCTIONS[verb]
        if len(keys) != nkeys:
            raise errors.TaskqError(f"{verb}: expects {nkeys} keys, got {len(keys)}")
        command = "FCALL_RO" if read_only else "FCALL"
        try:
            return self._redis.execute_command(command, name, nkeys, *keys, *args)
        except redis.exceptions.ResponseError as e:
            if "Function not found" not in str(e):
                raise
        try:
            self.load()
        except redis.exceptions.NoPermissionError as e:
            raise errors.TaskqError(
                f"the taskq library {LIBRARY} is not loaded on this Redis and this user may "
                f"not load it (FUNCTION LOAD): run one taskq command as the admin user "
                f"(for example `taskq job status JOB`), then retry"
            ) from e
        return self._redis.execute_command(command, name, nkeys, *keys, *args)
