"""Loads the Lua scripts, one per operation, and maps their return codes to errors.

Each ``lua/verb-N.lua`` opens with a ``#!lua`` line and a KEYS / ARGV / returns header.
At load time the part of ``_lib.lua`` the script uses (its top-level definitions reached
from the script's identifiers, transitively) and the generated ``K_*`` key locals (in the
order of ``keys.JOB_KEYS``) and histogram-bound helpers are inserted after that line, and
every ``C.NAME`` becomes the code's number, so Python stays the one source of truth for
codes and key names and no script builds what it does not use on every call. ``N`` in the file name
must equal the number of KEYS the operation takes; that is checked here.

Data flow: client.py / trainer.py / reaper.py -> scripts.py (EVALSHA, reloaded after
SCRIPT FLUSH by redis-py's ``Script``) -> Redis.
"""

from __future__ import annotations

import enum
import re
from importlib import resources
from typing import Any

from redis.commands.core import Script

from . import errors
from .keys import JOB_KEYS


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

_NAME_RE = re.compile(r"^([a-z]+)-(\d+)\.lua$")


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


_STRING_RE = re.compile(r"'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"")
_COMMENT_RE = re.compile(r"--[^\n]*")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CODE_RE = re.compile(r"\bC\.([A-Z_]+)\b")
_DEF_RE = re.compile(r"^local\s+(?:function\s+([A-Za-z_]\w*)|([A-Za-z_][\w\s,]*?)\s*=)")


def _identifiers(code: str) -> set[str]:
    """The identifiers a piece of Lua mentions outside strings and comments."""
    return set(_IDENT_RE.findall(_COMMENT_RE.sub("", _STRING_RE.sub("''", code))))


def _inline_codes(text: str, where: str) -> str:
    """``C.NAME`` -> the code's number (no table of codes is built per call)."""

    def number(m: re.Match[str]) -> str:
        try:
            value = int(Code[m.group(1)])
        except KeyError as e:
            raise errors.TaskqError(f"{where}: unknown return code C.{m.group(1)}") from e
        return f"({value})" if value < 0 else str(value)

    return _CODE_RE.sub(number, text)


def _blocks(lib: str) -> list[tuple[set[str], str]]:
    """The top-level definitions of a library text, in order: (names defined, text).

    A definition opens at a column-0 ``local`` line and runs to the next one; column-0
    comments go with the definition after them.
    """
    blocks: list[tuple[set[str], str]] = []
    pending: list[str] = []
    names: set[str] | None = None
    body: list[str] = []

    def close() -> None:
        if names is not None:
            blocks.append((names, "\n".join(body)))

    for line in lib.splitlines():
        m = _DEF_RE.match(line)
        if m:
            close()
            if m.group(1):
                names = {m.group(1)}
            else:
                names = {n.strip() for n in m.group(2).split(",")}
            body = pending + [line]
            pending = []
        elif line.startswith("--") or (not line.strip() and names is None):
            pending.append(line)
        elif names is None:
            if line.strip():
                raise errors.TaskqError(f"_lib.lua: statement outside a definition: {line!r}")
        elif line.startswith("--"):
            pending.append(line)
        else:
            body.append(line)
    close()
    return blocks


def _expand_hot(lib: str) -> str:
    """``HOT`` (the meta fields read once per call) becomes literal HMGET arguments and
    one table constructor, instead of a table built and walked on every call."""
    m = re.search(r"^local HOT = \{(.*?)\}\n", lib, re.S | re.M)
    if not m:
        raise errors.TaskqError("_lib.lua: no `local HOT = {...}`")
    fields = re.findall(r"'([a-z_]+)'", m.group(1))
    lib = lib[: m.start()] + lib[m.end():]
    args = ", ".join(f"'{f}'" for f in fields)
    ctor = "M = {" + ", ".join(f"['{f}'] = vals[{i}]" for i, f in enumerate(fields, 1)) + "}"
    for old, new in (("unpack(HOT)", args),
                     ("for i, f in ipairs(HOT) do M[f] = vals[i] end", ctor)):
        if old not in lib:
            raise errors.TaskqError(f"_lib.lua: load_meta no longer reads {old!r}")
        lib = lib.replace(old, new)
    return lib


def _generated() -> str:
    """Definitions made from Python's constants: the K_* keys and the histogram bounds."""
    lines = [f"local K_{name.upper()} = KEYS[{i}]" for i, name in enumerate(JOB_KEYS, 1)]
    lines.append("local function hist_bucket(ms)")
    for i, bound in enumerate(HIST_BOUNDS_MS, 1):
        lines.append(f"  if ms <= {bound} then return '{i}' end")
    lines.append(f"  return '{len(HIST_BOUNDS_MS) + 1}'")
    lines.append("end")
    lines.append("local function hist_bounds() return {"
                 + ", ".join(map(str, HIST_BOUNDS_MS)) + "} end")
    return "\n".join(lines) + "\n"


def _assemble(blocks: list[tuple[set[str], str]], body: str) -> str:
    """The definitions ``body`` uses, transitively, in library order, then ``body``."""
    defined: dict[str, int] = {}
    for index, (names, _) in enumerate(blocks):
        for name in names:
            defined[name] = index
    refs = [_identifiers(text) for _, text in blocks]
    wanted: set[int] = set()
    todo = [defined[n] for n in _identifiers(body) if n in defined]
    while todo:
        index = todo.pop()
        if index in wanted:
            continue
        wanted.add(index)
        todo.extend(defined[n] for n in refs[index] if n in defined)
    return "\n".join(blocks[i][1] for i in sorted(wanted)) + "\n" + body


def _load_sources() -> dict[str, tuple[int, str]]:
    pkg = resources.files("taskq") / "lua"
    lib = _expand_hot(_inline_codes((pkg / "_lib.lua").read_text(), "_lib.lua"))
    lib = lib.replace("#HIST_BOUNDS_MS", str(len(HIST_BOUNDS_MS)))
    blocks = _blocks(_generated() + lib)
    out: dict[str, tuple[int, str]] = {}
    for entry in sorted(pkg.iterdir(), key=lambda p: p.name):
        m = _NAME_RE.match(entry.name)
        if not m:
            continue
        verb, nkeys = m.group(1), int(m.group(2))
        if nkeys not in (len(JOB_KEYS), len(JOB_KEYS) + 1):
            raise errors.TaskqError(
                f"{entry.name}: takes {nkeys} keys but keys.JOB_KEYS has {len(JOB_KEYS)}"
            )
        text = entry.read_text()
        first, _, body = text.partition("\n")
        if not first.startswith("#!lua"):
            raise errors.TaskqError(f"{entry.name}: must open with a #!lua line")
        body = _inline_codes(body, entry.name).replace("#HIST_BOUNDS_MS",
                                                       str(len(HIST_BOUNDS_MS)))
        source = _assemble(blocks, body)
        left = _identifiers(source) & {"C", "HOT", "HIST_BOUNDS_MS"}
        if left:
            raise errors.TaskqError(f"{entry.name}: still uses {sorted(left)}")
        out[verb] = (nkeys, f"{first}\n{source}")
    return out


_SOURCES = _load_sources()
VERBS = tuple(sorted(_SOURCES))


class Scripts:
    """The registered scripts of one Redis connection (EVALSHA, reloaded on NOSCRIPT)."""

    def __init__(self, redis_client: Any) -> None:
        self._scripts: dict[str, Script] = {}
        self._nkeys: dict[str, int] = {}
        for verb, (nkeys, source) in _SOURCES.items():
            self._scripts[verb] = redis_client.register_script(source)
            self._nkeys[verb] = nkeys

    def call(self, verb: str, keys: list[str] | list[bytes], args: list[Any],
             client: Any = None) -> Any:
        """Run one operation's script.

        Args:
            verb: the operation (``lease``, ``ack``, ...).
            keys: its KEYS (checked against the file's N).
            args: its ARGV.
            client: a pipeline to queue the call on instead of the connection.

        Returns:
            The script's raw reply (a list whose first element is a ``Code``).
        """
        if len(keys) != self._nkeys[verb]:
            raise errors.TaskqError(f"{verb}: expects {self._nkeys[verb]} keys, got {len(keys)}")
        return self._scripts[verb](keys=keys, args=args, client=client)
