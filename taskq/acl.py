"""Redis ACL rules for one job's trainers, and for reapers and exporters (``taskq acl``).

The shared users of deploy/redis/acl.conf may touch every job's keys. The rules built
here give a user the keys of one job only (``~<prefix>:{JOB}:*``), and restrict its
``FCALL`` / ``FCALL_RO`` to the functions of its role with Redis 7's first-argument rules
(``+fcall|taskq_<version>_ack``): a trainer credential of job A can neither read nor
change job B, and cannot run the admin functions (cancel, advance, reset, ...) of A.

Redis checks a function's declared keys at ``FCALL`` and every command inside it against
the caller's ACL, so the rule must allow exactly what the role's functions do; the key
sets below say which keys each command may touch. The function names carry the
library's version (``scripts.LIBRARY``), so a rule is only good for the taskq version
that printed it: apply the new rule when upgrading.

What a rule cannot fence, and docs/security.md says plainly: a function's commands are
checked like direct commands, so a trainer may also run, outside the functions, the
writes its functions make (``HSET`` on its own job's meta, ...). Within its own job a
trainer credential is trusted.

Data flow: cli/acl.py -> acl.py -> keys.py (patterns), scripts.py (function names) ->
``ACL SETUSER`` on Redis (``--apply``, as a user allowed to manage users).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from typing import Any

from . import errors
from .keys import (
    JOB_KEYS,
    acl_jobs_index_pattern,
    acl_key_patterns,
    acl_shard_sets_pattern,
    prefix,
    valid_job_name,
)
from .scripts import LIBRARY, VERBS

#: Functions a trainer calls (``Trainer``, ``taskq work``): FCALL and FCALL_RO.
TRAINER_VERBS = ("register", "lease", "ack", "fail", "release", "heartbeat", "leave", "progress")
TRAINER_RO_VERBS = ("stats",)  # Trainer.passes() reads the current pass
REAPER_VERBS = ("reap", "closed")
REAPER_RO_VERBS = ("conns",)  # with CLIENT LIST ID: closed connections (connwatch.py)
EXPORTER_RO_VERBS = ("stats", "peek")  # peek: `taskq tasks` with an exporter's URL

#: Keys the trainer's and the reaper's functions DEL / UNLINK (a pass ending, a
#: broadcast) and the trainer BLPOPs (wake-up lists): per-pass state, nothing a job
#: cannot rebuild. The job's config, chunks, leases, counts and events are not here.
SCRATCH_KEYS = (
    "done",
    "front",
    "owned",
    "deadlines",
    "reserved",
    "started",
    "wake",
    "bcast0",
    "bcast1",
    "progress",
)
#: Keys no trainer or reaper function writes: the chunks (written once by create), the
#: manual clock (the admin's ``clock``) and the reaper's lock (``SET`` by the reaper only).
READ_ONLY_KEYS = ("chunks", "clock", "lock")
WRITTEN_KEYS = tuple(k for k in JOB_KEYS if k not in READ_ONLY_KEYS)

#: The writes the trainer's and reaper's functions make, each for a reason:
#: HSET/HDEL/HINCRBY meta, leases, winfo, counts, passes, hist; ZADD/ZREM/ZPOPMIN the
#: sorted sets (front, owned, deadlines, reserved, started, workers, waiting);
#: LPUSH/RPUSH/LTRIM/PEXPIRE the wake-up lists; SADD dead; SETBIT done; XADD events
#: (with MAXLEN, so no XTRIM).
WRITE_COMMANDS = (
    "hset",
    "hdel",
    "hincrby",
    "zadd",
    "zrem",
    "zpopmin",
    "lpush",
    "rpush",
    "ltrim",
    "pexpire",
    "sadd",
    "setbit",
    "xadd",
)

#: Connection commands (AUTH/HELLO/SELECT/CLIENT SETNAME, PING), every read command on
#: the user's keys (a function reads what it likes; a failing read half-way through a
#: function would stop it after its first writes) and TIME (functions read the clock);
#: minus what lists or counts the keys of other jobs (SCAN, KEYS, RANDOMKEY, DBSIZE).
BASE_RULES = (
    "-@all",
    "+@connection",
    "+@read",
    "+time",
    "-@admin",
    "-@dangerous",
    "-scan",
    "-keys",
    "-randomkey",
    "-dbsize",
)

_USER_RE = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
_PREFIX_RE = re.compile(r"^[^\s()\"']{1,128}$")


@dataclass(frozen=True)
class Rule:
    """One ACL user: its name and its rules (the password rule first).

    ``rules`` are ``ACL SETUSER`` arguments: a selector ``( ... )`` is one argument.
    """

    user: str
    rules: tuple[str, ...]
    role: str
    job: str | None

    def setuser_args(self) -> list[str]:
        """The arguments of ``ACL SETUSER`` (``reset`` first: applying replaces the user)."""
        return [self.user, "reset", *self.rules]

    def setuser_line(self) -> str:
        """``ACL SETUSER ...`` quoted for a shell (``redis-cli ...``) or redis-cli's prompt."""
        return "ACL SETUSER " + " ".join(shlex.quote(a) for a in self.setuser_args())

    def aclfile_line(self) -> str:
        """The line of an ACL file (``aclfile``) for this user."""
        return " ".join(["user", self.user, *self.rules])

    def functions(self) -> list[str]:
        """The function names this rule allows (they change with the library)."""
        return [r.split("|", 1)[1] for r in self.rules if r.startswith(("+fcall|", "+fcall_ro|"))]


def password_rule(password: str | None, user: str) -> str:
    """The password rule of a user.

    Args:
        password: the password; None for a placeholder.
        user: the user name (for the placeholder).

    Returns:
        ``#<sha256 hex>`` (Redis stores only the hash, and the secret is never printed or
        sent), or ``>CHANGE_ME_<user>`` when ``password`` is None.

    Raises:
        InvalidInput: an empty password, or one holding whitespace.
    """
    if password is None:
        return f">CHANGE_ME_{user}"
    if not password or any(c.isspace() for c in password):
        raise errors.InvalidInput("the password is empty or holds whitespace")
    return "#" + hashlib.sha256(password.encode()).hexdigest()


def function_name(verb: str) -> str:
    """The current library's function for ``verb``.

    Args:
        verb: the operation (``ack``, ``stats`` ...).

    Returns:
        ``taskq_<version>_<verb>`` for the library this taskq loads.

    Raises:
        TaskqError: the library has no such function (the verbs were renamed).
    """
    if verb not in VERBS:
        raise errors.TaskqError(f"the taskq library {LIBRARY} has no {verb!r} function")
    return f"{LIBRARY}_{verb}"


def _fcalls(verbs: tuple[str, ...], ro_verbs: tuple[str, ...]) -> list[str]:
    return [f"+fcall|{function_name(v)}" for v in verbs] + [
        f"+fcall_ro|{function_name(v)}" for v in ro_verbs
    ]


def _selector(patterns: list[str], commands: tuple[str, ...]) -> str:
    keys = " ".join(f"~{p}" for p in patterns)
    return f"({keys} resetchannels -@all {' '.join('+' + c for c in commands)})"


def _check(role: str, job: str | None, user: str | None, key_prefix: str | None) -> tuple[str, str]:
    if job is not None and not valid_job_name(job):
        raise errors.InvalidInput(f"bad job name {job!r}: use 1-64 of A-Z a-z 0-9 . _ -")
    name = user or f"{role}-{job if job is not None else 'all'}"
    if not _USER_RE.match(name):
        raise errors.InvalidInput(f"bad user name {name!r}: use 1-128 of A-Z a-z 0-9 . _ : @ -")
    pfx = key_prefix or prefix()
    if not _PREFIX_RE.match(pfx):
        raise errors.InvalidInput(f"key prefix {pfx!r} holds whitespace, quotes or parentheses")
    return name, pfx


def trainer_rule(
    job: str, user: str | None = None, password: str | None = None, key_prefix: str | None = None
) -> Rule:
    """The user of one job's trainers.

    It may: read the job's keys, call the trainer's functions on them (register, lease,
    ack, fail, release, heartbeat, leave, progress; ``stats`` read-only), BLPOP its wake-up lists,
    and make its functions' writes on its keys (never on the chunks, the clock or the
    lock; DEL/UNLINK only on the per-pass keys). Nothing of another job, nothing outside
    the job's slot (not even the jobs index: a trainer never lists jobs).

    Args:
        job: the job.
        user: the user name (default ``trainer-<job>``).
        password: the password (stored as its SHA-256); None prints a placeholder.
        key_prefix: overrides ``TASKQ_PREFIX``.

    Returns:
        The rule.

    Raises:
        InvalidInput: a bad job name, user name, prefix or password.
    """
    name, pfx = _check("trainer", job, user, key_prefix)
    rules = [
        "on",
        password_rule(password, name),
        "resetkeys",
        *(f"~{p}" for p in acl_key_patterns(job, key_prefix=pfx)),
        "resetchannels",
        *BASE_RULES,
        *_fcalls(TRAINER_VERBS, TRAINER_RO_VERBS),
        _selector(acl_key_patterns(job, WRITTEN_KEYS, pfx), WRITE_COMMANDS),
        _selector(acl_key_patterns(job, SCRATCH_KEYS, pfx), ("del", "unlink", "blpop")),
    ]
    return Rule(name, tuple(rules), "trainer", job)


def reaper_rule(
    job: str | None = None,
    user: str | None = None,
    password: str | None = None,
    key_prefix: str | None = None,
) -> Rule:
    """The user of ``taskq reaper`` for one job (``--job``) or every job.

    Like the trainer's, with the ``reap`` and ``closed`` functions (``conns`` read-only)
    and ``CLIENT LIST`` (it looks up its workers' connection ids), ``SET`` on the per-job
    lock, no BLPOP; for every job, read access to the jobs index (the reaper lists the jobs).

    Args:
        job: the job; None for every job.
        user: the user name (default ``reaper-<job>`` / ``reaper-all``).
        password: the password (stored as its SHA-256); None prints a placeholder.
        key_prefix: overrides ``TASKQ_PREFIX``.

    Returns:
        The rule.

    Raises:
        InvalidInput: a bad job name, user name, prefix or password.
    """
    name, pfx = _check("reaper", job, user, key_prefix)
    index = [] if job is not None else [f"%R~{acl_jobs_index_pattern(pfx)}"]
    rules = [
        "on",
        password_rule(password, name),
        "resetkeys",
        *(f"~{p}" for p in acl_key_patterns(job, key_prefix=pfx)),
        *index,
        "resetchannels",
        *BASE_RULES,
        "+client|list",
        *_fcalls(REAPER_VERBS, REAPER_RO_VERBS),
        _selector(acl_key_patterns(job, WRITTEN_KEYS, pfx), WRITE_COMMANDS),
        _selector(acl_key_patterns(job, SCRATCH_KEYS, pfx), ("del", "unlink")),
        _selector(acl_key_patterns(job, ("lock",), pfx), ("set",)),
    ]
    return Rule(name, tuple(rules), "reaper", job)


def exporter_rule(
    job: str | None = None,
    user: str | None = None,
    password: str | None = None,
    key_prefix: str | None = None,
) -> Rule:
    """The user of ``taskq exporter`` (and read-only status) for one job or every job.

    Read-only key patterns (``%R~``): reads and ``FCALL_RO`` of ``stats`` and ``peek``.

    Args:
        job: the job; None for every job (with the jobs index and the sharded jobs').
        user: the user name (default ``exporter-<job>`` / ``exporter-all``).
        password: the password (stored as its SHA-256); None prints a placeholder.
        key_prefix: overrides ``TASKQ_PREFIX``.

    Returns:
        The rule.

    Raises:
        InvalidInput: a bad job name, user name, prefix or password.
    """
    name, pfx = _check("exporter", job, user, key_prefix)
    # every job: the jobs index, and the sharded jobs' (a sharded job is shown as one)
    index = (
        []
        if job is not None
        else [f"%R~{acl_jobs_index_pattern(pfx)}", f"%R~{acl_shard_sets_pattern(pfx)}"]
    )
    rules = [
        "on",
        password_rule(password, name),
        "resetkeys",
        *(f"%R~{p}" for p in acl_key_patterns(job, key_prefix=pfx)),
        *index,
        "resetchannels",
        *BASE_RULES,
        *_fcalls((), EXPORTER_RO_VERBS),
    ]
    return Rule(name, tuple(rules), "exporter", job)


def apply(redis_client: Any, rule: Rule) -> None:
    """Create or replace the user on the server (``ACL SETUSER <user> reset ...``).

    The connection's user needs ``ACL SETUSER`` (``@admin``): deploy/redis/acl.conf's
    ``admin`` does not have it. The change lives in memory until ``ACL SAVE`` (with an
    ``aclfile``) or ``CONFIG REWRITE``.

    Args:
        redis_client: a redis-py client, as a user allowed to manage users.
        rule: the rule; its password must not be the placeholder.

    Raises:
        InvalidInput: the rule has no password.
        redis.exceptions.RedisError: the server refused (callers translate it).
    """
    if any(r.startswith(">CHANGE_ME") for r in rule.rules):
        raise errors.InvalidInput(
            f"user {rule.user}: no password given (--password-env VAR or --password-file F)"
        )
    redis_client.execute_command("ACL", "SETUSER", *rule.setuser_args())
