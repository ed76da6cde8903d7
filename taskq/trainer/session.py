"""A trainer's session with the server, and what it last heard of its job.

``Session`` owns the worker's registration: the job and worker incarnations, the lease
secret (one tuple with its incarnation, swapped whole, so a call never sends one
incarnation with another's secret), the ttl and heartbeat interval the server gave,
the last contact, the retry loop every call runs in (backoff with jitter, bounded by
``reconnect_timeout``), rejoining once after being declared lost (under the session's
lock), and the leave.
``JobView`` owns the job's pass, generation, state and this worker's drain flag, under
its own lock. Both are parts of ``Worker`` (trainer/worker.py); neither knows the others.

Data flow: trainer/worker.py / trainer/iteration.py / trainer/heartbeat.py -> trainer/session.py ->
engine/connection.py (register, leave) -> Redis.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from taskq import errors
from taskq.engine.connection import Connection, name_connection, translate
from taskq.keys import JobKeys
from taskq.mix import MixSpec
from taskq.trainer.protocol import PASSTHROUGH, JobInfo, Registered

log = logging.getLogger("taskq.trainer")


def default_worker_id() -> str:
    """``host:pid:random``, unique per process."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class JobView:
    """The job as this trainer last heard it: pass, generation, state, drain.

    Answers arrive out of order: the heartbeat thread (or the helper's reader) may apply
    one computed before a lease reply another thread applied since. Pass and generation
    only move forward; a state is taken only from an answer of the newest generation
    seen (every state change bumps the generation). Read the attributes freely; they
    change only through the methods.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.gen = 0
        self.pass_no = 0
        self.state = "running"
        #: why the job waits (``state == "waiting"``): manual_advance, all_dead, ...
        self.reason = ""
        self.draining = False
        self._skipped_gen = -1

    def note(self, info: JobInfo | Sequence[Any]) -> None:
        """Apply a reply's (pass, gen, state, reason)."""
        pass_no, gen, state = info[0], info[1], info[2]  # typed already (decode_info)
        reason = info[3] if len(info) > 3 else ""
        if (
            gen == self.gen
            and state == self.state
            and reason == self.reason
            and pass_no <= self.pass_no
        ):
            return  # what is noted already (most replies): applying it would change nothing
        with self._lock:
            if gen >= self.gen:
                self.state, self.reason = state, reason
            self.gen = max(self.gen, gen)
            self.pass_no = max(self.pass_no, pass_no)

    def end(self, state: str) -> None:
        """The job ended (``"completed"`` or ``"cancelled"``), as a reply's code said."""
        with self._lock:
            self.state = state

    def drain(self) -> None:
        """An operator asked this worker to leave."""
        self.draining = True

    def wait_gen(self, gen: int) -> int | None:
        """The generation to wait for a broadcast of, given the one a lease reply saw
        (< 0: none); None when a newer one was seen since (a heartbeat answer): that
        broadcast already happened, lease again, once per generation (a failover that
        lost writes can leave the server's generation behind for a while)."""
        with self._lock:
            seen = self.gen
            gen = seen if gen < 0 else gen
            if seen > gen and seen != self._skipped_gen:
                self._skipped_gen = seen
                return None
        return gen


T = TypeVar("T")


def retrying(timeout_s: float, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, retrying ``ConnectionLost`` (``RedisOutOfMemory`` too: Redis away,
    a master paused or failing over) with backoff and jitter for up to ``timeout_s``
    seconds, as every call of a trainer does (``Session.retrying``, which also stops once
    the trainer is closed)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        try:
            return fn(*args)
        except errors.ConnectionLost as e:
            if time.monotonic() > deadline:
                raise
            log.warning("%s; retrying in %.2fs", e, delay)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 2.0)


class Session:
    """One worker's registration with the server (see the module docstring)."""

    def __init__(
        self,
        connection: Connection,
        job: str,
        worker_id: str | None,
        worker_ttl: float | None,
        reconnect_timeout: float,
    ) -> None:
        worker_id = worker_id or default_worker_id()
        if "|" in worker_id or not worker_id:
            raise errors.InvalidInput(f"bad worker id {worker_id!r}: '|' not allowed")
        if worker_ttl is not None and worker_ttl <= 0:
            raise errors.InvalidInput(f"worker_ttl must be positive, got {worker_ttl}")
        if reconnect_timeout < 0:
            raise errors.InvalidInput(f"reconnect_timeout must be >= 0, got {reconnect_timeout}")
        self.connection = connection
        self.job = job
        self.keys: JobKeys = connection.keys(job)
        self.worker_id = worker_id
        self._own_ttl_ms = int(worker_ttl * 1000) if worker_ttl else 0
        self.reconnect_timeout = reconnect_timeout
        # the session's lock: one rejoin at a time (readers of creds take none)
        self._rejoin_lock = threading.Lock()
        self.job_incarnation = ""
        # (incarnation, lease secret): one tuple, swapped whole. The secret is sent with
        # every write and kept in this process alone (Redis keeps a digest); never
        # logged, never given to a child process
        self.creds: tuple[str, str] = ("", "")
        #: what the loop honours of a lease, sent at every register: "w" whole tasks, "r"
        #: the range it is handed, "s" that range and an end that moves (lib/workers.lua)
        self.reads = "w"
        self.ttl_s = 0.0
        self.heartbeat_interval = 0.0
        self.last_contact = time.monotonic()
        #: the error that ended the job for this trainer (the job is gone), or None
        self.ended: type[errors.TaskqError] | None = None
        #: set by ``close()``: calls stop retrying, rejoining stops, the heartbeat ends
        self.stop = threading.Event()
        #: the job's seed when its samples are shuffled (register says), else None: the
        #: tasks granted carry their order (``Task.order``)
        self.seed: int | None = None
        #: a mixed job's sources (register says), else None: a granted task's id names
        #: its source (``Task.source``)
        self.mix: MixSpec | None = None

    @property
    def incarnation(self) -> str:
        return self.creds[0]

    @property
    def secret(self) -> str:
        return self.creds[1]

    @property
    def closed(self) -> bool:
        return self.stop.is_set()

    def register(self) -> Registered:
        """Register a new incarnation with a new secret (at least 16 characters; every
        later write of the incarnation sends it), declaring what the loop honours of a
        lease (``reads``); returns the server's answer (its job info is for the caller to
        apply). The job's sample order comes back: granted tasks carry it.

        The new credentials are published (``creds``) only once the server answered: a
        call another thread builds meanwhile (a heartbeat, a lease) goes out under the
        old incarnation, and the ``REREGISTER`` it gets is this rejoin's (``rejoin``
        skips it). One naming the new incarnation before the server knew it would be
        told to re-register too, and the trainer declared lost again, what it leased
        under the new incarnation dropped.

        Raises:
            JobNotFound: no such job (or not that incarnation).
            ConnectionLost: Redis could not be reached.
        """
        incarnation, secret = secrets.token_hex(6), secrets.token_hex(16)
        conn = self.connection
        with translate(conn.url):
            cid = name_connection(conn.redis, incarnation)  # until the 1st heartbeat
        reg = Registered.decode(
            self.run(
                "register",
                [
                    self.job_incarnation,
                    self.worker_id,
                    incarnation,
                    self._own_ttl_ms,
                    socket.gethostname(),
                    os.getpid(),
                    secret,
                    cid,
                    self.reads,
                ],
            )
        )
        self.creds = (incarnation, secret)  # one store: never one without the other
        self.seed = reg.seed if reg.sample_order == "shuffled" else None
        self.mix = reg.mix
        self.job_incarnation = reg.job_incarnation
        self.ttl_s = reg.ttl_s
        self.heartbeat_interval = reg.heartbeat_interval_s
        log.debug("registered %s/%s on job %s", self.worker_id, incarnation, self.job)
        return reg

    def rejoin(
        self,
        incarnation: str,
        lost: Callable[[], None],
        joined: Callable[[Registered], None],
    ) -> None:
        """Join again under a new incarnation, once for all threads that saw
        ``incarnation`` declared lost; never after ``close()``. ``lost()`` runs first
        (drop what was held), ``joined(reply)`` after."""
        with self._rejoin_lock:
            if self.stop.is_set() or self.creds[0] != incarnation:
                return
            log.warning("worker %s was declared lost; re-registering", self.worker_id)
            lost()
            joined(self.register())

    def heard(self) -> None:
        """A reply came from the server."""
        self.last_contact = time.monotonic()

    def gone(self) -> None:
        """The server said the job is not there (deleted or replaced)."""
        self.last_contact = time.monotonic()
        self.ended = errors.JobNotFound

    def run(self, verb: str, args: list[Any]) -> Any:
        """One verb on this worker's job, its raw reply (the codes a trainer reads, a
        reply's first element; the others raised), noting the contact with the server.

        Raises:
            JobNotFound: the job was deleted or replaced.
            ConnectionLost: Redis could not be reached.
        """
        try:
            reply = self.connection.run(self.job, verb, args, passthrough=PASSTHROUGH)
        except errors.JobNotFound:
            self.gone()
            raise
        self.last_contact = time.monotonic()
        return reply

    def retrying(self, fn: Any, *args: Any, bound_s: float | None = None) -> Any:
        """Call ``fn`` until it succeeds, retrying ConnectionLost (``RedisOutOfMemory``
        too) with backoff and jitter for up to ``reconnect_timeout`` seconds (``bound_s``
        if given; else not once closed); the held-pairs heartbeat makes blind retries
        safe."""
        deadline = time.monotonic() + (self.reconnect_timeout if bound_s is None else bound_s)
        delay = 0.05
        while True:
            try:
                return fn(*args)
            except errors.ConnectionLost as e:
                if time.monotonic() > deadline or (bound_s is None and self.stop.is_set()):
                    raise
                log.warning("%s; retrying in %.2fs", e, delay)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)

    def leave(self) -> None:
        """Deregister (what is held goes back at once), retrying an unreachable Redis for
        at most ``min(reconnect_timeout, 5)`` seconds; a failure is logged."""
        incarnation, secret = self.creds
        try:
            self.retrying(
                self.run,
                "leave",
                [self.job_incarnation, self.worker_id, incarnation, secret],
                bound_s=min(self.reconnect_timeout, 5.0),
            )
        except errors.ConnectionLost as e:
            log.warning("leave: %s (the server reclaims after the ttl)", e)
        except errors.TaskqError as e:
            log.warning("leave: %s", e)
