"""One registered worker of one engine job: where a plain job's ``Trainer`` takes leases.

A ``Worker`` registers a worker incarnation on one job of the engine (a plain job, or one
shard of a sharded job), heartbeats from a daemon thread (it dies with the process, so a
SIGKILLed trainer keeps nothing alive) and takes tasks: acking the previous task,
starting a reserved one and leasing the next is one script call. Every write carries the
lease token; the server decides what is current.

It is built of parts that each own their state and lock: the session and the job view
(session.py: registration, incarnations, the lease secret, retries, rejoin, leave; pass,
generation, state, drain), the held leases (leases.py: held and reserved tasks, tokens,
call numbers, revocations), the progress buffer (progress.py), the heartbeat (heartbeat.py's
``Heartbeat``, the only thing the heartbeat thread sees), the lease-changing calls (calls.py)
and the iteration modes (iteration.py). ``Trainer`` (core.py) composes one ``Worker`` for
a plain job; a sharded job's part (sharded.py) one per shard it works on.

Data flow: trainer/core.py / trainer/sharded.py -> worker.py -> iteration.py / calls.py ->
protocol.py -> engine/connection.py -> Redis <- reaper.py.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Iterator, Sequence
from types import EllipsisType
from typing import Any

from taskq.engine.connection import Connection
from taskq.inputwait import InputMeter
from taskq.keys import JobKeys
from taskq.models import Task
from taskq.trainer.calls import Calls
from taskq.trainer.heartbeat import Heartbeat, heartbeat_mode, stop_dropped
from taskq.trainer.iteration import Iteration
from taskq.trainer.leases import HeldLeases
from taskq.trainer.progress import ProgressSender
from taskq.trainer.protocol import HeartbeatReply, Wire
from taskq.trainer.session import JobView, Session

log = logging.getLogger("taskq.trainer")


class Worker:
    """A worker of one engine job (its arguments are ``Trainer``'s). Each public member is
    ``Trainer``'s of the same name, documented there; tasks come as lists.

    Args:
        connection: the engine's connection to call through.
        job: the engine job (a plain job, or a shard).
        raw_url: the URL with its password, for connections of the heartbeat's own; None
            with a given client.
    """

    def __init__(
        self,
        connection: Connection,
        job: str,
        raw_url: str | None,
        worker_id: str | None = None,
        *,
        prefetch: int = 0,
        worker_ttl: float | None = None,
        heartbeat: bool | str = True,
        reconnect_timeout: float = 60.0,
        input_meter: InputMeter | None = None,
        split_tails: bool = True,
        on_all_dead: str = "wait",
        ranges: bool = False,
    ) -> None:
        self.job = job
        wire = Wire(connection, job)
        self.keys: JobKeys = wire.keys
        # each part checks its own arguments (InvalidInput) before anything is sent
        self._session = session = Session(wire, job, worker_id, worker_ttl, reconnect_timeout)
        # what the loop honours of a lease, declared at register (lib/workers.lua reads_of):
        # whole tasks, the range it is handed, or that range with an end that moves
        session.reads = ("s" if split_tails else "r") if ranges else "w"
        split_tails = session.reads == "s"
        self.worker_id = session.worker_id
        mode = heartbeat_mode(heartbeat, raw_url)
        # the loop's data wait, sent with the heartbeat (a given one: the torch loader's)
        self.input_meter = input_meter if input_meter is not None else InputMeter()
        self._view = view = JobView()
        self._leases = leases = HeldLeases()
        # progress inside tasks: buffered, sent with the heartbeat (docs/resume.md); with
        # the helper process, from the loop's own thread at most once per interval
        self._progress = progress = ProgressSender(wire, session, mode == "process", split_tails)
        self._heartbeat = beat = Heartbeat(
            connection, wire, session, leases, view, progress, self.input_meter
        )
        self._calls = calls = Calls(wire, session, leases, view, progress, beat, split_tails)
        self._iter = Iteration(
            connection,
            wire,
            session,
            leases,
            view,
            calls,
            beat,
            prefetch,
            self.input_meter,
            on_all_dead,
        )
        self._closed = False
        # a worker started while Redis is away (a pod scheduled during a restart) waits
        # for it like every other call, up to reconnect_timeout
        view.note(session.retrying(session.register).info)
        beat.start(mode, raw_url)
        # nothing started here holds the worker strongly: dropped, it is collected and
        # this stops its heartbeats
        self._finalizer = weakref.finalize(self, stop_dropped, job, session.stop, beat.helper)

    # -- what the worker knows ----------------------------------------------------------
    @property
    def held(self) -> list[Task]:
        return self._leases.held()

    @property
    def draining(self) -> bool:
        return self._view.draining

    @property
    def state(self) -> str:
        return self._view.state

    @property
    def pass_no(self) -> int:
        return self._view.pass_no

    @property
    def incarnation(self) -> str:
        return self._session.incarnation

    @property
    def job_incarnation(self) -> str:
        return self._session.job_incarnation

    @property
    def ttl_s(self) -> float:
        return self._session.ttl_s

    @property
    def heartbeat_interval(self) -> float:
        return self._session.heartbeat_interval

    @property
    def reconnect_timeout(self) -> float:
        return self._session.reconnect_timeout

    @reconnect_timeout.setter
    def reconnect_timeout(self, value: float) -> None:
        self._session.reconnect_timeout = value

    @property
    def prefetch(self) -> int:
        return self._iter.prefetch

    @prefetch.setter
    def prefetch(self, value: int) -> None:
        self._iter.prefetch = value

    @property
    def heartbeats_sent(self) -> int:
        return self._heartbeat.sent

    @property
    def stolen_from_me(self) -> int:
        return self._leases.stolen_from_me

    @property
    def shards(self) -> list[str]:
        """A plain job is its one shard."""
        return [self.job]

    home = 0
    taken_elsewhere = 0
    registered_shards = shards

    def global_id(self, task: Task) -> int:
        """A plain job's task id is its id in the whole job."""
        return task.id

    def current(self) -> list[Task]:
        """The tasks the loop is working on (started, not revoked)."""
        return [t for t in self._leases.held() if t.started and not t.revoked.is_set()]

    # -- taking tasks (iteration.py) ------------------------------------------------------
    def lease(
        self, timeout: float | None, expect_pass: int | None, acks: Sequence[Task]
    ) -> Task | None:
        return self._iter.lease(math.inf if timeout is None else timeout, expect_pass, acks)

    def lease_many(
        self,
        n: int,
        timeout: float | None = 2.0,
        expect_pass: int | None = None,
        acks: Sequence[Task] = (),
        *,
        starts: Sequence[Task] = (),
        reserve: bool = False,
    ) -> list[Task]:
        return self._iter.lease_many(
            n, math.inf if timeout is None else timeout, expect_pass, acks, starts, reserve
        )

    def iterate(self) -> Iterator[Task]:
        return self._iter.iterate(None)

    def passes(self) -> Iterator[Iterator[Task]]:
        return self._iter.passes()

    def batches(self, k: int) -> Iterator[list[Task]]:
        return self._iter.batches(k)

    # -- ending leases (calls.py) ---------------------------------------------------------
    def ack(self, tasks: list[Task]) -> None:
        self._calls.ack(tasks)

    def fail(self, tasks: list[Task], error: str) -> None:
        self._calls.write("fail", tasks, error)

    def release(self, tasks: list[Task]) -> None:
        self._calls.write("release", tasks)

    # -- progress and the heartbeat -------------------------------------------------------
    def progress(self, task: Task, n: int, end: int | None | EllipsisType = ...) -> None:
        self._progress.record(task, n, end)

    def flush_progress(self) -> list[int]:
        return self._progress.flush()

    def heartbeat(self) -> list[int]:
        return self._heartbeat.heartbeat()

    def apply_heartbeat(self, reply: HeartbeatReply, args: Sequence[Any]) -> list[int]:
        return self._heartbeat.apply_heartbeat(reply, args)

    def keep_beating(self) -> bool:
        return self._heartbeat.keep_beating()

    # -- leaving ------------------------------------------------------------------------
    def close(self) -> None:
        """Flush progress, leave (what is held goes back at once), stop the heartbeat
        (even if the leave is interrupted). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._session.stop.set()
        try:
            self._progress.flush_quietly()
            self._session.leave()
        finally:
            self._leases.revoke_all()
            self._finalizer.detach()
            self._heartbeat.stop()
