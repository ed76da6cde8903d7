"""``taskq.torch.DataLoader``: a torch DataLoader that acks what the training loop took.

``__iter__`` hands the dataset a task queue, starts torch's iterator (the workers fork
here, before any Redis connection or thread of this iteration exists), then starts the
feeder thread that owns the trainer, and returns the iteration's iterator
(``iteration.py``): it acks a task once the batch holding its last sample was taken, or
with ``acks="commit"`` at the next ``commit()``.

Data flow: training loop -> loader.py -> iteration.py -> feeder.py (trainer/core.py -> Redis);
workers (dataset.py) -> torch's result queue -> iteration.py.
"""

from __future__ import annotations

import multiprocessing
import queue
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

import torch.utils.data

from taskq.engine.contract import MAX_HELD
from taskq.trainer.alldead import check_mode
from taskq.trainer.core import default_worker_id

from .. import errors
from ..inputwait import InputMeter
from . import frameworks, resume, signals
from .dataset import END_SLOTS, NO_END, Feed, InProcess, TaskDataset
from .even import EvenSteps
from .feeder import PASS_OVER, Feeder
from .iteration import TaskqIter

_PASS_ENDS = ("global", "local")
_ACKS = ("taken", "commit")


class PassProgress(NamedTuple):
    """``DataLoader.progress()``: where the job is in the loader's pass, for a progress
    bar (what ``len(loader)`` gives a static loader)."""

    #: the loader's pass (its current or last iteration's)
    pass_no: int
    #: tasks of the pass finished (done or dead), by every trainer of the job
    done: int
    #: tasks in the pass
    total: int
    #: samples this loader's loop took in its current (or last) iteration
    samples: int
    #: samples of the pass finished (done, dead, or recorded as taken by their holders)
    #: by every trainer; None when a task's chunks do not say their size
    samples_done: int | None = None
    #: samples in the pass (None: as above)
    samples_total: int | None = None


class _Box:
    """An in-process stand-in for a shared ``Value``."""

    def __init__(self, value: int) -> None:
        self.value = value


def _passthrough(unit: Any) -> Any:
    return unit  # batches are collated in the reader, beside their tags


class DataLoader(torch.utils.data.DataLoader):  # type: ignore[type-arg]
    """A ``torch.utils.data.DataLoader`` over a ``TaskDataset`` whose tasks come from taskq.

    ``for batch in loader`` yields the batches of one pass and ends when the pass is
    complete for everyone (``pass_end="global"``) or when nothing of it is left for this
    loader to take (``"local"``: for DDP with ``torch.distributed.algorithms.Join``; the
    next ``iter(loader)`` then waits for the next pass). A completed or cancelled job ends
    the iteration at once. ``loader.state`` says why the last iteration ended.

    Args:
        dataset: a ``TaskDataset``.
        batch_size: samples per batch (None: one sample at a time, not collated).
        num_workers, collate_fn, pin_memory, drop_last, timeout, worker_init_fn,
            multiprocessing_context, prefetch_factor, persistent_workers,
            pin_memory_device: as in ``torch.utils.data.DataLoader`` (collate_fn and
            drop_last apply per worker, in the worker).
        on_error: "fail" (a task whose reader fails is failed with the error text and
            the loop goes on) or "raise" (also raise ``CorruptData`` from the loop).
        pass_end: "global" or "local" (see above); unset: "local" with
            ``even_steps``, else "global".
        acks: "taken" (a task is acked once the loop took its last sample, how far the
            loop got into the others is sent with the heartbeat) or "commit" (both wait
            for ``commit()`` or ``state_dict()``: a job restarted from its last
            checkpoint repeats nothing committed; see docs/torch.md for the trade-off).
        tasks_ahead: tasks leased and not yet read to their end, at most (default
            ``max(2, num_workers) * (interleave + 2)``).
        worker_id: the trainer's worker id (default ``host:pid:random``, kept for the
            loader's life).
        ahead: batches the training loop fetches before it steps on the one it got:
            the last ``ahead`` batches handed out are not counted as taken (acks,
            progress, ``state_dict()``, SIGTERM) until that many more were asked for.
            Unset: what the framework calling ``iter()`` needs (Lightning's ``fit``: 1,
            frameworks.py), else 0 (a plain loop).
        collective: ``state_dict()`` is a collective call of the default
            ``torch.distributed`` process group (frameworks call it on every rank):
            every rank sends what it took, rank 0 checkpoints, all return its state.
            Unset: when a framework calls ``state_dict()`` on each of several ranks
            (Lightning, accelerate's ``save_state``, the HF Trainer).
        even_steps: every rank of the ``torch.distributed`` process group yields a
            batch at the same calls, and the iteration ends on all at the same call: a
            rank whose pass is over before the others' repeats its last batch
            (``loss_weight`` 0.0 for it) until none has one (DDP under a loop without
            ``Join``; even.py). Unset: on under Lightning, the HF Trainer or an
            accelerate ``Accelerator`` that prepared the loader, over several ranks
            (the loader weights a repeat's loss by 0 in their loss or backward), else
            off; a loop of your own over several ``torch.distributed`` ranks gives it
            or ``pass_end`` (``iter()`` refuses otherwise). Set in a loop of your own,
            the loop must weight its loss by ``loader.loss_weight``: the loader
            refuses to go on past the first step that did not read it. Needs
            ``pass_end="local"``.
        on_all_dead: what the loop does when every live task of its pass is dead
            (each failed ``max_failures`` times; the job waits for an operator):
            ``"raise"`` (the default: ``AllTasksDead`` from the loop, naming the dead
            tasks, their last error and ``taskq tasks retry JOB`` / ``taskq job cancel
            JOB``: a training run does not hang in silence) or ``"wait"`` (that text as
            a warning once a minute; the loop goes on once they are retried).

    Raises:
        InvalidInput: a bad argument (a sampler or shuffle: order comes from the job).
    """

    #: the ``Accelerator`` whose ``prepare`` was given this loader (a weak reference)
    _prepared_by: Callable[[], Any] | None = None

    @property
    def _is_accelerate_prepared(self) -> bool:
        """accelerate's ``prepare`` passes a loader so marked through as it is (its own
        rebuild around the dataset would read the job without this loader), and its
        ``save_state`` / ``load_state`` call ``state_dict()`` / ``load_state_dict()`` of
        a stateful one: docs/frameworks.md. Asked from ``prepare``, the loader notes the
        ``Accelerator`` asking: ``iter()`` then knows the loop is accelerate's."""
        fw = frameworks.detect()
        if fw is not None and fw.kind == "accelerate":
            self._prepared_by = weakref.ref(fw.owner)
        return True

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:
        pass  # prepare marks what it prepared: this loader always is

    use_stateful_dataloader = True

    def __init__(
        self,
        dataset: TaskDataset,
        batch_size: int | None = 1,
        *,
        num_workers: int = 0,
        collate_fn: Any = None,
        drop_last: bool = False,
        on_error: str = "fail",
        pass_end: str | None = None,
        acks: str = "taken",
        tasks_ahead: int | None = None,
        worker_id: str | None = None,
        ahead: int | None = None,
        collective: bool | None = None,
        even_steps: bool | None = None,
        on_all_dead: str = "raise",
        **torch_options: Any,
    ) -> None:
        if not isinstance(dataset, TaskDataset):
            raise errors.InvalidInput("taskq.torch.DataLoader needs a taskq.torch.TaskDataset")
        for name in ("sampler", "batch_sampler", "shuffle", "generator"):
            if torch_options.get(name) is not None:
                raise errors.InvalidInput(
                    f"{name}= is not supported: the job gives the order "
                    "(TaskDataset(shuffle=, seed=) for inside a task)"
                )
        if torch_options.pop("in_order", False):
            raise errors.InvalidInput(
                "in_order=True is not supported: one worker waiting "
                "for a task would hold back the others' batches"
            )
        if on_error not in ("fail", "raise"):
            raise errors.InvalidInput(f"on_error must be 'fail' or 'raise', not {on_error!r}")
        check_mode(on_all_dead)
        if pass_end is not None and pass_end not in _PASS_ENDS:
            raise errors.InvalidInput(f"pass_end must be one of {_PASS_ENDS}, not {pass_end!r}")
        if acks not in _ACKS:
            raise errors.InvalidInput(f"acks must be one of {_ACKS}, not {acks!r}")
        if ahead is not None and not 0 <= ahead <= 8:
            raise errors.InvalidInput(f"ahead must be in [0, 8], got {ahead}")
        #: the settings given (None: inferred at each iter(), frameworks.py)
        self._given: dict[str, Any] = {
            "ahead": ahead,
            "collective": collective,
            "even_steps": even_steps,
            "pass_end": pass_end,
        }
        settings = frameworks.settle(self._given, None)  # InvalidInput: a bad mix
        if batch_size is not None and batch_size < 1:
            raise errors.InvalidInput(f"batch_size must be >= 1 or None, got {batch_size}")
        if drop_last and batch_size is None:
            raise errors.InvalidInput("drop_last needs a batch_size")
        super().__init__(
            dataset,
            batch_size=None,
            num_workers=num_workers,
            collate_fn=_passthrough,
            in_order=False,
            **torch_options,
        )
        self.samples_per_batch = batch_size
        self.user_collate_fn = collate_fn
        self.user_drop_last = drop_last
        self.on_error = on_error
        self.acks = acks
        self.on_all_dead = on_all_dead
        # what the running (or next) iteration does: settled again at each iter()
        self.ahead = settings.ahead
        self.pass_end = settings.pass_end
        self.even_steps = settings.even_steps
        #: the framework found at the last iter() (frameworks.py): "lightning",
        #: "transformers", "accelerate" or None (its trainer is not kept: a DDP model it
        #: holds must go before the process group, docs/frameworks.md)
        self.framework: str | None = None
        self._weighs_padding = False
        #: the loop read ``loss_weight`` or ``batch_is_padding`` (even_steps' check)
        self._padding_read = False
        self._even: EvenSteps | None = None
        #: load_state_dict() was called since the last iter() (frameworks.resume)
        self._state_loaded = False
        # what one trainer may hold is bounded (MAX_HELD): leased-ahead tasks plus those
        # whose samples are still on their way to the loop must stay under it
        limit = MAX_HELD // 2
        if tasks_ahead is not None and not 1 <= tasks_ahead <= limit:
            raise errors.InvalidInput(f"tasks_ahead must be in [1, {limit}], got {tasks_ahead}")
        self.tasks_ahead = tasks_ahead or min(limit, max(2, num_workers) * (dataset.interleave + 2))
        #: one worker id for all iterations (each registers anew under it)
        self.worker_id = worker_id or default_worker_id()
        self._state: str | None = None
        #: over this loader's life (cumulative, all iterations): "samples", "batches",
        #: "tasks_acked", "tasks_failed", "worker_restarts" (DataLoader workers that died
        #: and were replaced), "tasks_given_back" (the tasks those were reading),
        #: "samples_handed_on" (read ahead past a split task's point and not handed to
        #: the loop: the task's other piece has them, torchdata/cut.py),
        #: "padding_batches" (even_steps: repeats yielded while other ranks had batches)
        self.counts: Counter[str] = Counter()
        #: the loop's data wait (``next(loader)``) and steps, sent with the heartbeats
        self.input_meter = InputMeter()
        self._done_pass: int | None = None
        self._iteration_no = 0
        self._feed: Feed | None = None
        self._current: TaskqIter | None = None
        self._status_client: Any = None  # progress(): one client for its status calls
        self._job: Any = None  # progress(): the job's handle (plain or sharded)
        self._sizes: dict[str, Any] = {}  # progress(): the tasks' sizes, read once
        #: a mixed job's samples per source of the iterations before the current one
        self._mix_before: Counter[str] = Counter()

    @property
    def state(self) -> str | None:
        """Why the last iteration ended: "pass_complete", "completed" (the job is over),
        "cancelled", "exhausted" (pass_end="local": nothing of the pass was left to take;
        "completed" once the job completed after it, as when this was its last pass),
        "draining"; None before the first iteration ended."""
        if self._state == "exhausted" and self.pass_end == "local":
            ds: TaskDataset = self.dataset  # type: ignore[assignment]
            try:
                with resume.client_of(ds) as client:
                    st = client.job(ds.job).status(summaries=0)
            except errors.TaskqError:
                return self._state
            if st.state == "completed":
                self._state = "completed"
        return self._state

    @state.setter
    def state(self, value: str | None) -> None:
        self._state = value

    @property
    def pass_no(self) -> int | None:
        """The pass of the current (or last) iteration; None before the first one."""
        cur = self._current
        return None if cur is None else cur.feeder.pass_no

    @property
    def batch_pass(self) -> int | None:
        """The pass of the batch the loop steps on (the one yielded last; with
        ``ahead=k`` the one yielded k calls ago) — the oldest pass when it mixes two;
        None before the first batch and for a padding batch. With ``pass_end="local"``
        an iteration may begin with what is left of the previous pass (a task that came
        back from a lost trainer): its batches say so here, not ``pass_no``."""
        passes = self.batch_passes
        return min(passes) if passes else None

    @property
    def batch_passes(self) -> dict[int, int]:
        """The batch the loop steps on (as ``batch_pass``): its samples per pass
        (``{pass: samples}``)."""
        cur = self._current
        return {} if cur is None else dict(cur.stepped[0])

    @property
    def batch_sources(self) -> list[str | None]:
        """The source job of each row of the batch the loop steps on (as
        ``batch_pass``), for a mixed job (docs/mixing.md); None for a row of another
        job's task; [] before the first batch and for a padding batch."""
        cur = self._current
        return [] if cur is None else list(cur.stepped[2])

    def mix_counts(self) -> dict[str, int]:
        """A mixed job's samples per source this loader's loop stepped on, over its
        iterations, up to the batch it steps on (``batch_sources``): what an online
        mixing policy reads to set the next weights (``job.set_weights``). Local to this
        loader; the job's counts over every trainer: ``job.mix_status()``."""
        cur = self._current
        return dict(self._mix_before + (Counter() if cur is None else cur.mix_stepped()))

    @property
    def collective(self) -> bool:
        """Whether ``state_dict()`` is a collective call now: as given, or inferred from
        its caller (frameworks.py)."""
        return frameworks.collective(self._given["collective"])

    @property
    def batch_is_padding(self) -> bool:
        """``even_steps``: the batch the loop steps on is a repeat this rank yields
        while the others still have batches (its samples were taken before); see
        ``loss_weight``."""
        self._padding_read = True
        cur = self._current
        return cur is not None and cur.stepped[1]

    @property
    def loss_weight(self) -> float:
        """The weight of the loss of the batch the loop steps on: 0.0 for a padding
        batch (``even_steps``: a repeat of one already trained, stepped on beside the
        other ranks), else 1.0. A loop of your own under ``even_steps`` returns
        ``loss * loader.loss_weight``; Lightning's and the HF Trainer's losses are
        weighted by the loader itself."""
        return 0.0 if self.batch_is_padding else 1.0

    def padding_weighted(self) -> bool:
        """even_steps' check, after the loop's first step: is a padding batch's loss
        weighted (by the framework's integration, or by the loop, which read
        ``loss_weight`` or ``batch_is_padding``)?"""
        return self._weighs_padding or self._padding_read

    def progress(self) -> PassProgress:
        """How far the job is through this loader's pass, over all trainers (a status
        call and the sample count's reads; call it every few dozen steps, not every
        step).

        Returns:
            ``PassProgress``: tasks finished (done or dead) and tasks in the pass; samples
            finished and in the pass (None when a task's chunks do not say their size;
            the first call reads every task's size once); and the samples this loader's
            loop took in its current iteration.

        Raises:
            JobNotFound, ConnectionLost.
        """
        ds: TaskDataset = self.dataset  # type: ignore[assignment]
        if self._status_client is None:
            from taskq.admin.client import Client

            self._status_client = ds.client or Client(ds.url)
        if self._job is None:
            self._job = self._status_client.job(ds.job)
        st = self._job.status(summaries=0)
        mine = self.pass_no
        finished, total = self._job.samples(self._sizes)
        done = st.done + st.dead
        if mine is not None and st.pass_no > mine:
            done, finished = st.tasks, total or 0  # the loader's pass is over
        elif mine is not None and st.pass_no < mine:
            done, finished = 0, 0  # the loader waits for its pass to begin
        elif st.state == "completed" or (st.state == "waiting" and st.reason in PASS_OVER):
            done, finished = st.tasks, total or 0
        cur = self._current
        return PassProgress(
            st.pass_no if mine is None else mine,
            done,
            st.tasks,
            0 if cur is None else cur.samples,
            None if total is None else finished,
            total,
        )

    def __len__(self) -> int:
        """No length: a pass's batches are not known ahead (other trainers take some of its
        tasks); ``progress()`` says how far the pass is. transformers' ``Trainer`` asks
        first thing in ``train()``: the loader hooks it then (frameworks.py).

        Raises:
            TypeError: always (as ``len()`` of an iterable dataset).
        """
        frameworks.asked_length(self)
        raise TypeError("taskq.torch.DataLoader has no length: see loader.progress()")

    def __iter__(self) -> TaskqIter:  # type: ignore[override]
        cur = self._current
        n = 0 if cur is None else cur.uncommitted()
        if n:
            raise errors.TaskqError(
                f"the loader's last iteration took from {n} task(s) it did not commit: "
                "call loader.commit() (or loader.close() to give them back, to be read "
                "again) before the next iter()"
            )
        self.end_current()
        self._settle()
        self._iteration_no += 1
        ds: TaskDataset = self.dataset  # type: ignore[assignment]
        if ds.trainer_options.get("handle_signals", True):
            signals.install()  # SIGTERM: SystemExit in the loop, everything released
        fresh = not (self.persistent_workers and self._iterator is not None)
        if self.num_workers == 0:
            feed = Feed(
                queue.Queue(),
                _Box(self._iteration_no),
                [0],
                self.samples_per_batch,
                self.user_collate_fn,
                self.user_drop_last,
                ends=[NO_END] * END_SLOTS,
                opened=[0] * END_SLOTS,
                here=InProcess(),
            )
        elif fresh or self._feed is None:
            if self._feed is not None:
                self._feed.retire()  # its feeder thread ends before the fork
            feed = self._worker_feed(self._iteration_no)
        else:
            feed = self._feed
        feed.iteration.value = self._iteration_no
        self._feed = ds.feed = feed
        # the workers start (fork) here, before this iteration's trainer and threads
        torch_iter = self._start_workers()
        start = sum(feed.finished)
        feeder = Feeder(
            ds,
            feed.tasks,
            max(1, self.num_workers),
            lambda: sum(feed.finished) - start,
            self._iteration_no,
            self.pass_end,
            self.tasks_ahead,
            self._done_pass,
            self.worker_id,
            hold_acks=self.acks == "commit",
            input_meter=self.input_meter,
            spare=0 if self.num_workers == 0 else 1,
            ends=feed.ends,
            opened=feed.opened,
            here=feed.here,
            on_all_dead=self.on_all_dead,
        )
        if self.num_workers == 0:
            feed.on_finished = feeder.wake
        feeder.start()
        # even_steps: every rank is here (an epoch's iter()); the agreement's group too
        even = (
            self._even
            if self.even_steps and self._even is not None and self._even.start()
            else None
        )
        if self._current is not None:
            self._mix_before += self._current.mix_stepped()
        self._current = TaskqIter(self, torch_iter, feeder, feed, even)
        return self._current

    def _settle(self) -> None:
        """This iteration's settings: those given, the rest from the framework calling
        ``iter()`` (frameworks.py), which also gets what it needs beside them.

        Raises:
            InvalidInput: a given setting the framework contradicts (one line).
        """
        fw = frameworks.detect()
        if fw is None and self._prepared_by is not None:
            accelerator = self._prepared_by()
            if accelerator is not None:
                fw = frameworks.Framework("accelerate", accelerator, accelerator.num_processes)
        settings = frameworks.settle(self._given, fw, 1 if fw else frameworks.ranks())
        self.framework = None if fw is None else fw.kind
        self.ahead, self.pass_end = settings.ahead, settings.pass_end
        self.even_steps = settings.even_steps
        self._weighs_padding = settings.weighs_padding
        if settings.even_steps and self._even is None:
            self._even = EvenSteps()
        frameworks.install(fw, settings, self)
        loaded, self._state_loaded = self._state_loaded, False
        frameworks.resume(fw, self, loaded)  # transformers' train(resume_from_checkpoint=)

    def _worker_feed(self, iteration: int) -> Feed:
        """A new task queue and shared counters for a run of worker processes."""
        ctx = self.multiprocessing_context or multiprocessing.get_context()
        ds: TaskDataset = self.dataset  # type: ignore[assignment]
        return Feed(
            ctx.Queue(),
            ctx.RawValue("q", iteration),
            ctx.RawArray("q", self.num_workers),
            self.samples_per_batch,
            self.user_collate_fn,
            self.user_drop_last,
            taken=ctx.RawArray("q", self.num_workers),
            reading=ctx.RawArray("q", [-1] * (self.num_workers * ds.interleave)),
            width=ds.interleave,
            ends=ctx.RawArray("q", [NO_END] * END_SLOTS),
            opened=ctx.RawArray("b", END_SLOTS),
        )

    def _start_workers(self) -> Any:
        """torch's iterator over the dataset (its workers start here). torch's SIGCHLD
        handler would raise a worker's death in the main thread wherever it is (in the
        loop body too); the iteration watches its workers itself and restarts them
        (iteration.py), so the handler is told to leave these alone."""
        torch_iter: Any = super().__iter__()
        if getattr(torch_iter, "_worker_pids_set", False):
            from torch.utils.data import _utils

            _utils.signal_handling._remove_worker_pids(id(torch_iter))
            torch_iter._worker_pids_set = False
        return torch_iter

    def sync(self) -> None:
        """Ack the tasks the loop finished and send how far it got into the others, now
        (not at the next step or heartbeat): each data-parallel rank calls it before the
        one that checkpoints calls ``state_dict()`` (see docs/torch.md). With
        ``acks="commit"`` it is ``commit()``."""
        self.commit()

    def commit(self) -> int:
        """Commit what the loop took so far (the batch handed out last included): ack
        the tasks it took to their end and record how far it got into the others, now.
        With ``acks="commit"`` nothing is acked or recorded otherwise: after a crash the
        tasks' next holders read again what the loop took since the last commit. Call it
        where the model's state is saved (``state_dict()`` commits first) and often
        enough: one trainer holds at most 64 tasks, uncommitted ones included.

        Returns:
            The number of tasks acked.

        Raises:
            TaskqError: the iteration ended with an error before (it gave back what it
                held: nothing was committed); ConnectionLost.
        """
        cur = self._current
        return 0 if cur is None else cur.commit()

    def state_dict(self, ckpt: str | None = None) -> dict[str, Any]:
        """Checkpoint the job's position and name it, for the model's checkpoint
        (``taskq/torchdata/resume.py``; docs/torch.md).

        Args:
            ckpt: the checkpoint's id (default: a new time-ordered one).

        Returns:
            ``taskq.admin.checkpoints.state_of(job, record)``: a small JSON-able dict.

        Raises:
            InvalidInput, JobNotFound, JobCancelled, ConnectionLost.
        """
        return resume.state_dict(self, ckpt)

    def load_state_dict(self, state: dict[str, Any], key: str | None = None) -> bool:
        """Put the job back to the checkpoint ``state`` names, once per restart
        (``taskq/torchdata/resume.py``; docs/torch.md).

        Args:
            state: what ``state_dict()`` returned.
            key: what names this restart (default: with a ``torch.distributed``
                process group, one rank 0 makes and broadcasts: every rank calls this;
                under torchrun without a group it is refused; see docs/torch.md).

        Returns:
            True when this call rewound the job.

        Raises:
            InvalidInput, JobNotFound, JobCancelled, ConnectionLost.
        """
        self._state_loaded = True
        return resume.load_state_dict(self, state, key)

    # what its iterations and resume.py see of the loader (host.py)

    @property
    def current(self) -> TaskqIter | None:
        """The running iteration, if any."""
        return self._current

    def end_current(self, forget_pass: bool = False) -> None:
        """End the running iteration (releasing what it holds); ``forget_pass``: the
        next iteration asks the job which pass it is in."""
        cur = self._current
        if cur is not None:
            cur.close()
        if forget_pass:
            self._done_pass = None

    def iteration_ended(self, state: str | None, done_pass: int | None) -> None:
        """An iteration ended with ``state``; ``done_pass``: the pass it finished."""
        self.state = state
        if done_pass is not None:
            self._done_pass = done_pass

    def drop_workers(self, torch_iter: Any) -> None:
        """Forget ``torch_iter`` as the kept (persistent) worker iterator."""
        if self._iterator is torch_iter:
            self._iterator = None

    def restart_workers(self, iteration_no: int) -> tuple[Feed, Any]:
        """A new task queue for the iteration and torch's iterator over new workers
        (after a worker died: the old queue's lock may be held by the dead one)."""
        ds: TaskDataset = self.dataset  # type: ignore[assignment]
        feed = self._worker_feed(iteration_no)
        self._feed = ds.feed = feed
        return feed, self._start_workers()

    def close(self) -> None:
        """End the current iteration (releasing what it holds, uncommitted tasks too,
        leaving the job), stop persistent workers and close the workers' task queue.
        Idempotent."""
        self.end_current()
        it = self._iterator
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self._iterator = None
        if self._feed is not None:
            self._feed.retire()  # its feeder thread, which would live through forks, ends
            self._feed = self.dataset.feed = None  # type: ignore[attr-defined]
        if self._even is not None:
            self._even.close()
        client, self._status_client, self._job = self._status_client, None, None
        if client is not None and client is not self.dataset.client:  # type: ignore[attr-defined]
            client.redis.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
