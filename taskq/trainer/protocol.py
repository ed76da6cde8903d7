"""The trainer's wire protocol: each verb's ARGV built, and its reply decoded, in one place.

``Wire`` runs the verbs a trainer calls (register, ack, fail, release, progress, leave,
heartbeat) on one job and hands back typed replies; the ARGV order and the reply shapes of
the Lua headers (``taskq/engine/lua/<verb>.lua``) are known here alone. A reply is decoded once, where
it arrives; the rest of the trainer reads named fields. What a reply *does* to a
trainer's state (held leases, pass, generation) stays in the worker's parts (trainer/worker.py).

Every verb that ends, starts, grants or renews leases (and register, which sets it)
carries the worker incarnation's lease secret as its last argument (before the optional
connection id of register and heartbeat); Redis keeps only a digest of it (docs/design.md,
"Lease secrets"). It is never logged, nor put in an error.

Data flow: trainer/worker.py's parts / heartbeat.py -> protocol.py -> the engine's ``Connection``
(``run``, engine/connection.py) / engine/transport.py -> Redis.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

from taskq import errors
from taskq.data import order_key, task_size
from taskq.engine.connection import Connection, name_connection, trainer_conn_name, translate
from taskq.engine.contract import Code
from taskq.engine.transport import Scripts
from taskq.integrity import decode_chunks
from taskq.mix import MixSpec
from taskq.models import Task

#: codes a trainer reads from the reply instead of raising
PASSTHROUGH = (Code.REREGISTER, Code.JOB_COMPLETED, Code.JOB_CANCELLED)

_NO_CORRUPT: tuple[tuple[Task, errors.CorruptData], ...] = ()


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


def apply_end(task: Task, end: int, start: int) -> None:
    """A progress reply's news about ``task``: its piece's end (-1 none, -2 a tail piece
    whose split is still pending) and a tail piece's start (-1 none)."""
    if end == -2:
        return
    if task.split_pending and start >= 0:
        task.start = start
        task.split_pending = False
    if end >= 0:
        task.end = end


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


class Wire:
    """The verbs a trainer sends for one job, over one ``Client``.

    Args:
        client: the engine's connection to call through (its ``run`` raises negative
            codes except ``PASSTHROUGH``, which come back in the reply).
        job: the job name.
    """

    def __init__(self, client: Connection, job: str) -> None:
        self.client = client
        self.job = job
        self.keys = client.keys(job)
        # the last (raw info, JobInfo) a step decoded, one tuple so threads swap it whole:
        # the job's info changes a few times a pass, and a reply equal to the last one
        # reuses its JobInfo
        self._info: tuple[Any, JobInfo | None] = (None, None)
        #: a mixed job's sources, learned at register (``task.source``)
        self.mix: MixSpec | None = None
        #: the job's seed when its samples are shuffled (register says), else None: the
        #: tasks built here carry their order (``Task.order``)
        self.seed: int | None = None

    def run(self, verb: str, args: list[Any]) -> Any:
        """One verb's raw reply.

        Raises:
            JobNotFound: the job was deleted or replaced.
            ConnectionLost: Redis could not be reached.
        """
        return self.client.run(self.job, verb, args, passthrough=PASSTHROUGH)

    def register(
        self,
        job_incarnation: str,
        worker_id: str,
        incarnation: str,
        secret: str,
        ttl_ms: int,
        host: str,
        pid: int,
        reads: str = "w",
    ) -> Registered:
        """Join the job as ``worker_id`` under a new ``incarnation`` whose lease secret is
        ``secret`` (at least 16 characters; every later write of the incarnation sends it).
        ``reads``: what its loop honours of a lease (``w`` whole tasks, ``r`` the range
        it is handed, ``s`` that range and an end that moves; lib/workers.lua). The job's
        sample order comes back: the tasks this wire builds carry it (``Task.order``).

        Returns:
            The job's incarnation, the worker's ttl and heartbeat interval, the job's info.

        Raises:
            JobNotFound: no such job (or not that incarnation).
            ConnectionLost: Redis could not be reached.
        """
        with translate(self.client.url):
            cid = name_connection(self.client.redis, incarnation)  # until the 1st heartbeat
        reply = self.run(
            "register",
            [job_incarnation, worker_id, incarnation, ttl_ms, host, pid, secret, cid, reads],
        )
        mix = MixSpec.from_json(reply[7]) if len(reply) > 7 and reply[7] else None
        # (a task's source is named from its id: the sources' ranges of this incarnation)
        self.mix = mix
        reg = Registered(
            str(reply[1]),
            int(reply[2]) / 1000.0,
            int(reply[3]) / 1000.0,
            decode_info(reply[4]),
            str(reply[5]) if len(reply) > 5 else "",
            int(reply[6]) if len(reply) > 6 else 0,
            mix,
        )
        self.seed = reg.seed if reg.sample_order == "shuffled" else None
        return reg

    def step(
        self,
        job_incarnation: str,
        worker_id: str,
        incarnation: str,
        secret: str,
        call_no: int,
        acks: Sequence[Task],
        starts: Sequence[Task],
        want: int,
        mode: str,
        expect_pass: int,
    ) -> Step:
        """Ack ``acks``, start ``starts`` and lease up to ``want`` more, in one call.

        Args:
            mode: ``S`` (lease started), ``R`` (reserve), ``F`` (first started, rest
                reserved).
            expect_pass: lease only from this pass (-1: any).

        Returns:
            The decoded reply; its tasks carry the pass the reply names.

        Raises:
            JobNotFound: the job was deleted or replaced.
            ConnectionLost: Redis could not be reached.
        """
        args: list[Any] = [job_incarnation, worker_id, incarnation, call_no, len(acks)]
        for t in acks:
            args += [t.id, t.token]
        args.append(len(starts))
        for t in starts:
            args += [t.id, t.token]
        args += [want, mode, expect_pass, secret]
        return self.decode_step(self.client.run(self.job, "ack", args, passthrough=PASSTHROUGH))

    def decode_step(self, reply: Sequence[Any]) -> Step:
        """Decode an ``ack`` reply, building its tasks (apart: those with unreadable
        chunks, each with its error naming the job, the task and the key)."""
        code = int(reply[0])
        if len(reply) < 6:
            return Step(code, [], 0.0, None, [], [], _NO_CORRUPT)
        raw_info = reply[3]
        last_raw, info = self._info
        if info is None or raw_info != last_raw:
            info = decode_info(raw_info)
            self._info = (raw_info, info)
        pass_no, job, chunks_key = info.pass_no, self.job, self.keys.chunks
        seed = self.seed
        granted: list[Task] = []
        corrupt: Any = _NO_CORRUPT
        # one row per task: {id, token, attempt, chunks_json, started, start[, end]};
        # start is where reading begins (the task's recorded progress, docs/resume.md),
        # end where it stops for a piece of a split task (-1: the task's end). Positional
        # arguments and no per-row unpacking: this loop is most of a reply's decoding.
        for row in reply[1]:
            n = len(row)  # (once: a builtin call per row and check is per task)
            task = Task(
                int(row[0]),
                pass_no,
                [],
                int(row[1]),
                int(row[2]),
                job,
                row[4] == 1 or row[4] == "1",
                int(row[5]) if n > 5 else 0,
            )
            if n > 6:  # a piece of a split task: its end, and whether it is pending
                end = int(row[6])
                task.end = end if end >= 0 else None
                task.split_pending = n > 7 and int(row[7]) == 1
            if self.mix is not None:
                task.source = self.mix.source_of(task.id)
            if seed is not None:  # a job whose samples are shuffled: the task's order
                task.order = order_key(job, seed, pass_no, task.id)
            try:
                task.chunks = decode_chunks(row[3], chunks_key, row[0])
                granted.append(task)
            except errors.CorruptData as e:
                corrupt = [*corrupt, (task, e)]
        # the per-write results are the script's integer codes, as the parser made them
        return Step(code, granted, int(reply[2]) / 1000.0, info, reply[4], reply[5], corrupt)

    def write(
        self,
        verb: str,
        job_incarnation: str,
        worker_id: str,
        incarnation: str,
        secret: str,
        tasks: Sequence[Task],
        extra: Sequence[Any] = (),
    ) -> list[int]:
        """End leases: ``fail`` (``extra`` = [error text]) or ``release``.

        Returns:
            One result code per task (``Code.STALE``: not this worker's lease any more).

        Raises:
            JobNotFound: the job was deleted or replaced.
            ConnectionLost: Redis could not be reached.
        """
        args: list[Any] = [job_incarnation, worker_id, incarnation, *extra, len(tasks)]
        for t in tasks:
            args += [t.id, t.token]
        args.append(secret)
        reply = self.run(verb, args)
        return [int(x) for x in reply[1]] if len(reply) > 1 else []

    def progress(
        self,
        job_incarnation: str,
        worker_id: str,
        incarnation: str,
        secret: str,
        items: Sequence[tuple[Task, int, int | None]],
        sizes: bool = True,
    ) -> list[int]:
        """Record how far into each task its holder got: ``(task, samples, known_end)``
        triples (the end the holder honoured when it took them), each with the task's size
        when its chunks say it (what tail splitting needs). A task the server split gets
        its piece's end in ``task.end`` from the reply.

        Returns:
            One result code per pair (``Code.STALE``: not this worker's lease any more;
            nothing recorded).

        Raises:
            JobNotFound: the job was deleted or replaced.
            ConnectionLost: Redis could not be reached.
        """
        args: list[Any] = [job_incarnation, worker_id, incarnation, len(items)]
        for task, n, known in items:
            # (a loop reading to the chunks' end whatever task.end says is never split)
            size = task_size(task.chunks) if sizes and task.follows_end else None
            if size is None:
                args += [task.id, task.token, n]
            elif known is None:
                args += [task.id, task.token, f"{n}:{size}"]
            else:  # the end this holder honoured: it confirms a split (lib/split.lua)
                args += [task.id, task.token, f"{n}:{size}:{known}"]
        args.append(secret)
        reply = self.run("progress", args)
        if len(reply) > 3:
            for (task, _, _), e, s in zip(items, reply[2], reply[3], strict=False):
                apply_end(task, int(e), int(s))
        return [int(x) for x in reply[1]] if len(reply) > 1 else []

    def leave(self, job_incarnation: str, worker_id: str, incarnation: str, secret: str) -> int:
        """Deregister, releasing everything held.

        Returns:
            How many leases were released.

        Raises:
            JobNotFound: the job was deleted or replaced.
            ConnectionLost: Redis could not be reached.
        """
        reply = self.run("leave", [job_incarnation, worker_id, incarnation, secret])
        return int(reply[1]) if len(reply) > 1 else 0

    def heartbeat(self, scripts: Scripts, args: list[Any]) -> HeartbeatReply:
        """One heartbeat on ``scripts`` (the heartbeat's own connection or the client's).

        Raises:
            ConnectionLost: Redis could not be reached.
        """
        return HeartbeatReply.decode(
            call_heartbeat(scripts, self.client.url, self.keys.script, args)
        )

    def wait(self, gen: int, timeout: float) -> None:
        """Block up to ``timeout`` seconds for a wake token or the next broadcast after
        generation ``gen`` (it goes to the list of the next generation's parity).

        Raises:
            ConnectionLost: Redis could not be reached.
        """
        bcast = self.keys.bcast0 if (gen + 1) % 2 == 0 else self.keys.bcast1
        with translate(self.client.url):
            self.client.redis.blpop([self.keys.wake, bcast], timeout=max(timeout, 0.01))
