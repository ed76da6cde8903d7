"""``taskq.torch.DataLoader``: a torch DataLoader that acks what the training loop took.

``__iter__`` hands the dataset a task queue, starts torch's iterator (the workers fork
here, before any Redis connection or thread of this iteration exists), then starts the
feeder thread that owns the trainer. The iterator returned strips the per-sample tags
off each batch and acks a task once the batch holding its last sample was taken: on the
next ``__next__`` (the step finished) or at the end of the iteration. If torch raises (a
worker died), every task held and not taken to its end is released, then the error is
raised again.

Data flow: training loop -> loader.py -> feeder.py (trainer.py -> Redis);
workers (dataset.py) -> torch's result queue -> loader.py.
"""

from __future__ import annotations

import multiprocessing
import queue
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any, NoReturn

import torch.utils.data

from .. import errors
from ..scripts import MAX_HELD
from ..trainer import default_worker_id
from .dataset import Feed, TaskDataset, TaskMsg, Unit, stop_msg
from .feeder import Feeder

_PASS_ENDS = ("global", "local")
_JOIN_S = 15.0


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
        pass_end: "global" or "local" (see above).
        tasks_ahead: tasks leased and not yet read to their end, at most (default
            ``max(2, num_workers) * (interleave + 2)``).
        worker_id: the trainer's worker id (default ``host:pid:random``, kept for the
            loader's life).

    Raises:
        InvalidInput: a bad argument (a sampler or shuffle: order comes from the job).
    """

    def __init__(
        self,
        dataset: TaskDataset,
        batch_size: int | None = 1,
        *,
        num_workers: int = 0,
        collate_fn: Any = None,
        drop_last: bool = False,
        on_error: str = "fail",
        pass_end: str = "global",
        tasks_ahead: int | None = None,
        worker_id: str | None = None,
        **torch_options: Any,
    ) -> None:
        if not isinstance(dataset, TaskDataset):
            raise errors.InvalidInput("taskq.torch.DataLoader needs a taskq.torch.TaskDataset")
        for name in ("sampler", "batch_sampler", "shuffle", "generator"):
            if torch_options.get(name) is not None:
                raise errors.InvalidInput(f"{name}= is not supported: the job gives the order "
                                          "(TaskDataset(shuffle=, seed=) for inside a task)")
        if torch_options.pop("in_order", False):
            raise errors.InvalidInput("in_order=True is not supported: one worker waiting "
                                      "for a task would hold back the others' batches")
        if on_error not in ("fail", "raise"):
            raise errors.InvalidInput(f"on_error must be 'fail' or 'raise', not {on_error!r}")
        if pass_end not in _PASS_ENDS:
            raise errors.InvalidInput(f"pass_end must be one of {_PASS_ENDS}, not {pass_end!r}")
        if batch_size is not None and batch_size < 1:
            raise errors.InvalidInput(f"batch_size must be >= 1 or None, got {batch_size}")
        if drop_last and batch_size is None:
            raise errors.InvalidInput("drop_last needs a batch_size")
        super().__init__(dataset, batch_size=None, num_workers=num_workers,
                         collate_fn=_passthrough, in_order=False, **torch_options)
        self.samples_per_batch = batch_size
        self.user_collate_fn = collate_fn
        self.user_drop_last = drop_last
        self.on_error = on_error
        self.pass_end = pass_end
        # what one trainer may hold is bounded (MAX_HELD): leased-ahead tasks plus those
        # whose samples are still on their way to the loop must stay under it
        limit = MAX_HELD // 2
        if tasks_ahead is not None and not 1 <= tasks_ahead <= limit:
            raise errors.InvalidInput(f"tasks_ahead must be in [1, {limit}], got {tasks_ahead}")
        self.tasks_ahead = tasks_ahead or min(limit,
                                              max(2, num_workers) * (dataset.interleave + 2))
        #: one worker id for all iterations (each registers anew under it)
        self.worker_id = worker_id or default_worker_id()
        #: why the last iteration ended: "pass_complete", "completed", "cancelled",
        #: "exhausted" (pass_end="local"), "draining"; None before the first one ended
        self.state: str | None = None
        #: samples, batches, tasks acked and failed over this loader's life
        self.counts: Counter[str] = Counter()
        self._done_pass: int | None = None
        self._iteration_no = 0
        self._feed: Feed | None = None
        self._current: _TaskqIter | None = None

    @property
    def pass_no(self) -> int | None:
        """The pass of the current (or last) iteration; None before the first one."""
        cur = self._current
        return None if cur is None else cur.feeder.pass_no

    def __iter__(self) -> _TaskqIter:  # type: ignore[override]
        self._end_current()
        self._iteration_no += 1
        ds: TaskDataset = self.dataset  # type: ignore[assignment]
        fresh = not (self.persistent_workers and self._iterator is not None)
        if self.num_workers == 0:
            feed = Feed(queue.Queue(), _Box(self._iteration_no), [0],
                        self.samples_per_batch, self.user_collate_fn, self.user_drop_last)
        elif fresh or self._feed is None:
            if self._feed is not None and self._feed.tasks is not None:
                _retire(self._feed.tasks)  # its feeder thread must not live through the fork
            ctx = self.multiprocessing_context or multiprocessing.get_context()
            feed = Feed(ctx.Queue(), ctx.RawValue("q", self._iteration_no),
                        ctx.RawArray("q", self.num_workers), self.samples_per_batch,
                        self.user_collate_fn, self.user_drop_last)
        else:
            feed = self._feed
        feed.iteration.value = self._iteration_no
        self._feed = ds.feed = feed
        # the workers start (fork) here, before this iteration's trainer and threads
        torch_iter = super().__iter__()
        start = sum(feed.finished)
        feeder = Feeder(ds, feed.tasks, max(1, self.num_workers),
                        lambda: sum(feed.finished) - start, self._iteration_no,
                        self.pass_end, self.tasks_ahead, self._done_pass, self.worker_id,
                        lambda: list(getattr(torch_iter, "_workers", ())))
        if self.num_workers == 0:
            feed.on_finished = feeder.wake
        feeder.start()
        self._current = _TaskqIter(self, torch_iter, feeder, feed)
        return self._current

    def _end_current(self) -> None:
        cur = self._current
        if cur is not None and not cur.ended:
            cur.close()

    def close(self) -> None:
        """End the current iteration (releasing what it holds, leaving the job) and stop
        persistent workers. Idempotent."""
        self._end_current()
        it = self._iterator
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self._iterator = None

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _TaskqIter:
    """One pass of a ``taskq.torch.DataLoader``: yields the user's batches."""

    def __init__(self, loader: DataLoader, torch_iter: Any, feeder: Feeder, feed: Feed) -> None:
        self.loader_ref = weakref.ref(loader)
        self.torch_iter: Any = torch_iter
        self.feeder = feeder
        self.feed = feed
        self.on_error = loader.on_error
        self.pass_end = loader.pass_end
        self.ended = False
        self.tail: Iterator[Unit] | None = None
        self._taken: list[tuple[int, int]] = []
        # dropped unfinished (a `break` out of the loop): release, leave, stop the thread
        self._finalizer = weakref.finalize(self, _abandon, feeder, feed)

    def __iter__(self) -> _TaskqIter:
        return self

    def __next__(self) -> Any:
        if self.ended:
            raise StopIteration
        try:
            return self._next()
        except StopIteration:
            raise
        except BaseException:
            # the step before this call finished: what it took counts as taken
            self._end(ack_taken=True, shutdown=True)
            raise

    def _next(self) -> Any:
        counts = self._counts()
        if self._taken:
            self.feeder.ack(self._taken)
            self._taken = []
        while True:
            if self.feeder.error is not None:
                raise self.feeder.error
            if self.feeder.end_state in ("completed", "cancelled"):
                self._finish()
            unit = self._next_unit()
            if unit is None:
                self._finish()
            tags, ctrl, batch = unit
            self._control(ctrl)
            finished = []
            holds = self.feeder.holds
            for task_id, token, _, last in tags:
                if last and holds(task_id, token):
                    finished.append((task_id, token))
            if batch is None:
                self.feeder.ack(finished)  # dropped (drop_last): nothing left to take
                continue
            self._taken = finished
            counts["samples"] += len(tags)
            counts["batches"] += 1
            return batch

    def _counts(self) -> Counter[str]:
        loader = self.loader_ref()
        return loader.counts if loader is not None else Counter()

    def _next_unit(self) -> Unit | None:
        if self.torch_iter is not None:
            try:
                unit: Unit = next(self.torch_iter)
                return unit
            except StopIteration:
                self.torch_iter = None
                if self.pass_end == "local":
                    return None
                self.tail = self._tail_units()
        if self.tail is None:
            return None
        return next(self.tail, None)

    def _tail_units(self) -> Iterator[Unit]:
        """Work leased after the readers stopped (re-dispatched from a lost trainer),
        read here in the main process until the pass is complete for everyone."""
        ds: TaskDataset = self.feeder.dataset
        tail, it_no = self.feeder.tail, self.feeder.iteration

        def take(block: bool) -> TaskMsg | None:
            while True:
                try:
                    return tail.get(timeout=0.25) if block else tail.get_nowait()
                except queue.Empty:
                    if not block:
                        return None
                    if not self.feeder.is_alive():
                        return stop_msg(it_no)

        return ds.units(take, self.feed, lambda: None, flush_when_idle=True,
                        rng_key=f"tail:{it_no}")

    def _control(self, ctrl: list[Any]) -> None:
        holds = self.feeder.holds
        for kind, task_id, token, text in ctrl:
            if not holds(task_id, token):
                continue
            if kind == "done":
                self.feeder.ack([(task_id, token)])
                continue
            self.feeder.fail(task_id, token, text)
            if self.on_error == "raise":
                raise errors.CorruptData(f"job {self.feeder.dataset.job!r} task {task_id}: "
                                         f"{text}")

    def _finish(self) -> NoReturn:
        self._end(ack_taken=True, shutdown=False, raise_error=True)
        raise StopIteration

    def _end(self, ack_taken: bool, shutdown: bool, raise_error: bool = False) -> None:
        if self.ended:
            return
        self.ended = True
        self._finalizer.detach()
        feeder = self.feeder
        if ack_taken and self._taken:
            feeder.ack(self._taken)
        self._taken = []
        if shutdown or self.torch_iter is not None:
            self._stop_workers(shutdown)
        feeder.finish()
        feeder.join(_JOIN_S)
        loader = self.loader_ref()
        if loader is not None:
            loader.counts["tasks_acked"] += feeder.acked
            loader.counts["tasks_failed"] += feeder.failed
            loader.state = feeder.end_state
            if feeder.end_state in ("pass_complete", "exhausted"):
                loader._done_pass = feeder.pass_no
        if feeder.error is not None and raise_error:
            raise feeder.error

    def _stop_workers(self, broken: bool) -> None:
        """Stop reading: readers see their iteration is over; a broken torch iterator's
        workers are shut down (persistent ones too: the next iteration starts new ones)."""
        self.feed.iteration.value = -1
        it = self.torch_iter
        self.torch_iter = None
        loader = self.loader_ref()
        if it is None or loader is None:
            return
        if broken or not loader.persistent_workers:
            if hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()
            if loader._iterator is it:
                loader._iterator = None

    def close(self) -> None:
        """Abandon this iteration: release what it holds (nothing taken counts as done)."""
        self._end(ack_taken=False, shutdown=False)


def _retire(tasks: Any) -> None:
    """Close a past iteration's task queue and join its feeder thread (drained first, so
    the thread never blocks on a full pipe whose readers are gone)."""
    if not hasattr(tasks, "join_thread"):
        return  # num_workers=0: a queue.Queue, no thread
    try:
        while True:
            tasks.get_nowait()
    except (queue.Empty, OSError, EOFError, ValueError):
        pass
    tasks.close()
    tasks.join_thread()


def _abandon(feeder: Feeder, feed: Feed) -> None:
    feed.iteration.value = -1
    feeder.finish()

