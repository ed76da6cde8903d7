"""Builds taskq's Redis Function library, one function per operation (transport.py calls it).

Each ``lua/verb.lua`` opens with a ``#!lua`` line (``flags=no-writes`` for the read-only
ones, ``flags=allow-oom`` for those that only free or set a flag, so an operator can still
cancel, delete or pause a job on a Redis out of memory; one flag per verb) and a KEYS /
ARGV / returns header; its ``-- KEYS:`` line says which keys it takes:
``the job's keys (keys.SCRIPT_KEYS)``, then ``+ name, ...`` for any extra one (create's
staging hash), and that is the number of keys a call must pass (checked here). Every verb
checks its whole ARGV first (``lib/args.lua``) and answers ``INVALID`` with the name of the
bad argument before its first write: Redis does not roll a script back.

How the library is put together (one chunk, in this order):

- the generated ground: the ``K_*`` locals in the order of ``keys.SCRIPT_KEYS`` and
  ``kc(name)``, which makes a cold key; ``job_keys()``, ``HIST_BOUNDS``, ``META_NAMES``;
  ``CALL``, the call's state several parts share (lib/call.lua lists its fields), and
  ``lib``, the table of the parts;
- ``build()``: each part ``lua/lib/<part>.lua``, in the order of ``LIB_PARTS``, wrapped in
  its own closure, ``lib.<part> = (function() <the file> end)()``. A part is a Lua module:
  it opens by binding what it calls (``local rcall = redis.call``,
  ``local mget = lib.meta.mget``: upvalues from then on, as fast as a local of the chunk)
  and ends with ``return {name = name, ...}``, the functions other parts and verbs use.
  The parts are built by the library's first call in a server (``begin()``), not while the
  library loads: Redis gives a loading library no Lua globals (``redis``, ``string``, ...);
- ``begin(keys)``, which every function calls first: the parts built if they are not, the
  keys of this call's job, and each part with per-call state reset through its ``reset()``
  (lib/call.lua's makes a new ``CALL``);
- each verb registered as the function ``taskq_<version>_<verb>``, which calls
  ``begin(KEYS)`` and then the verb's body. A verb binds what it calls from the parts
  right after its header (``local done = lib.call.done``); ``build()`` makes those lines a
  closure around the body (``VERBS.<verb>``), so they too run once, not on every call.

A part's locals outlive a call. Every top-level ``local`` of a part is a function, a
binding (``local a, b = x.y, z``: set once, at build), a table marked ``-- constant`` on
its line, or state marked ``-- per call`` that the part's ``local function reset()`` sets
back and returns (``reset = reset``); anything else is refused, naming the part.

The only text the build rewrites is the contract's, so that Python stays its one source:
``C.NAME`` (a ``contract.Code``) and the bounds of ``contract._LIMITS`` become numbers,
``K_<COLD>`` becomes ``kc('<cold>')``, ``F.<NAME>`` becomes the slot of meta field
``keys.MetaField.<NAME>`` in lib/meta.lua's cache (an integer: the hot fields first, in the
order of ``HOT_META``, so ``load_meta``'s HMGET reply is the cache itself; kept because it
pays over 3 % a call) and ``N.<NAME>`` its name (what a command on the hash names);
with the cache go ``META_HOT_SLOTS`` (how many fields the HMGET names) and ``META_FALSES``
(a constructor of falses over the slots a call's tables of changes are made with). An
unknown name is refused.

The guard. Lua 5.1 refuses a function of more than 200 locals or 60 upvalues, and a
library that does not load fails on every server at once. ``budget`` reads each unit's Lua
tokens (no regex over lines: neither indentation nor an ``end`` in a string fools it) and
counts the top-level locals of each part's closure, each verb's callback and the chunk,
and the names of the part and the chunk each function uses (its upvalues, an upper bound).
A unit within ``LIMIT_MARGIN`` (10) of either limit is refused with a message that names
it and says what to do; ``BUDGETS`` holds every unit's count, and a binding of a name a
part does not return is refused too. ``build(texts)`` runs the whole build, every check
made, with the Lua of some parts or verbs replaced (or a verb added): how a change is
checked before it is loaded; ``expand(file, text)`` shows what the build makes of a file.

What a maintainer adds where: a helper goes into the part of its concern (bind what it
calls at the top, add it to the return table if a verb or a later part calls it, and bind
it there); per-call state goes into the part's locals with ``-- per call`` and its
``reset()``, or into ``CALL`` when other parts read it; a new part is a new file listed in
``LIB_PARTS`` after the parts it binds; a new verb is a new ``lua/<verb>.lua``.

Why a Function library and not one EVALSHA script per operation: a library is compiled
and its definitions built once; a script re-creates every local function it defines on
every call (~0.09 µs a closure, bench/HISTORY.md). The library's name carries a hash of its
text, so clients of two taskq versions can share a server during an upgrade; a client
loads its library when the server answers "function not found" (a new server, FUNCTION
FLUSH, a new cluster master). Libraries persist and replicate like data. Loading needs
``FUNCTION LOAD``, which deploy/redis/acl.conf gives the admin role only: whoever may load
a library may replace one, and every role's calls would run the replacement. The
semantics the scripts implement are in docs/design.md.

The build's result is kept in ``~/.cache/taskq`` (``$XDG_CACHE_HOME``) under a hash of
every file it reads (``cached_build``): an import reads it back instead of tokenizing the
Lua again, and a changed file makes a new entry.

Data flow: lua/*.lua + contract.py + keys.py -> library.py (the text, at import) ->
transport.py (FUNCTION LOAD, FCALL) -> Redis.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from taskq import errors, keys
from taskq.engine import contract
from taskq.engine.contract import _LIMITS, HIST_BOUNDS_MS, Code
from taskq.keys import COLD_KEYS, META_FIELDS, SCRIPT_KEYS

# Lua 5.1's limits per function (a part's closure, a verb's callback, any function in
# them), and the build's: a unit within LIMIT_MARGIN of them is refused.
LUA_MAX_LOCALS, LUA_MAX_UPVALUES, LIMIT_MARGIN = 200, 60, 10
MAX_LOCALS, MAX_UPVALUES = LUA_MAX_LOCALS - LIMIT_MARGIN, LUA_MAX_UPVALUES - LIMIT_MARGIN

LIB_PARTS: tuple[str, ...] = (
    "meta.lua",
    "args.lua",
    "events.lua",
    "call.lua",
    "mixrule.lua",
    "mixdead.lua",
    "mixseq.lua",
    "mixfeed.lua",
    "mix.lua",
    "mixslot.lua",
    "mixtrim.lua",
    "secrets.lua",
    "workers.lua",
    "leases.lua",
    "pieces.lua",
    "split.lua",
    "endings.lua",
    "passes.lua",
    "progress.lua",
    "reclaim.lua",
    "dispatch.lua",
    "cuts.lua",
)

_NAME_RE = re.compile(r"^([a-z]+)\.lua$")
_KEYS_RE = re.compile(
    r"^-- KEYS: the job's keys \(keys\.SCRIPT_KEYS\)(?: \+ ([a-z_]+(?:, [a-z_]+)*))?(?:$| )", re.M
)
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
    "MIXH",
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
        "-- this call's state that several parts share (made by lib/call.lua's reset(), each call)",
        "local CALL = {}",
        "-- the parts (lib/*.lua), each the table of its functions, built by the first call",
        "local lib, BUILT = {}, false",
        "-- each verb's function, by name (built with the parts: build())",
        "local VERBS = {}",
    ]
    return "\n".join(lines) + "\n"


_CODE_RE = re.compile(r"\bC\.([A-Za-z_]\w*)")
_LIMIT_RE = re.compile(r"\b(" + "|".join(_LIMITS) + r")\b")


def _constants(file: str, text: str) -> str:
    """``text`` with every ``C.NAME`` (a ``Code``) and every bound of ``_LIMITS`` written
    as its number: one source of truth with Python, and a literal costs no lookup."""

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


class _Token(NamedTuple):
    kind: str  # name, string, number, comment, symbol
    text: str
    line: int


_LONG_OPEN_RE = re.compile(r"\[(=*)\[")
_TOKEN_RE = re.compile(
    r"(?P<space>[ \t\r\n]+)|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<string>'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\")"
    r"|(?P<symbol>\.\.\.|\.\.|==|~=|<=|>=|[^\s\w])"
)


def lua_tokens(text: str) -> list[_Token]:
    """Lua 5.1's tokens of ``text``: names (keywords too), strings, numbers, comments and
    symbols, each with its line. What the budget guard reads, so that neither indentation
    nor a keyword inside a string or a comment can fool it.

    Raises:
        TaskqError: an unfinished string or long bracket.
    """
    out: list[_Token] = []
    i, line, n = 0, 1, len(text)
    while i < n:
        kind = ""
        if text.startswith("--", i) or text.startswith("[", i):
            skip = 2 if text.startswith("--", i) else 0
            long = _LONG_OPEN_RE.match(text, i + skip)
            if long:
                close = text.find("]" + long.group(1) + "]", long.end())
                if close < 0:
                    raise errors.TaskqError(f"line {line}: an unfinished long bracket")
                end, kind = close + len(long.group(1)) + 2, "comment" if skip else "string"
            elif skip:
                close = text.find("\n", i)
                end, kind = n if close < 0 else close, "comment"
        if not kind:
            m = _TOKEN_RE.match(text, i)
            if not m or (m.lastgroup == "symbol" and text[i] in "'\""):
                raise errors.TaskqError(f"line {line}: an unfinished string")
            end, kind = m.end(), str(m.lastgroup)
        if kind != "space":
            out.append(_Token(kind, text[i:end], line))
        line += text.count("\n", i, end)
        i = end
    return out


@dataclass
class Budget:
    """A unit's use of Lua 5.1's per-function limits: the locals its chunk (a part's closure,
    a verb's callback) declares at its top level, and for each function inside it the names
    of the part and the library's chunk that it uses (its upvalues: an upper bound, a name
    a function also declares itself is counted)."""

    locals: list[str] = field(default_factory=list)
    upvalues: dict[str, set[str]] = field(default_factory=dict)
    per_call: list[str] = field(default_factory=list)
    loose: list[str] = field(default_factory=list)  # top-level state neither per call nor constant


_OPENERS = {"function", "do", "if", "repeat"}


def _statement_locals(toks: list[_Token], k: int) -> tuple[list[str], int]:
    """The names a ``local`` at ``toks[k]`` declares, and the index after them."""
    k += 1
    if toks[k].text == "function":
        return [toks[k + 1].text], k + 2
    names = [toks[k].text]
    k += 1
    while k + 1 < len(toks) and toks[k].text == ",":
        names.append(toks[k + 1].text)
        k += 2
    return names, k


def _binding_end(toks: list[_Token], k: int, count: int) -> int | None:
    """The index after ``toks[k:]`` when they are ``= a.b, c, ...`` (``count`` dotted
    names) ending their line: a local bound once, when its unit is built (a Lua global or
    a part's function), never written. None when they are not."""
    if k >= len(toks) or toks[k].text != "=":
        return None
    k += 1
    for i in range(count):
        if i and (k >= len(toks) or toks[k].text != ","):
            return None
        k += 1 if i else 0
        if k >= len(toks) or toks[k].kind != "name":
            return None
        k += 1
        while k + 1 < len(toks) and toks[k].text == "." and toks[k + 1].kind == "name":
            k += 2
    return k if k >= len(toks) or toks[k].line > toks[k - 1].line else None


def _split_bindings(body: str) -> tuple[str, list[str], str]:
    """A verb's text up to the end of its leading bindings (its header and the
    ``local a = lib.part.a`` lines), the names they bind, and the rest (the callback)."""
    code = [t for t in lua_tokens(body) if t.kind != "comment"]
    k, names, last_line = 0, [], 0
    while k + 1 < len(code) and code[k].text == "local" and code[k + 1].text != "function":
        bound, after = _statement_locals(code, k)
        end = _binding_end(code, after, len(bound))
        if end is None:
            break
        names += bound
        last_line, k = code[end - 1].line, end
    lines = body.split("\n")
    return "\n".join(lines[:last_line]) + "\n", names, "\n".join(lines[last_line:])


def budget(text: str, outer: frozenset[str] = frozenset()) -> Budget:
    """The locals and upvalues of one unit of the library (see ``Budget``).

    Args:
        text: the unit's Lua (a part's file, a verb's body).
        outer: the names of the chunk around it (the library's own locals).

    Returns:
        Its Budget: ``per_call`` lists the top-level locals whose line ends in
        ``-- per call``; ``loose`` those that are neither that, nor ``-- constant``, nor a
        binding (``local a, b = x.y, z``), nor a function.
    """
    toks = lua_tokens(text)
    code = [t for t in toks if t.kind != "comment"]
    marks = {t.line: t.text for t in toks if t.kind == "comment"}
    out = Budget()
    # (opener, function name or "", names it uses) per open block
    stack: list[tuple[str, str, set[str]]] = []
    used_anywhere: set[str] = set()
    k = 0
    while k < len(code):
        t = code[k]
        if t.kind == "name" and t.text == "local" and not stack:
            names, after = _statement_locals(code, k)
            out.locals += names
            if code[k + 1].text == "function":
                k += 1  # (the function's own name is read where it opens)
                continue
            mark = marks.get(t.line, "")
            if re.search(r"--\s*per call\b", mark):
                out.per_call += names
            elif not re.search(r"--\s*constant\b", mark) and (
                _binding_end(code, after, len(names)) is None
            ):
                out.loose += names
            k = after
            continue
        if t.kind == "name" and t.text in _OPENERS:
            name = ""
            if t.text == "function":
                name = code[k + 1].text if code[k + 1].kind == "name" else ""
                name = name or f"the function at line {t.line}"
            stack.append((t.text, name, set()))
            if t.text == "function" and code[k + 1].kind == "name":
                k += 1  # (its own name: no use of it)
        elif t.kind == "name" and t.text in ("end", "until") and stack:
            opener, name, used = stack.pop()
            if opener == "function":
                out.upvalues[name] = used
                for _, outer_name, outer_used in stack:
                    if outer_name:
                        outer_used |= used
        elif t.kind == "name" and not (k and code[k - 1].text in (".", ":")):
            used_anywhere.add(t.text)
            for _, name, used in stack:
                if name:
                    used.add(t.text)
        k += 1
    known = set(outer) | set(out.locals)
    out.upvalues = {name: used & known for name, used in out.upvalues.items()}
    out.upvalues[""] = used_anywhere & outer  # the unit's own (a part's closure, a callback)
    return out


#: The names the library's chunk declares (the generated ground, ``build``, ``begin``):
#: every part and verb may read them without binding them.
CHUNK_NAMES = frozenset(budget(_generated()).locals) | {"build", "begin"}


def _check(unit: str, got: Budget, what_to_do: str) -> None:
    """Refuse a unit within ``LIMIT_MARGIN`` of Lua 5.1's limits: it would stop loading a
    few definitions later, on every server at once."""
    if len(got.locals) > MAX_LOCALS:
        raise errors.TaskqError(
            f"{unit} declares {len(got.locals)} top-level locals (at most {MAX_LOCALS}; Lua "
            f"5.1 stops at {LUA_MAX_LOCALS}): {what_to_do}"
        )
    for name, used in got.upvalues.items():
        if len(used) > MAX_UPVALUES:
            where = f"{unit}'s function {name}" if name else unit
            raise errors.TaskqError(
                f"{where} uses {len(used)} locals from around it (upvalues; at most "
                f"{MAX_UPVALUES}, Lua 5.1 stops at {LUA_MAX_UPVALUES}): split it, or gather "
                f"the state it reads into a table"
            )


_RETURN_RE = re.compile(r"^return \{(.*?)\}\s*end\)\(\)\n\Z", re.S | re.M)
_BINDING_RE = re.compile(r"\blib\.(\w+)\.(\w+)")


def _exports(file: str, wrapped: str) -> set[str]:
    """The names a part returns (its closure's last statement, ``return {name = name, ...}``)."""
    m = _RETURN_RE.search(wrapped)
    if not m:
        raise errors.TaskqError(f"lib/{file}: must end with `return {{name = name, ...}}`")
    return set(re.findall(r"(\w+)\s*=", m.group(1)))


def _check_bindings(unit: str, text: str, exports: dict[str, set[str]]) -> None:
    """Refuse ``lib.<part>.<name>`` where the part returns no such name (it would be nil,
    an error only when called)."""
    for part, name in _BINDING_RE.findall(text):
        if name not in exports.get(part, ()):
            raise errors.TaskqError(
                f"{unit}: binds lib.{part}.{name}, which lib/{part}.lua does not return "
                f"(add `{name} = {name}` to its return table)"
            )


def _part(file: str, text: str, budgets: dict[str, Budget]) -> tuple[str, bool]:
    """A part's text wrapped in its closure (``lib.<part> = (function() ... end)()``, built
    by ``build()``), and whether it has per-call state (then begin() calls its ``reset``).

    Raises:
        TaskqError: a top-level local that is state but not marked ``-- per call``, a
            per-call local its ``reset()`` does not set, a part near Lua's limits.
    """
    got = budget(text, CHUNK_NAMES)
    unit = f"lib/{file}"
    budgets[unit] = got
    if got.loose:
        raise errors.TaskqError(
            f"{unit}: top-level `local {', '.join(got.loose)}` outlives a call: end its line "
            f"with `-- per call` and set it in the part's reset(), or `-- constant` when it "
            f"is never written"
        )
    if got.per_call:
        missing = set(got.per_call) - got.upvalues.get("reset", set())
        if missing or not re.search(r"\breset = reset\b", text):
            raise errors.TaskqError(
                f"{unit}: its per-call locals ({', '.join(sorted(missing or got.per_call))}) "
                f"need a `local function reset()` that sets each, returned as `reset = reset`"
            )
    _check(
        unit,
        got,
        "move a group of its functions into a part of their own (a new lib/ file in "
        "library.LIB_PARTS), or bind fewer of other parts' functions",
    )
    stem = file.removesuffix(".lua")
    return f"lib.{stem} = (function()\n-- lib/{file}\n{text}end)()\n", bool(got.per_call)


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


def expand(file: str, text: str) -> str:
    """The Lua of ``file`` as the build writes it into the library: the contract's codes and
    bounds as numbers, meta fields as slots (``F.``) or names (``N.``), cold keys as ``kc()``.

    Args:
        file: the file's name, for the messages (``lib/meta.lua``, ``ack.lua``).
        text: its Lua.

    Returns:
        The rewritten text.

    Raises:
        TaskqError: an unknown code or meta field, or a meta field named by its slot in a
            command on the meta hash.
    """
    return _constants(file, _fields(file, text))


class Library(NamedTuple):
    """A built library: what ``build`` returns."""

    #: ``taskq_<hash of the text>``, the name the library is loaded under
    name: str
    #: the text ``FUNCTION LOAD`` takes
    source: str
    #: {verb: (function name, number of keys, read-only)}
    functions: dict[str, tuple[str, int, bool]]
    #: every unit's ``Budget``: ``lib/<part>.lua``, ``<verb>.lua``, ``the library's chunk``
    budgets: dict[str, Budget]


def build(texts: Mapping[str, str] | None = None) -> Library:
    """Build the library from taskq/engine/lua, every check of the module's docstring made.

    Args:
        texts: Lua to use instead of the package's files, by path under ``lua/``: a part
            (``lib/meta.lua``, one of ``LIB_PARTS``) or a verb (``ack.lua``; a new name adds
            a verb). How a maintainer checks a changed part against the guard before
            loading it.

    Returns:
        The library (name, source, functions, budgets).

    Raises:
        TaskqError: a unit the guard refuses, with the unit's name and what to do.
    """
    pkg = resources.files("taskq.engine") / "lua"
    texts = dict(texts or {})
    unknown = [t for t in texts if t.startswith("lib/") and t[4:] not in LIB_PARTS]
    if unknown:
        raise errors.TaskqError(f"{unknown[0]}: not a part of library.LIB_PARTS")
    budgets: dict[str, Budget] = {}
    parts = []
    for file in LIB_PARTS:
        text = texts.pop(f"lib/{file}", None) or (pkg / "lib" / file).read_text()
        parts.append((file, *_part(file, expand(f"lib/{file}", text), budgets)))
    exports = {file.removesuffix(".lua"): _exports(file, text) for file, text, _ in parts}
    for file, text, _ in parts:
        _check_bindings(f"lib/{file}", text, exports)
    verb_texts = {
        entry.name: entry.read_text()
        for entry in pkg.iterdir()
        if _NAME_RE.match(entry.name) and entry.is_file()
    }
    verb_texts |= texts
    verbs: list[tuple[str, int, str, str]] = []
    for file in sorted(verb_texts):
        m = _NAME_RE.match(file)
        if not m:
            raise errors.TaskqError(f"{file}: a verb's file is named <verb>.lua (lowercase)")
        verb = m.group(1)
        first, _, body = verb_texts[file].partition("\n")
        if not first.startswith("#!lua"):
            raise errors.TaskqError(f"{file}: must open with a #!lua line")
        flags = first.partition("flags=")[2].split()
        body = expand(file, body)
        head, bound, rest = _split_bindings(body)
        _check(file, Budget(locals=bound), "bind fewer names")
        budgets[file] = budget(rest, CHUNK_NAMES | set(bound))
        _check(file, budgets[file], "move some of its work into a lib/ part")
        _check_bindings(file, body, exports)
        closure = (
            f"VERBS.{verb} = (function()\n{head}return function(KEYS, ARGV)\n{rest}\nend\nend)()\n"
        )
        verbs.append((verb, _nkeys(file, body), ",".join(flags[:1]), closure))
    chunk = (
        _generated()
        + "-- Builds the parts, in the order of library.LIB_PARTS, then the verbs, on the\n"
        + "-- library's first call in a server: a library has no Lua globals while it loads, a\n"
        + "-- call has (redis.call ...).\n"
        + "local function build()\n"
        + "".join(text for _, text, _ in parts)
        + "".join(closure for _, _, _, closure in verbs)
        + "BUILT = true\nend\n"
        + "-- Every function of the library starts here: the library built, the keys of this\n"
        + "-- call's job, and every part's per-call state back to its start.\n"
        + "local function begin(keys)\n"
        + "  if not BUILT then build() end\n"
        + "  set_keys(keys)\n"
        + "".join(f"  lib.{file.removesuffix('.lua')}.reset()\n" for file, _, has in parts if has)
        + "end\n"
    )
    budgets["the library's chunk"] = budget(chunk)
    _check(
        "the library's chunk",
        budgets["the library's chunk"],
        "gather generated constants into a table, or per-call state into CALL",
    )
    text = chunk + "".join(
        f"\nredis.register_function{{function_name = '%FN%{verb}', "
        f"flags = {{{', '.join(repr(f) for f in flags.split(',') if f)}}}, "
        f"callback = function(KEYS, ARGV)\nbegin(KEYS)\nreturn VERBS.{verb}(KEYS, ARGV)\nend}}\n"
        for verb, _, flags, _ in verbs
    )
    version = hashlib.sha1(text.encode()).hexdigest()[:12]
    name = f"taskq_{version}"
    source = f"#!lua name={name}\n" + text.replace("%FN%", f"{name}_")
    functions = {
        verb: (f"{name}_{verb}", nkeys, "no-writes" in flags) for verb, nkeys, flags, _ in verbs
    }
    return Library(name, source, functions, budgets)


#: How many built libraries the cache keeps (one per version of the Lua: a few checkouts
#: or virtualenvs of taskq on one machine share it).
CACHE_KEEP = 8


def cache_dir() -> Path:
    """Where built libraries are kept: ``$XDG_CACHE_HOME/taskq`` (``~/.cache/taskq``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "taskq"


def _inputs_digest() -> str:
    """A hash of everything the build reads: the package's Lua files and the Python that
    turns them into the library (this module, contract.py, keys.py)."""
    digest = hashlib.sha1()
    lua = resources.files("taskq.engine") / "lua"
    files = [(f"lua/{e.name}", e) for e in lua.iterdir() if e.is_file()]
    files += [(f"lua/lib/{e.name}", e) for e in (lua / "lib").iterdir() if e.is_file()]
    files += [(Path(m.__file__ or "").name, Path(m.__file__ or "")) for m in (contract, keys)]
    files.append(("library.py", Path(__file__)))
    for name, entry in sorted(files, key=lambda f: f[0]):
        digest.update(name.encode() + b"\0" + entry.read_bytes() + b"\0")
    return digest.hexdigest()


def cached_build() -> Library:
    """``build()``, kept in ``cache_dir()`` under a hash of its inputs: the build reads every
    unit's Lua tokens for the guard (about 0.3 s on an idle machine, at every import of
    taskq), and its result changes only with the files it reads. A missing, unreadable or
    damaged entry is built again; a cache that cannot be written is left alone. Keeps the
    ``CACHE_KEEP`` newest entries."""
    path = cache_dir() / f"library-{_inputs_digest()}.json"
    try:
        kept = json.loads(path.read_text())
        return Library(
            kept["name"],
            kept["source"],
            {verb: (fn, nkeys, ro) for verb, (fn, nkeys, ro) in kept["functions"].items()},
            {
                unit: Budget(
                    b["locals"],
                    {name: set(used) for name, used in b["upvalues"].items()},
                    b["per_call"],
                    b["loose"],
                )
                for unit, b in kept["budgets"].items()
            },
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    built = build()
    budgets = {
        unit: asdict(b) | {"upvalues": {n: sorted(u) for n, u in b.upvalues.items()}}
        for unit, b in built.budgets.items()
    }
    entry = {
        "name": built.name,
        "source": built.source,
        "functions": built.functions,
        "budgets": budgets,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as out:
            json.dump(entry, out)
        os.replace(out.name, path)
        kept_files = sorted(path.parent.glob("library-*.json"), key=os.path.getmtime)
        for old in kept_files[:-CACHE_KEEP]:
            old.unlink(missing_ok=True)
    except OSError:
        pass
    return built


LIBRARY, SOURCE, FUNCTIONS, BUDGETS = cached_build()
VERBS = tuple(sorted(FUNCTIONS))
