"""A trainer's ways to take tasks: ``lease`` / ``lease_many``, iteration, ``passes()``,
``batches(k)``.

``TrainerIteration`` is the part of ``Trainer`` (trainer.py) a training loop drives: each
step acks the previous task, starts a reserved one and leases the next in one call
(trainer_calls.py's ``_step``), and waits on the wake-up lists when there is no work.

Data flow: training loop -> trainer_iter.py -> trainer_calls.py -> protocol.py -> Redis.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator, Sequence

from . import errors
from .models import Task
from .trainer_beats import TrainerBeats
from .trainer_calls import (
    _MAX_BLOCK_S,
    DRAINING,
    JOB_CANCELLED,
    JOB_COMPLETED,
    OK,
    PASS_DONE,
    REREGISTER,
    STALE,
)

log = logging.getLogger("taskq.trainer")


class TrainerIteration(TrainerBeats):
    """The iteration modes of a ``Trainer``; not used on its own."""

    # -- the public calls ---------------------------------------------------------
    def lease(
        self,
        timeout: float = 2.0,
        expect_pass: int | None = None,
        acks: Sequence[Task] = (),
    ) -> Task | None:
        """Lease one task, started; with ``acks``, ack those in the same call.

        Args:
            timeout: seconds to wait for work (0: do not wait).
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
        tasks = self._lease_n(
            1, timeout, expect_pass, acks=self._still_held(acks), raise_corrupt=True
        )
        return tasks[0] if tasks else None

    def lease_many(
        self,
        n: int,
        timeout: float = 2.0,
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
            timeout: seconds to wait for work (0: do not wait).
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
            InvalidInput: ``n < 0``, or 0 with neither acks nor starts.
            JobCompleted, JobCancelled, JobNotFound, Draining, ConnectionLost: as ``lease``.
        """
        if n < 0 or (n == 0 and not acks and not starts):
            raise errors.InvalidInput(f"n must be >= 1 (0 with acks or starts), got {n}")
        return self._lease_n(
            n,
            timeout,
            expect_pass,
            acks=self._still_held(acks),
            starts=list(starts),
            mode="R" if reserve else "S",
        )

    def _still_held(self, acks: Sequence[Task]) -> list[Task]:
        with self._lock:
            return [t for t in acks if self._held.get(t.id) is t]

    def _lease_n(
        self,
        n: int,
        timeout: float,
        expect_pass: int | None,
        acks: list[Task] | None = None,
        raise_corrupt: bool = False,
        starts: list[Task] | None = None,
        mode: str = "S",
    ) -> list[Task]:
        deadline = time.monotonic() + timeout
        acks = list(acks or [])
        starts = starts or []
        while True:
            r = self._retrying(
                self._step, acks, starts, n, mode, -1 if expect_pass is None else expect_pass
            )
            if acks and STALE in r.ack_res:
                self._check_acks(acks, r.ack_res, raise_stale=False)
            acks, starts = [], []
            bad = self._fail_corrupt(r.corrupt) if r.corrupt else []
            if r.code == REREGISTER:
                continue
            if r.code == DRAINING:
                self._draining = True
                raise errors.Draining(f"worker {self.worker_id} is draining")
            if r.code == JOB_COMPLETED or r.code == JOB_CANCELLED:
                self._end_code(r.code)
            if bad and raise_corrupt:
                raise bad[0]
            if r.granted or r.code == PASS_DONE or n == 0:
                return r.granted
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            if not bad:
                self._retrying(
                    self._wait, min(remaining, r.wait_s) if r.wait_s > 0 else remaining, r.gen
                )

    # -- iteration ----------------------------------------------------------------
    def __iter__(self) -> Iterator[Task]:
        return self._iterate(None)

    def _iterate(self, expect_pass: int | None) -> Iterator[Task]:
        """``_tasks`` with each ``next()`` timed by the trainer's input meter (its data
        wait; the time between two ``next()`` calls is the step)."""
        meter = self.input_meter
        tasks = self._tasks(expect_pass)
        meter.restart()
        try:
            while True:
                meter.enter()
                task = next(tasks, None)
                if task is None:
                    return
                meter.leave()
                yield task
        finally:
            meter.stop()
            tasks.close()

    def _tasks(self, expect_pass: int | None) -> Generator[Task, None, None]:
        current: Task | None = None
        ep = -1 if expect_pass is None else expect_pass
        while True:
            acks: list[Task] = []
            starts: list[Task] = []
            with self._lock:
                if current is not None and self._held.get(current.id) is current:
                    acks = [current]
                if self._reserved:
                    starts = [self._reserved.popleft()]
            if current is not None and current._revoked is not None and current._revoked.is_set():
                log.warning(
                    "job %s: lease of task %s was revoked; its result is not counted",
                    self.job,
                    current.id,
                )
                acks = []
            current = None
            if self._draining:
                if acks:
                    self._retrying(self._step, acks, [], 0, "S", ep)
                return
            if starts:
                want, mode = self.prefetch - len(self._reserved), "R"
            else:
                want, mode = 1 + self.prefetch, "F"
            try:
                r = self._retrying(self._step, acks, starts, want, mode, ep)
            except (errors.JobNotFound, errors.JobCancelled):
                self._mark_all_revoked()
                raise
            if acks and STALE in r.ack_res:
                self._check_acks(acks, r.ack_res, raise_stale=False)
            # logged; the loop goes on with other work
            bad = self._fail_corrupt(r.corrupt) if r.corrupt else []
            code, got = r.code, r.granted
            if code == REREGISTER:
                continue
            if code == DRAINING:
                self._draining = True
                return
            if code == JOB_COMPLETED or code == JOB_CANCELLED:
                self._mark_all_revoked()
                return
            if starts and r.start_res and r.start_res[0] == OK:
                current = starts[0]
            with self._lock:
                for t in got:
                    if t.started and current is None:
                        current = t
                    else:
                        self._reserved.append(t)
            if current is not None:
                yield current
                continue
            if code == PASS_DONE:
                self._release_reserved()
                return
            if not got and not starts and not bad:
                self._retrying(self._wait, r.wait_s if r.wait_s > 0 else _MAX_BLOCK_S, r.gen)

    def _release_reserved(self) -> None:
        with self._lock:
            reserved = list(self._reserved)
        if reserved:
            try:
                self.release(reserved)
            except errors.LeaseLost:
                pass

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
        try:
            pass_no = self.client.status(self.job, summaries=0).pass_no
        except errors.JobNotFound:
            return
        while self._state not in ("completed", "cancelled") and not self._closed:
            yield self._iterate(pass_no)
            if self._draining:
                return
            pass_no = max(pass_no + 1, self._pass)

    def batches(self, k: int) -> Iterator[list[Task]]:
        """Lists of up to ``k`` tasks started together and acked together (one call per
        batch); ends when the job is completed or cancelled, or this worker drains.

        Args:
            k: the most tasks in one batch.

        Returns:
            An iterator of batches (tasks with unreadable chunks are failed and left out).

        Raises:
            InvalidInput: ``k < 1``.
            JobNotFound: the job was deleted or replaced.
        """
        if k < 1:
            raise errors.InvalidInput(f"batch size must be >= 1, got {k}")
        batch: list[Task] = []
        meter = self.input_meter
        meter.restart()
        try:
            while True:
                meter.enter()
                try:
                    batch = self._lease_n(k, _MAX_BLOCK_S, None, acks=self._still_held(batch))
                except (errors.JobCompleted, errors.JobCancelled, errors.Draining):
                    return
                if batch:
                    meter.leave()
                    yield batch
        finally:
            meter.stop()
