"""The feeder: the one thread of a trainer process that talks to Redis for its DataLoader.

It owns the process's ``taskq.Trainer`` (one per loader iteration, made after the
DataLoader workers started, so nothing of it crosses a fork; for a sharded job the
same class, used through the same public calls, its tasks named by their job-wide id):
it leases tasks of the current pass, keeping about ``tasks_ahead`` tasks leased and not
read to their end (the readers' queue and the reserve of read-ahead not begun:
``readahead.py``); it acks and fails the tasks the main thread tells it about; it
decides when the readers stop and when the pass is over. Every trainer call comes from this thread:
a lease reply processed after a concurrent ack's reply could let a heartbeat in between
revoke the lease as "reply lost", so calls are never made from two threads at once.

What it holds, and what the main thread asked about it (acks, fails, progress,
commits), is the iteration's one table of held tasks (``held.py``), which it performs.
Why a lease got nothing (the pass over, the job ended, every live task dead) it reads
from the lease reply (``Trainer.pass_complete``, ``state``, ``reason``).

Data flow: loader iterator (main thread) -> held.py -> feeder -> trainer/core.py -> Redis;
feeder -> readahead.py -> task queue -> readers (dataset.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from taskq.admin.client import Client
from taskq.engine.contract import MAX_BATCH, MAX_HELD
from taskq.trainer.alldead import AllDeadWatch
from taskq.trainer.core import Trainer

from .. import errors
from ..inputwait import InputMeter
from ..models import Task
from . import signals
from .dataset import InProcess, TaskDataset
from .held import HeldTasks
from .readahead import ReadAhead

log = logging.getLogger("taskq.torch")

#: seconds a lease waits when this process holds nothing (no ack of ours can be pending)
_BLOCK_S = 2.0
#: how often to look for re-dispatched work while our own tasks are still being consumed
_TAIL_POLL_S = 0.5
#: how long an ack may wait for the next lease call to carry it, while feeding
_ACK_DELAY_S = 0.25
#: a job waiting for one of these reasons has its pass complete: a plain job at a
#: boundary; a sharded job with every shard done, at the barrier (its next step advances)
PASS_OVER = ("manual_advance", "barrier")
#: acks="commit": how long the loop may wait for a batch, with nothing left being read
#: and no lease possible under MAX_HELD, before that is an error (a batch read to its end
#: reaches the loop well within it)
_STARVED_S = 2.0


class Feeder(threading.Thread):
    """Leases for one loader iteration and performs its acks and fails.

    Args:
        dataset: the job, reader settings and trainer options.
        tasks: the readers' queue (workers' multiprocessing queue, or an in-process one).
        readers: how many readers take from ``tasks`` (one stop message each).
        finished: the number of tasks the readers finished reading so far.
        iteration: the loader's iteration number, carried by every message.
        pass_end: "global" (the pass is over when it is complete for everyone) or
            "local" (when nothing of it is left to lease, e.g. for DDP with Join).
        tasks_ahead: tasks leased and not yet read to their end, at most.
        after_pass: the pass the previous iteration finished, if it did.
        worker_id: the trainer's worker id.
        hold_acks: acks="commit": taken tasks stay held until ``commit()``; leases stop
            at MAX_HELD held, and a loop waiting for a batch that none of the tasks held
            can give is answered with an error (it must commit more often).
        spare: tasks queued per reader beyond its open ones (``readahead.py``).
        ends: the readers' cells of each task's current end (``Feed.ends``), written
            here when a task is split while read.
        opened: the readers' marks of the cells whose task they opened (``Feed.opened``):
            a moved end of a task not opened is reported at once (``ReadAhead.honours``).
        here: the in-process reader (``num_workers=0``): a moved end it will honour
            exactly is reported without waiting for it (``InProcess``).
        on_all_dead: "raise" (``AllTasksDead`` from the loop when every live task of
            the pass is dead) or "wait" (a warning a minute until an operator acts).
    """

    def __init__(
        self,
        dataset: TaskDataset,
        tasks: Any,
        readers: int,
        finished: Callable[[], int],
        iteration: int,
        pass_end: str,
        tasks_ahead: int,
        after_pass: int | None,
        worker_id: str | None,
        *,
        hold_acks: bool = False,
        input_meter: InputMeter | None = None,
        spare: int = 1,
        ends: Any = None,
        opened: Any = None,
        here: InProcess | None = None,
        on_all_dead: str = "raise",
    ) -> None:
        super().__init__(daemon=True, name=f"taskq-feeder-{dataset.job}")
        self.dataset = dataset
        self.iteration = iteration
        self.pass_end = pass_end
        self._wake = threading.Event()
        #: what this iteration holds and what the main thread asked about it (the main
        #: thread asks there; an ack, a fail or an end honoured wakes this thread)
        self.held = HeldTasks(dataset.job, self._wake.set)
        #: the readers' queue and end cells (the reserve is held, reserved)
        self.ahead = ReadAhead(
            self.held,
            tasks,
            readers,
            finished,
            iteration,
            tasks_ahead,
            dataset.interleave,
            spare,
            ends,
            opened,
            here,
        )
        #: tasks leased after the readers stopped (global pass end), read in-process
        self.tail = self.ahead.tail
        #: sent tasks whose end moved, not yet taken by the main thread (moved_ends)
        self.moved = self.ahead.moved
        self.after_pass = after_pass
        self.worker_id = worker_id
        self.hold_acks = hold_acks
        self.on_all_dead = on_all_dead
        self.all_dead: AllDeadWatch | None = None
        #: the loader's data-wait meter, sent with this iteration's trainer's heartbeats
        self.input_meter = input_meter
        #: when the main thread began waiting for a batch (monotonic), 0.0 when not
        self.main_waiting = 0.0
        self.end_state: str | None = None
        self.error: BaseException | None = None
        self.pass_no: int | None = None
        self.trainer: Trainer | None = None
        self._calls: deque[tuple[Callable[[Trainer], Any], Future[Any]]] = deque()
        self._finish = threading.Event()
        #: "feed" (readers take tasks), "tail" (global pass end: waiting for everyone,
        #: late work read in the main process), "end"
        self.phase = "feed"
        self._acks: list[Task] = []
        self._acks_since = 0.0
        self._sizes = False
        #: when this iteration last got a task (a stream's max_idle counts from it)
        self._got_at = time.monotonic()

    # -- the main thread's side ---------------------------------------------------
    def moved_ends(self) -> list[tuple[int, int, int]]:
        """(task, token, end) of the tasks sent to the readers whose end moved since the
        last call (a split while they are read: the main thread cuts them, cut.py)."""
        moved = self.moved
        return [moved.popleft() for _ in range(len(moved))]

    @property
    def calls_waiting(self) -> int:
        """Calls the main thread asked of this thread (``call``) not run yet."""
        return len(self._calls)

    def wake(self) -> None:
        """A reader finished a task (in-process readers call this): lease more now."""
        self._wake.set()

    def call(self, fn: Callable[[Trainer], Any], timeout: float = 60.0) -> Any:
        """Run ``fn(trainer)`` in this thread once what the main thread asked so far is
        done: its acks performed and the progress recorded sent (``flush_progress``).

        Raises:
            TaskqError: the iteration ended first; what ``fn`` raised.
        """
        fut: Future[Any] = Future()
        self._calls.append((fn, fut))
        self._wake.set()
        deadline = time.monotonic() + timeout
        while not fut.done():
            if not self.is_alive() or time.monotonic() > deadline:
                if not fut.done():
                    raise errors.TaskqError("the loader's iteration ended before the call")
            try:
                return fut.result(timeout=0.2)
            except FutureTimeout:
                continue
        return fut.result()

    def commit(self, acks: list[tuple[int, int]], reached: dict[tuple[int, int], int]) -> None:
        """Ack these (task, token) pairs and record how far the loop got into the held
        tasks of ``reached`` (progress sent at once), in this thread, now.

        Raises:
            TaskqError: the iteration ended first; ConnectionLost.
        """
        self.call(lambda trainer: self.held.commit(acks, reached))

    def park(self, keep: list[tuple[int, int]]) -> None:
        """End leasing for this iteration but keep the (task, token) pairs of ``keep``
        held (heartbeats go on) until ``commit()`` or ``finish()``; anything else held
        (work leased for a tail nobody reads) is released.

        Raises:
            TaskqError: the iteration ended first.
        """

        def run(trainer: Trainer) -> None:
            if self.phase != "end":
                self.phase = self._end("exhausted")
            self.held.keep_only(keep)

        self.call(run)

    def finish(self) -> None:
        """Perform what was asked, release anything still held, leave, and end."""
        self._finish.set()
        self._wake.set()

    # -- the thread ---------------------------------------------------------------
    def run(self) -> None:
        try:
            self._start()
            self._loop()
        except BaseException as e:  # handed to the main thread, which raises it
            self.error = e
            self._end("error")
        finally:
            try:
                self._flush()
            except BaseException as e:
                self.error = self.error or e
            while self._calls:
                self._calls.popleft()[1].set_exception(
                    errors.TaskqError("the loader's iteration ended before the call")
                )
            if self.trainer is not None:
                self.held.release_all()
                self.trainer.close()  # leaves the job
                if self.dataset.client is None:  # ours: no socket outlives the iteration
                    try:
                        self.trainer.connection.redis.close()
                    except Exception as e:
                        log.debug("closing the connections: %s", e)

    def _start(self) -> None:
        ds = self.dataset
        # signals reach the main thread only: the loader handles SIGTERM there (signals.py)
        options = {k: v for k, v in ds.trainer_options.items() if k != "handle_signals"}
        # the readers honour a task's range [start, end) and an end that moves
        options.setdefault("ranges", True)
        self.trainer = Trainer(
            ds.job,
            url=ds.url,
            client=ds.client,
            worker_id=self.worker_id,
            handle_signals=False,
            input_meter=self.input_meter,
            **options,
        )
        self.held.trainer = self.trainer
        #: admin reads (status, the job's handle, checkpoints) on the trainer's connection
        conn = self.trainer.connection
        self.client = ds.client or Client(redis_client=conn.redis, key_prefix=conn.prefix)
        self.all_dead = AllDeadWatch(self.client.job(ds.job), self.on_all_dead)
        #: tail splitting: the sizes of the tasks started go out at once (held.sizes)
        self._sizes = options.get("split_tails", True) is not False
        # a task is named here by its id in the whole job (``global_id``: a sharded job's
        # task ids are its shard's, two shards have tasks of the same id)
        self.held.key = self.trainer.global_id
        st = self.client.job(ds.job).status(summaries=0)
        self.held.splits = bool(st.config.get("split_tails"))
        pass_no = st.pass_no
        if self.after_pass is not None:
            pass_no = max(pass_no, self.after_pass + 1)
        elif st.state == "waiting" and st.reason in PASS_OVER:
            pass_no += 1  # the current pass is complete: this iteration is the next one
        self.pass_no = pass_no

    def _loop(self) -> None:
        assert self.trainer is not None and self.pass_no is not None
        assert self.all_dead is not None
        trainer, pass_no = self.trainer, self.pass_no
        last_poll = 0.0
        while True:
            new = self.held.collect()
            if new and not self._acks:
                self._acks_since = time.monotonic()
            self._acks += new
            # a task split while read: its reader learns the end it moved to
            for t, tok, end in self.ahead.sync_ends():
                self.held.honour(t, tok, end)  # reported at once (the split confirmed)
            if self._calls:
                self._run_calls()
            if self._finish.is_set():
                self._ack(self._take_acks())
                return
            if signals.leaving():
                # the process's SIGTERM landed on another thread: the main thread's
                # SystemExit waits for its blocking call to return; release now
                log.info("job %s: SIGTERM: releasing what this loader holds", self.dataset.job)
                self._ack(self._take_acks())
                return
            # a lease the server took back (say, the job was cancelled): ask it now
            revoked = self.held.drop_revoked()
            holding = self.held.count() > 0
            reading = self.ahead.reading()
            starts: list[Task] = []
            reserve = False
            if self.phase == "feed":
                starts, want, reserve = self.ahead.plan()
            elif self.phase == "tail":
                # a piece is leased to be read: nothing more while what is held is not
                # read to its end (a started lease taken now would wait behind it, out of
                # reach of an idle trainer's steal, and a tail with it)
                polled = holding and time.monotonic() - last_poll < _TAIL_POLL_S
                want = 0 if polled or self.held.unread() else 1
            else:
                want = 0
            if not want and not starts and not (revoked and self.phase != "end"):
                # while feeding, acks wait for the next lease call (one call for many
                # tasks) up to _ACK_DELAY_S; at a pass's tail everyone waits for them
                if self._acks and (
                    self.phase != "feed" or time.monotonic() - self._acks_since > _ACK_DELAY_S
                ):
                    self._ack(self._take_acks())
                # worker processes finishing a task do not wake us: look at their counts
                # (at the tail, with tasks held: their progress goes out often, the
                # replies tell a split of one, held.py)
                self._wait(0.05 if self.phase == "feed" else 0.1 if holding else 0.5)
                continue
            room = MAX_HELD - self.held.count()  # acks pending go out with the lease
            if room <= 0 and not starts:
                self._check_starved(reading)
                self._wait(0.05)
                continue
            want = max(0, min(want, room))
            if want:
                last_poll = time.monotonic()
            acks = self._take_acks()
            if len(acks) > MAX_BATCH:  # more than one call may carry: ack them apart
                self._ack(acks)
                acks = []
            self.held.acked += len(acks)
            if not want and not starts and not acks:
                continue
            try:
                # one call acks what the loop took, starts what the readers begin and
                # leases several (each call waits for the GIL behind a busy main thread
                # with num_workers=0)
                got = trainer.lease_many(
                    want,
                    0 if holding or acks or starts else _BLOCK_S,
                    pass_no,
                    acks=acks,
                    starts=starts,
                    reserve=reserve,
                )
            except errors.JobCompleted:
                self.phase = self._end("completed")
                continue
            except errors.JobCancelled:
                self.phase = self._end("cancelled")
                continue
            except errors.Draining:
                self.phase = self._end("draining")
                continue
            self.ahead.started(starts)
            if got:
                self._got_at = time.monotonic()
                self.all_dead.moved_on()
                self._nothing_to_lease(False)
                self.ahead.took(got, reserve, self.phase == "tail")
            if self._sizes and (starts or (got and not reserve)):
                self.held.sizes(starts + ([] if reserve else got))
            if got:
                continue
            if not want:
                continue
            if self._finish.is_set():
                continue
            # why nothing came, from the lease reply (trainer.state / reason / pass_no /
            # pass_complete: the job as the reply saw it)
            if trainer.state in ("completed", "cancelled"):
                self.phase = self._end(trainer.state)
            elif trainer.reason == "all_dead" and trainer.pass_no <= pass_no:
                # nothing comes until an operator retries the dead tasks or cancels: say
                # so (a warning a minute) or raise it in the loop (on_all_dead)
                self.all_dead.seen(trainer.pass_no)
                self._wait(0.5)
            elif trainer.pass_complete(pass_no):
                self.phase = self._end("pass_complete")
            elif trainer.pass_no < pass_no:
                if holding:
                    self._wait(0.5)  # the pass has not started; ours are still out
                elif self.pass_end == "local" and self.phase == "feed":
                    # the pass this iteration is for has not started and nothing of the
                    # last one is left to take (others hold it): nothing of it for us now.
                    # Waiting here kept a DDP rank in its loop while its peer, finishing
                    # that pass, was blocked in a collective on it
                    self.ahead.stop_readers()
                    self.phase = self._end("exhausted")
                    self.held.at_tail = True
            elif self.phase == "feed" and trainer.reason == "rewinding":
                self._wait(0.5)  # a rewind half done: the readers go on
            elif self.phase == "feed" and self.held.n_reserved:
                self.ahead.note_dry()  # the readers start the reserve first
            elif self.phase == "feed":
                self._nothing_now(holding, reading)
            elif holding:
                # at the tail with our own tasks: the loop goes on (progress out often,
                # held.py), the next look at the pass in _TAIL_POLL_S
                self._wait(0.1)

    def _nothing_now(self, holding: bool, reading: int) -> None:
        """The pass goes on, nothing of it was leasable now and nothing is reserved: is
        that its tail? What a reply does not say (an open stream, a pause, work left to
        others a while) is read from the job's status, once per such lease (at the
        pass's tail: once, the readers stop then)."""
        st = self.client.job(self.dataset.job).status(summaries=0)
        own = self.pass_no
        if st.state in ("completed", "cancelled"):
            self.phase = self._end(st.state)  # since the reply (its next would say so)
        elif own is not None and (
            st.pass_no > own
            or (st.pass_no == own and st.state == "waiting" and st.reason in PASS_OVER)
        ):
            self.phase = self._end("pass_complete")
        elif st.stream == "open" and st.state == "running":
            # an open stream with nothing now: more comes (the next lease call blocks
            # until an append wakes it); the readers go on, unless the loop asked to
            # end an iteration that found nothing for max_idle seconds (the readers read
            # all they were given: a last partial batch goes out when they stop). Its
            # readers done with what they hold, the loop waits for appends (a partial
            # batch in a worker holds the last task): not a wait for data
            self._nothing_to_lease(reading <= 0)
            idle = self.dataset.max_idle
            if idle is not None and reading <= 0 and time.monotonic() - self._got_at >= idle:
                self.phase = self._end("idle")
            elif holding:
                self._wait(0.5)
        elif st.state == "paused" or st.todo > 0:
            # nothing for us now, but the pass is not at its tail (paused, work left to
            # others a while): the readers go on
            self._wait(0.5)
        else:
            # nothing left to lease now: readers finish what they have
            self.ahead.stop_readers()
            self.phase = "tail" if self.pass_end == "global" else self._end("exhausted")
            self.held.at_tail = True

    def restart_readers(
        self, tasks: Any, ends: Any, finished: Callable[[], int], dead_held: set[int]
    ) -> int:
        """New reader processes replace the old ones (one died): give back the tasks the
        dead one was reading (progress first) and hand the new ones every other task
        held, from where the loop got, up to the end the loop honours for a task it cut
        (their entries say: held.py). Called in this thread (``call``).

        Returns:
            The number of tasks given back.
        """
        back = self.ahead.restart(tasks, ends, finished, dead_held)
        self.held.give_back(back)
        return len(back)

    def _check_starved(self, reading: int) -> None:
        """acks="commit" at the held bound: the loop waiting for a batch that nothing held
        can give would wait for ever (its uncommitted tasks fill the bound)."""
        since = self.main_waiting
        if (
            self.hold_acks
            and reading <= 0
            and since
            and time.monotonic() - since > _STARVED_S
            and self.main_waiting == since
        ):
            raise errors.TaskqError(
                f"job {self.dataset.job!r}: this trainer holds {self.held.count()} tasks, the "
                f"most one may hold ({MAX_HELD}), and the loop waits for more: with "
                "acks='commit' a task taken stays held until loader.commit(), so call "
                "commit() more often (what was not committed is given back, read again)"
            )

    def _run_calls(self) -> None:
        assert self.trainer is not None
        # what the main thread asked before its call (it may have asked since this
        # loop's last collect: a checkpoint must count that batch's acks and progress)
        self._acks += self.held.collect()
        self._ack(self._take_acks())
        self.trainer.flush_progress()
        while self._calls:
            fn, fut = self._calls.popleft()
            try:
                fut.set_result(fn(self.trainer))
            except BaseException as e:  # the caller raises it
                fut.set_exception(e)

    def _nothing_to_lease(self, idle: bool) -> None:
        """Mark the loop's meter while an open stream has nothing to lease and the readers
        nothing left to read (inputwait.py counts the loop's wait then apart)."""
        meter = self.input_meter
        if meter is None:
            return
        if idle:
            meter.idle_begin()
        else:
            meter.idle_end()

    def _end(self, state: str) -> str:
        self._nothing_to_lease(False)
        self.phase = "end"
        if self.end_state is None:
            self.end_state = state
        self.ahead.end()
        return "end"

    def _wait(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _flush(self) -> None:
        """Perform the main thread's acks (one call) and fails."""
        new = self.held.collect()
        self._ack(self._take_acks() + new)

    def _take_acks(self) -> list[Task]:
        acks, self._acks = self._acks, []
        return acks

    def _ack(self, acks: list[Task]) -> None:
        self.held.ack_now(acks)
