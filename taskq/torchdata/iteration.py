"""One iteration (one pass) of a ``taskq.torch.DataLoader``: the iterator the loop holds.

It strips the per-sample tags off each batch and, once the step that took a batch is
over (the next ``__next__``, ``commit()`` or the end of the iteration), acks the tasks
whose last sample the batch held and records how far it got into the others. With
``acks="commit"`` both wait in this iterator until ``commit()``: the tasks stay held
(the trainer's heartbeat keeps their leases), and an iteration that ends while some are
uncommitted parks its feeder (no more leases, heartbeats go on) until ``commit()`` or
``close()``. A DataLoader worker that died is replaced (``_restart_workers``) and the pass
goes on; if torch raises anything else, every task held and not committed is released,
then the error is raised again.

Data flow: training loop -> iteration.py -> held.py -> feeder.py (trainer/core.py -> Redis);
workers (dataset.py) -> torch's result queue -> iteration.py.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from .. import errors
from . import cut
from .dataset import Feed, TaskDataset, TaskMsg, Unit, being_read, stop_msg
from .even import EvenSteps
from .feeder import Feeder

if TYPE_CHECKING:
    from .host import IterationHost

_JOIN_S = 15.0
#: stands after the last batch yielded once the iteration ended (``TaskqIter.stepped``)
_END_MARK: tuple[dict[int, int], bool, list[str | None]] = ({}, False, [])
#: worker deaths one iteration survives; the next one is raised (a task that kills every
#: reader would otherwise be read for ever)
_MAX_RESTARTS = 3

log = logging.getLogger("taskq.torch")

Pair = tuple[int, int]


class TaskqIter:
    """One pass of a ``taskq.torch.DataLoader``: yields the user's batches."""

    def __init__(
        self,
        loader: IterationHost,
        torch_iter: Any,
        feeder: Feeder,
        feed: Feed,
        even: EvenSteps | None = None,
    ) -> None:
        self.loader_ref = weakref.ref(loader)
        self.torch_iter: Any = torch_iter
        self.feeder = feeder
        #: the tasks held and what the loop asks about them (acks, fails, progress; the
        #: feeder performs it), with what the loop did with each (how far it took, cuts)
        self.held = feeder.held
        self.feed = feed
        self.on_error = loader.on_error
        self.pass_end = loader.pass_end
        #: acks="commit": taken tasks wait for commit()
        self.hold = loader.acks == "commit"
        self.ended = False
        self.tail: Iterator[Unit] | None = None
        #: batches handed out and not settled yet: (tasks they ended, reach per task)
        self._handed: deque[tuple[list[Pair], dict[Pair, int]]] = deque()
        #: of those, the last ``ahead`` are not counted as taken: a framework's loop
        #: (Lightning's, accelerate's) fetches that many batches before it steps on one
        self.ahead = loader.ahead
        # acks="commit": taken to their end / how far taken, not committed yet
        self._pending: dict[Pair, None] = {}
        self._pending_reached: dict[Pair, int] = {}
        self._feeder_done = False
        #: times each next() (the loop's data wait) and the steps between (inputwait.py)
        self.meter = loader.input_meter
        self.meter.restart()
        #: worker deaths survived in this iteration
        self.restarts = 0
        #: units taken off torch's queue ahead of the loop, to cut a split task (cut.py)
        self._ahead: deque[Unit] = deque()
        #: torch's iterator ended while units were taken ahead
        self._torch_end = False
        #: the batches yielded last, as (samples per pass, a padding repeat, each row's
        #: source job: a mixed job's, docs/mixing.md): the oldest is the one the loop
        #: steps on (``ahead`` calls ago; loader.batch_pass, loader.batch_sources)
        self._yielded: deque[tuple[dict[int, int], bool, list[str | None]]] = deque(
            maxlen=self.ahead + 1
        )
        self._passes: dict[int, int] = {}
        self._sources: list[str | None] = []
        #: samples per source of the batches yielded (loader.mix_counts)
        self.mix_yielded: Counter[str] = Counter()
        #: even_steps (even.py): the ranks' agreement at each next(); True once they
        #: agreed that none has a batch
        self.even = even
        self._even_over = False
        #: next() calls so far (even_steps checks, after the loop's first step, that
        #: a padding batch's loss is weighted)
        self._nexts = 0
        #: samples handed to the loop in this iteration
        self.samples = 0
        # dropped unfinished (a `break` out of the loop, or a parked feeder whose loader
        # is gone): release, leave, stop the thread
        self._finalizer = weakref.finalize(self, _abandon, feeder, feed)

    def __iter__(self) -> TaskqIter:
        return self

    def __next__(self) -> Any:
        meter = self.meter
        meter.enter()
        try:
            batch = self._next_batch()
        except BaseException:
            meter.stop()
            raise
        meter.leave()
        return batch

    @property
    def stepped(self) -> tuple[dict[int, int], bool, list[str | None]]:
        """The batch the loop steps on (yielded ``ahead`` calls ago, or the last one once
        the iteration ended): its samples per pass, whether it is a padding repeat, and
        its rows' sources."""
        return self._yielded[0] if self._yielded else _END_MARK

    def mix_stepped(self) -> Counter[str]:
        """Samples per source of the batches yielded up to the one the loop steps on."""
        ahead = Counter(s for entry in list(self._yielded)[1:] for s in entry[2] if s)
        return self.mix_yielded - ahead

    def _next_batch(self) -> Any:
        try:
            if self.even is not None:
                batch = self._next_even()
            elif self.ended:
                raise StopIteration
            else:
                batch = self._next_own()
        except StopIteration:
            if self.ahead and self._yielded and self._yielded[-1] is not _END_MARK:
                self._yielded.append(_END_MARK)  # the loop steps on the last one now
            raise
        return batch

    def _next_own(self) -> Any:
        try:
            batch = self._next()
        except StopIteration:
            raise
        except BaseException:
            # the step before this call finished: what it took counts as taken (with
            # acks="commit" it is released all the same: nothing uncommitted is kept)
            self._end(ack_taken=True, shutdown=True)
            raise
        self._yielded.append((self._passes, False, self._sources))
        self.mix_yielded.update(s for s in self._sources if s)
        return batch

    def _next_even(self) -> Any:
        """even_steps: this rank's next batch if every rank agrees one has a batch
        (a rank that is out repeats its last one, as padding); StopIteration on every
        rank at the same call once none has (even.py)."""
        even = self.even
        assert even is not None
        if self._even_over:
            raise StopIteration
        self._nexts += 1
        loader = self.loader_ref()
        if self._nexts == self.ahead + 2 and loader is not None and not loader.padding_weighted():
            # every rank runs the same loop: all refuse at this call, none waits
            self._even_over = True
            try:
                even.agree(False, failed=True)
            except Exception:  # noqa: BLE001 - the group is broken: our error first
                log.debug("even_steps: could not tell the other ranks", exc_info=True)
            self._end(ack_taken=True, shutdown=True)
            raise errors.InvalidInput(
                "even_steps: the loop's first step read neither loader.loss_weight nor "
                "loader.batch_is_padding (nor called accelerate's backward); a rank out of "
                "data steps on a repeat of its last batch, which would be trained twice: "
                "return loss * loader.loss_weight"
            )
        batch, have = None, False
        if not self.ended:
            try:
                batch, have = self._next_own(), True
            except StopIteration:
                pass
            except BaseException:
                self._even_over = True
                try:
                    even.agree(False, failed=True)  # the others raise too, none waits
                except Exception:  # noqa: BLE001 - the group is broken: our error first
                    log.debug("even_steps: could not tell the other ranks", exc_info=True)
                raise
        verdict = even.agree(have)
        if verdict.failed:
            self._even_over = True
            self._end(ack_taken=True, shutdown=True)
            raise errors.TaskqError(
                f"job {self.feeder.dataset.job!r}: another rank's loader failed at this "
                "step (its error is in its log); this rank stops with it (even_steps)"
            )
        if verdict.all_out:
            self._even_over = True
            raise StopIteration
        if verdict.pad_source is not None:
            shared = even.share(batch, verdict.pad_source)
            if even.pad is None:
                even.pad = shared
        if have:
            even.pad = batch
            return batch
        self._counts()["padding_batches"] += 1
        self._yielded.append(({}, True, []))
        return even.pad

    def _next(self) -> Any:
        counts = self._counts()
        self.settle()
        while True:
            if self.feeder.error is not None:
                raise self.feeder.error
            if self.feeder.end_state in ("completed", "cancelled"):
                self._finish()
            unit = self._next_unit()
            if unit is None:
                self._finish()
            if self.feeder.moved:
                # a task being read was split: cut it here before this unit goes out
                self._ahead.appendleft(unit)
                self._plan_cuts()
                continue
            tags, ctrl, batch = unit
            self._control(ctrl)
            finished = []
            reached: dict[Pair, int] = {}
            passes: Counter[int] = Counter()
            sources: list[str | None] = []
            held, own_pass = self.held, self.feeder.pass_no
            if own_pass is None:  # set before the feeder's first lease: never here
                own_pass = -1
            for task_id, token, index, last in tags:
                # pass_end="local": a task of the last pass that came back is served in
                # this one (a sample of a task no longer held counts as this pass's)
                entry = held.entry(task_id, token)
                task = None if entry is None else entry.task
                of = None if task is None else task.pass_no
                passes[own_pass if of is None else of] += 1
                sources.append(None if task is None else task.source)
                if last:
                    if of is not None:
                        finished.append((task_id, token))
                        # where its reading ended (its ack says it: a split's point)
                        held.read_to(task_id, token, index + 1)
                else:
                    # a task's samples come in increasing position: the last one counts
                    reached[task_id, token] = index + 1
            if batch is None:
                self._ack_later(finished)  # dropped (drop_last): nothing left to take
                for pair in finished:
                    held.took(pair, -1)
                continue
            self._handed.append((finished, reached))
            self._passes, self._sources = dict(passes), sources
            self.samples += len(tags)
            counts["samples"] += len(tags)
            counts["batches"] += 1
            return batch

    def _ack(self, pairs: list[Pair]) -> None:
        if self.hold:
            self._pending.update(dict.fromkeys(pairs))
        else:
            self.held.ack(pairs)

    def _ack_later(self, pairs: list[Pair]) -> None:
        """Ack tasks nothing is left to take of, with the last batch handed out: its
        samples of them are in a step yet to finish."""
        if self._handed:
            self._handed[-1][0].extend(pairs)
        else:
            self._ack(pairs)

    def settle(self, keep: int | None = None) -> None:
        """The batches handed out were taken (their steps finished), all but the last
        ``keep`` (default ``ahead``: those the framework's loop fetched ahead of its
        step): ack the tasks they ended, record how far they got into the others
        (acks="commit": keep both for ``commit()``)."""
        keep = self.ahead if keep is None else keep
        held = self.held
        while len(self._handed) > keep:
            taken, reached = self._handed.popleft()
            for key, n in reached.items():
                held.took(key, n)
            for key in taken:
                held.took(key, -1)
            if reached:
                if self.hold:
                    for key, n in reached.items():
                        self._pending_reached[key] = max(n, self._pending_reached.get(key, 0))
                else:
                    held.progress(reached)
            if taken:
                self._ack(taken)

    def uncommitted(self) -> int:
        """Tasks the loop took from (to their end or not) since the last commit."""
        if not self.hold:
            return 0
        if not self.ended:
            self.settle()
        return len(self._pending.keys() | self._pending_reached.keys())

    def commit(self) -> int:
        """Ack the tasks the loop took to their end and record how far it got into the
        others, in the feeder thread, now; a parked iteration's feeder then ends.

        Returns:
            The number of tasks acked.

        Raises:
            TaskqError: the iteration had ended with an error (what it held was
                released: nothing is committed), or the call failed.
        """
        if not self.ended:
            self.settle()
        acks, reached = list(self._pending), dict(self._pending_reached)
        self._pending, self._pending_reached = {}, {}
        if self._feeder_done:
            if acks or reached:
                raise errors.TaskqError(
                    f"job {self.feeder.dataset.job!r}: nothing committed, the loader's "
                    "iteration ended first and gave back what it held"
                )
            return 0
        if acks or reached or not self.hold:
            self.feeder.commit(acks, reached)
        if self.ended:
            self._close_feeder()
        return len(acks)

    def _counts(self) -> Counter[str]:
        loader = self.loader_ref()
        return loader.counts if loader is not None else Counter()

    def _next_unit(self) -> Unit | None:
        if self._ahead:
            return self._ahead.popleft()
        if self.torch_iter is not None:
            unit = None if self._torch_end else self._pull()
            if unit is not None:
                return unit
            self.torch_iter = None
            if self.pass_end == "local":
                return None
            self.tail = self._tail_units()
        if self.tail is None:
            return None
        return next(self.tail, None)

    def _pull(self) -> Unit | None:
        """The next unit off torch's queue (a dead worker replaced first); None at its
        end."""
        self.feeder.main_waiting = time.monotonic()
        try:
            while True:
                dead = self._dead_workers()
                if dead:
                    self._restart_workers(dead)
                try:
                    unit: Unit = next(self.torch_iter)
                    return unit
                except RuntimeError:
                    if not self._dead_workers():
                        raise  # not a worker's death (torch names it, within 5 s)
        except StopIteration:
            return None
        finally:
            self.feeder.main_waiting = 0.0

    def _plan_cuts(self) -> None:
        """Tasks being read were split (their trainer learned a new end): take units off
        torch's queue until each one's reading ended there (a few: the workers' read-ahead
        and the batch that ends the task), drop those past the points (cut.py) and report
        each cut task's honoured end at once (the split's confirmation)."""
        held = self.held
        for t, tok, end in self.feeder.moved_ends():
            e = held.entry(t, tok)
            if e is not None:
                e.point = end
        if self.torch_iter is None or self._torch_end:
            for e in held.entries():
                e.point = None
            return
        feed = self.feed
        # begun by a reader (being read, or some of it taken by the loop) and not read to
        # its end by the loop: its reader's units may be on torch's queue; not cut here,
        # and its reader did not say its own end (that end is the split's: no cut follows)
        reading = set().union(*(being_read(feed, i) for i in range(len(feed.finished))))
        points: dict[Pair, int] = {}
        for e in held.entries():
            if e.point is None:
                continue
            if (
                (e.key in reading or e.taken is not None)
                and e.taken != -1
                and e.cut is None
                and not e.said
            ):
                points[e.pair] = e.point
            else:
                e.point = None
        if not points:
            return
        units = list(self._ahead)
        depth = getattr(self.torch_iter, "_prefetch_factor", 2) * max(1, len(feed.finished))
        bound = len(units) + 4 * depth + 4
        waiting = {p for p, m in points.items() if not any(cut.ended(u, p, m) for u in units)}
        restarts = self.restarts
        while waiting and len(units) < bound:
            unit = self._pull()
            if self.restarts != restarts:
                return  # a worker died: what the old ones read is dropped with them
            if unit is None:
                self._torch_end = True
                break
            units.append(unit)
            waiting = {p for p in waiting if not cut.ended(unit, p, points[p])}
        for p in waiting:
            del points[p]  # not read to its end within reach: its reader's rule applies
        planned, ends = cut.plan(units, points)
        self._ahead = deque(planned)
        if not ends:
            return
        dropped = sum(len(u[0]) for u in units) - sum(len(u[0]) for u in planned)
        counts = self._counts()
        counts["samples_handed_on"] += dropped
        for (task_id, token), end in ends.items():
            e = held.entry(task_id, token)
            if e is not None:
                e.cut, e.point = end, None
            held.honour(task_id, token, end)
        log.debug(
            "job %s: cut at %s, %d samples read ahead left to the tails' holders",
            self.feeder.dataset.job,
            ends,
            dropped,
        )

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of this iteration's DataLoader workers (empty with
        ``num_workers=0`` or once the iteration ended): what a test kills to see a
        worker replaced."""
        return [w.pid for w in self._workers()]

    def _workers(self) -> list[Any]:
        # torch's iterator keeps its worker processes in ``_workers`` (torch 2.x): there
        # is no public way to see one die, and its own check names a death only after 5 s
        return list(getattr(self.torch_iter, "_workers", ()))

    def _dead_workers(self) -> list[int]:
        """The DataLoader workers of this iteration that died (by index)."""
        return [i for i, w in enumerate(self._workers()) if w.exitcode not in (None, 0)]

    def _restart_workers(self, dead: list[int]) -> None:
        """A worker died (the OOM killer, say): start new workers and go on with the pass.
        The tasks the dead one was reading are given back (progress first: their next
        holder starts where the loop got); every other task held is read on by the new
        workers from where the loop got (what the old workers read and the loop did not
        take is dropped with them, so nothing reaches the loop twice).

        Raises:
            RuntimeError: workers died more than ``_MAX_RESTARTS`` times in this pass.
        """
        loader = self.loader_ref()
        old_iter, old_feed = self.torch_iter, self.feed
        workers = self._workers()
        what = ", ".join(f"pid {workers[i].pid} (exit {workers[i].exitcode})" for i in dead)
        if loader is None or self.restarts >= _MAX_RESTARTS:
            raise RuntimeError(
                f"DataLoader worker(s) {what} died, {self.restarts + 1} times in this pass"
            )
        self.restarts += 1
        dead_reading = set().union(*(being_read(old_feed, i) for i in dead))
        self._ahead.clear()  # read by the old workers, not taken: dropped with them
        old_feed.iteration.value = -1  # the other readers end
        self.torch_iter = None
        if hasattr(old_iter, "_shutdown_workers"):
            old_iter._shutdown_workers()
        loader.drop_workers(old_iter)
        feed, self.torch_iter = loader.restart_workers(self.feeder.iteration)
        self.feed = feed
        given_back = self.feeder.call(
            lambda trainer: self.feeder.restart_readers(
                feed.tasks, feed.ends, lambda: sum(feed.finished), dead_reading
            )
        )
        old_feed.retire()  # (the dead worker may have held its read lock)
        counts = self._counts()
        counts["worker_restarts"] += 1
        counts["tasks_given_back"] += given_back
        log.warning(
            "job %s: DataLoader worker %s died; new workers started, the %d task(s) it "
            "was reading given back, the others read on from where the loop got",
            self.feeder.dataset.job,
            what,
            given_back,
        )

    def _tail_units(self) -> Iterator[Unit]:
        """Work leased after the readers stopped (re-dispatched from a lost trainer),
        read here in the main process until the pass is complete for everyone. With
        uncommitted tasks held it ends instead of waiting (the pass cannot end before
        they are committed): the next iteration takes the pass's late work."""
        ds: TaskDataset = self.feeder.dataset
        tail, it_no = self.feeder.tail, self.feeder.iteration

        def take(block: bool) -> TaskMsg | None:
            while True:
                try:
                    return tail.get(timeout=0.25) if block else tail.get_nowait()
                except queue.Empty:
                    if not block:
                        return None
                    if not self.feeder.is_alive() or self.uncommitted():
                        return stop_msg(it_no)

        return ds.units(
            take, self.feed, lambda _task: None, flush_when_idle=True, rng_key=f"tail:{it_no}"
        )

    def _control(self, ctrl: list[Any]) -> None:
        held = self.held
        for kind, task_id, token, text in ctrl:
            e = held.entry(task_id, token)
            if e is None:
                continue
            if kind in ("end", "done") and e.cut is not None:
                continue  # cut here: its end honoured, its ack made (cut.py)
            if kind == "end":
                # its reader's own end (at the point or past it, what it read) is the one
                # reported: no cut of this task follows (the first end said is the split's,
                # a point learnt later included)
                e.point, e.said = None, True
                held.honour(task_id, token, int(text))
                continue
            if kind in ("done", "cut"):
                if text:
                    held.read_to(task_id, token, int(text))
                self._ack_later([(task_id, token)])
                held.took((task_id, token), -1)
                continue
            held.fail(task_id, token, text)
            if self.on_error == "raise":
                raise errors.CorruptData(f"job {self.feeder.dataset.job!r} task {task_id}: {text}")

    def _finish(self) -> NoReturn:
        # everything handed out counts, the batches a framework fetched ahead too (its
        # loop steps on them next): the pass cannot end while they are held
        self.settle(keep=0)
        self._end(ack_taken=True, shutdown=False, raise_error=True, park=True)
        raise StopIteration

    def _end(
        self, ack_taken: bool, shutdown: bool, raise_error: bool = False, park: bool = False
    ) -> None:
        if self.ended:
            if not park:
                self._close_feeder()  # a parked feeder: give back what it holds
            return
        self.ended = True
        if ack_taken:
            self.settle()
        self._handed.clear()
        stop_workers = shutdown or self.torch_iter is not None
        if park and self.uncommitted() and self.feeder.error is None:
            if stop_workers:
                self._stop_workers(shutdown)
            # the pass is over for this loop, its tasks wait for commit(): lease no more
            try:
                self.feeder.park(list(self._pending.keys() | self._pending_reached.keys()))
            except errors.TaskqError:
                self._close_feeder()
            else:
                self._note_end()
        else:
            # what is held goes back before the readers are shut down: torch waits up to
            # its MP_STATUS_CHECK_INTERVAL (5 s) for a worker that does not stop at once
            # (a loaded machine, a read in a slow call), and a SIGTERM's release must not
            self.feed.iteration.value = -1  # the readers take no more tasks meanwhile
            self._close_feeder()
            if stop_workers:
                self._stop_workers(shutdown)
        if self.feeder.error is not None and raise_error:
            raise self.feeder.error

    def _close_feeder(self) -> None:
        """End the feeder: perform what was asked, release what is held, leave."""
        if self._feeder_done:
            return
        self._feeder_done = True
        self._finalizer.detach()
        self.feeder.finish()
        self.feeder.join(_JOIN_S)
        self._pending, self._pending_reached = {}, {}
        self._note_end()
        loader = self.loader_ref()
        if loader is not None:
            loader.counts["tasks_acked"] += self.held.acked
            loader.counts["tasks_failed"] += self.held.failed

    def _note_end(self) -> None:
        loader = self.loader_ref()
        feeder = self.feeder
        if loader is not None:
            # the pass is over for this loader: complete, or ended locally. An iteration
            # of the global pass end that ended "exhausted" held uncommitted tasks: its
            # pass goes on, and the next iteration takes its late work (docs/torch.md)
            over = feeder.end_state == "pass_complete" or (
                feeder.end_state == "exhausted" and feeder.pass_end == "local"
            )
            loader.iteration_ended(feeder.end_state, feeder.pass_no if over else None)

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
            loader.drop_workers(it)

    def close(self) -> None:
        """Abandon this iteration: release what it holds (nothing taken counts as done;
        with acks="commit" nothing uncommitted either)."""
        if self.hold:
            self._handed.clear()
            self._pending, self._pending_reached = {}, {}
        self._end(ack_taken=False, shutdown=False)


def _abandon(feeder: Feeder, feed: Feed) -> None:
    """An iteration dropped unfinished, or alive at the interpreter's exit (SIGTERM's
    SystemExit raised in the loop body): the feeder releases what it holds, progress
    first, before the process ends (a daemon thread would be cut short)."""
    feed.iteration.value = -1
    feeder.finish()
    if feeder is not threading.current_thread():
        feeder.join(_JOIN_S)
