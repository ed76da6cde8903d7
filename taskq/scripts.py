"""Loads the Lua scripts, one per operation, and maps their return codes to errors.

Each ``lua/verb-N.lua`` opens with a ``#!lua`` line and a KEYS / ARGV / returns header.
At load time the generated constants (return codes, ``K_*`` key locals in the order of
``keys.JOB_KEYS``, histogram bounds) and ``_lib.lua`` are inserted after that line, so
Python stays the one source of truth for codes and key names. ``N`` in the file name
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


def _prelude() -> str:
    codes = ", ".join(f"{c.name}={int(c)}" for c in Code)
    lines = [f"local C = {{{codes}}}"]
    lines += [f"local K_{name.upper()} = KEYS[{i}]" for i, name in enumerate(JOB_KEYS, 1)]
    lines.append("local HIST_BOUNDS_MS = {" + ", ".join(map(str, HIST_BOUNDS_MS)) + "}")
    return "\n".join(lines) + "\n"


def _load_sources() -> dict[str, tuple[int, str]]:
    pkg = resources.files("taskq") / "lua"
    lib = (pkg / "_lib.lua").read_text()
    prelude = _prelude()
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
        out[verb] = (nkeys, f"{first}\n{prelude}{lib}\n{body}")
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

    def call(self, verb: str, keys: list[str], args: list[Any], client: Any = None) -> Any:
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
