"""Builds taskq's Redis Function library, one function per operation (transport.py calls it).

Each ``lua/verb.lua`` opens with a ``#!lua`` line (``flags=no-writes`` for the read-only
ones, ``flags=allow-oom`` for those that only free or set a flag, so an operator can still
cancel, delete or pause a job on a Redis out of memory; one flag per verb) and a KEYS /
ARGV / returns header; its ``-- KEYS:`` line says which keys it takes:
``the job's keys (keys.SCRIPT_KEYS)``, then ``+ name, ...`` for any extra one (create's
staging hash), and that is the number of keys a call must pass (checked here). The
library is, in this order: the generated constants (the ``K_*`` key locals in the order of
``keys.SCRIPT_KEYS`` and ``kc(name)``, which makes a cold one; the ``C`` table of return
codes, the per-call bounds ``MAX_BATCH`` ..., the histogram bounds), the parts
``lua/lib/*.lua`` joined in the order of ``LIB_PARTS``, the generated ``begin()``, then each
verb's body registered as the function ``taskq_<version>_<verb>``, which calls
``begin(KEYS)`` first. ``F.<NAME>`` in any of them is replaced by the slot of the meta field
``keys.MetaField.<NAME>`` in the library's cache of the meta hash (an integer: lib/meta.lua's
tables are arrays), ``N.<NAME>`` by its name (a command on the hash names it); an unknown name
is refused.
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

Data flow: lua/*.lua + contract.py + keys.py -> library.py (the text, at import) ->
transport.py (FUNCTION LOAD, FCALL) -> Redis.
"""

from __future__ import annotations

import hashlib
import os
import re
from importlib import resources

from taskq import errors
from taskq.engine import contract
from taskq.engine.contract import _LIMITS, HIST_BOUNDS_MS, Code
from taskq.keys import COLD_KEYS, META_FIELDS, SCRIPT_KEYS

MAX_LOCALS = 180
MAX_UPVALUES = 50

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
    r"^-- KEYS: the job's keys \(keys\.SCRIPT_KEYS\)(?: \+ ([a-z_]+(?:, [a-z_]+)*))?(?:$| )", re.M
)
_TOP_LOCAL_RE = re.compile(r"^local\s+(?!function\b)(.*)$", re.M)
_PER_CALL_RE = re.compile(r"^([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*=\s*(.*?)\s*--\s*per call\b")
_FIELD_RE = re.compile(r"\bF\.([A-Za-z_]\w*)")


_COLD_RE = re.compile(r"\bK_(" + "|".join(k.upper() for k in COLD_KEYS) + r")\b")


# The meta fields the hot verbs (ack, lease, heartbeat) read, fetched in one HMGET by
# lib/meta.lua's load_meta, in this order: their slots 1..len, then the field the ack writes
# and does not read. Every meta field is a slot (``F.NAME``, an integer) in the library's
# cache; ``META_NAMES[slot]`` is its name. The rest follow in keys.MetaField's order.
HOT_META = (
    "INC",
    "MCLOCK",
    "SEEN",
    "TTL",
    "HBI",
    "OFFSET",
    "ROUND",
    "STATE",
    "EVMAX",
    "DUE",
    "PASS",
    "GEN",
    "REASON",
    "PAUSED",
    "N",
    "CURSOR",
    "NDONE",
    "NLEASED",
    "NRESERVED",
    "LAST_TOKEN",
    "TT",
    "AUTO_TT",
    "P_BACKUPS",
    "DUR_MED",
    "ACKED_JOB",
    "C_ACKED",
    "C_LEASED",
    "P_LEASED",
    "SHUFFLE",
    "DUR_SUM",
    "NWAITING",
)
META_SLOTS: dict[str, int] = {
    name: i
    for i, name in enumerate(
        [*HOT_META, "LAST_ACK", *(n for n in META_FIELDS if n not in HOT_META and n != "LAST_ACK")],
        1,
    )
}
# the slots a call's tables of changes are made with (lib/meta.lua: the hot ones and the
# ack's last_ack; any other goes into a table's hash part when set)
SLOTS_MADE = len(HOT_META) + 1


def _generated() -> str:
    """Definitions made from Python's constants: the K_* keys, the meta fields' names by
    slot and the histogram. (The codes and the bounds are written into the text as numbers,
    cold keys as ``kc('name')``: ``_constants``; meta fields as their slots: ``_fields``.)"""
    names = [f"K_{name.upper()}" for name in SCRIPT_KEYS]
    meta_names = ", ".join(f"'{META_FIELDS[n]}'" for n in META_SLOTS)  # (in slot order)
    slots = ", ".join(f"keys[{i}]" for i in range(1, len(names) + 1))
    bounds = ", ".join(map(str, HIST_BOUNDS_MS))
    lines = [
        f"local KC, {', '.join(names)}",
        "-- the keys of the job a call is about (called by begin()); KC: the job's key base,",
        "-- made by the first kc() of the call",
        "local function set_keys(keys)",
        f"  KC, {', '.join(names)} = false, {slots}",
        "end",
        "-- the job's key `name` (keys.COLD_KEYS: not passed in KEYS, made when used)",
        "local function kc(name)",
        "  if not KC then KC = string.sub(K_META, 1, -5) end  -- '<prefix>:{job}:' (of ...:meta)",
        "  return KC .. name",
        "end",
        "-- every key of the job: those passed and the cold ones (create, delete unlink them)",
        "local function job_keys()",
        f"  return {{{', '.join(names)}, {', '.join(f'kc({k!r})' for k in COLD_KEYS)}}}",
        "end",
        f"local HIST_BOUNDS = {{{bounds}}}",
        "-- the meta fields' names by slot (F.<NAME> is a slot): a constant, never written",
        f"local META_NAMES = {{{meta_names}}}",
    ]
    return "\n".join(lines) + "\n"


_CODE_RE = re.compile(r"\bC\.([A-Za-z_]\w*)")
_LIMIT_RE = re.compile(r"\b(" + "|".join(_LIMITS) + r")\b")


def _constants(file: str, text: str) -> str:
    """``text`` with every ``C.NAME`` (a ``Code``) and every bound of ``_LIMITS`` written
    as its number: a literal costs no lookup and no local of the library's chunk (Lua 5.1
    allows 200 of them, ``MAX_LOCALS``)."""

    def code(m: re.Match[str]) -> str:
        if m.group(1) not in Code.__members__:
            raise errors.TaskqError(f"{file}: C.{m.group(1)} is not a contract.Code")
        value = int(Code[m.group(1)])
        return f"({value})" if value < 0 else str(value)

    text = _CODE_RE.sub(code, text)
    text = re.sub(r"\bMETA_HOT_SLOTS\b", str(len(HOT_META)), text)
    # a table of changes over the slots made at once (lib/meta.lua): a constructor of falses
    text = re.sub(r"\bMETA_FALSES\b", "{" + ", ".join(["false"] * SLOTS_MADE) + "}", text)
    text = _COLD_RE.sub(lambda m: f"kc('{m.group(1).lower()}')", text)
    return _LIMIT_RE.sub(lambda m: str(getattr(contract, m.group(1))), text)


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
            f"C.*, library._constants), or gather related per-call state into one table"
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
    one's. A top-level local without the marker is refused (it could not be reset). First
    ``bind_globals()`` (lib/meta.lua) binds the Lua globals the library calls into its
    locals (globals exist only in a call, not while the library loads): the resets may call
    them.

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
                "  bind_globals()",
                *resets,
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


_NAME_FIELD_RE = re.compile(r"\bN\.([A-Za-z_]\w*)")
_META_CALL_RE = re.compile(r"rcall\([^\n]*K_META[^\n]*\bF\.[A-Z]")


def _fields(file: str, text: str) -> str:
    """``text`` with every ``F.NAME`` replaced by the meta field's slot in the library's
    cache (``META_SLOTS``) and every ``N.NAME`` by its name, quoted: what a command sent
    to Redis names. ``F.`` in a command on the meta hash is refused (it would name the
    field by its slot)."""

    def field(m: re.Match[str], quoted: bool) -> str:
        if m.group(1) not in META_FIELDS:
            raise errors.TaskqError(f"{file}: {m.group(0)} is not in keys.MetaField")
        return f"'{META_FIELDS[m.group(1)]}'" if quoted else str(META_SLOTS[m.group(1)])

    bad = _META_CALL_RE.search(text)
    if bad:
        raise errors.TaskqError(
            f"{file}: a command on K_META names a field as F.NAME (its slot in the library's "
            f"cache): write N.NAME, its name, or use mget / mset: {bad.group(0)}"
        )
    text = _NAME_FIELD_RE.sub(lambda m: field(m, True), text)
    return _FIELD_RE.sub(lambda m: field(m, False), text)


def _nkeys(file: str, text: str) -> int:
    """The number of KEYS a verb takes, from its ``-- KEYS:`` header line."""
    m = _KEYS_RE.search(text)
    if not m:
        raise errors.TaskqError(
            f"{file}: needs a header line `-- KEYS: the job's keys (keys.SCRIPT_KEYS)`, "
            f"with `+ name, ...` for any extra key"
        )
    return len(SCRIPT_KEYS) + (len(m.group(1).split(",")) if m.group(1) else 0)


def _build() -> tuple[str, str, dict[str, tuple[str, int, bool]]]:
    """(library name, library source, {verb: (function name, number of keys, read-only)})."""
    pkg = resources.files("taskq.engine") / "lua"
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
