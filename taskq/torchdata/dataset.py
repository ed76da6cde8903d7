"""``TaskDataset``: the reading half of ``taskq.torch``, run in DataLoader worker processes.

A worker takes task messages (task, token, order, chunks, start, end) from a queue the
loader's feeder thread fills in the main process, reads each task's samples with the
reader in the task's sample order (the job's: the chunks', or a permutation fixed by the
job's seed, the pass and the task), interleaves a few open tasks, batches them, and yields
one *unit* per batch: the user's collated batch plus a tag per sample (task, token,
index, last) and control entries (a task finished with no sample left to deliver, or its
reader failed with this text). The loader's iterator in the main process strips the tags
and acks a task once the loop took its last sample. Workers never talk to Redis.

Data flow: feeder (main process, trainer/core.py) -> task queue -> TaskDataset (worker) ->
torch's result queue -> loader iterator (main process) -> training loop.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import queue
import random
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate, default_convert

from .. import errors
from ..data import sample_order

#: a task message: (iteration, task id, token, order, chunks, start, end, end slot); task
#: id None = stop; order: the task's sample order (``Task.order``: '' the chunks', else
#: the key of ``taskq.data.sample_order``'s permutation, the same in every trainer of the
#: job); end: where the lease's reading ends (a piece of a split task), None:
#: the task's; end slot: the cell of ``Feed.ends`` holding the task's current end (it
#: moves when the task is split while read), -1 none
TaskMsg = tuple[int, Any, int, str, Any, int, "int | None", int]
#: per sample: (task id, token, position in the task's sample order, last sample of the
#: task); a task's samples arrive in increasing position
Tag = tuple[int, int, int, bool]
#: (kind, task id, token, text); kind "done": nothing of the task left to deliver (no
#: samples, or drop_last dropped its last ones; text: where its reading ended); "error":
#: the reader or transform failed (text: the error); "end": the reader honours this end
#: (text) from now on, having read ahead to it at most (a split task, docs/torch.md)
Ctrl = tuple[str, int, int, str]
#: what one fetch returns: (tags, control entries, batch or None)
Unit = tuple[list[Tag], list[Ctrl], Any]

log = logging.getLogger("taskq.torch")

_POLL_S = 0.25
#: ``Feed.ends`` cells: a task's current end, or NO_END (the task's own)
NO_END = 2**62
#: cells of ``Feed.ends`` (each task on the readers' queue or being read has one)
END_SLOTS = 256
_PR_SET_PDEATHSIG = 1
_END = object()


def stop_msg(iteration: int) -> TaskMsg:
    """The message telling one reader that no more tasks come in this iteration."""
    return (iteration, None, 0, "", None, 0, None, -1)


@dataclass
class Feed:
    """What the loader hands a dataset for one run of workers (picklable for spawn: the
    multiprocessing objects cross at process start only).

    ``iteration`` holds the loader's current iteration number; a message of another
    iteration is stale (left over from an abandoned one with persistent workers) and a
    reader whose iteration is no longer current ends. ``finished`` counts tasks each
    reader finished reading (one slot per worker; the feeder paces on it); ``taken``
    counts the task messages each took off the queue (the queue is FIFO: the first
    ``sum(taken)`` tasks dispatched are being read or were read); ``reading`` holds the
    ids of the tasks each reader is reading (``width`` cells per worker, -1 free), so a
    dead worker's tasks are known. ``ends`` holds the current end of each task sent
    (``END_SLOTS`` cells, written by the feeder): a reader stops there, and says where
    it stopped (a task split while read, docs/torch.md "Tail splitting"). ``opened``
    marks each cell whose task a reader took off the queue (set before the reader first
    reads the cell, cleared by the feeder before it sends a task with that cell): a task
    not marked is read, when opened, to the end its cell says then, exactly.
    """

    tasks: Any
    iteration: Any
    finished: Any
    batch_size: int | None
    collate_fn: Callable[[Any], Any] | None
    drop_last: bool
    taken: Any = None
    reading: Any = None
    width: int = 0
    ends: Any = None
    opened: Any = None
    parent_pid: int = field(default_factory=os.getpid)
    #: in-process readers only (not picklable): told each time a task was read
    on_finished: Callable[[], None] | None = None
    #: in-process readers only (``num_workers=0``): what lets the feeder honour a moved
    #: end for a reader between batches (``InProcess``)
    here: InProcess | None = None

    def retire(self) -> None:
        """Close the task queue of a run of workers that is over (they were shut down):
        what they left unread is drained, so the queue's feeder thread (in this process)
        can flush the rest and end, and it is not joined. A worker that died holding the
        queue's read lock (SIGKILL, or torch's terminate of one that did not stop) leaves
        the drain nothing to read, and a join would then wait for ever on a pipe nobody
        reads, full when what was queued outgrows it (torch's ``_shutdown_workers`` closes
        its own queues so too). A ``queue.Queue`` (``num_workers=0``) has no thread."""
        tasks = self.tasks
        if not hasattr(tasks, "cancel_join_thread"):
            return
        try:
            while True:
                tasks.get_nowait()
        except (queue.Empty, OSError, EOFError, ValueError):
            pass
        tasks.cancel_join_thread()
        tasks.close()


class InProcess:
    """The reader of a loader without worker processes, as its feeder thread sees it.

    The reader runs only while the loop fetches a batch (``lock`` held, per unit); its
    open tasks are in ``open`` by end cell. Between batches everything it read of a task
    but the one sample it looked ahead is with the loop, so the feeder, told a new end
    ``m``, knows the end the reader will honour exactly: ``m`` past the looked-ahead
    position, else that position, the sample there not delivered (``stops``: the reader
    ends the task there at its next turn; the tail's holder reads it). It reports that
    end at once (readahead.py ``sync_ends``): the split is confirmed while the loop
    trains, not a batch later, and the loop's last step of the task is not one for a
    lone looked-ahead sample (a full step of a slow loop: docs/torch.md "Tail
    splitting"). (A task not opened yet is told its end by its cell: ``Feed.opened``.)
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: dict[int, _Open] = {}
        #: end cell -> the position its open task ends at, its looked-ahead sample (there)
        #: not delivered: written by the feeder between batches, taken by the reader
        self.stops: dict[int, int] = {}

    def honour(self, slot: int, task_id: int, token: int, end: int) -> int | None:
        """The end the reader of the task in end cell ``slot`` honours, told the new end
        ``end`` between batches: ``end`` when it is past the looked-ahead position, else
        that position (the reader is told to end the task there); None: being read now
        (the reader sees the new end itself), not open, or read to its end."""
        if not self.lock.acquire(blocking=False):
            return None  # the loop is fetching: the reader sees the new end itself
        try:
            o = self.open.get(slot)
            if o is None or o.task_id != task_id or o.token != token or o.ahead is _END:
                return None
            at = int(o.ahead[0])
            if end > at:
                return end  # (the reader delivers ``at`` and stops at ``end``: _bounded)
            self.stops[slot] = at
            return at
        finally:
            self.lock.release()


def default_reader(chunks: Any, start: int) -> Iterable[Any]:
    """The reader used when none is given: ``taskq.data.read_task``."""
    try:
        from ..data import read_task  # type: ignore[import-not-found,unused-ignore]
    except ImportError as e:  # pragma: no cover - depends on the installed extras
        raise errors.InvalidInput("no default reader (taskq.data is missing); pass reader=") from e
    return read_task(chunks, start)  # type: ignore[no-any-return]


class _Open:
    """One task being read: its samples in delivery order, one looked ahead (to know
    which is the last)."""

    __slots__ = ("task_id", "token", "samples", "ahead", "slot")

    def __init__(
        self, task_id: int, token: int, samples: Iterator[tuple[int, Any]], slot: int = -1
    ) -> None:
        self.task_id, self.token, self.samples, self.slot = task_id, token, samples, slot
        self.ahead: Any = next(samples, _END)


class TaskDataset(IterableDataset[Any]):
    """An ``IterableDataset`` over the tasks of a taskq job, for ``taskq.torch.DataLoader``.

    Args:
        job: the job name.
        transform: applied to every sample in the worker (e.g. tokenize).
        reader: ``(chunks, start) -> iterable of samples`` for one task; defaults to
            ``taskq.data.read_task``. Its exceptions fail the task with their text.
        url: Redis URL (or ``TASKQ_REDIS_URL``) for the loader's trainer.
        client: a configured ``taskq.Client`` instead (stays in the main process).
        shuffle: interleave ``interleave`` open tasks at random (the samples of what
            a reader holds); False reads tasks one at a time. The order of the samples
            inside a task is the job's, whatever this says: the chunks', or with
            ``create_job(shuffle_samples=True)`` a permutation fixed by the job's seed,
            the pass and the task — the same in every trainer and every reader
            (``taskq.data.read_task(task)``), so a piece of a task or a resumed task
            is the same samples whoever reads it. A shuffled task is read whole into
            memory (a resumed one from its sample 0, the first ``task.start`` of its
            order skipped).
        seed: seeds the interleaving of open tasks (free to differ between loaders).
        interleave: tasks a worker reads from at once (sample-level mixing).
        max_idle: a stream job (docs/streams.md): end an iteration once it got no task
            for this many seconds (checked every couple of seconds), for a loop that
            evaluates or checkpoints on a clock; the next iteration goes on in the same
            pass. None (default): an iteration over an open stream waits for appends
            and ends when the stream is sealed and drained.
        trainer_options: keyword arguments for the loader's ``taskq.Trainer``;
            ``handle_signals=False`` keeps the loader from handling SIGTERM (see
            ``taskq/torchdata/signals.py``).

    Raises:
        InvalidInput: ``interleave < 1``, ``max_idle <= 0``.
    """

    def __init__(
        self,
        job: str,
        transform: Callable[[Any], Any] | None = None,
        *,
        reader: Callable[[Any, int], Iterable[Any]] | None = None,
        url: str | None = None,
        client: Any = None,
        shuffle: bool = True,
        seed: int = 0,
        interleave: int = 2,
        max_idle: float | None = None,
        trainer_options: dict[str, Any] | None = None,
    ) -> None:
        if interleave < 1:
            raise errors.InvalidInput(f"interleave must be >= 1, got {interleave}")
        if max_idle is not None and not max_idle > 0:
            raise errors.InvalidInput(f"max_idle must be a number of seconds > 0, got {max_idle}")
        self.job = job
        self.transform = transform
        self.reader = reader or default_reader
        self.url = url
        self.client = client
        self.shuffle = shuffle
        self.seed = seed
        self.interleave = interleave if shuffle else 1
        self.max_idle = max_idle
        self.trainer_options = dict(trainer_options or {})
        self.feed: Feed | None = None

    def __getstate__(self) -> dict[str, Any]:
        # a worker reads files only: the client (sockets, locks) stays in the main process
        return {**self.__dict__, "client": None}

    def __iter__(self) -> Iterator[Unit]:
        feed = self.feed
        if feed is None:
            raise errors.InvalidInput("TaskDataset is read through taskq.torch.DataLoader")
        info = get_worker_info()
        slot = info.id if info is not None else 0
        iteration = int(feed.iteration.value)
        in_worker = info is not None
        if in_worker:
            _die_with_parent(feed.parent_pid)

        def take(block: bool) -> TaskMsg | None:
            msg = _take(feed, iteration, block, in_worker)
            if msg is not None and msg[1] is not None:
                _opened(feed, slot, msg[1], msg[7])
            return msg

        return self.units(
            take,
            feed,
            lambda task_id: _count(feed, slot, task_id),
            flush_when_idle=False,
            rng_key=f"{slot}:{iteration}",
        )

    def units(
        self,
        source: Callable[[bool], TaskMsg | None],
        feed: Feed,
        finished: Callable[[int], None],
        flush_when_idle: bool,
        rng_key: str,
    ) -> Iterator[Unit]:
        """Units from the tasks ``source`` gives until a stop message.

        Args:
            source: the next message (blocking or not; None: nothing now).
            feed: batch size, collate and drop_last.
            finished: called with the task id once per task read to its end (or failed).
            flush_when_idle: yield a short batch rather than wait with samples held
                (for work read in the main process, where nobody else could take them).
            rng_key: what makes this reader's interleaving differ from the others'.

        Returns:
            An iterator of (tags, control, batch) units.
        """
        units = self._units(source, feed, finished, flush_when_idle, rng_key)
        return units if feed.here is None else _locked(units, feed.here.lock)

    def _units(
        self,
        source: Callable[[bool], TaskMsg | None],
        feed: Feed,
        finished: Callable[[int], None],
        flush_when_idle: bool,
        rng_key: str,
    ) -> Iterator[Unit]:
        rand = random.Random(f"{self.seed}:{rng_key}:interleave").random
        open_: list[_Open] = []
        #: "end" entries the readers of open tasks made (a moved end seen): sent at once
        notes: list[Ctrl] = []
        #: tasks read to an end of their own (pieces of a split task, or told one), and
        #: whether the batch being filled holds the last sample of one: at a pass's tail
        #: nothing else may come to fill it, so it goes out short rather than wait
        pieces: set[int] = set()

        def note(entry: Ctrl) -> None:
            # an open task's end moved: it is read like a piece from now on
            notes.append(entry)
            pieces.add(entry[1])

        piece_done = False
        tags: list[Tag] = []
        samples: list[Any] = []
        ctrl: list[Ctrl] = []
        stopped = False
        size = feed.batch_size or 1
        collate = feed.collate_fn or (default_collate if feed.batch_size else default_convert)
        transform, interleave = self.transform, self.interleave
        ends = feed.ends
        here = {} if feed.here is None else feed.here.open  # in-process: the open tasks
        stops = {} if feed.here is None else feed.here.stops
        while True:
            # no task is opened beside a piece or a task whose end moved (its cell says
            # an end): their last samples then share batches with none but each other's,
            # which the loop's process may drop whole (cut.py)
            while (
                not stopped
                and len(open_) < interleave
                and not (
                    ends is not None and any(ends[t.slot] != NO_END for t in open_ if t.slot >= 0)
                )
            ):
                if not open_ and flush_when_idle and (samples or ctrl):
                    msg = source(False)
                    if msg is None:
                        yield self._unit(tags, samples, ctrl, collate, feed.batch_size)
                        tags, samples, ctrl = [], [], []
                        continue
                else:
                    if not open_ and (ctrl or piece_done or notes):
                        # about to wait for a task with nothing open: what ctrl holds (a
                        # task read with no sample, as an empty piece of a split task),
                        # a piece's last samples and the ends just honoured must not wait
                        # for the next one
                        if piece_done and samples and feed.drop_last and feed.batch_size:
                            ctrl += [("done", t, tok, str(k + 1)) for t, tok, k, lst in tags if lst]
                            tags, samples = [], []
                        if samples or ctrl:
                            yield self._unit(tags, samples, ctrl, collate, feed.batch_size)
                            tags, samples, ctrl = [], [], []
                        piece_done = False
                        if notes:
                            yield [], notes[:], None
                            notes.clear()
                    msg = source(not open_)
                if msg is None:
                    break
                if msg[1] is None:
                    stopped = True
                    break
                task = self._open(msg, ctrl, feed.ends, note)
                if msg[6] is not None:
                    pieces.add(msg[1])
                if task is None:
                    finished(msg[1])
                elif task.ahead is _END:
                    ctrl.append(("done", task.task_id, task.token, str(msg[5])))
                    finished(task.task_id)
                else:
                    open_.append(task)
                    here[task.slot] = task
            if notes:
                # the end a reader now honours goes to the loop ahead of the samples held
                # here (all below it): the loop's progress reports name it (a split's
                # confirmation) without waiting for this batch to fill
                yield [], notes[:], None
                notes.clear()
            if stops:
                # in-process, between batches: the feeder ended open tasks at their
                # looked-ahead sample (a split point at or below it), which is not
                # delivered; all below it is with the loop
                for task in [t for t in open_ if t.slot in stops]:
                    open_.remove(task)
                    here.pop(task.slot, None)
                    pieces.discard(task.task_id)
                    ctrl.append(("done", task.task_id, task.token, str(stops[task.slot])))
                    finished(task.task_id)
                stops.clear()
                continue  # (what ctrl holds goes out before the reader waits for a task)
            n_open = len(open_)
            if not n_open:
                break
            # the hot loop: one sample per turn, with locals only
            task = open_[int(rand() * n_open)] if n_open > 1 else open_[0]
            index, raw = task.ahead
            try:
                sample = raw if transform is None else transform(raw)
                task.ahead = ahead = next(task.samples, _END)
            except Exception as e:
                ctrl.append(("error", task.task_id, task.token, _text(e)))
                open_.remove(task)
                here.pop(task.slot, None)
                finished(task.task_id)
                continue
            last = ahead is _END
            tags.append((task.task_id, task.token, index, last))
            samples.append(sample)
            if last:
                open_.remove(task)
                here.pop(task.slot, None)
                finished(task.task_id)
                if pieces and task.task_id in pieces:
                    # a piece read to its end, or a task whose end moved (an "end" entry
                    # made just now): its last samples go out in a batch of their own,
                    # which the loop's process may drop whole (cut.py)
                    pieces.discard(task.task_id)
                    piece_done = True
            if len(samples) >= size:
                yield self._unit(tags, samples, ctrl, collate, feed.batch_size)
                tags, samples, ctrl = [], [], []
                piece_done = False
        if samples and feed.drop_last and feed.batch_size:
            # dropped as torch drops a worker's short last batch; their tasks are over
            ctrl += [("done", t, tok, str(k + 1)) for t, tok, k, last in tags if last]
            tags, samples = [], []
        if samples or ctrl:
            yield self._unit(tags, samples, ctrl, collate, feed.batch_size)

    @staticmethod
    def _unit(
        tags: list[Tag],
        samples: list[Any],
        ctrl: list[Ctrl],
        collate: Callable[[Any], Any],
        batch_size: int | None,
    ) -> Unit:
        if not samples:
            return tags, ctrl, None
        return tags, ctrl, collate(samples if batch_size else samples[0])

    def _open(
        self,
        msg: TaskMsg,
        ctrl: list[Ctrl],
        ends: Any = None,
        note: Callable[[Ctrl], None] | None = None,
    ) -> _Open | None:
        """Start reading one task; None (and an error entry) when the reader fails."""
        _, task_id, token, order_key, chunks, start, end, slot = msg

        def bounded(samples: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
            if ends is None or slot < 0 or note is None:
                return samples
            return _bounded(samples, ends, slot, lambda h: note(("end", task_id, token, str(h))))

        try:
            if order_key:
                # the job's permutation of the task (the same in every trainer and reader:
                # a piece or a resumed task is a range of positions in it, progress counts
                # them), so it is read whole from sample 0 and the first ``start`` skipped
                items = list(self.reader(chunks, 0))  # a read error surfaces here
                order = sample_order(order_key, len(items))
                stop = len(items) if end is None else min(end, len(items))
                return _Open(
                    task_id,
                    token,
                    bounded(iter([(k, items[order[k]]) for k in range(start, stop)])),
                    slot,
                )
            samples = iter(self.reader(chunks, start))
            if end is not None:  # a piece of a split task: up to its end (fixed at its grant)
                samples = itertools.islice(samples, max(0, end - start))
            return _Open(task_id, token, bounded(enumerate(samples, start)), slot)
        except Exception as e:
            ctrl.append(("error", task_id, token, _text(e)))
            return None


def _locked(units: Iterator[Unit], lock: threading.Lock) -> Iterator[Unit]:
    """``units``, each made with ``lock`` held (``InProcess``: the feeder looks at the
    reader only between them)."""
    while True:
        with lock:
            unit = next(units, None)
        if unit is None:
            return
        yield unit


def _bounded(
    samples: Iterator[tuple[int, Any]], ends: Any, slot: int, note: Callable[[int], None]
) -> Iterator[tuple[int, Any]]:
    """``samples`` (position, sample) up to the task's current end, ``ends[slot]``, read
    before each one. A new end seen is honoured from there: ``h = max(end, position)``
    (what was read below the position is delivered; nothing at or past ``h`` is), told to
    the loop with ``note(h)``; an end only ever comes down (the loop's progress reports
    are what could move it up, and they stay below ``h``)."""
    seen = NO_END
    honoured = NO_END
    for k, item in samples:
        e = ends[slot]
        if e != seen:
            seen = e
            h = max(e, k)
            if h < honoured:
                honoured = h
                note(h)
        if k >= honoured:
            return
        yield k, item


def _text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _take(feed: Feed, iteration: int, block: bool, in_worker: bool) -> TaskMsg | None:
    """The next task message of ``iteration``; a stop message when the iteration is no
    longer current or (in a worker process) the main process is gone."""
    while True:
        if int(feed.iteration.value) != iteration or (
            in_worker and os.getppid() != feed.parent_pid
        ):
            return stop_msg(iteration)
        try:
            msg: TaskMsg = feed.tasks.get(timeout=_POLL_S) if block else feed.tasks.get_nowait()
        except queue.Empty:
            if not block:
                return None
            continue
        if msg[0] == iteration:
            return msg


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this worker when its trainer dies (Linux): a worker of a
    SIGKILLed trainer would otherwise block for ever on torch's result pipe (its siblings
    keep the read end open), holding the trainer's stdout and its files open."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError) as e:  # pragma: no cover - no prctl
        log.debug("no parent-death signal: %s", e)
        return
    if os.getppid() != parent_pid:  # it died before the prctl
        os._exit(1)


def _opened(feed: Feed, slot: int, task_id: int, end_slot: int) -> None:
    """A reader took a task off the queue: count it and note it as being read (its end
    cell marked opened before the reader reads it: the feeder may then no longer take
    the cell's end for the one it honours)."""
    if end_slot >= 0 and feed.opened is not None:
        feed.opened[end_slot] = 1
    if feed.taken is not None:
        feed.taken[slot] += 1
    if feed.width:
        cells = feed.reading
        for k in range(slot * feed.width, (slot + 1) * feed.width):
            if cells[k] < 0:
                cells[k] = task_id
                return


def _count(feed: Feed, slot: int, task_id: int) -> None:
    # one writer per slot (this worker), so no lock: a lock held by a SIGKILLed worker
    # would hang the feeder that reads the counts
    if feed.width:
        cells = feed.reading
        for k in range(slot * feed.width, (slot + 1) * feed.width):
            if cells[k] == task_id:
                cells[k] = -1
                break
    feed.finished[slot] += 1
    if feed.on_finished is not None:
        feed.on_finished()


def being_read(feed: Feed, slot: int) -> set[int]:
    """The ids of the tasks reader ``slot`` is reading (taken, not read to their end)."""
    if not feed.width:
        return set()
    cells = feed.reading
    return {
        int(cells[k]) for k in range(slot * feed.width, (slot + 1) * feed.width) if cells[k] >= 0
    }
