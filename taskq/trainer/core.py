"""The trainer client: lease, ack, fail, release, heartbeats, graceful leave.

``Trainer`` is the one class a training loop uses, for a plain job and a sharded one
alike: its public surface (properties, ``lease`` / ``lease_many``, iteration,
``passes()``, ``batches(k)``, ``ack`` / ``fail`` / ``release``, ``progress``,
``heartbeat()``, the ``with`` block, ``close``) is written here once, and each member
calls the part that does the work. The trainer owns its home ``Worker`` (worker.py: the
parts of one registered worker of one engine job: session, held leases, the calls that
change them, progress, heartbeat). What differs for a sharded job is only where leases
come from, a lease source chosen once from the job's record when the trainer is made: a
plain job's ``PlainSource`` (iteration.py, its worker's own), or a sharded job's
``ShardedSource`` (sharded.py: a home shard's worker first, the other shards' tails, the
barrier; it names the worker of a task's shard for the other verbs). The ``with``
block's signal handling is ``signals.py``'s ``SignalLeave``.

Data flow: trainer code -> trainer/core.py -> the worker's parts (trainer/iteration.py,
progress.py, heartbeat.py; a sharded job's leases through trainer/sharded.py) ->
protocol.py -> engine/connection.py -> Redis <- reaper.py.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from types import EllipsisType, TracebackType
from typing import Any, Protocol

from taskq import errors
from taskq.admin import shardset
from taskq.admin.jobs import check_name
from taskq.engine.connection import Connection, resolve_url
from taskq.engine.contract import MAX_BATCH
from taskq.inputwait import InputMeter
from taskq.keys import JobKeys
from taskq.models import Task
from taskq.trainer.iteration import PlainSource
from taskq.trainer.protocol import HeartbeatReply
from taskq.trainer.session import default_worker_id as default_worker_id  # its old home
from taskq.trainer.session import retrying
from taskq.trainer.sharded import ShardedSource
from taskq.trainer.signals import SignalLeave
from taskq.trainer.worker import Worker

log = logging.getLogger("taskq.trainer")


class HasConnection(Protocol):
    """What holds an engine connection: a ``taskq.Client`` (admin/client.py, which this
    layer does not import)."""

    @property
    def connection(self) -> Connection: ...


def connection_of(client: Connection | HasConnection) -> Connection:
    """The engine connection of ``client``: itself, or its ``connection``."""
    return client if isinstance(client, Connection) else client.connection


class Trainer:
    """A worker of one job.

    Args:
        job: the job name.
        url: Redis URL (or ``TASKQ_REDIS_URL``); ignored when ``client`` is given.
        client: the connection to share (cluster, Sentinel, TLS): an engine
            ``Connection``, or a configured ``taskq.Client`` (its ``connection`` is taken).
        worker_id: defaults to ``host:pid:random``; ``|`` is not allowed.
        prefetch: reserved tasks kept ahead of the current one (others may steal them;
            a sharded job's: leased ahead on the shard the last ones came from).
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
        ranges: the loop reads the range ``[task.start, task.end)`` of each task in its
            sample order (``read_task(task)``, which follows ``task.current_end``), so it
            may be handed a piece of a task split at a pass's tail, and with
            ``split_tails`` its own tasks may be split (docs/design.md, "Tail splitting").
            False (the default): the loop is taken to read whole tasks (``for task in
            trainer: train_on(task.chunks)``): it is never handed a piece, never splits
            another's task, and its own are never split. Declared at register.
        split_tails: with ``ranges``, take part in tail splitting: a task whose loop
            reads up to ``task.end`` as it moves (``read_task(task)``) sends its size
            with its progress, so at a pass's tail an idle trainer may take its unread
            end; the end moves with the replies to the progress reports. A loop that
            never asks ``task.current_end`` is never split. False: the loop honours the
            range it was handed but not an end that moves: its tasks are never split, and
            a piece handed to it whose split is still pending is released at once.
        home: a sharded job's only: the home shard's index (the next in turn when None).
        idle_wait: a sharded job's only: seconds the first idle round waits for work
            before looking at the other shards again; it doubles while nothing comes, up
            to ``max_idle_wait`` (the polls of a crowd of idle trainers at a pass's tail
            stay bounded).
        max_idle_wait: a sharded job's only: the longest wait between two looks at the
            other shards.
        on_all_dead: what a loop (``for task in trainer``, ``passes()``, ``batches()``)
            does while the job waits because every live task of its pass is dead:
            ``"wait"`` (the default: a warning naming the dead tasks, their last error
            and the commands to retry them or cancel the job, once a minute; the loop
            goes on as soon as they are retried: a fleet of workers needs no restart)
            or ``"raise"`` (``AllTasksDead`` with that text, from the loop).

    Attributes:
        state: the job's state as this trainer last heard it (see the property).
        pass_no: the newest pass this trainer heard of (see the property).
        connection: the engine ``Connection`` given or made, which every call of this
            trainer goes through (``taskq.Client(redis_client=connection.redis,
            key_prefix=connection.prefix)`` reads the job on it: status, checkpoint).

    A sharded job's trainer takes from its home shard first, then the other shards'
    tails, and runs the barrier step at a pass's end (trainer/sharded.py); the surface is
    the same, ``global_id(task)`` names a task in the whole job and ``task.job`` its
    shard.

    Raises:
        JobNotFound: no such job.
        InvalidInput: a bad argument (``home`` given for a plain job too).
        ConnectionLost: Redis unreachable (``RedisOutOfMemory``: full) for longer than
            ``reconnect_timeout``.
    """

    def __init__(
        self,
        job: str,
        url: str | None = None,
        client: Connection | HasConnection | None = None,
        worker_id: str | None = None,
        *,
        prefetch: int = 0,
        worker_ttl: float | None = None,
        heartbeat: bool | str = True,
        handle_signals: bool = True,
        reconnect_timeout: float = 60.0,
        input_meter: InputMeter | None = None,
        ranges: bool = False,
        split_tails: bool = True,
        home: int | None = None,
        idle_wait: float = 0.5,
        max_idle_wait: float = 5.0,
        on_all_dead: str = "wait",
    ) -> None:
        # one redis-py retry per command: the trainer's own loop (backoff with jitter,
        # bounded by reconnect_timeout) does the rest, so the bound is what it says
        self.connection = conn = (
            retrying(reconnect_timeout, lambda: Connection(url, retries=1))
            if client is None
            else connection_of(client)
        )
        self.job = job
        self.handle_signals = handle_signals
        # the raw URL (with any password) for connections of our own; None with a given client
        raw_url = resolve_url(url) if client is None else url
        kw: dict[str, Any] = {
            "prefetch": prefetch,
            "worker_ttl": worker_ttl,
            "heartbeat": heartbeat,
            "reconnect_timeout": reconnect_timeout,
            "input_meter": input_meter,
            "split_tails": split_tails,
            "on_all_dead": on_all_dead,
            "ranges": ranges,
        }
        check_name(job)  # a bad name: InvalidInput before anything is sent
        # where leases come from, chosen once from the job's record: a plain job's one
        # worker, or a sharded job's home shard, the others' tails and the barrier
        sset = retrying(reconnect_timeout, shardset.load, conn, job)
        if sset is not None:
            # its shards' workers beat on the given connection unless given a URL
            self._sharded: ShardedSource | None = ShardedSource(
                conn,
                sset,
                url,
                worker_id,
                home=home,
                idle_wait=idle_wait,
                max_idle_wait=max_idle_wait,
                **kw,
            )
            self._home = self._sharded.shard_worker(self._sharded.home)
            self._source: PlainSource | ShardedSource = self._sharded
        elif home is not None:
            raise errors.InvalidInput(f"home is a sharded job's; job {job!r} is not sharded")
        else:
            self._sharded = None
            self._home = Worker(conn, job, raw_url, worker_id, **kw)
            self._source = self._home.plain
        self._attach()

    @classmethod
    def of_shard(
        cls,
        job: str,
        url: str | None = None,
        client: Connection | HasConnection | None = None,
        **kw: Any,
    ) -> Trainer:
        """A plain trainer of ``job``, a job of the engine (a sharded job's shard),
        without reading whether ``job`` is a sharded job.

        Args:
            job: the job (a shard's) name.
            url, client, kw: ``Trainer``'s arguments (not a sharded job's).
        """
        self: Trainer = cls.__new__(cls)
        self.connection = Connection(url, retries=1) if client is None else connection_of(client)
        self.job = job
        self.handle_signals = kw.pop("handle_signals", True)
        raw_url = resolve_url(url) if client is None else url
        self._sharded = None
        self._home = Worker(self.connection, job, raw_url, **kw)
        self._source = self._home.plain
        self._attach()
        return self

    def _attach(self) -> None:
        """What both constructors set once the home worker is made."""
        home = self._home
        self.worker_id = home.worker_id
        self.keys: JobKeys = home.keys
        #: the loop's data wait, sent with the heartbeats (a given one: the torch loader's)
        self.input_meter = home.input_meter
        self._signals = SignalLeave(self.job)

    def _workers(self) -> list[Worker]:
        """The workers open now: the plain job's one, or a sharded job's open shards'."""
        return [self._home] if self._sharded is None else self._sharded.workers()

    def _route(self, tasks: Task | list[Task]) -> list[tuple[Worker, list[Task]]]:
        """The tasks the loop gives back by hand, by the worker that holds them."""
        tasks = tasks if isinstance(tasks, list) else [tasks]
        return [(self._home, tasks)] if self._sharded is None else self._sharded.route(tasks)

    @property
    def sharded(self) -> bool:
        """True for a sharded job's trainer (trainer/sharded.py takes its leases)."""
        return self._sharded is not None

    @property
    def shards(self) -> list[str]:
        """The engine jobs this trainer takes from: a sharded job's shards (shard ``k`` at
        index ``k``), a plain job's ``[job]``."""
        return [self.job] if self._sharded is None else self._sharded.shards

    @property
    def home(self) -> int:
        """The index in ``shards`` of the home shard, taken from first (0: a plain job)."""
        return 0 if self._sharded is None else self._sharded.home

    @property
    def registered_shards(self) -> list[str]:
        """The shards this trainer is registered on now (home and those it leases from)."""
        return [w.job for w in self._workers()]

    @property
    def taken_elsewhere(self) -> int:
        """Tasks taken from shards other than home (a pass's shared tail)."""
        return 0 if self._sharded is None else self._sharded.taken_elsewhere

    # -- what the trainer knows -------------------------------------------------------
    @property
    def held(self) -> list[Task]:
        """The tasks this trainer believes it holds (current and reserved), on every
        shard of a sharded job."""
        return [t for w in self._workers() for t in w.leases.held()]

    @property
    def draining(self) -> bool:
        """True once an operator asked this worker to finish its task and leave."""
        return self._source.draining

    @property
    def state(self) -> str:
        """The job's state as this trainer last heard it (read-only): ``"running"``,
        ``"waiting"`` (at a pass boundary for ``taskq pass next``), ``"completed"`` (its
        last pass is done) or ``"cancelled"``. Every reply and heartbeat answer updates
        it; after ``passes()`` or iteration ends it says why (see ``passes``). A sharded
        job's: the whole job's."""
        return self._source.state

    @property
    def pass_no(self) -> int:
        """The newest pass of the job this trainer heard of (read-only; never goes back)."""
        return self._source.pass_no

    @property
    def reason(self) -> str:
        """Why the job waits (``state == "waiting"``) as this trainer last heard it:
        ``"manual_advance"``, ``"all_dead"``, ``"rewinding"``, ...; "" when it does not
        (read-only; a sharded job's: the whole job's, as its last idle round saw it)."""
        return self._source.reason

    def pass_complete(self, pass_no: int) -> bool:
        """True once pass ``pass_no`` is over for everyone, as this trainer's replies said:
        the job moved past it, or waits at its boundary for ``taskq pass next`` (a
        sharded job: every shard finished it). A lease expecting that pass that got
        nothing got nothing for that reason (no status read needed to tell).

        Args:
            pass_no: the pass asked about.

        Returns:
            Whether it is over (False may be stale: only replies update it).
        """
        return self._source.pass_complete(pass_no)

    @property
    def incarnation(self) -> str:
        """This worker's current incarnation (a new one after a rejoin; a sharded job's:
        on its home shard)."""
        return self._home.session.incarnation

    @property
    def job_incarnation(self) -> str:
        """The job's incarnation this trainer registered with (a sharded job's: its home
        shard's)."""
        return self._home.session.job_incarnation

    @property
    def ttl_s(self) -> float:
        """This worker's liveness ttl in seconds, as the server gave it."""
        return self._home.session.ttl_s

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between heartbeats, as the server gave it."""
        return self._home.session.heartbeat_interval

    @property
    def reconnect_timeout(self) -> float:
        """Seconds a call keeps retrying while Redis is unreachable (settable)."""
        if self._sharded is not None:
            return self._sharded.reconnect_timeout
        return self._home.session.reconnect_timeout

    @reconnect_timeout.setter
    def reconnect_timeout(self, value: float) -> None:
        if self._sharded is not None:
            self._sharded.reconnect_timeout = value
        else:
            self._home.session.reconnect_timeout = value

    @property
    def prefetch(self) -> int:
        """Reserved tasks kept ahead of the current one (settable)."""
        return self._source.prefetch

    @prefetch.setter
    def prefetch(self, value: int) -> None:
        self._source.prefetch = value

    @property
    def heartbeats_sent(self) -> int:
        """Heartbeat answers applied (on every shard of a sharded job)."""
        return sum(w.heartbeat.sent for w in self._workers())

    @property
    def stolen_from_me(self) -> int:
        """Reserved tasks an idle trainer took before this one started them."""
        return sum(w.leases.stolen_from_me for w in self._workers())

    def global_id(self, task: Task) -> int:
        """The task's id in the whole job: ``task.id`` for a plain job; a sharded job's
        task is mapped from its shard (``task.job``) to its id in the sharded job."""
        return task.id if self._sharded is None else self._sharded.global_id(task)

    # -- taking tasks (trainer/iteration.py) ---------------------------------------------------
    def lease(
        self,
        timeout: float | None = 2.0,
        expect_pass: int | None = None,
        acks: Sequence[Task] = (),
    ) -> Task | None:
        """Lease one task, started; with ``acks``, ack those in the same call.

        Args:
            timeout: seconds to wait for work (0: do not wait; None: until there is).
            expect_pass: never return work of another pass (``PASS_DONE`` -> None).
            acks: finished tasks to ack in the same call. A lost lease among them is
                logged, not raised: its ``revoked`` event is set and nothing was counted.

        Returns:
            A task, or None when ``timeout`` passed with nothing to give.

        Raises:
            JobCompleted: the job's last pass is done; there will never be work again.
            JobCancelled: the job was cancelled; there will never be work again.
            JobNotFound: the job was deleted or replaced; there will never be work again.
            Draining: an operator asked this worker to leave.
            CorruptData: the task granted has unreadable chunks (the message names the
                job, the task and the key); it was already failed, not left leased.
            ConnectionLost: Redis unreachable (``RedisOutOfMemory``: full) for longer than
                ``reconnect_timeout``.
        """
        return self._source.lease(math.inf if timeout is None else timeout, expect_pass, acks)

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
        """Lease up to ``n`` tasks, started, in one call; with ``acks``, ack those in it.

        Args:
            n: the most tasks to lease (1 to the job's per-call bound; 0 with ``acks``
                or ``starts``: none, only those).
            timeout: seconds to wait for work (0: do not wait; None: until there is).
            expect_pass: never return work of another pass (``PASS_DONE`` -> []).
            acks: finished tasks to ack in the same call (a lost lease is logged and its
                ``revoked`` event set, not raised).
            starts: tasks this trainer leased with ``reserve=True``, to start in the same
                call (before the lease): each comes back started (``task.started``) or,
                if an idle trainer took it meanwhile, no longer held (``task.revoked``
                set; ``stolen_from_me`` counts it).
            reserve: lease the tasks reserved, not started: read-ahead an idle trainer
                may still take (steal) until it is started (``starts=``); the task
                timeout runs from the start.

        Returns:
            The tasks leased (those with unreadable chunks are failed and left out);
            empty when ``timeout`` passed with nothing to give.

        Raises:
            InvalidInput: ``n < 0``, 0 with neither acks nor starts, or more than
                ``MAX_BATCH`` (32, the tasks one call leases).
            JobCompleted, JobCancelled, JobNotFound, Draining, ConnectionLost: as ``lease``.
        """
        if n < 0 or (n == 0 and not acks and not starts) or n > MAX_BATCH:
            raise errors.InvalidInput(
                f"lease_many(n): n must be 1 to {MAX_BATCH} (0 with acks or starts), got {n}"
            )
        return self._source.lease_many(
            n, math.inf if timeout is None else timeout, expect_pass, acks, starts, reserve
        )

    def __iter__(self) -> Iterator[Task]:
        return self._source.iterate()

    def passes(self) -> Iterator[Iterator[Task]]:
        """One iterator per pass; each ends when its pass is complete for everyone (a
        barrier: the next one blocks while the job waits at a manual boundary).

        A pass's iterator ends the same way whether its pass is complete, the job is
        completed or cancelled, or this worker drains; tell them apart after it ends by
        ``state`` (``"completed"``, ``"cancelled"``; else the pass is done and the job
        goes on) and ``draining``. ``passes()`` itself ends after the job's last pass,
        on cancel or drain. For example::

            for epoch in trainer.passes():
                for task in epoch:
                    train(task)
                if trainer.state == "cancelled":
                    break              # no checkpoint of a cancelled run
                checkpoint()

        Returns:
            Iterators of tasks, one per pass, until the job is completed or cancelled.

        Raises:
            JobNotFound: the job was deleted or replaced meanwhile.
        """
        return self._source.passes()

    def batches(self, k: int) -> Iterator[list[Task]]:
        """Lists of up to ``k`` tasks started together and acked together (one call per
        batch); ends when the job is completed or cancelled, or this worker drains.

        Args:
            k: the most tasks in one batch.

        Returns:
            An iterator of batches (tasks with unreadable chunks are failed and left out).

        Raises:
            InvalidInput: ``k`` is not 1 to ``MAX_BATCH`` (32, the tasks one call leases and
                acks), at the call, before any lease.
            JobNotFound: the job was deleted or replaced.
        """
        if k < 1 or k > MAX_BATCH:
            raise errors.InvalidInput(
                f"batches(k): k must be 1 to {MAX_BATCH} (the tasks one call leases and "
                f"acks), got {k}"
            )
        return self._source.batches(k)

    # -- ending leases (trainer/iteration.py's Calls) -------------------------------------------------
    def ack(self, task: Task | list[Task]) -> None:
        """Ack a finished task (or a batch). Repeating an ack that landed is a no-op.

        Args:
            task: a task or a list of tasks this trainer holds.

        Raises:
            LeaseLost: the lease was no longer this trainer's; nothing was counted.
        """
        for worker, tasks in self._route(task):
            worker.calls.ack(tasks)

    def fail(self, task: Task | list[Task], error: str = "") -> None:
        """Report a failed task (counts a failure; dead at the caps). A failed batch goes
        back uncharged, to be retried one task at a time.

        Args:
            task: a task or a list.
            error: the reason, kept in the event (500 chars).

        Raises:
            LeaseLost: the lease was no longer this trainer's.
        """
        for worker, tasks in self._route(task):
            worker.calls.write("fail", tasks, str(error)[:500])

    def release(self, task: Task | list[Task]) -> None:
        """Give a task back unfinished (leasable by others at once).

        Args:
            task: a task or a list of tasks this trainer holds.

        Raises:
            LeaseLost: the lease was no longer this trainer's.
        """
        for worker, tasks in self._route(task):
            worker.calls.write("release", tasks)

    # -- progress (trainer/progress.py) -------------------------------------------------
    def progress(self, task: Task, n: int, end: int | None | EllipsisType = ...) -> None:
        """Record that the loop took samples ``[0, n)`` of ``task`` (``n`` counts from the
        task's sample 0: a resumed task reports ``task.start`` + what it took). Cheap: kept
        here and sent with the next heartbeat (and before ``release``, ``fail``,
        ``close``), so a re-dispatched task's next holder starts there (``task.start``).
        Only moves forward. See docs/resume.md.

        Args:
            task: a task this trainer holds.
            n: samples taken so far, an integer >= 0.
            end: the end the loop honours from now on (None: none, the task's end);
                default ``task.end`` as it is now. A loop whose reading is done elsewhere
                (taskq.torch's readers) names the end they honour: a report naming the
                split point confirms a split (docs/design.md, "Tail splitting"). Naming
                one (None too) says the loop stops at the ends it is told, so the task's
                size goes with its progress and it can be split (as ``task.current_end``).

        Raises:
            InvalidInput: ``n`` is not an integer >= 0.
        """
        worker = self._home if self._sharded is None else self._sharded.worker_of(task)
        worker.progress.record(task, n, end)

    def flush_progress(self) -> list[int]:
        """Send the recorded progress now (the heartbeat does it every interval).

        Returns:
            The ids of tasks whose report was refused: their lease is no longer this
            trainer's (nothing recorded; what they claimed is counted as re-read).

        Raises:
            ConnectionLost: Redis could not be reached (the progress stays buffered).
        """
        return [i for w in self._workers() for i in w.progress.flush()]

    # -- the heartbeat (trainer/heartbeat.py) ---------------------------------------------
    def heartbeat(self) -> list[int]:
        """Send one heartbeat now (what the heartbeat thread does every interval).

        Returns:
            The ids of held tasks the server revoked (their ``revoked`` is set).

        Raises:
            ConnectionLost: Redis could not be reached (``RedisOutOfMemory``: it is full).
        """
        return [i for w in self._workers() for i in w.heartbeat.heartbeat()]

    def apply_heartbeat(self, reply: HeartbeatReply, args: Sequence[Any]) -> list[int]:
        """Act on the answer to a heartbeat sent with ARGV ``args`` (by ``heartbeat()`` or
        the helper process); for ``taskq.trainer.heartbeat``, not needed by trainer code.

        Answers may land after newer lease replies: only the leases ``args`` listed are
        revoked, and pass, generation and state never move backwards.

        Args:
            reply: the decoded answer.
            args: the heartbeat's ARGV (``protocol.heartbeat_args``).

        Returns:
            The ids of held tasks now marked revoked.
        """
        return self._home.heartbeat.apply_heartbeat(reply, args)

    def keep_beating(self) -> bool:
        """Mark what is held at risk while out of contact for longer than the ttl; False
        once there is nothing to beat for (closed, or the job is gone)."""
        return any([w.heartbeat.keep_beating() for w in self._workers()])

    # -- leaving ------------------------------------------------------------------
    def __enter__(self) -> Trainer:
        self._signals.enter(self.handle_signals)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._signals.exit(exc, self._fail_current, self.close)

    def close(self) -> None:
        """Release everything held in one call and deregister (leasable by others at once),
        then stop the heartbeat thread or helper process (even if the leave is interrupted).
        Idempotent. Retries an unreachable Redis for at most ``min(reconnect_timeout, 5)``
        seconds; past that the server reclaims the leases after the worker's ttl.

        Raises:
            SystemExit: a SIGTERM during the leave (nothing from Redis: that is logged).
            KeyboardInterrupt: a SIGINT during the leave.
        """
        if self._sharded is None:
            self._home.close()
        else:
            self._sharded.close()

    def _fail_current(self, exc_type: type[BaseException] | None, exc: BaseException) -> None:
        """The body raised: the task(s) it was working on failed (a batch goes back to be
        retried one task at a time); reserved ones are released by close()."""
        current = self._source.current()
        if current:
            name = exc_type.__name__ if exc_type else "error"
            try:
                self.fail(current, error=f"{name}: {exc}")
            except errors.TaskqError as e:
                log.warning("could not fail task(s) %s: %s", [t.id for t in current], e)
