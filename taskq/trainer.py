"""The thin trainer client: lease, ack, fail, release, heartbeats, graceful leave.

A ``Trainer`` registers a worker incarnation, heartbeats from a daemon thread (it dies
with the process, so a SIGKILLed trainer keeps nothing alive), and iterates tasks:
acking the previous task, starting a reserved one and leasing the next is one script
call. Every write carries the lease token; the server decides what is current.

The verbs' ARGV and replies are ``protocol.py``'s; the heartbeat thread and helper
process (``heartbeat.py``) see a trainer only as a ``HeartbeatHost``. The class is built
in parts: its calls and what their replies do (``trainer_calls.py``), the heartbeat's
view (``trainer_beats.py``), the iteration modes (``trainer_iter.py``); this module has
its construction, properties and leaving; the ``with`` block's signal handling is
``signals.py``'s (shared with ``ShardedTrainer``).

Data flow: trainer code -> trainer.py -> protocol.py -> scripts.py (lua) -> Redis <- reaper.py.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from . import errors
from .client import Client
from .connection import resolve_url
from .heartbeat import HelperHeartbeat, start_thread, stop_dropped
from .inputwait import InputBeat, InputMeter
from .keys import JobKeys
from .models import Task
from .progress import ProgressBuffer
from .protocol import Wire
from .scripts import MAX_PREFETCH, Scripts
from .signals import LeaveOnSignal
from .trainer_iter import TrainerIteration

log = logging.getLogger("taskq.trainer")


#: What ``Trainer(name)`` of a sharded job builds: ``ShardedTrainer``, set by
#: sharded_trainer.py when it is imported (``import taskq`` does), so that this module
#: imports nothing that imports it back.
SHARDED_TRAINER: Callable[..., Any] | None = None


def _is_sharded(client: Client, job: str, reconnect_timeout: float) -> bool:
    """Whether ``job`` is a sharded job (``client.job``), retrying an unreachable Redis
    for up to ``reconnect_timeout`` seconds as the trainer's own calls do."""
    deadline = time.monotonic() + reconnect_timeout
    delay = 0.05
    while True:
        try:
            return client.job(job).sharded
        except errors.ConnectionLost as e:
            if time.monotonic() > deadline:
                raise
            log.warning("%s; retrying in %.2fs", e, delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def default_worker_id() -> str:
    """``host:pid:random``, unique per process."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Trainer(TrainerIteration, LeaveOnSignal):
    """A worker of one job.

    Args:
        job: the job name.
        url: Redis URL (or ``TASKQ_REDIS_URL``); ignored when ``client`` is given.
        client: a configured ``taskq.Client`` to share (cluster, Sentinel, TLS).
        worker_id: defaults to ``host:pid:random``; ``|`` is not allowed.
        prefetch: reserved tasks kept ahead of the current one (others may steal them).
        worker_ttl: this worker's own liveness ttl in seconds (e.g. for long GIL-bound
            steps); the job's ``worker_ttl`` when None.
        heartbeat: ``"thread"`` (or True, the default): a daemon thread of this process;
            ``"process"``: a helper process that keeps heartbeating while this process
            holds the GIL for long steps, and exits when this process dies (needs ``url``,
            not a ``client`` built on a given redis-py client); False: none (tests that
            drive ``heartbeat()`` by hand).
        handle_signals: in the ``with`` block, turn SIGTERM into ``SystemExit`` and SIGINT
            into ``KeyboardInterrupt`` (main thread only; forked children get the default
            behaviour back) so the loop ends and everything held is released.
        reconnect_timeout: seconds a call keeps retrying while Redis is unreachable
            (backoff with jitter); then ``ConnectionLost`` is raised.
        input_meter: the meter of the loop's data wait to send with the heartbeats
            (``taskq.torch.DataLoader`` gives its own); a new one when None. Iterating the
            trainer times each ``next()``; ``heartbeat="process"`` does not send it.

    Attributes:
        state: the job's state as this trainer last heard it (see the property).
        pass_no: the newest pass this trainer heard of (see the property).

    Raises:
        JobNotFound: no such job.
        ConnectionLost: Redis unreachable (``RedisOutOfMemory``: full) for longer than
            ``reconnect_timeout``.
    """

    def __new__(
        cls, job: str, url: str | None = None, client: Client | None = None, *a: Any, **kw: Any
    ) -> Any:
        """``Trainer(name)`` works on any job: a sharded job's name gives its
        ``ShardedTrainer`` (sharded_trainer.py), the same surface (iteration,
        ``passes()``, ``batches(k)``, ``lease`` / ``lease_many``, ``progress``, ``ack`` /
        ``fail`` / ``release``, the ``with`` block, ``close``); ``client.job(name)`` tells
        which (jobs.py). A subclass, or ``of_shard``, is always a plain trainer."""
        if cls is not Trainer:
            return super().__new__(cls)
        probe = client or Client(url, retries=1)
        if _is_sharded(probe, job, float(kw.get("reconnect_timeout", 60.0))):
            if SHARDED_TRAINER is None:  # pragma: no cover - `import taskq` sets it
                raise errors.TaskqError(f"job {job!r} is sharded: import taskq.sharded_trainer")
            return SHARDED_TRAINER(job, url, probe, *a, **kw)
        self = super().__new__(cls)
        self.__dict__["_probe_client"] = probe  # the client __init__ would make: made once
        return self

    @classmethod
    def of_shard(cls, job: str, **kw: Any) -> Trainer:
        """A plain trainer of ``job``, a job of the engine (a sharded trainer's shard),
        without asking whether ``job`` is a sharded job.

        Args:
            job: the job (a shard's) name.
            kw: ``Trainer``'s arguments.
        """
        self: Trainer = object.__new__(cls)
        Trainer.__init__(self, job, **kw)
        return self

    def __init__(
        self,
        job: str,
        url: str | None = None,
        client: Client | None = None,
        worker_id: str | None = None,
        *,
        prefetch: int = 0,
        worker_ttl: float | None = None,
        heartbeat: bool | str = True,
        handle_signals: bool = True,
        reconnect_timeout: float = 60.0,
        input_meter: InputMeter | None = None,
    ) -> None:
        # one redis-py retry per command: the trainer's own loop (backoff with jitter,
        # bounded by reconnect_timeout) does the rest, so the bound is what it says
        self.client = client or self.__dict__.pop("_probe_client", None) or Client(url, retries=1)
        self.job = job
        self._wire = Wire(self.client, job)
        self.keys: JobKeys = self._wire.keys
        self.worker_id = worker_id or default_worker_id()
        if "|" in self.worker_id or not self.worker_id:
            raise errors.InvalidInput(f"bad worker id {self.worker_id!r}: '|' not allowed")
        if not 0 <= prefetch <= MAX_PREFETCH:
            raise errors.InvalidInput(f"prefetch must be in [0, {MAX_PREFETCH}], got {prefetch}")
        if worker_ttl is not None and worker_ttl <= 0:
            raise errors.InvalidInput(f"worker_ttl must be positive, got {worker_ttl}")
        if heartbeat is True:
            heartbeat = "thread"
        if heartbeat not in (False, "thread", "process"):
            raise errors.InvalidInput(
                f"heartbeat must be 'thread', 'process' or False, not {heartbeat!r}"
            )
        # the raw URL (with any password) for connections of our own; None with a given client
        self._raw_url = resolve_url(url) if client is None else url
        if heartbeat == "process" and self._raw_url is None:
            raise errors.InvalidInput(
                "heartbeat='process' needs url= (the helper process opens its own connection)"
            )
        if reconnect_timeout < 0:
            raise errors.InvalidInput(f"reconnect_timeout must be >= 0, got {reconnect_timeout}")
        self.prefetch = prefetch
        self.handle_signals = handle_signals
        self.reconnect_timeout = reconnect_timeout
        self._own_ttl_ms = int(worker_ttl * 1000) if worker_ttl else 0
        self._lock = threading.RLock()
        self._rejoin_lock = threading.Lock()
        self._held: dict[int, Task] = {}
        self._reserved: deque[Task] = deque()
        self._call_no = 0
        # the heartbeat's last_reply_call_no: the server revokes unlisted leases granted by
        # calls up to it, so it stays below every call still in flight (another thread's
        # lease may be granted but not yet applied when this thread's ack reply lands)
        self._last_reply_no = 0
        self._replied = 0
        self._in_flight: set[int] = set()
        self._info_lock = threading.Lock()
        self._gen = 0
        self._pass = 0
        self._state = "running"
        self._skipped_gen = -1
        self._draining = False
        self._ended: type[errors.TaskqError] | None = None
        self._closed = False
        self._last_contact = time.monotonic()
        self._stop = threading.Event()
        self._pid = os.getpid()
        self._old_handlers: dict[int, Any] = {}
        self.job_incarnation = ""
        self.incarnation = ""
        # this incarnation's lease secret: sent with every write, kept in this process
        # alone (Redis keeps a digest); never logged, never given to a child process
        self._secret = ""
        self.heartbeats_sent = 0
        self.stolen_from_me = 0
        # progress inside tasks: buffered, sent with the heartbeat (docs/resume.md); with
        # the helper process, from the loop's own thread at most once per interval
        self._progress = ProgressBuffer()
        self._progress_inline = heartbeat == "process"
        self._progress_sent = time.monotonic()
        # the loop's data wait, sent with the heartbeat (a given one: the torch loader's)
        self.input_meter = input_meter if input_meter is not None else InputMeter()
        self._input_beat = InputBeat.of(self.input_meter)
        self._helper: HelperHeartbeat | None = None
        self._hb_scripts: Scripts | None = None
        self._hb_thread: threading.Thread | None = None
        # a trainer started while Redis is away (a pod scheduled during a restart) waits
        # for it like every other call, up to reconnect_timeout
        self._retrying(self._register)
        if heartbeat == "thread":
            self._hb_thread, self._hb_scripts = start_thread(
                self, self._stop, self._raw_url, self.heartbeat_interval, self.ttl_s
            )
        elif heartbeat == "process":
            assert self._raw_url is not None
            self._helper = HelperHeartbeat(
                self,
                self._raw_url,
                self.client.prefix,
                self.heartbeat_interval,
                self.ttl_s,
                self._beat_args(),
            )
        # nothing started here holds the trainer strongly: dropped, it is collected and
        # this stops its heartbeats
        self._finalizer = weakref.finalize(self, stop_dropped, job, self._stop, self._helper)

    @property
    def held(self) -> list[Task]:
        """The tasks this trainer believes it holds (current and reserved)."""
        with self._lock:
            return list(self._held.values())

    @property
    def draining(self) -> bool:
        """True once an operator asked this worker to finish its task and leave."""
        return self._draining

    @property
    def state(self) -> str:
        """The job's state as this trainer last heard it (read-only): ``"running"``,
        ``"waiting"`` (at a pass boundary for ``taskq pass next``), ``"completed"`` (its
        last pass is done) or ``"cancelled"``. Every reply and heartbeat answer updates
        it; after ``passes()`` or iteration ends it says why (see ``passes``)."""
        return self._state

    @property
    def pass_no(self) -> int:
        """The newest pass of the job this trainer heard of (read-only; never goes back)."""
        return self._pass

    def global_id(self, task: Task) -> int:
        """The task's id in the whole job: ``task.id`` (``ShardedTrainer`` maps a shard's
        task to its id in the sharded job)."""
        return task.id

    # -- leaving ------------------------------------------------------------------
    def close(self) -> None:
        """Release everything held in one call and deregister (leasable by others at once),
        then stop the heartbeat thread or helper process (even if the leave is interrupted).
        Idempotent. Retries an unreachable Redis for at most ``min(reconnect_timeout, 5)``
        seconds; past that the server reclaims the leases after the worker's ttl.

        Raises:
            SystemExit: a SIGTERM during the leave (nothing from Redis: that is logged).
            KeyboardInterrupt: a SIGINT during the leave.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        try:
            self._leave()
        finally:
            with self._lock:
                for task in self._held.values():
                    task.revoked.set()
                self._held.clear()
                self._reserved.clear()
            self._stop_heartbeats()

    def _leave(self) -> None:
        self._flush_quietly()
        try:
            with self._lock:
                incarnation, secret = self.incarnation, self._secret
            self._retrying(
                self._contact,
                self._wire.leave,
                self.job_incarnation,
                self.worker_id,
                incarnation,
                secret,
                bound_s=min(self.reconnect_timeout, 5.0),
            )
        except errors.ConnectionLost as e:
            log.warning("leave: %s (the server reclaims after the ttl)", e)
        except errors.TaskqError as e:
            log.warning("leave: %s", e)

    def _stop_heartbeats(self) -> None:
        """End the heartbeat thread (a beat in flight is bounded by its socket timeout) or
        the helper process."""
        self._finalizer.detach()
        thread = self._hb_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.5, min(self.ttl_s / 2, 5.0)) + 0.5)
        if self._helper is not None:
            self._helper.stop()

    def _fail_current(self, exc_type: type[BaseException] | None, exc: BaseException) -> None:
        """The body raised: the task(s) it was working on failed (a batch goes back to be
        retried one task at a time); reserved ones are released by close()."""
        current = [t for t in self.held if t.started and not t.revoked.is_set()]
        if current:
            name = exc_type.__name__ if exc_type else "error"
            try:
                self.fail(current, error=f"{name}: {exc}")
            except errors.TaskqError as e:
                log.warning("could not fail task(s) %s: %s", [t.id for t in current], e)
