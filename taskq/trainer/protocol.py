"""The trainer's replies, typed, and the heartbeat's call (shared with its helper process).

Each trainer verb builds its ARGV, sends it and applies its reply in one method of the
part that owns what the reply changes: register and leave in session.py, the ack/start/
lease step and fail / release in iteration.py's ``Calls``, progress in progress.py, the
heartbeat in heartbeat.py (the Lua headers, ``taskq/engine/lua/<verb>.lua``, give each
ARGV order and reply shape). This module holds what more than one of them shares: the
typed replies (``JobInfo``, ``Registered``, ``Step``, ``HeartbeatReply``), the
heartbeat's ARGV and its raw call (the helper process sends it too), and the codes a
trainer reads from a reply instead of raising.

Every verb that ends, starts, grants or renews leases (and register, which sets it)
carries the worker incarnation's lease secret as its last argument (before the optional
connection id of register and heartbeat); Redis keeps only a digest of it (docs/design.md,
"Lease secrets"). It is never logged, nor put in an error.

Data flow: the worker's parts (trainer/session.py, iteration.py, progress.py, heartbeat.py)
-> protocol.py (types; the heartbeat's call) -> engine/transport.py -> Redis.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

from taskq import errors
from taskq.engine.connection import name_connection, trainer_conn_name, translate
from taskq.engine.contract import Code
from taskq.engine.transport import Scripts
from taskq.mix import MixSpec
from taskq.models import Task

#: codes a trainer reads from the reply instead of raising
PASSTHROUGH = (Code.REREGISTER, Code.JOB_COMPLETED, Code.JOB_CANCELLED)


class JobInfo(NamedTuple):
    """The job as a reply saw it: ``{pass, gen, state, reason}``."""

    pass_no: int
    gen: int
    state: str
    reason: str


def decode_info(raw: Sequence[Any]) -> JobInfo:
    """The ``{pass, gen, state, reason}`` element of a reply."""
    return JobInfo(int(raw[0]), int(raw[1]), str(raw[2]), str(raw[3]) if len(raw) > 3 else "")


class Registered(NamedTuple):
    """``register``: ``{code, job_inc, worker_ttl_ms, heartbeat_ms, info, sample order,
    seed, mix}``."""

    job_incarnation: str
    ttl_s: float
    heartbeat_interval_s: float
    info: JobInfo
    #: the job's sample order: "" the chunks', "shuffled" (``taskq.data.sample_order``)
    sample_order: str = ""
    seed: int = 0
    #: a mixed job's sources (docs/mixing.md), None for any other job
    mix: MixSpec | None = None

    @classmethod
    def decode(cls, reply: Sequence[Any]) -> Registered:
        """Decode a raw ``register`` reply."""
        return cls(
            str(reply[1]),
            int(reply[2]) / 1000.0,
            int(reply[3]) / 1000.0,
            decode_info(reply[4]),
            str(reply[5]) if len(reply) > 5 else "",
            int(reply[6]) if len(reply) > 6 else 0,
            MixSpec.from_json(reply[7]) if len(reply) > 7 and reply[7] else None,
        )


class Step(NamedTuple):
    """``ack`` (ack, start, lease in one call): ``{code, rows, wait_ms, info, acks, starts}``.

    A reply that carries only its code (an error the caller reads) has no tasks, no
    info and no per-write results.
    """

    code: int
    granted: list[Task]  # usable tasks (corrupt ones are apart, in ``corrupt``)
    wait_s: float
    info: JobInfo | None
    ack_res: list[int]  # one result code per ack sent
    start_res: list[int]  # one result code per start sent
    corrupt: Sequence[tuple[Task, errors.CorruptData]]  # granted, chunks unreadable

    @property
    def gen(self) -> int:
        """The broadcast generation the reply saw (-1: none)."""
        return self.info.gen if self.info is not None else -1


class HeartbeatReply(NamedTuple):
    """``heartbeat``: ``{code, revoked task ids, info}``."""

    code: int
    revoked: list[int]
    info: JobInfo | None

    @classmethod
    def decode(cls, reply: Sequence[Any]) -> HeartbeatReply:
        """Decode a raw heartbeat reply (from this process or the helper's JSON line)."""
        return cls(
            int(reply[0]),
            [int(x) for x in reply[1]] if len(reply) > 1 else [],
            decode_info(reply[2]) if len(reply) > 2 else None,
        )


def heartbeat_args(
    job_incarnation: str,
    worker_id: str,
    incarnation: str,
    secret: str,
    last_reply_no: int,
    pairs: Sequence[tuple[int, int]],
) -> list[Any]:
    """The heartbeat's ARGV: ``job_inc, worker, winc, last_reply_call_no, n, (task,
    token) x n, secret`` (``call_heartbeat`` adds the connection's id)."""
    args: list[Any] = [job_incarnation, worker_id, incarnation, last_reply_no, len(pairs)]
    for tid, tok in pairs:
        args += [tid, tok]
    args.append(secret)
    return args


def heartbeat_pairs(args: Sequence[Any]) -> list[tuple[int, int]]:
    """The (task, token) pairs a heartbeat's ARGV lists (``heartbeat_args`` read back)."""
    return [(int(args[5 + 2 * k]), int(args[6 + 2 * k])) for k in range(int(args[4]))]


def heartbeat_incarnation(args: Sequence[Any]) -> str:
    """The worker incarnation a heartbeat's ARGV was sent under."""
    return str(args[2])


#: Seconds a heartbeat connection's id is taken as known: after that, after any failed
#: heartbeat, and after any reconnect of the connection (``Scripts.own_resets``: a
#: CLIENT KILL, Redis's ``timeout``, a proxy closing it; the call that found it closed
#: went out on a pooled connection) the next heartbeat names its connection and asks its
#: id again, so the record names the connection the heartbeats go out on (connwatch.py).
CONN_RECHECK_S = 10.0
_CONN_IDS: weakref.WeakKeyDictionary[Scripts, tuple[str, str, float, int]] = (
    weakref.WeakKeyDictionary()
)  # scripts -> (incarnation, connection id, checked at, own_resets then)


def _conn_id(scripts: Scripts, incarnation: str) -> str:
    known = _CONN_IDS.get(scripts)
    now = time.monotonic()
    resets = scripts.own_resets
    if (
        known is not None
        and known[0] == incarnation
        and known[3] == resets
        and now - known[2] < CONN_RECHECK_S
    ):
        return known[1]
    cid = scripts.name_own_connection(trainer_conn_name(incarnation))
    if cid is None:
        cid = name_connection(scripts.redis, incarnation)
    _CONN_IDS[scripts] = (incarnation, cid, now, scripts.own_resets)
    return cid


def call_heartbeat(
    scripts: Scripts, masked_url: str, keys: list[str], args: list[Any]
) -> list[Any]:
    """One raw heartbeat call (the helper process sends the raw reply on, as JSON).

    Args:
        scripts: the connection to call on (the heartbeat's own, or the client's).
        masked_url: the URL named in errors.
        keys: the job's keys.
        args: ``heartbeat_args(...)``.

    Returns:
        The raw reply (``HeartbeatReply.decode`` reads it).

    Raises:
        ConnectionLost: Redis could not be reached.
    """
    try:
        with translate(masked_url):
            # the connection, named, and its id: the reaper sees it close when the trainer
            # dies (connwatch.py); the record keeps the id this heartbeat goes out on
            cid = _conn_id(scripts, heartbeat_incarnation(args))
            reply: list[Any] = scripts.call("heartbeat", keys, [*args, cid] if cid else args)
    except errors.ConnectionLost:
        _CONN_IDS.pop(scripts, None)  # the next heartbeat may go out on a new connection
        raise
    return reply
