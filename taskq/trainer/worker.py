"""One registered worker of one engine job: the parts a ``Trainer`` owns for it.

A ``Worker`` is one worker incarnation registered on one job of the engine (a plain job,
or one shard of a sharded job). It is made of parts that each own their state and lock,
and it keeps them side by side, with no surface of its own: ``Trainer`` (core.py) calls
the part that does the work. The parts: the session and the job view (session.py:
registration, incarnations, the lease secret, retries, rejoin, leave; pass, generation,
state, drain), the held leases (leases.py), the progress
buffer (progress.py), the heartbeat (heartbeat.py's ``Heartbeat``, the only thing the
heartbeat thread sees: a daemon thread, so a SIGKILLed trainer keeps nothing alive) the
calls that change leases and the plain lease source (iteration.py: the ack/start/lease
step, the writes, and where a plain job's leases come from).

A plain job's ``Trainer`` has one ``Worker``; a sharded job's lease source
(sharded.py) one per shard it works on.

Data flow: trainer/core.py / trainer/sharded.py -> worker.py (making and closing the
parts) -> session.py (register) -> engine/connection.py -> Redis.
"""

from __future__ import annotations

import weakref

from taskq.engine.connection import Connection
from taskq.inputwait import InputMeter
from taskq.trainer.heartbeat import Heartbeat, heartbeat_mode, stop_dropped
from taskq.trainer.iteration import Calls, PlainSource
from taskq.trainer.leases import HeldLeases
from taskq.trainer.progress import ProgressSender
from taskq.trainer.session import JobView, Session


class Worker:
    """The parts of one registered worker of one engine job (its arguments are
    ``Trainer``'s).

    Args:
        connection: the engine's connection to call through.
        job: the engine job (a plain job, or a shard).
        raw_url: the URL with its password, for connections of the heartbeat's own; None
            with a given connection.

    Attributes:
        session: the registration (session.py ``Session``).
        view: the job as this worker last heard it (session.py ``JobView``).
        leases: what it holds (leases.py ``HeldLeases``).
        calls: the calls that change leases (iteration.py ``Calls``).
        progress: the progress buffer and its sending (progress.py).
        heartbeat: the heartbeat (heartbeat.py ``Heartbeat``).
        plain: where a plain job's leases come from (iteration.py ``PlainSource``).

    Raises:
        InvalidInput: a bad argument (each part checks its own before anything is sent).
        JobNotFound: no such job.
        ConnectionLost: Redis unreachable for longer than ``reconnect_timeout``.
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
        self.session = session = Session(connection, job, worker_id, worker_ttl, reconnect_timeout)
        self.keys = session.keys
        # what the loop honours of a lease, declared at register (lib/workers.lua reads_of):
        # whole tasks, the range it is handed, or that range with an end that moves
        session.reads = ("s" if split_tails else "r") if ranges else "w"
        self.worker_id = session.worker_id
        mode = heartbeat_mode(heartbeat, raw_url)
        # the loop's data wait, sent with the heartbeat (a given one: the torch loader's)
        self.input_meter = input_meter if input_meter is not None else InputMeter()
        self.view = view = JobView()
        self.leases = leases = HeldLeases()
        # progress inside tasks: buffered, sent with the heartbeat (docs/resume.md); with
        # the helper process, from the loop's own thread at most once per interval
        self.progress = ProgressSender(session, mode == "process", session.reads == "s")
        self.heartbeat = beat = Heartbeat(session, leases, view, self.progress, self.input_meter)
        self.calls = Calls(session, leases, view, self.progress, beat)
        self.plain = PlainSource(
            session, leases, view, self.calls, beat, prefetch, self.input_meter, on_all_dead
        )
        self._closed = False
        # a worker started while Redis is away (a pod scheduled during a restart) waits
        # for it like every other call, up to reconnect_timeout
        view.note(session.retrying(session.register).info)
        beat.start(mode, raw_url)
        # nothing started here holds the worker strongly: dropped, it is collected and
        # this stops its heartbeats
        self._finalizer = weakref.finalize(self, stop_dropped, job, session.stop, beat.helper)

    def close(self) -> None:
        """Flush progress, leave (what is held goes back at once), stop the heartbeat
        (even if the leave is interrupted). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.session.stop.set()
        try:
            self.progress.flush_quietly()
            self.session.leave()
        finally:
            self.leases.revoke_all()
            self._finalizer.detach()
            self.heartbeat.stop()
