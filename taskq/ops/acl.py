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
trainer credential is trusted. A producer's is not: ``append`` writes no meta field and
adds descriptors and ids with ``HSETNX`` only, so its rule allows no write to the meta,
no overwrite and no ``DEL`` (``PRODUCER_WRITES``).

Data flow: cli/acl.py -> acl.py -> keys.py (patterns), engine/library.py (function names) ->
``ACL SETUSER`` on Redis (``--apply``, as a user allowed to manage users).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from redis.cluster import RedisCluster

from taskq import errors
from taskq.engine.library import LIBRARY, VERBS
from taskq.keys import (
    JOB_KEYS,
    acl_jobs_index_pattern,
    acl_key_patterns,
    acl_shard_sets_pattern,
    barrier_key,
    prefix,
    shard_set_key,
    valid_job_name,
)

#: A mixed job's writes in a lease (lib/mix.lua, docs/mixing.md): its slots charged into
#: the pass's stored sequence (SETRANGE), and when a pass starts, the sequence of one no
#: longer kept dropped (UNLINK) and the weight log below the kept passes trimmed. Only a
#: trainer's lease charges; the reaper's functions reach the same part of the library (a
#: pass they end), so its rule carries it too. The producer's does not: an append ends no
#: pass and refuses a mixed job. Dead copies (lib/mixdead.lua): a new pass of a mixed job
#: drops the dead slots of the pass before with their counts (UNLINK dead, deadbits,
#: counts: its slots hold other copies now), and a weight change's cut makes the slots it
#: charges again live (SREM dead) until the charge marks them. A stream source's feed log
#: and the slots that repaid a debt (ZADD by the charge) lose the entries of what is
#: charged again, and the repaid slots those below the kept passes (ZREMRANGEBYSCORE). A
#: slot granted past the cursor is recorded (ZADD ``mixahead``); those the cursor passed,
#: and all when the state goes to another pass, go (ZREMRANGEBYSCORE).
MIX_WRITES = (
    (("mixseq",), ("setrange", "unlink")),  # (keys.KEY_FAMILIES: its blocks, lib/mixseq.lua)
    (("mixlog", "mixfeed", "mixrepaid", "mixahead"), ("zremrangebyscore",)),
    (("dead",), ("srem",)),
    (("dead", "deadbits", "counts"), ("unlink",)),  # (one UNLINK: one selector)
)

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
#: HSET/HDEL/HINCRBY meta, leases, winfo, counts, passes, hist; HSETNX a task's size in
#: leases (progress, for tail splitting); ZADD/ZREM/ZPOPMIN the
#: sorted sets (front, owned, deadlines, reserved, started, workers, waiting);
#: LPUSH/RPUSH/LTRIM/PEXPIRE the wake-up lists; SADD dead; SETBIT done; XADD events
#: (with MAXLEN, so no XTRIM).
WRITE_COMMANDS = (
    "hset",
    "hsetnx",
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
#: minus what lists or counts the keys of other jobs (SCAN, KEYS, RANDOMKEY, DBSIZE) and
#: client-side caching: ``CLIENT TRACKING ... BCAST PREFIX taskq:`` would push the names
#: of other jobs' changed keys, ``REDIRECT`` would send pushes to another client's
#: connection, and ``CLIENT CACHING`` only serves tracking. The rest of ``@connection``
#: is about the caller's own connection (CLIENT ID/INFO/GETNAME/SETINFO/REPLY/
#: TRACKINGINFO/GETREDIR/NO-TOUCH, ECHO, RESET, WAIT, COMMAND's docs); the ones that
#: reach other clients (CLIENT LIST/KILL/PAUSE/UNBLOCK/NO-EVICT) are ``@admin``.
BASE_RULES = (
    "-@all",
    "+@connection",
    "+@read",
    "+time",
    "-@admin",
    "-@dangerous",
    "-client|tracking",
    "-client|caching",
    "-scan",
    "-keys",
    "-randomkey",
    "-dbsize",
)


#: What a Redis Cluster client needs to connect and follow the slot map (redis-py reads
#: ``CLUSTER SLOTS`` / ``CLUSTER SHARDS`` when it is made and after a MOVED, and
#: ``COMMAND`` for the key positions): topology, no data. Harmless on a single Redis.
CLUSTER_RULES = (
    "+cluster|slots",
    "+cluster|shards",
    "+cluster|nodes",
    "+cluster|info",
    "+cluster|myid",
    "+cluster|keyslot",
    "+readonly",
    "+command",
)

#: What a sharded job's trainer does beyond a plain job's (trainer/sharded.py): the barrier
#: step (``advance`` on each shard, through ``next_pass`` with the pass expected), the
#: bounded reap of a shard whose trainers vanished, a home from the record's counter and
#: the barrier lock (``keys.barrier_key``: SET NX PX, PEXPIRE, DEL by its holder).
SHARDED_TRAINER_VERBS = ("advance", "reap")
SHARDED_RECORD_WRITES = ("hincrby",)
BARRIER_WRITES = ("set", "pexpire", "del")

#: The writes of ``append`` and of a follower's record, each on the keys it needs, so that
#: the producer appends and does nothing else (docs/security.md): the new tasks'
#: descriptors and ids added with HSETNX only (a field that exists is never overwritten),
#: the counts in ``appended`` (append writes no meta field: not the state, not a counter),
#: the appends' log, the event, the wake-up tokens of waiting trainers, the source and
#: follower records. No DEL, no write to meta, leases, done, dead, progress, the
#: checkpoints or the broadcast lists.
PRODUCER_WRITES: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("chunks", "appids", "appidx"), ("hsetnx",)),
    (("appended",), ("hincrby",)),
    (("appends",), ("zadd",)),
    (("events",), ("xadd",)),
    (("wake",), ("lpush", "ltrim")),
    (("follow",), ("hset", "hdel")),
    # an append naming its source records how far it went in, the oldest source forgotten
    (("sources",), ("hset", "hdel")),
    (("srcseq",), ("zadd", "zpopmin")),
    # a mixed job's feed (--feed): its source's store moves with the tasks it adds
    (("mixstore",), ("zadd",)),
)


@dataclass(frozen=True)
class Role:
    """What one kind of user may do: the one place a role's rule is described.

    ``rule()`` turns a role into the rule of one job (or every job); ``taskq acl
    <role>`` is generated from ``ROLES``.
    """

    name: str
    #: One line for ``taskq acl --help`` and the command's help.
    summary: str
    #: Functions called with ``FCALL`` and with ``FCALL_RO``.
    verbs: tuple[str, ...]
    ro_verbs: tuple[str, ...]
    #: Whether the rule is always for one job (a trainer never lists jobs).
    needs_job: bool
    #: Key patterns read-only (``%R~``) rather than read and write (``~``).
    read_only: bool = False
    #: Commands beyond ``BASE_RULES`` on the user's keys (``+client|list``).
    extra: tuple[str, ...] = ()
    #: Selectors ``(keys, commands)``: the writes its functions make, on which keys.
    writes: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()


ROLES: dict[str, Role] = {
    r.name: r
    for r in (
        Role(
            "trainer",
            "The user of JOB's trainers: JOB's keys only, the trainer's functions only.",
            ("register", "lease", "ack", "fail", "release", "heartbeat", "leave", "progress"),
            ("stats",),  # Trainer.passes() reads the current pass
            needs_job=True,
            writes=(
                (WRITTEN_KEYS, WRITE_COMMANDS),
                (SCRATCH_KEYS, ("del", "unlink", "blpop")),
                *MIX_WRITES,
            ),
        ),
        Role(
            "producer",
            "The user of JOB's producers (`taskq job append / follow`): JOB's keys only, "
            "append only.",
            ("append",),
            ("stats",),  # the handle reads the job's status (the follower, the CLI)
            needs_job=True,
            writes=PRODUCER_WRITES,
        ),
        Role(
            "reaper",
            "The user of `taskq reaper` for JOB (with --job JOB), or every job without JOB.",
            ("reap", "closed", "trim"),
            ("conns",),  # with CLIENT LIST ID: closed connections (connwatch.py)
            needs_job=False,
            # It looks up its workers' connection ids; CLIENT LIST shows every client's
            # address and name, so no other role has it.
            extra=("+client|list",),
            writes=(
                (WRITTEN_KEYS, WRITE_COMMANDS),
                (SCRATCH_KEYS, ("del", "unlink")),
                (("lock",), ("set",)),
                # a stream's trim: its done tasks' descriptors, the appends' log below them
                # (a mixed job fed by a stream: its copies, the feed and weight logs below
                # what a charge reads, lib/mixtrim.lua: ZREM and MIX_WRITES)
                (("chunks",), ("hdel",)),
                (("appends",), ("zremrangebyscore",)),
                *MIX_WRITES,
            ),
        ),
        Role(
            "exporter",
            "A read-only user (`taskq exporter`, status) for JOB, or every job without JOB.",
            (),
            ("stats", "peek"),  # peek: `taskq tasks` with an exporter's URL
            needs_job=False,
            read_only=True,
        ),
    )
}
TRAINER_VERBS, TRAINER_RO_VERBS = ROLES["trainer"].verbs, ROLES["trainer"].ro_verbs
REAPER_VERBS, REAPER_RO_VERBS = ROLES["reaper"].verbs, ROLES["reaper"].ro_verbs
EXPORTER_RO_VERBS = ROLES["exporter"].ro_verbs

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


def _glob_escape_key(key: str) -> str:
    """One key as an ACL pattern matching only itself."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in key)


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


def rule(
    role: str,
    job: str | None = None,
    user: str | None = None,
    password: str | None = None,
    key_prefix: str | None = None,
    shards: Sequence[str] | None = None,
) -> Rule:
    """The user of ``role`` (a name in ``ROLES``) for one job, or for every job.

    The rule: the password, the job's key patterns (``~``, or ``%R~`` for a read-only
    role) and, for every job, the jobs index read-only (such a user lists the jobs);
    ``BASE_RULES``; the role's extra commands; its functions by name; one selector per
    write it makes (``Role.writes``), so a write is allowed only on the keys that need it.

    Args:
        role: ``trainer``, ``producer``, ``reaper`` or ``exporter``.
        job: the job; None for every job (not for a trainer).
        user: the user name (default ``<role>-<job>`` / ``<role>-all``).
        password: the password (stored as its SHA-256); None prints a placeholder.
        key_prefix: overrides ``TASKQ_PREFIX``.
        shards: when ``job`` is a sharded job, its shards' names (``Client.job(job)``
            tells): the rule covers every shard's keys and the record's
            (``taskq:{JOB}:*``), and a trainer may also run the barrier step and the
            reap of a shard (``SHARDED_TRAINER_VERBS``), take a home from the record and
            hold the barrier lock.

    Returns:
        The rule (it also allows what a Redis Cluster client needs to connect:
        ``CLUSTER_RULES``).

    Raises:
        InvalidInput: an unknown role, a missing job for a trainer, a bad job name, user
            name, prefix or password.
    """
    spec = ROLES.get(role)
    if spec is None:
        raise errors.InvalidInput(f"unknown role {role!r}: use one of {', '.join(ROLES)}")
    if spec.needs_job and job is None:
        raise errors.InvalidInput(f"a {role} rule is for one job: name the job")
    name, pfx = _check(role, job, user, key_prefix)
    for shard in shards or ():
        _check(role, shard, user, key_prefix)
    access = "%R~" if spec.read_only else "~"
    # a sharded job: every shard's keys, and the record's tag (the record, the lock)
    tags: list[str | None] = [*shards, job] if shards else [job]

    def patterns(names: tuple[str, ...] | None = None) -> list[str]:
        return [p for tag in tags for p in acl_key_patterns(tag, names, pfx)]

    verbs = spec.verbs
    writes = [(patterns(keys), cmds) for keys, cmds in spec.writes]
    if shards and role == "trainer":
        verbs = (*verbs, *SHARDED_TRAINER_VERBS)
        record = [_glob_escape_key(shard_set_key(job or "", pfx))]
        writes += [
            (patterns(("lock",)), ("set",)),  # the reap's per-shard lock
            (record, SHARDED_RECORD_WRITES),
            ([_glob_escape_key(barrier_key(job or "", pfx))], BARRIER_WRITES),
        ]
    rules = [
        "on",
        password_rule(password, name),
        "resetkeys",
        *(f"{access}{p}" for p in patterns()),
        # every job: the jobs index and the sharded jobs' (a sharded job is shown as one)
        *(
            []
            if job is not None
            else [f"%R~{acl_jobs_index_pattern(pfx)}", f"%R~{acl_shard_sets_pattern(pfx)}"]
        ),
        "resetchannels",
        *BASE_RULES,
        *CLUSTER_RULES,
        *spec.extra,
        *_fcalls(verbs, spec.ro_verbs),
        *(_selector(keys, cmds) for keys, cmds in writes),
    ]
    return Rule(name, tuple(rules), role, job)


#: ``rule`` of one role, for callers that build one kind of user.
trainer_rule = partial(rule, "trainer")
producer_rule = partial(rule, "producer")
reaper_rule = partial(rule, "reaper")
exporter_rule = partial(rule, "exporter")


def apply(redis_client: Any, rule: Rule) -> None:
    """Create or replace the user on the server (``ACL SETUSER <user> reset ...``); on a
    Redis Cluster on every node (ACLs are per node: a client connects to each master).

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
    if isinstance(redis_client, RedisCluster):
        redis_client.execute_command(
            "ACL", "SETUSER", *rule.setuser_args(), target_nodes=RedisCluster.ALL_NODES
        )
        return
    redis_client.execute_command("ACL", "SETUSER", *rule.setuser_args())
