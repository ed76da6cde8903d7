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
import inspect
import os
import re
import threading
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
CK_PAGE_PAIRS = 2000  #: (task, samples) pairs of one checkpoint progress page (one scan step)
RW_WALK = 500  #: positions of the checkpoint's order one rewind walk step goes through
RW_MARK = 100  #: summaries one rewind mark step marks rewound
RW_DEAD_BYTES = 64  #: dead-bitmap bytes (8 x as many tasks) one rewind dead step restores

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
    "CK_PAGE_PAIRS",
    "RW_WALK",
    "RW_MARK",
    "RW_DEAD_BYTES",
)

#: The most top-level locals the built library's chunk may have, and upvalues any of its
#: functions may have: Lua 5.1 stops loading at 200 and 60; the build refuses well before.
MAX_LOCALS = 180
MAX_UPVALUES = 50

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
    "meta.lua",
    "args.lua",
    "events.lua",
    "call.lua",
    "secrets.lua",
    "leases.lua",
    "split.lua",
    "endings.lua",
    "passes.lua",
    "workers.lua",
    "progress.lua",
    "dispatch.lua",
    "cuts.lua",
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


#: Keys no hot call (lease, ack, heartbeat, progress) touches: the library reads them as
#: ``KC[i]`` (the call's KEYS table, ``i`` written at build) rather than as a local each,
#: keeping the chunk's locals well under Lua's 200. The Lua text still says ``K_CKPT``.
COLD_KEYS = (
    "wake",
    "deadbits",
    "passes",
    "passidx",
    "bcast0",
    "bcast1",
    "clock",
    "lock",
    "ckpts",
    "ckpt",
    "ckprog",
)
_COLD_RE = re.compile(r"\bK_(" + "|".join(k.upper() for k in COLD_KEYS) + r")\b")


def _generated() -> str:
    """Definitions made from Python's constants: the K_* keys and the histogram. (The codes
    and the bounds are written into the text as numbers, cold keys as ``KC[i]``:
    ``_constants``.)"""
    names = [f"K_{name.upper()}" for name in JOB_KEYS if name not in COLD_KEYS]
    slots = ", ".join(f"keys[{JOB_KEYS.index(n[2:].lower()) + 1}]" for n in names)
    bounds = ", ".join(map(str, HIST_BOUNDS_MS))
    lines = [
        f"local KC, {', '.join(names)}",
        "-- the keys of the job a call is about (called by begin())",
        "local function set_keys(keys)",
        f"  KC, {', '.join(names)} = keys, {slots}",
        "end",
        f"local HIST_BOUNDS = {{{bounds}}}",
        "local function hist_bucket(ms)",
    ]
    for i, bound in enumerate(HIST_BOUNDS_MS, 1):
        lines.append(f"  if ms <= {bound} then return '{i}' end")
    lines += [f"  return '{len(HIST_BOUNDS_MS) + 1}'", "end"]
    return "\n".join(lines) + "\n"


_CODE_RE = re.compile(r"\bC\.([A-Za-z_]\w*)")
_LIMIT_RE = re.compile(r"\b(" + "|".join(_LIMITS) + r")\b")


def _constants(file: str, text: str) -> str:
    """``text`` with every ``C.NAME`` (a ``Code``) and every bound of ``_LIMITS`` written
    as its number: a literal costs no lookup and no local of the library's chunk (Lua 5.1
    allows 200 of them, ``MAX_LOCALS``)."""

    def code(m: re.Match[str]) -> str:
        if m.group(1) not in Code.__members__:
            raise errors.TaskqError(f"{file}: C.{m.group(1)} is not a scripts.Code")
        value = int(Code[m.group(1)])
        return f"({value})" if value < 0 else str(value)

    text = _CODE_RE.sub(code, text)
    text = _COLD_RE.sub(lambda m: f"KC[{JOB_KEYS.index(m.group(1).lower()) + 1}]", text)
    return _LIMIT_RE.sub(lambda m: str(globals()[m.group(1)]), text)


_LUA_STRING_RE = re.compile(r"'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"|--[^\n]*")
_IDENT_RE = re.compile(r"(?<![.\w])([A-Za-z_]\w*)")
_TOP_DECL_RE = re.compile(
    r"^local\s+(?:function\s+([A-Za-z_]\w*)|([A-Za-z_][\w\s,]*?)\s*(?:=|$))", re.M
)


def headroom(chunk: str) -> tuple[int, dict[str, int]]:
    """The top-level locals of a library chunk and the upvalues of each of its functions.

    ``chunk`` is the library's text before its first ``redis.register_function``, plus
    the functions registered (each callback counted as a function of its own). An
    identifier a function uses that names a top-level local declared before it is an
    upvalue (nested functions count for the function around them, as in Lua); a local of
    the function with the same name is counted too, so the count is an upper bound.

    Returns:
        (locals, {function: upvalues}).
    """
    raw_head, _, raw_tail = chunk.partition("\nredis.register_function")
    head = _LUA_STRING_RE.sub("''", raw_head)
    declared: list[str] = []
    upvalues: dict[str, int] = {}
    lines = head.splitlines()
    i = 0
    while i < len(lines):
        m = _TOP_DECL_RE.match(lines[i])
        if m and m.group(1):
            name, end = m.group(1), i + 1
            if re.search(r"\)\s.*\bend$", lines[i]):  # a function on one line
                end, text = i, lines[i].partition(")")[2]
            else:
                while end < len(lines) and lines[end] != "end":
                    end += 1
                text = "\n".join(lines[i + 1 : end])
            known = set(declared)
            upvalues[name] = len({w for w in _IDENT_RE.findall(text) if w in known})
            declared.append(name)
            i = end + 1
            continue
        if m and m.group(2):
            declared += [n.strip() for n in m.group(2).split(",") if n.strip()]
        i += 1
    known = set(declared)
    for fn in re.finditer(r"function_name = '%FN%(\w+)'(.*?)\nend}", raw_tail, re.S):
        text = _LUA_STRING_RE.sub("''", fn.group(2))
        upvalues[f"verb {fn.group(1)}"] = len({w for w in _IDENT_RE.findall(text) if w in known})
    return len(declared), upvalues


def _check_headroom(text: str) -> None:
    """Refuse a library close to Lua 5.1's limits (200 locals, 60 upvalues): it would
    stop loading a few definitions later, on every server at once."""
    n_locals, upvalues = headroom(text)
    if n_locals > MAX_LOCALS:
        raise errors.TaskqError(
            f"the Lua library has {n_locals} top-level locals (at most {MAX_LOCALS}; Lua "
            f"5.1 stops at 200): write constants into the text at build (like F.* and "
            f"C.*, scripts._constants), or gather related per-call state into one table"
        )
    worst = max(upvalues, key=upvalues.__getitem__)
    if upvalues[worst] > MAX_UPVALUES:
        raise errors.TaskqError(
            f"the Lua library's function {worst} uses {upvalues[worst]} library locals "
            f"(upvalues; at most {MAX_UPVALUES}, Lua 5.1 stops at 60): split it, or "
            f"move state it resets into a helper it calls (as bind_globals does)"
        )


def _begin(parts: dict[str, str]) -> str:
    """``begin(keys)``, made from the per-call state the library parts declare.

    A library's locals outlive a call, so every top-level ``local`` of a part that is not a
    function must be per-call state, declared on one line ending in ``-- per call``:
    ``begin()`` assigns each declaration's initial value again, so no call sees the last
    one's. A top-level local without the marker is refused (it could not be reset). Then
    ``bind_globals()`` (lib/meta.lua) binds the Lua globals the library calls into its
    locals: globals exist only in a call, not while the library loads.

    Args:
        parts: file name -> text of each library part.

    Returns:
        The Lua source of ``begin``.

    Raises:
        TaskqError: a top-level local that is neither a function nor marked per call.
    """
    resets = []
    bound = _bound_globals(parts)
    for file, text in parts.items():
        for decl in _TOP_LOCAL_RE.findall(text):
            m = _PER_CALL_RE.match(decl)
            if not m:
                raise errors.TaskqError(
                    f"lib/{file}: top-level `local {decl.strip()}` is not a function and not "
                    f"marked `-- per call` (begin() could not reset it)"
                )
            names = [n.strip() for n in m.group(1).split(",")]
            if all(n in bound for n in names):
                continue  # bind_globals sets them on every call: no reset, no upvalue
            resets.append(f"  {m.group(1)} = {m.group(2)}")
    return (
        "\n".join(
            [
                "-- Every function of the library starts here: the keys of this call's job, and every",
                "-- piece of per-call state back to its start (generated from the `-- per call` lines).",
                "local function begin(keys)",
                "  set_keys(keys)",
                *resets,
                "  bind_globals()",
                "end",
            ]
        )
        + "\n"
    )


_BIND_RE = re.compile(r"^local function bind_globals\(\)\n(.*?)^end$", re.S | re.M)


def _bound_globals(parts: dict[str, str]) -> set[str]:
    """The names ``bind_globals()`` (lib/meta.lua) assigns: begin() need not reset them."""
    for text in parts.values():
        m = _BIND_RE.search(text)
        if m:
            body = m.group(1)
            return {
                n.strip()
                for stmt in re.findall(r"^\s*([\w\s,]+?)\s*=", body, re.M)
                for n in stmt.split(",")
            }
    return set()


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
    parts = {
        file: _constants(f"lib/{file}", _fields(f"lib/{file}", (pkg / "lib" / file).read_text()))
        for file in LIB_PARTS
    }
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
        verbs.append(
            (
                verb,
                _nkeys(entry.name, body),
                ",".join(flags[:1]),
                _constants(entry.name, _fields(entry.name, body)),
            )
        )
    text = (
        _generated()
        + lib
        + "".join(
            f"\nredis.register_function{{function_name = '%FN%{verb}', "
            f"flags = {{{', '.join(repr(f) for f in flags.split(',') if f)}}}, "
            f"callback = function(KEYS, ARGV)\nbegin(KEYS)\n{body}\nend}}\n"
            for verb, _, flags, body in verbs
        )
    )
    if os.environ.get("TASKQ_NO_HEADROOM") != "1":
        _check_headroom(text)
    version = hashlib.sha1(text.encode()).hexdigest()[:12]
    name = f"taskq_{version}"
    source = f"#!lua name={name}\n" + text.replace("%FN%", f"{name}_")
    functions = {
        verb: (f"{name}_{verb}", nkeys, "no-writes" in flags) for verb, nkeys, flags, _ in verbs
    }
    return name, source, functions


LIBRARY, SOURCE, _FUNCTIONS = _build()
VERBS = tuple(sorted(_FUNCTIONS))


def _bulk(arg: Any) -> bytes:
    """One RESP bulk string (redis-py's Encoder rules for the types taskq sends)."""
    t = type(arg)
    if t is int:  # the common case first: ids, tokens, counts (bool is not int here)
        b = b"%d" % arg
    elif t is str:
        b = arg.encode()
    elif isinstance(arg, bytes):
        b = arg
    elif isinstance(arg, str):
        b = arg.encode()
    elif isinstance(arg, (int, float)) and not isinstance(arg, bool):
        b = repr(arg).encode()
    else:
        raise errors.TaskqError(f"cannot send {type(arg).__name__} {arg!r} to Redis")
    return b"$%d\r\n%s\r\n" % (len(b), b)


#: Packed bulk strings of the small ints a call sends most (counts, modes' wants, -1).
_INT_BULK: dict[int, bytes] = {i: b"$%d\r\n%d\r\n" % (len(b"%d" % i), i) for i in range(-1, 1024)}

#: Bumped in a forked child: a kept connection belongs to the process that opened it
#: (os.getpid() is a system call on every call; this is a list read).
_FORK_GEN = [0]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _FORK_GEN.__setitem__(0, _FORK_GEN[0] + 1))

#: Packed bulk strings of the short str arguments a trainer repeats on every call (its job
#: incarnation, worker id, incarnation, mode letters, secret), up to this many per Scripts.
_BULK_CACHE_MAX = 256


def _pool_of(redis_client: Any) -> Any:
    """The connection pool to call on directly, or None (a cluster client, one pinned
    connection, a pool that needs a command name): those go through execute_command."""
    if not isinstance(redis_client, redis.Redis) or redis_client.connection is not None:
        return None
    pool = redis_client.connection_pool
    try:
        params = inspect.signature(pool.get_connection).parameters
    except (TypeError, ValueError):
        return None
    name = params.get("command_name")
    if name is not None and name.default is inspect.Parameter.empty:
        return None  # redis-py < 5.3 wants it; the ordinary path serves it
    return pool


def _exchange(conn: Any, body: list[bytes]) -> Any:
    """Send one packed command on the kept connection ``conn`` and read its reply.

    A connected connection is written and read directly (its socket, its parser, which
    handles RESP3 pushes itself): redis-py's ``send_packed_command`` / ``read_response``
    around them (the health check, the error text naming the host) cost ~7 k
    instructions of a trainer's ~125 k per task (bench/README.md, "Hot-path pass 3").
    Their error handling is kept: any failure closes the connection (a reply half read
    must not be taken for the next one); an OS error becomes redis-py's
    ``ConnectionError``, which the caller retries through ``execute_command``; an error
    reply is raised. A connection not connected (or a redis-py without these
    attributes) goes through redis-py's own calls.

    Raises:
        redis.exceptions.ConnectionError, TimeoutError: the socket failed (closed).
        redis.exceptions.ResponseError: Redis answered an error.
    """
    sock, parser = getattr(conn, "_sock", None), getattr(conn, "_parser", None)
    if sock is None or parser is None:
        conn.send_packed_command(body)
        return conn.read_response()
    try:
        sock.sendall(body[0])
        reply = parser.read_response()
    except OSError as e:  # socket.timeout too
        conn.disconnect()
        raise redis.exceptions.ConnectionError(f"taskq: {e}") from e
    except BaseException:
        conn.disconnect()
        raise
    if isinstance(reply, redis.exceptions.ResponseError):
        raise reply
    return reply


class Scripts:
    """The operations, called on one Redis connection (FCALL; the library is loaded on
    first need)."""

    def __init__(self, redis_client: Any) -> None:
        self._redis = redis_client
        # A call's constant part (FCALL, the function, its KEYS: 24 of a trainer's ~30
        # arguments) is packed once per (verb, keys); bench/README.md measured redis-py's
        # per-command machinery around it (packing every argument, the Retry and event
        # wrappers) as the largest share of a trainer's CPU per task.
        self._pool = _pool_of(redis_client)
        self._packed: dict[tuple[str, tuple[Any, ...]], tuple[int, bytes]] = {}
        # the same, found by the key list's identity (a job's keys are one list for the
        # life of its Client): no tuple of 22 keys hashed per call. The entry holds the
        # list, so its id is not reused while cached.
        self._packed_by_id: dict[tuple[str, int], tuple[Any, tuple[int, bytes]]] = {}
        self._bulk_str: dict[str, bytes] = {}
        # one connection kept out of the pool for whichever thread calls first (the pool's
        # get/release with its checks and events cost as much as the packing); a second
        # thread meanwhile takes one from the pool. (fork generation, connection): a
        # forked child leaves its parent's socket alone and takes its own.
        self._own: tuple[int, Any] | None = None
        self._own_lock = threading.Lock()
        #: Times the kept connection was dropped (its next call reconnects, under a new
        #: CLIENT ID): a heartbeat names its connection again when this changed.
        self.own_resets = 0

    @property
    def redis(self) -> Any:
        """The redis-py client the operations are called on."""
        return self._redis

    def name_own_connection(self, name: str) -> str | None:
        """Name the connection that this thread's calls go out on and return its CLIENT ID.

        The kept connection of ``call`` is outside the pool, so naming a pooled one would
        record an id no call uses; a closed-connection watch (connwatch.py) must see the
        connection the heartbeats really go out on.

        Args:
            name: the connection's name (CLIENT SETNAME).

        Returns:
            The id; '' where CLIENT is refused (a proxy, a managed service); None when the
            calls do not go out on a kept connection (a cluster client, another thread
            holds it): then a pooled connection is what to name.

        Raises:
            redis.exceptions.ConnectionError: Redis unreachable.
        """
        if self._pool is None or not self._own_lock.acquire(blocking=False):
            return None
        try:
            if self._own is None or self._own[0] != _FORK_GEN[0]:
                self._own = (_FORK_GEN[0], self._pool.get_connection())
            conn = self._own[1]
            for attempt in (1, 2):  # a connection a restart closed reconnects once
                replies: list[Any] = []
                try:
                    conn.send_packed_command(
                        conn.pack_commands([("CLIENT", "SETNAME", name), ("CLIENT", "ID")])
                    )
                    for _ in range(2):  # both replies are read, refused or not
                        try:
                            replies.append(conn.read_response())
                        except redis.exceptions.ResponseError:
                            replies.append(None)
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    conn.disconnect()
                    self.own_resets += 1
                    if attempt == 2:
                        raise
                    continue
                break
            return "" if replies[0] is None or replies[1] is None else str(int(replies[1]))
        finally:
            self._own_lock.release()

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
            if self._pool is not None:
                return self._call_packed(verb, command, name, keys, args)
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

    def _call_packed(
        self, verb: str, command: str, name: str, keys: list[str] | list[bytes], args: list[Any]
    ) -> Any:
        """FCALL on a pooled connection with the constant part packed once; a connection
        error goes on through ``execute_command``, whose retry policy is the client's."""
        by_id = self._packed_by_id.get((verb, id(keys)))
        if by_id is not None and by_id[0] is keys:
            const = by_id[1]
        else:
            cache_key = (verb, tuple(keys))
            found = self._packed.get(cache_key)
            if found is None:
                head = [command, name, len(keys), *keys]
                found = (len(head), b"".join(_bulk(a) for a in head))
                self._packed[cache_key] = found
            const = found
            if len(self._packed_by_id) < 64:
                self._packed_by_id[(verb, id(keys))] = (keys, const)
        n, packed = const
        parts = [b"*%d\r\n" % (n + len(args)), packed]
        strs = self._bulk_str
        for a in args:
            if type(a) is int:
                p = _INT_BULK.get(a)
                if p is None:
                    b = b"%d" % a
                    p = b"$%d\r\n%s\r\n" % (len(b), b)
                parts.append(p)
            elif type(a) is str:
                p = strs.get(a)
                if p is None:
                    p = _bulk(a)
                    if len(a) <= 64 and len(strs) < _BULK_CACHE_MAX:
                        strs[a] = p
                parts.append(p)
            else:
                parts.append(_bulk(a))
        body = [b"".join(parts)]
        assert self._pool is not None
        if self._own_lock.acquire(False):  # positional: the keyword form costs 0.2 µs
            try:
                if self._own is None or self._own[0] != _FORK_GEN[0]:
                    self._own = (_FORK_GEN[0], self._pool.get_connection())
                conn = self._own[1]
                try:
                    return _exchange(conn, body)
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    conn.disconnect()
                    self.own_resets += 1
            finally:
                self._own_lock.release()
        else:
            conn = self._pool.get_connection()
            try:
                conn.send_packed_command(body)
                return conn.read_response()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                conn.disconnect()
            finally:
                self._pool.release(conn)
        return self._redis.execute_command(command, name, len(keys), *keys, *args)
