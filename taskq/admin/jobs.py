"""The job surface: ``Job``, one class for a plain and a sharded job, each verb written
once; and job creation (``create``).

A verb is one method of ``Job`` decorated ``@verb``: it encodes its arguments, calls the
engine's script on one engine job (a plain job, or one shard of a sharded job) and decodes
the reply. A sharded job (S engine jobs and a record: shardset.py) runs the same method
as ``ROUTES`` says, the way redis-py's cluster client routes each command
(``COMMAND_FLAGS``) and merges its replies (``RESULT_CALLBACKS``): on every shard and
combined (``EVERY``), on the shard holding the task (``TASK``), on every unfinished shard
(``LIVE``), on shard 0 (``HOME``), or by code of its own (``OWN``) where the semantics
differ: the barrier (``next``, ``reset``; ``advance``, the barrier step), the
checkpoint's cut and its rewind, an append spread over the shards, the status and audit
of the whole. ``Client.job(name)`` gives a ``Job``; the CLI and ops/ call its verbs.

The shards run with a manual pass boundary: a shard whose pass ``p`` is complete waits.
The barrier step (``Job.advance``) reads every shard and, once all wait at ``p``,
advances each by ``next(expected_pass=p)``; a shard already at ``p+1`` answers
``PassMismatch``, which is success, so the step is safe to repeat by anyone: a trainer
that finds its pass done everywhere (trainer/sharded.py), the reaper (``advance_all``),
``taskq pass next``. A shard left waiting behind one that moved on (a step that died
half-way) is advanced first. The step runs under the barrier lock (barrier.py), which a
checkpoint holds while it takes its cut across the shards, so no pass moves under a cut;
the cut is also checked (every shard's pass and attempt read before and after) and
taken again when one moved all the same. See docs/sharding.md.

``create`` writes a new job: every setting (``JobConfig``) checked before the first
write, the chunks staged in pipelined batches and flipped live by one ``create`` script
call per engine job (a sharded job: its record first, then each shard).

Data flow: client.py (``Client.job``, ``create_job``) / cli/ / ops/ / trainer/ ->
jobs.py -> engine/connection.py (``run``: one call per verb and engine job), stats.py
(reads), checkpoints.py, shardset.py (the record, the combines), barrier.py -> Redis.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import inspect
import itertools
import json
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar, cast

from redis.cluster import RedisCluster

from taskq import errors
from taskq.admin import checkpoints, mix, shardset, stats
from taskq.admin.barrier import ADMIN_WAIT_S, STEP_LOCK_MS, barrier_lock
from taskq.admin.shardset import (
    ShardedStatus,
    ShardSet,
    all_dead,
    at_boundary,
    event_order,
    list_sets,
    require,
)
from taskq.config import check_memory_policy, encode_tasks, validate_config
from taskq.engine.connection import Connection, translate
from taskq.engine.contract import APPEND_BYTES, APPEND_MAX, MAX_RETRY, PAGE_MAX, TRIM_MAX, Code
from taskq.keys import MAX_SHARDED_NAME, jobs_index, shard_set_key, shard_sets_index, valid_job_name
from taskq.keys import MetaField as F
from taskq.models import AppendResult, FollowRecord, JobConfig, JobStatus, SealResult

log = logging.getLogger("taskq.jobs")

STAGING_TTL_S = 3600
STAGING_BATCH = 500  # fields per HSET while staging: each one a short command
#: The longest one wait of a blocked append for an ack (then it asks again).
_APPEND_BLOCK_MS = 5000
#: The field of a follower's record holding its watermark (a file key always holds "|").
FOLLOW_WATERMARK = "watermark"
#: Fields per HSCAN / HDEL page of a follower's record.
FOLLOW_PAGE = 1000
#: How often a sharded ``events(block_ms=...)`` looks at the shards' streams while it
#: waits (no one blocking read spans slots).
EVENTS_POLL_S = 0.1
#: The shard-set record's field prefix of a sealed sharded checkpoint.
CKPT_FIELD = "ckpt."
#: Tries at a cut before a checkpoint gives up (the passes moved under every one).
CUT_ATTEMPTS = 3
#: The barrier lock's lifetime while a cut is taken or restored; renewed per shard.
CUT_LOCK_MS = 30_000
#: How long a checkpoint or rewind waits for a barrier step to let go of the lock.
CUT_WAIT_S = 10.0

#: What ``rewind`` takes: a checkpoint's id, or the record ``checkpoint`` returned.
CheckpointRef = str | dict[str, Any]


def check_name(name: str) -> None:
    """Refuse a bad job name (one readable line)."""
    if not isinstance(name, str) or not valid_job_name(name):
        raise errors.InvalidInput(f"bad job name {_short(name)}: use 1-64 of A-Z a-z 0-9 . _ -")


def _short(value: Any, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 4] + "...'"


def checkpoint_id(job: str, ckpt: Any) -> str:
    """The id in what ``rewind`` was given: an id, or the record ``checkpoint`` returned.

    Raises:
        InvalidInput: neither (one line: the argument is not dumped).
    """
    if isinstance(ckpt, dict):
        ckpt = ckpt.get("id")
        if not isinstance(ckpt, str):
            raise errors.InvalidInput(
                f"job {job!r}: rewind takes a checkpoint id or the record checkpoint() "
                f"returned; this dict has no 'id'"
            )
    if not isinstance(ckpt, str):
        raise errors.InvalidInput(
            f"job {job!r}: rewind takes a checkpoint id or the record checkpoint() "
            f"returned, not {type(ckpt).__name__}"
        )
    if not valid_job_name(ckpt):
        raise errors.InvalidInput(
            f"job {job!r}: bad checkpoint id {_short(ckpt)}: use 1-64 of A-Z a-z 0-9 . _ -"
        )
    return ckpt


def refuse_half_rewind(name: str, reply: Any, at: int) -> None:
    """Raise when a verb was refused because a rewind of the job is half done (its reply
    names the checkpoint at index ``at``)."""
    if int(reply[0]) == Code.LOCKED:
        ckpt = reply[at]
        raise errors.TaskqError(
            f"job {name}: a rewind to checkpoint {ckpt} is half done (its position is half "
            f"copied); finish it first with `taskq job rewind {name} {ckpt}`; nothing changed"
        )


# -- routes: how a sharded job runs a verb --------------------------------------------
EVERY = "every"  # on every shard; ``how(job, [(shard, reply)], *args)`` combines
TASK = "task"  # on the shard holding global task ``args[0]`` (its local id given);
# ``how(job, shard, reply)`` makes the reply global
LIVE = "live"  # on every unfinished shard (the whole job completed or cancelled: refused)
HOME = "home"  # on shard 0 (a record kept once for the job)
OWN = "own"  # ``how(job, *args)``: code of its own, where the semantics differ
ROUTE_KINDS = (EVERY, TASK, LIVE, HOME, OWN)

P = ParamSpec("P")
R = TypeVar("R")


class Route(NamedTuple):
    """How a sharded job runs one verb: ``to`` (``EVERY``, ``TASK``, ``LIVE``, ``HOME``,
    ``OWN``) and ``how`` (the combine, or the code of its own; see each ``to``)."""

    to: str
    how: Callable[..., Any] | None = None

    def run(self, job: Job, body: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """Run verb ``body`` (its plain form) on sharded ``job`` as this route says."""
        if self.to == OWN:
            return cast(Callable[..., Any], self.how)(job, *args, **kwargs)
        if self.to == HOME:
            return body(job.shards[0], *args, **kwargs)
        if self.to == TASK:  # the task id, given by position or by name, made local
            call = inspect.signature(body).bind(job, *args, **kwargs)
            task_param = list(call.arguments)[1]
            shard, local = job.locate(call.arguments[task_param])
            call.arguments.update({"self": shard, task_param: local})
            reply = body(*call.args, **call.kwargs)
            return self.how(job, shard, reply) if self.how else reply
        if self.to not in (EVERY, LIVE):
            raise AssertionError(f"route of {body.__name__}: no such kind {self.to!r}")
        replies = []
        for shard in job.shards if self.to == EVERY else job.unfinished():
            try:
                replies.append((shard, body(shard, *args, **kwargs)))
            except errors.JobCompleted:
                if self.to != LIVE:
                    raise  # (LIVE: completed since the read, nothing to do there)
        return self.how(job, replies, *args, **kwargs) if self.how else None


def verb(body: Callable[Concatenate[Job, P], R]) -> Callable[Concatenate[Job, P], R]:
    """Make ``body`` (a verb on one engine job) a verb of the surface: a plain job runs
    it, a sharded job as ``ROUTES[body.__name__]`` says (a verb without a route is
    refused on a sharded job, loudly)."""

    @functools.wraps(body)
    def run(job: Job, *args: P.args, **kwargs: P.kwargs) -> R:
        if job.sset is None:
            return body(job, *args, **kwargs)
        route = ROUTES.get(body.__name__)
        if route is None:
            raise errors.InvalidInput(f"job {job.name}: {body.__name__} has no sharded route")
        return cast(R, route.run(job, body, args, kwargs))

    return run


class Job:
    """One job: its verbs, each one bounded script call per engine job it touches
    (``retry`` of many tasks: one per batch; checkpoints: their bounded steps).

    Task ids are the job's own: a sharded job's global ids (task ``i`` of the whole job
    is task ``i // S`` of shard ``i % S``); rows of tasks, workers and events of a sharded
    job name their ``shard``.

    Args:
        connection: the engine's connection.
        job: the name of a plain job (checked), or a sharded job's record (shardset.py).
    """

    def __init__(self, connection: Connection, job: str | ShardSet) -> None:
        self.connection = connection
        self.sset = job if isinstance(job, ShardSet) else None
        self.name = job.name if isinstance(job, ShardSet) else job
        self.keys = connection.keys(self.name)
        #: a sharded job's shards (shard ``k`` at index ``k``), each a plain ``Job``
        self.shards = [Job(connection, s) for s in self.sset.shards] if self.sset else []

    def __repr__(self) -> str:
        return f"Job({self.name!r}{f', shards={len(self.shards)}' if self.sset else ''})"

    @property
    def sharded(self) -> bool:
        """True for a job spread over shards."""
        return self.sset is not None

    def parts(self) -> list[str]:
        """The engine jobs it is made of: itself for a plain job, its shards for a
        sharded one (what a per-job ACL rule must cover)."""
        return list(self.sset.shards) if self.sset else [self.name]

    # -- a sharded job's shards ---------------------------------------------------
    def locate(self, task_id: int) -> tuple[Job, int]:
        """(shard, its task id) of global task ``task_id`` of a sharded job.

        Raises:
            InvalidInput: no such task.
        """
        sset = cast(ShardSet, self.sset)
        task_id = int(task_id)
        if 0 <= task_id < sset.tasks:
            name, local = sset.locate(task_id)
            return self.shards[sset.shards.index(name)], local
        # past the create's tasks: an appended one if its shard has that many
        count = len(self.shards)
        shard = self.shards[task_id % count]
        if task_id < 0 or task_id // count >= shard.status(summaries=0).tasks:
            raise errors.InvalidInput(f"job {self.name}: no task {task_id}")
        return shard, task_id // count

    def globalize(self, shard: Job, row: dict[str, Any]) -> dict[str, Any]:
        """A shard's task row with the task's global id (``shard_task``: its id there)."""
        local = int(row["id"])
        gid = cast(ShardSet, self.sset).global_id(shard.name, local)
        return {**row, "id": gid, "shard": shard.name, "shard_task": local}

    def shard_statuses(self) -> list[JobStatus]:
        """Every shard's status, shard ``k`` at index ``k``.

        Raises:
            JobNotFound: a shard is missing.
        """
        return [s.status(summaries=0) for s in self.shards]

    def unfinished(self) -> list[Job]:
        """The shards a pause or resume acts on: every one not completed.

        Raises:
            JobCancelled, JobCompleted: the job as a whole is. JobNotFound.
        """
        states = [s.state for s in self.shard_statuses()]
        if "cancelled" in states:
            raise errors.JobCancelled(f"job {self.name!r} was cancelled")
        if all(st == "completed" for st in states):
            raise errors.JobCompleted(f"job {self.name!r} is completed")
        return [shard for shard, st in zip(self.shards, states, strict=True) if st != "completed"]

    # -- a mixed job (docs/mixing.md; mix.py) -------------------------------------
    @verb
    def set_weights(self, weights: Mapping[str, object], at: int | None = None) -> int:
        """A mixed job's weights from slot ``at`` on (None: the first slot not charged).

        Returns:
            The slot from which they hold (``at`` when not charged yet, else the first
            slot not charged).

        Raises:
            InvalidInput: not a mixed job (a sharded job never is); a source missing or
                unknown; a bad weight or slot. JobNotFound, JobCancelled.
        """
        return mix.set_weights(self.connection, self.name, weights, at)

    @verb
    def mix_sequence(self, pass_no: int | None = None) -> list[dict[str, Any]]:
        """The slots a mixed job charged in a pass (default: the current one), in order:
        ``{"slot", "pass", "position", "source", "source_task", "source_pass", "task",
        "repaid"}`` (mix.py ``sequence``).

        Raises:
            InvalidInput: not a mixed job. JobNotFound.
        """
        return mix.sequence(self.connection, self.name, pass_no)

    @verb
    def mix_status(self, cache: dict[str, Any] | None = None) -> dict[str, Any]:
        """A mixed job per source: weight, charged and acked this pass, the acked tasks'
        samples, tasks, pass, debt; the slot the charge waits at (mix.py ``status``;
        ``cache``: keep it between calls).

        Raises:
            InvalidInput: not a mixed job. JobNotFound.
        """
        return mix.status(self.connection, self.name, cache)

    # -- reading ------------------------------------------------------------------
    @verb
    def status(self, summaries: int = 20) -> JobStatus:
        """A snapshot (O(1) in the number of tasks); a sharded job's: a ``ShardedStatus``,
        the sums (counters and histograms summed, times the latest, the lowest unfinished
        pass), each shard's status in ``.shards``.

        Raises:
            JobNotFound: no such job (or a shard is missing).
        """
        with translate(self.connection.url, self.keys, self.connection.redis):
            return stats.snapshot(self.connection, self.name, summaries=summaries)

    @verb
    def samples(self, cache: dict[str, Any] | None = None) -> tuple[int, int | None]:
        """Samples of the current pass attempt finished (done, dead, or recorded as taken
        by their holders) and the pass's samples; ``(0, None)`` when a task's chunks do
        not say their size (stats.samples). ``cache``: keep it between calls (the tasks'
        sizes are read once, O(tasks); later calls read the bitmaps and the progress).

        Raises:
            JobNotFound: no such job.
        """
        cache = {} if cache is None else cache
        with translate(self.connection.url, self.keys, self.connection.redis):
            if not self.connection.redis.exists(self.keys.meta):
                raise errors.JobNotFound(f"job {self.name!r} not found (deleted or replaced)")
            return stats.samples(self.connection, self.name, cache.setdefault(self.name, {}))

    @verb
    def audit(self) -> dict[str, Any]:
        """Per pass: done, dead, skipped, stale rejected, resets, longest lateness; and a
        check that the counters agree with the sets they count (a sharded job: every
        shard's, and whether the shards agree: ``shardset.sharded_audit``)."""
        with translate(self.connection.url, self.keys, self.connection.redis):
            return stats.audit(self.connection, self.name)

    @verb
    def task(self, task_id: int, history: int = 20) -> dict[str, Any]:
        """One task: state (todo, leased, done, dead), chunks, lease holder, failures,
        attempts, last error, and its latest ``history`` events.

        Raises:
            InvalidInput: no such task. JobNotFound, CorruptData.
        """
        with translate(self.connection.url, self.keys, self.connection.redis):
            return stats.task_detail(self.connection, self.name, int(task_id), history=history)

    @verb
    def tasks_page(
        self, state: str = "leased", cursor: str = "0", count: int = PAGE_MAX
    ) -> tuple[list[dict[str, Any]], str]:
        """One page of the tasks of the current pass in ``state`` (one bounded call).

        Args:
            state: todo | leased | done | dead.
            cursor: "0" for the first page, then the cursor the last page returned (a
                sharded job's: ``"<shard index>:<its cursor>"``, through the shards).
            count: the most rows of this page, 1..``PAGE_MAX`` (a page may hold fewer and
                still not be the last one, as SCAN's do).

        Returns:
            (rows, next cursor); the listing is complete when the cursor is "0".

        Raises:
            InvalidInput: a bad state, cursor or count. JobNotFound.
        """
        check_page(state, count)
        reply = self.connection.run(self.name, "peek", [state, cursor, int(count)])
        return stats.parse_tasks(reply[1], state), str(reply[2])

    def iter_tasks(self, state: str = "leased") -> Iterator[dict[str, Any]]:
        """Every task of the current pass in ``state``, page by page (each page one
        bounded call; a task changing state meanwhile may be listed twice or missed)."""
        cursor = "0"
        while True:
            rows, cursor = self.tasks_page(state, cursor)
            yield from rows
            if cursor == "0":
                return

    def tasks(
        self, state: str = "leased", limit: int = 100, details: bool = False
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` tasks of the current pass in ``state`` (todo|leased|done|dead),
        read page by page (no call lists more than ``PAGE_MAX``).

        Args:
            details: add each task's ``chunks`` and ``last_error`` (from the newest
                events; bounded).
        """
        rows = list(itertools.islice(self.iter_tasks(state), check_limit(limit)))
        for shard in self.shards or [self]:
            mine = [r for r in rows if r.get("shard", self.name) == shard.name]
            if details and mine:
                local = [{**r, "id": r.get("shard_task", r["id"])} for r in mine]
                with translate(self.connection.url, shard.keys, self.connection.redis):
                    stats.add_details(self.connection, shard.name, local)
                for row, got in zip(mine, local, strict=True):
                    row.update({k: v for k, v in got.items() if k != "id"})
        return rows

    @verb
    def events(
        self, since: str = "-", count: int = 100, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        """Events after ``since`` ("-" for the oldest kept), oldest first; ``block_ms``
        waits for new ones (a sharded job's: merged by id, each naming its ``shard``; ids
        are the shards' own, in time order across masters whose clocks agree)."""
        key = self.keys.events
        redis_client = self.connection.redis
        with translate(self.connection.url):
            if block_ms is not None:
                start = "$" if since == "-" else since
                reply = redis_client.xread({key: start}, count=count, block=block_ms)
                return [(i, f) for _, entries in reply for i, f in entries]
            lo = since if since == "-" else "(" + since
            return list(redis_client.xrange(key, min=lo, max="+", count=count))

    @verb
    def latest_events(self, kind: str, limit: int, scan: int = 1000) -> list[dict[str, str]]:
        """The newest ``limit`` events of type ``kind`` among the newest ``scan`` events,
        oldest first (bounded)."""
        with translate(self.connection.url, self.keys, self.connection.redis):
            return stats.latest_of_type(self.connection, self.name, kind, limit, scan)

    @verb
    def first_lease_ms(self) -> int | None:
        """When pass 0's first lease was granted (server ms), if still in the events."""
        with translate(self.connection.url, self.keys, self.connection.redis):
            return stats.first_lease_ms(self.connection, self.name)

    @verb
    def workers(self) -> list[dict[str, Any]]:
        """The registered workers with their lease counts (a sharded job: every shard's,
        each row naming its ``shard``; a trainer shows once per shard it is on)."""
        with translate(self.connection.url, self.keys, self.connection.redis):
            return stats.workers(self.connection, self.name)

    # -- passes -------------------------------------------------------------------
    @verb
    def next(self, expected_pass: int | None = None, force: bool = False) -> int:
        """Start the next pass of a job waiting at a manual boundary (a sharded job: every
        shard, under the barrier lock).

        Args:
            expected_pass: the pass the caller believes current (compare-and-set);
                the current one when None.
            force: skip what is left of an incomplete pass (recorded as skipped).

        Returns:
            The pass number after the call.

        Raises:
            PassIncomplete: work left and no force. PassMismatch: ``expected_pass`` is not
            the current pass (the message says which is, and whether it moved on or was
            never reached). JobCompleted, JobCancelled, JobNotFound; TaskqError: a
            checkpoint or rewind holds a sharded job's barrier.
        """
        if expected_pass is None:
            expected_pass = self.status(summaries=0).pass_no
        try:
            reply = self.connection.run(self.name, "advance", ["", expected_pass, int(force)])
        except errors.PassMismatch as e:
            raise errors.PassMismatch(self._mismatch(expected_pass)) from e
        except errors.PassIncomplete as e:
            st = self.status(summaries=0)
            raise errors.PassIncomplete(
                f"job {self.name}: pass {st.pass_no} has work left (todo {st.todo}, leased "
                f"{st.leased}); --force skips it"
            ) from e
        refuse_half_rewind(self.name, reply, 3)
        return int(reply[1])

    def _mismatch(self, expected: int) -> str:
        current = self.status(summaries=0).pass_no
        if expected > current:
            return (
                f"job {self.name}: pass {expected} is not reached yet (the current pass is "
                f"{current}); nothing changed"
            )
        return (
            f"job {self.name}: pass {expected} is over, the pass moved on to {current} "
            f"meanwhile; nothing changed"
        )

    @verb
    def reset(self, expected_pass: int | None = None) -> int:
        """Restart the current pass (a new attempt; its leases become stale).

        Returns:
            The pass restarted.

        Raises:
            PassMismatch: ``expected_pass`` is not the current pass. JobNotFound, ...
        """
        expect = -1 if expected_pass is None else expected_pass
        try:
            reply = self.connection.run(self.name, "reset", ["", expect])
        except errors.PassMismatch as e:
            raise errors.PassMismatch(self._mismatch(expect)) from e
        refuse_half_rewind(self.name, reply, 2)
        return int(reply[1])

    def advance(self, manual: bool = False, wait_s: float = 0.0) -> int | None:
        """A sharded job's barrier step: safe to run any time, by anyone, any number of
        times at once (a plain job moves its passes itself: None).

        It runs under the barrier lock (barrier.py): while another step or a
        checkpoint's cut holds it, this one does nothing (returns None; the next idle
        round, the reaper or the holder itself moves the passes).

        First every shard waiting at a pass below the highest shard's is advanced (an
        earlier step advanced some shards and died). Then, when every unfinished shard
        waits at the same pass ``p`` (its pass complete, or none of its tasks live while
        another shard has live ones) and the job advances by itself (or ``manual``), each
        is advanced with ``expected_pass=p``. A job none of whose tasks is live waits
        (``all_dead``), as a plain job does, until a retry.

        Args:
            manual: advance at a manual boundary too (``next``).
            wait_s: how long to wait for the lock when another holds it.

        Returns:
            The pass advanced to, or None when nothing was ready (or the lock was held).

        Raises:
            JobNotFound: a shard is missing. ConnectionLost.
        """
        if self.sset is None:
            return None
        with barrier_lock(self.connection, self.name, "step", STEP_LOCK_MS, wait_s) as held:
            if held is None:
                return None
            return self._step(manual)

    def _step(self, manual: bool = False) -> int | None:
        """The barrier step's moves (``advance``), for a caller holding the barrier lock."""
        shards = self.shard_statuses()
        if any(s.state == "cancelled" for s in shards):
            for s in shards:  # a cancel that died half-way: finish it
                if s.state not in ("cancelled", "completed"):
                    _cancel_shard(Job(self.connection, s.job))
            return None
        top = max(s.pass_no for s in shards)
        moved = None
        for s in shards:
            if at_boundary(s) and s.pass_no < top:
                self._advance_shard(s, s.pass_no)
                moved = top
        live = [s for s in shards if s.state != "completed"]
        if (
            moved is None
            and live
            and (cast(ShardSet, self.sset).auto_advance or manual)
            and all(at_boundary(s) and s.pass_no == top for s in live)
            and not all(all_dead(s) for s in shards)  # a completed shard had live tasks
        ):
            for s in live:
                self._advance_shard(s, top)
            moved = top + 1
        return moved

    def _advance_shard(self, s: JobStatus, expected: int, force: bool = False) -> None:
        """``next`` on one shard; a shard that moved on already (a repeated step) or
        finished is success. A shard with no live task only moves with ``force`` (it skips
        nothing: no task of it is live, none is leased)."""
        try:
            Job(self.connection, s.job).next(expected_pass=expected, force=force or all_dead(s))
        except (errors.PassMismatch, errors.JobCompleted):
            pass

    # -- tasks and workers --------------------------------------------------------
    @verb
    def retry(self, task_ids: Sequence[int] | None = None) -> int:
        """Put dead tasks (all of them when ``task_ids`` is None) back at the front.

        Args:
            task_ids: the dead tasks to retry; each is checked first (read before the
                write), so a typo is an error rather than "0 retried".

        Returns:
            How many tasks were retried.

        Raises:
            InvalidInput: a task id that does not exist, or a task that is not dead
                (nothing retried). JobNotFound.
        """
        total = 0
        if task_ids:
            ids = sorted({int(t) for t in task_ids})
            for task_id in ids:
                state = self.task(task_id, history=0)["state"]
                if state != "dead":
                    raise errors.InvalidInput(
                        f"job {self.name}: task {task_id} is {state}, not dead; only dead "
                        f"tasks are retried (nothing retried)"
                    )
            for start in range(0, len(ids), MAX_RETRY):
                batch = ids[start : start + MAX_RETRY]
                reply = self.connection.run(self.name, "retry", ["", len(batch), *batch])
                refuse_half_rewind(self.name, reply, 3)
                total += int(reply[1])
            return total
        while True:
            reply = self.connection.run(self.name, "retry", ["", 0])
            refuse_half_rewind(self.name, reply, 3)
            total += int(reply[1])
            if int(reply[1]) == 0 or int(reply[2]) == 0:
                return total

    @verb
    def revoke(self, task_id: int) -> bool:
        """Send one task's lease back to the front (nothing counted).

        Returns:
            True if revoked, False if the task is not leased.

        Raises:
            InvalidInput: no such task. JobNotFound.
        """
        self.task(task_id, history=0)  # no such task: an error, not "not leased"
        reply = self.connection.run(self.name, "revoke", ["", int(task_id)])
        return int(reply[0]) == Code.OK

    @verb
    def drain(self, worker_id: str) -> None:
        """Ask a worker to finish its current task and leave (a sharded job: on every
        shard it is registered on).

        Raises:
            InvalidInput: no such worker.
        """
        self.connection.run(self.name, "drain", ["", worker_id])

    @verb
    def reap(
        self, budget: int = 1000, lock_ms: int = 2000, owner: str = ""
    ) -> tuple[int, bool, bool]:
        """Reclaim expired leases once: at most ``min(budget, MAX_RECLAIM)`` (one call
        stays short whatever the budget). Returns (reclaimed, more_left,
        locked_by_another_reaper); a sharded job's: the sum, any, any."""
        reply = self.connection.run(self.name, "reap", ["", budget, lock_ms, owner or "reaper"])
        if int(reply[0]) == Code.LOCKED:
            return 0, False, True
        return int(reply[1]), bool(int(reply[2])), False

    @verb
    def advance_clock(self, ms: int, silent: bool = False) -> int:
        """Tests only: move a manual-clock job's clock by ``ms`` (a sharded job: every
        shard's; the first's new time).

        Args:
            silent: the advance is not traffic (so the silence rule may apply).
        """
        reply = self.connection.run(self.name, "clock", ["", int(ms), int(silent)])
        return int(reply[1])

    # -- appending ----------------------------------------------------------------
    @verb
    def append(
        self,
        chunks: Iterable[Any],
        ids: Sequence[str] | None = None,
        block: bool = True,
        timeout: float | None = None,
        source: str | None = None,
        feed: str | None = None,
    ) -> AppendResult:
        """Add chunks to the job as new tasks: they join the current pass (after its own
        order) and every later one (docs/streams.md); a sharded job spreads them over its
        shards (``_append_spread``).

        Every chunk and id is checked, as the engine checks them, before the first
        write; the chunks then go in pages (at most ``APPEND_MAX`` chunks and
        ``APPEND_BYTES`` bytes, whole tasks, each one atomic call), so an append
        interrupted half-way has added whole pages, and repeating it with the same
        ``ids`` (or ``source``) adds the rest only.

        Args:
            chunks: JSON-able chunk descriptors, in order (grouped ``chunks_per_task`` to
                a task as at the create; a call's last task may be shorter).
            ids: one id per chunk (a string of 1-1024 bytes, e.g. the file and its
                size): a chunk whose id was appended to this job before is skipped.
            block: when the job's ``max_backlog`` would be passed, wait for trainers to
                ack (woken by the job's events, no polling); False: refuse at once.
            timeout: seconds to wait at most in all (None: as long as it takes).
            source: the name of what ``chunks`` are, from its start (a file: the same
                chunks in the same order every time; 1-1024 bytes). Each page records,
                as it goes in, how many of the source's chunks went in, and a later
                append of the source skips them: exact across a restart mid-source even
                once the tasks (and their ids) were trimmed. The job keeps the last
                ``SOURCES_KEEP`` sources appended to.
            feed: a mixed job's open stream source (docs/mixing.md): the chunks are that
                source's next tasks (``ids`` and ``source`` kept per source); without it a
                mixed job takes no append, and a job that feeds a mixed job takes none.

        Returns:
            The tasks added, the chunks skipped, the first new task's id, the backlog.

        Raises:
            InvalidInput: a chunk that is not JSON (or that Redis would refuse: a lone
                surrogate), bad ids or source, a sealed stream (nothing written; a page
                refused after others went in: the message names the chunks that did).
            BacklogFull: the backlog stayed full (``block=False``, or the timeout
                passed); the pages before went in, the message says how many.
            JobNotFound, JobCancelled.
        """
        encoded, id_list = _check_append(self.name, chunks, ids)
        if source is not None:
            check_chunk_id(self.name, -1, source, "source")
        if not encoded:
            return AppendResult(0, 0, None, self.status(summaries=0).backlog)
        with translate(self.connection.url, self.keys, self.connection.redis):
            cpt, max_backlog, inc = self.connection.redis.hmget(
                self.keys.meta, [F.CPT, F.MAX_BACKLOG, F.INC]
            )
        if inc is None:
            raise errors.JobNotFound(f"job {self.name!r} not found (deleted or replaced)")
        pages = _append_pages(encoded, int(cpt or 1), int(max_backlog or 0))
        deadline = None if timeout is None else time.monotonic() + timeout
        added = skipped = 0
        first: int | None = None
        backlog = 0
        for lo, hi in pages:
            while True:
                args: list[Any] = [inc, 1 if id_list else 0, hi - lo, source or "", lo]
                args += [feed or "", 0]
                for k in range(lo, hi):
                    if id_list:
                        args.append(id_list[k])
                    args.append(encoded[k])
                try:
                    reply = self.connection.run(self.name, "append", args)
                except errors.TaskqError as e:
                    if lo == 0:
                        raise
                    # (a seal, cancel or replace between pages: the pages before stay)
                    rest = (
                        f"chunks {lo}-{hi - 1} may have too (the reply was lost: a resend "
                        f"with ids or source adds nothing twice)"
                        if isinstance(e, errors.ConnectionLost)
                        else f"nothing from chunk {lo} on"
                    )
                    raise type(e)(
                        f"{e}; chunks 0-{lo - 1} went in ({added} tasks appended, "
                        f"{skipped} chunks skipped), {rest}"
                    ) from e
                if int(reply[0]) == Code.OK:
                    break
                backlog, limit, last_id = int(reply[3]), int(reply[4]), str(reply[5])
                left = None if deadline is None else deadline - time.monotonic()
                if not block or (left is not None and left <= 0):
                    raise errors.BacklogFull(
                        f"job {self.name}: backlog {backlog} of max_backlog {limit}: the next "
                        f"{hi - lo} chunks would pass it; {added} tasks appended before, "
                        f"nothing from chunk {lo} on"
                    )
                self._wait_for_events(last_id, left)
            added += int(reply[1])
            skipped += int(reply[2])
            backlog = int(reply[4])
            if first is None and int(reply[1]) > 0:
                first = int(reply[3])
        return AppendResult(added, skipped, first, backlog)

    def _wait_for_events(self, after: str, left: float | None) -> None:
        """Block until the job writes an event after ``after`` (an ack, a pass end) or
        ``left`` seconds pass (at most ``_APPEND_BLOCK_MS``, then the caller asks again)."""
        block_ms = (
            _APPEND_BLOCK_MS if left is None else max(1, min(_APPEND_BLOCK_MS, int(left * 1000)))
        )
        with translate(self.connection.url):
            self.connection.redis.xread({self.keys.events: after}, count=1, block=block_ms)

    @verb
    def files_appended(self, file_keys: Sequence[str]) -> list[bool]:
        """Whether each file (``path|size|version``) was appended whole by a follower
        (``taskq job follow``), from the job's ``follow`` hash (a sharded job's: shard 0's) (one HMGET per
        ``FOLLOW_PAGE`` files, pipelined).

        Raises:
            InvalidInput: a key that is not a file key (``check_file_key``).
        """
        keys = check_file_keys(self.name, file_keys)
        if not keys:
            return []
        with translate(self.connection.url, self.keys, self.connection.redis):
            pipe = self.connection.redis.pipeline(transaction=False)
            for lo in range(0, len(keys), FOLLOW_PAGE):
                pipe.hmget(self.keys.follow, keys[lo : lo + FOLLOW_PAGE])
            pages = pipe.execute()
        return [g is not None for page in pages for g in page]

    @verb
    def file_appended(self, file_key: str, chunks: int) -> None:
        """Note that a file's ``chunks`` chunks were all appended (after its last page:
        a follower stopped before it appends the file again, and the chunk ids skip
        what went in).

        Raises:
            InvalidInput: a key that is not a file key (``check_file_key``).
        """
        (key,) = check_file_keys(self.name, [file_key])
        with translate(self.connection.url, self.keys, self.connection.redis):
            self.connection.redis.hset(self.keys.follow, key, chunks)

    @verb
    def follow_record(self) -> FollowRecord:
        """A follower's record as it starts: its watermark and the file keys above it
        (read in pages of ``FOLLOW_PAGE`` fields; the record is bounded: ``forget_files``)."""
        redis = self.connection.redis
        files: list[str] = []
        with translate(self.connection.url, self.keys, redis):
            mark = redis.hget(self.keys.follow, FOLLOW_WATERMARK)
            cursor = 0
            while True:
                cursor, page = redis.hscan(self.keys.follow, cursor, count=FOLLOW_PAGE)
                files += [k for k in page if k != FOLLOW_WATERMARK]
                if not cursor:
                    break
        watermark = None
        if mark is not None:
            mtime, path = json.loads(mark)
            watermark = (float(mtime), str(path))
        return FollowRecord(watermark, files)

    @verb
    def forget_files(self, watermark: tuple[float, str] | None, file_keys: Sequence[str]) -> None:
        """Move a follower's watermark (every file at or below its ``(mtime, path)`` was
        appended) and drop the record of files it covers or that are gone: the watermark
        is written first, so a stop between the two leaves fields to drop, never a file
        unrecorded. Pages of ``FOLLOW_PAGE`` fields per HDEL.

        Raises:
            InvalidInput: a key that is not a file key (``check_file_key``).
        """
        keys = check_file_keys(self.name, file_keys)
        redis = self.connection.redis
        with translate(self.connection.url, self.keys, redis):
            pipe = redis.pipeline(transaction=False)
            if watermark is not None:
                pipe.hset(self.keys.follow, FOLLOW_WATERMARK, json.dumps(list(watermark)))
            for lo in range(0, len(keys), FOLLOW_PAGE):
                pipe.hdel(self.keys.follow, *keys[lo : lo + FOLLOW_PAGE])
            pipe.execute()

    @verb
    def seal(self, feed: str | None = None) -> SealResult:
        """Close a stream job: nothing more is appended; its pass ends once every task
        appended is done (the job completes after its last pass; a stream of no task
        completes at the seal). Idempotent: sealing a sealed stream changes nothing.
        With ``feed``, the job is a mixed job and ``feed`` its open stream source: the
        source's store is sealed (it runs out once its tasks are taken, docs/mixing.md).

        Returns:
            The number of tasks the stream holds (an int), with ``already_sealed``: the
            stream was sealed before this call.

        Raises:
            InvalidInput: not a stream job. JobNotFound, JobCancelled.
        """
        if feed is not None:  # (the producer's verb: append.lua seals a feed)
            reply = self.connection.run(self.name, "append", ["", 0, 0, "", 0, feed, 1])
        else:
            reply = self.connection.run(self.name, "seal", [""])
        return SealResult(int(reply[1]), bool(int(reply[2])))

    @verb
    def trim(self, steps: int = 8) -> int:
        """Up to ``steps`` bounded steps of a stream's trim (the reaper runs it every
        tick): each moves the watermark over up to ``TRIM_MAX`` finished tasks; the done
        ones' descriptors and records go, the dead ones are set aside with theirs
        (docs/streams.md, "Trimming behind a watermark"); a mixed job fed by an open stream
        source is trimmed the same way over its positions, their copies with them
        (docs/mixing.md, "Trim"). Any other job, or one not in its last pass, is left as
        it is.

        Returns:
            The tasks the watermark passed (0: nothing to do now).
        """
        passed = 0
        for _ in range(steps):
            step = int(self.connection.run(self.name, "trim", ["", TRIM_MAX])[1])
            passed += step
            if step < TRIM_MAX:
                return passed
        return passed

    # -- the job's life -----------------------------------------------------------
    @verb
    def pause(self) -> None:
        """Pause: trainers get no new leases (they wait, without polling, as in a waiting
        state) and keep what they hold; acks and heartbeats go on. Passes may still end
        and start. Idempotent.

        Raises:
            JobNotFound, JobCompleted, JobCancelled.
        """
        self.connection.run(self.name, "pause", [""])

    @verb
    def resume(self) -> None:
        """End a pause: every waiting trainer is woken to lease again. Idempotent.

        Raises:
            JobNotFound.
        """
        self.connection.run(self.name, "resume", [""])

    @verb
    def cancel(self) -> None:
        """Cancel: every lease is revoked; trainers' loops end (a sharded job: every
        shard; the barrier step finishes a cancel that died half-way).

        Raises:
            JobNotFound, JobCompleted.
        """
        self.connection.run(self.name, "cancel", [""])

    @verb
    def delete(self) -> None:
        """Delete every key of the job (a sharded job: every shard and its record); its
        trainers get ``JobNotFound``.

        Raises:
            JobNotFound: no such job.
        """
        conn = self.connection
        try:
            conn.run(self.name, "delete", [""])
        finally:
            with translate(conn.url):
                if not conn.redis.exists(self.keys.meta):
                    conn.redis.srem(jobs_index(conn.prefix), self.name)

    def replace(
        self,
        chunks: Iterable[Any],
        config: JobConfig | None = None,
        progress: Callable[[int, int], None] | None = None,
        **settings: Any,
    ) -> JobStatus:
        """Create the job again from ``chunks`` (a new incarnation), as
        ``Client.create_job`` with ``replace=True``; the shards as many as now unless
        ``shards=`` says otherwise (a plain job stays one, a sharded one sharded: change
        the kind after ``delete``).

        Raises:
            InvalidInput: a change of kind, a bad setting (nothing written).
        """
        kind = {"shards": len(self.shards) or 1} if config is None else {}
        cfg = JobConfig.of(config, **{**kind, **settings})
        if (cfg.shards == 1) != (self.sset is None):
            raise errors.InvalidInput(
                f"job {self.name!r} is a job of one shard: delete it first to make a "
                f"sharded job of that name"
                if self.sset is None
                else f"job {self.name!r} is a sharded job: replace it with shards >= 2, or "
                f"delete it first to make a job of one shard of that name"
            )
        return create(self.connection, self.name, chunks, cfg, replace=True, progress=progress)

    # -- checkpoints --------------------------------------------------------------
    @verb
    def checkpoint(
        self,
        keep: int = checkpoints.DEFAULT_KEEP,
        ckpt: str | None = None,
        policy: bytes | None = None,
    ) -> dict[str, Any]:
        """Record the job's position (pass, done set, progress, counters) under an id (a
        sharded job: one cut over every shard, ``_checkpoint_cut``).

        Args:
            keep: sealed checkpoints kept per job (the oldest beyond it go), 1-1000.
            ckpt: the id (default: a new time-ordered one).
            policy: an opaque blob of up to 64 KiB kept with it (a mixing policy's
                state; ``checkpoint_policy`` reads it back; a sharded job: not built).

        Returns:
            The checkpoint's record; ``record["id"]`` names it (``rewind`` takes either).

        Raises:
            InvalidInput, JobNotFound, JobCancelled; TaskqError while a rewind runs.
        """
        return checkpoints.checkpoint(self.connection, self.name, keep, ckpt, policy)

    @verb
    def checkpoint_policy(self, ckpt: CheckpointRef) -> bytes | None:
        """The policy blob checkpoint ``ckpt`` carries, or None (``checkpoint(policy=)``).

        Raises:
            InvalidInput: no such sealed checkpoint. JobNotFound.
        """
        return checkpoints.policy_of(self.connection, self.name, checkpoint_id(self.name, ckpt))

    @verb
    def checkpoints(self) -> list[dict[str, Any]]:
        """The job's sealed checkpoints, oldest first.

        Raises:
            JobNotFound.
        """
        return checkpoints.listing(self.connection, self.name)

    @verb
    def rewind(self, ckpt: CheckpointRef, once: bool = False, key: str = "") -> bool:
        """Put the job back to checkpoint ``ckpt`` (see ``checkpoints.rewind``; a sharded
        job: every shard to the same cut, ``_rewind_cut``).

        Args:
            ckpt: the checkpoint's id, or the record ``checkpoint`` returned.
            once: skip when the job's last rewind went to ``ckpt`` under the same ``key``
                (a restart's id), or without a key when nothing was acked since
                (restarted trainers loading the same state).
            key: see ``once``.

        Returns:
            True when rewound, False when ``once`` skipped it.

        Raises:
            InvalidInput (unknown checkpoint), JobNotFound, JobCancelled.
        """
        return checkpoints.rewind(
            self.connection, self.name, checkpoint_id(self.name, ckpt), once, key
        )

    def checkpoint_record(self, ckpt: str) -> dict[str, Any]:
        """One sharded checkpoint's record (a sharded job's).

        Raises:
            InvalidInput: no such checkpoint (never made, unfinished or dropped).
        """
        conn = self.connection
        with translate(conn.url):
            raw = conn.redis.hget(shard_set_key(self.name, conn.prefix), CKPT_FIELD + ckpt)
        if raw is None:
            raise errors.InvalidInput(
                f"job {self.name!r}: no checkpoint {ckpt!r} (see `taskq job checkpoints "
                f"{self.name}`)"
            )
        rec: dict[str, Any] = json.loads(raw)
        return rec


# -- combines: a sharded job's replies as the whole job's ------------------------------
def summed(job: Job, replies: list[tuple[Job, Any]], *_: Any, **__: Any) -> int:
    """The shards' counts summed."""
    return sum(int(reply) for _, reply in replies)


def _first(job: Job, replies: list[tuple[Job, Any]], *_: Any, **__: Any) -> Any:
    return replies[0][1]


def _each_shard(job: Job, replies: list[tuple[Job, Any]], *_: Any, **__: Any) -> list[Any]:
    """Rows of every shard, each naming its ``shard``."""
    return [{**row, "shard": shard.name} for shard, rows in replies for row in rows]


def _earliest(job: Job, replies: list[tuple[Job, Any]], *_: Any, **__: Any) -> int | None:
    return min((ms for _, ms in replies if ms is not None), default=None)


def _samples(
    job: Job, replies: list[tuple[Job, Any]], *_: Any, **__: Any
) -> tuple[int, int | None]:
    """The shards' ``samples`` summed; ``(0, None)`` when a shard's sizes are unknown."""
    if any(total is None for _, (_, total) in replies):
        return 0, None
    return sum(r[0] for _, r in replies), sum(r[1] for _, r in replies)


def _latest_events(
    job: Job, replies: list[tuple[Job, Any]], kind: str, limit: int, *_: Any, **__: Any
) -> list[dict[str, str]]:
    rows = _each_shard(job, replies)
    rows.sort(key=lambda e: event_order(str(e.get("id", "0-0"))))
    return rows[-limit:] if limit > 0 else []


def _reaped(job: Job, replies: list[tuple[Job, Any]], *_: Any, **__: Any) -> tuple[int, bool, bool]:
    """(reclaimed in all, more left in any, any locked)."""
    return (
        sum(r[0] for _, r in replies),
        any(r[1] for _, r in replies),
        any(r[2] for _, r in replies),
    )


def _sealed(job: Job, replies: list[tuple[Job, Any]], *_: Any, **__: Any) -> SealResult:
    """The tasks the stream holds in all (``already_sealed``: every shard was)."""
    return SealResult(sum(r for _, r in replies), all(r.already_sealed for _, r in replies))


def _audit(job: Job, replies: list[tuple[Job, Any]], *_: Any, **__: Any) -> dict[str, Any]:
    return shardset.sharded_audit(
        cast(ShardSet, job.sset), [a for _, a in replies], job.shard_statuses()
    )


# -- a sharded job's code of its own (OWN routes) ----------------------------------------
def _status(job: Job, summaries: int = 20) -> ShardedStatus:
    redis_client = job.connection.redis
    masters = [
        str(redis_client.get_node_from_key(s.keys.meta).name)
        if isinstance(redis_client, RedisCluster)
        else None
        for s in job.shards
    ]
    return shardset.sharded_status(cast(ShardSet, job.sset), job.shard_statuses(), masters)


def _tasks_page(
    job: Job, state: str = "leased", cursor: str = "0", count: int = PAGE_MAX
) -> tuple[list[dict[str, Any]], str]:
    """One page of one shard's tasks (global ids); the cursor ``"<shard index>:<its
    cursor>"`` goes on through the shards, ``"0"`` at the end."""
    check_page(state, count)
    k, _, inner = cursor.partition(":") if cursor != "0" else ("0", "", "0")
    if not k.isdigit() or int(k) >= len(job.shards) or not inner:
        raise errors.InvalidInput(f"job {job.name}: bad cursor {cursor[:40]!r}")
    shard = job.shards[int(k)]
    rows, nxt = shard.tasks_page(state, inner, count)
    if nxt != "0":
        nxt = f"{k}:{nxt}"
    elif int(k) + 1 < len(job.shards):
        nxt = f"{int(k) + 1}:0"
    return [job.globalize(shard, r) for r in rows], nxt


def _events(
    job: Job, since: str = "-", count: int = 100, block_ms: int | None = None
) -> list[tuple[str, dict[str, str]]]:
    """Every shard's events after ``since``, merged by id; ``block_ms`` waits for new
    ones, looking every ``EVENTS_POLL_S`` (no blocking read spans slots)."""

    def merged(start: str) -> list[tuple[str, dict[str, str]]]:
        parts = [
            [(i, {**f, "shard": s.name}) for i, f in s.events(start, count)] for s in job.shards
        ]
        return list(itertools.islice(heapq.merge(*parts, key=lambda e: event_order(e[0])), count))

    if block_ms is None:
        return merged(since)
    if since == "-":  # from the newest event over the shards
        with translate(job.connection.url):
            newest = [job.connection.redis.xrevrange(s.keys.events, count=1) for s in job.shards]
        ids = [e[0][0] for e in newest if e]
        since = max(ids, key=event_order) if ids else "0-0"
    deadline = time.monotonic() + block_ms / 1000.0
    while True:
        got = merged(since)
        if got or time.monotonic() >= deadline:
            return got
        time.sleep(EVENTS_POLL_S)


def _next(job: Job, expected_pass: int | None = None, force: bool = False) -> int:
    """Start the next pass of every shard (``Job.next``; under the barrier
    lock, waiting ``ADMIN_WAIT_S`` for it).
    """
    name = job.name
    with barrier_lock(job.connection, name, "step", STEP_LOCK_MS, ADMIN_WAIT_S) as held:
        if held is None:
            raise errors.TaskqError(
                f"job {name}: a checkpoint or rewind holds the barrier (over "
                f"{ADMIN_WAIT_S:g} s); nothing changed, try again"
            )
        st = _status(job)
        if st.state == "completed":
            raise errors.JobCompleted(f"job {name!r} is completed")
        if st.state == "cancelled":
            raise errors.JobCancelled(f"job {name!r} was cancelled")
        if expected_pass is not None and expected_pass != st.pass_no:
            raise errors.PassMismatch(
                f"job {name}: the current pass is {st.pass_no}, not {expected_pass}; "
                f"nothing changed"
            )
        if force:
            for s in st.shards:
                if s.state != "completed" and s.pass_no == st.pass_no:
                    job._advance_shard(s, s.pass_no, force=True)
            job._step()
            return job.status().pass_no
        moved = job._step(manual=True)
        if moved is not None:
            return moved
        left = [
            f"{s.job} (todo {s.todo}, leased {s.leased})"
            for s in st.shards
            if not at_boundary(s) and s.state != "completed"
        ]
        if not left:
            raise errors.PassIncomplete(
                f"job {name}: no task of pass {st.pass_no} is live (all dead); retry them "
                "(taskq tasks retry) or --force"
            )
        raise errors.PassIncomplete(
            f"job {name}: pass {st.pass_no} has work left in {', '.join(left)}; --force skips it"
        )


def _reset(job: Job, expected_pass: int | None = None) -> int:
    """Restart the current pass in every shard (its leases become stale)."""
    st = _status(job)
    if expected_pass is not None and expected_pass != st.pass_no:
        raise errors.PassMismatch(
            f"job {job.name}: the current pass is {st.pass_no}, not {expected_pass}; "
            f"nothing changed"
        )
    for s in st.shards:
        if s.state != "completed" and s.pass_no == st.pass_no:
            try:
                Job(job.connection, s.job).reset(expected_pass=st.pass_no)
            except errors.PassMismatch:
                pass
    return st.pass_no


def _retry(job: Job, task_ids: Sequence[int] | None = None) -> int:
    """Retry dead tasks (global ids; all when None) in every shard."""
    if not task_ids:
        return sum(s.retry() for s in job.shards)
    by_shard: dict[Job, list[int]] = {}
    for t in task_ids:
        shard, local = job.locate(t)
        by_shard.setdefault(shard, []).append(local)
    return sum(shard.retry(ids) for shard, ids in by_shard.items())


def _drain(job: Job, worker_id: str) -> None:
    """Ask a worker to finish and leave, on every shard it is registered on."""
    found = False
    for shard in job.shards:
        if any(w["id"] == worker_id for w in shard.workers()):
            shard.drain(worker_id)
            found = True
    if not found:
        raise errors.InvalidInput(f"job {job.name}: no worker {worker_id!r}")


def _cancel_shard(shard: Job) -> None:
    try:
        shard.cancel()
    except (errors.JobCancelled, errors.JobCompleted):
        pass


def _cancel(job: Job) -> None:
    """Cancel every shard (idempotent per shard; the barrier step finishes a cancel
    that died half-way).
    """
    shards = job.shard_statuses()
    if all(s.state == "completed" for s in shards):
        raise errors.JobCompleted(f"job {job.name!r} is completed")
    for s in shards:
        if s.state not in ("cancelled", "completed"):
            _cancel_shard(Job(job.connection, s.job))


def _delete(job: Job) -> None:
    """Delete every shard and the record (shards already gone are skipped)."""
    conn = job.connection
    require(conn, job.name)
    for shard in job.shards:
        try:
            shard.delete()
        except errors.JobNotFound:
            pass
    with translate(conn.url):
        conn.redis.delete(shard_set_key(job.name, conn.prefix))
        conn.redis.srem(shard_sets_index(conn.prefix), job.name)


def _position(job: Job) -> list[tuple[int, int, bool]]:
    """What a cut must not see move: each shard's (pass, pass attempt, finished)."""
    return [
        (st.pass_no, st.pass_attempt, st.state in ("completed", "cancelled"))
        for st in job.shard_statuses()
    ]


def _moved(job: Job, before: list[Any], after: list[Any]) -> bool:
    """True when a shard's pass moved between ``before`` and ``after`` (``_position``).

    A shard that completed the job's last pass meanwhile has not: the last pass has
    no barrier (each shard completes by itself), so its part, taken before or after,
    is one of the same cut.
    """
    passes = cast(ShardSet, job.sset).passes
    last = None if passes is None else passes - 1
    for (b_pass, b_attempt, b_end), (a_pass, a_attempt, a_end) in zip(before, after, strict=True):
        if (b_pass, b_attempt, b_end) == (a_pass, a_attempt, a_end):
            continue
        if a_end and not b_end and b_pass == last and a_pass in (last, passes):
            continue
        return True
    return False


def _free_id(job: Job, ckpt: str, attempt: int) -> str:
    """The shards' checkpoint id for cut ``attempt`` of ``ckpt``: one no shard holds
    yet (sealed or half-written by an attempt that died or was refused), so no shard's
    part of the cut is an older one."""
    redis_client = job.connection.redis
    for k in itertools.count(attempt):
        candidate = ckpt if k == 0 else f"{ckpt[:58]}.r{k}"
        with translate(job.connection.url):
            taken = any(redis_client.hexists(s.keys.ckpt, candidate) for s in job.shards)
        if not taken:
            return candidate
    raise AssertionError("unreachable")


def _checkpoint_cut(
    job: Job,
    keep: int = checkpoints.DEFAULT_KEEP,
    ckpt: str | None = None,
    policy: bytes | None = None,
) -> dict[str, Any]:
    """Checkpoint every shard as one cut, then list it in the shard-set record.

    The cut is taken under the barrier lock: no barrier step moves a pass while it is
    taken. Every shard's (pass, attempt) is read before and after; if any moved all
    the same (a lock that expired, a pass reset), the cut is refused and taken again
    under a new id for the shards (``<id>.r<k>``, recorded in the sharded record), up
    to ``CUT_ATTEMPTS`` times.

    Args:
        keep: sealed checkpoints kept (per shard, and in the record), 1-1000.
        ckpt: the id (default: a new time-ordered one); an id already listed is
            returned as it is.

    Returns:
        The sharded checkpoint: ``id``, ``pass`` (the lowest shard's), ``done`` and
        ``unfinished`` (sums), ``job_state`` (the shards' if they agree, else
        ``mixed``), ``sealed_ms`` (the last shard's), ``shard_ids`` (shard -> its
        checkpoint's id) and ``shards`` (each shard's record).
    """
    if policy is not None:
        _no_policy(job)
    conn, name = job.connection, job.name
    if not isinstance(keep, int) or isinstance(keep, bool) or not 1 <= keep <= 1000:
        raise errors.InvalidInput(f"keep must be an integer 1-1000, got {keep!r}")
    ckpt = checkpoint_id(name, ckpt or checkpoints.new_id())
    key = shard_set_key(name, conn.prefix)
    with translate(conn.url):
        listed = conn.redis.hget(key, CKPT_FIELD + ckpt)
    if listed is not None:
        done: dict[str, Any] = json.loads(listed)
        return done
    # the shards keep a few more than the record: a refused attempt's parts count there
    shard_keep = min(1000, keep + CUT_ATTEMPTS)
    for attempt in range(CUT_ATTEMPTS):
        with barrier_lock(conn, name, "checkpoint", CUT_LOCK_MS, CUT_WAIT_S) as keep_lock:
            if keep_lock is None:
                continue  # a barrier step holds it past the wait: try again
            shard_id = _free_id(job, ckpt, attempt)
            before = _position(job)
            recs = []
            for shard in job.shards:
                recs.append(shard.checkpoint(keep=shard_keep, ckpt=shard_id))
                keep_lock()
            if _moved(job, before, _position(job)) or not keep_lock():
                log.warning("job %s: checkpoint %s: a pass moved during the cut; again", name, ckpt)
                continue
        out = shardset.combine_checkpoints(ckpt, recs)
        out["shard_ids"] = dict.fromkeys(cast(ShardSet, job.sset).shards, shard_id)
        with translate(conn.url):
            conn.redis.hset(key, CKPT_FIELD + ckpt, json.dumps(out))
            ids = sorted(f for f in conn.redis.hkeys(key) if f.startswith(CKPT_FIELD))
            if len(ids) > keep:  # ids are time-ordered: the oldest go, as per shard
                conn.redis.hdel(key, *ids[: len(ids) - keep])
        # a step refused while the cut held the lock is not left to the trainers' next
        # idle round (seconds away, at a pass's tail): the cut's taker runs it now
        job.advance()
        return out
    raise errors.TaskqError(
        f"job {name!r}: checkpoint {ckpt}: the passes moved (or a barrier step held the "
        f"lock) during {CUT_ATTEMPTS} attempts at one cut; try again"
    )


# -- appending: spread over the shards -------------------------------------------


def _append_spread(
    job: Job,
    chunks: Iterable[Any],
    ids: Sequence[str] | None = None,
    block: bool = True,
    timeout: float | None = None,
    source: str | None = None,
    feed: str | None = None,
) -> AppendResult:
    """Add chunks as new tasks, spread over the shards (the plain form on each,
    docs/streams.md): a chunk with an id goes to the shard its id hashes to (``shard_of_id``: so a
    retried append finds the id where it went the first time and skips it); chunks
    without ids go a task at a time in turn, from where the job's layout stands
    (global task ``i`` in shard ``i % S`` while every append is without ids).

    Everything is checked before the first write. ``block`` and ``timeout`` as for a
    plain job, each shard against its own ``max_backlog`` (the job's divided among
    them); ``timeout`` bounds the whole call. ``source`` (with ids only: the ids
    decide each chunk's shard, the same every time) is recorded on each shard for
    its part of the source.

    Returns:
        The tasks added, chunks skipped, the lowest new task's global id, the backlog
        summed over the shards.
    """
    if feed is not None:
        raise errors.InvalidInput("not a mixed job: --feed names a stream source of a mixed job")
    encoded, id_list = _check_append(job.name, chunks, ids)
    if source is not None:
        check_chunk_id(job.name, -1, source, "source")
        if id_list is None:
            raise errors.InvalidInput(
                f"job {job.name}: a sharded job's append names a source only with ids "
                f"(they place each chunk on its shard, the same every time)"
            )
    if not encoded:
        return AppendResult(0, 0, None, job.status().backlog)
    decoded = [json.loads(text) for text in encoded]
    count = len(job.shards)
    parts: list[list[int]] = [[] for _ in range(count)]
    if id_list is not None:
        for k, chunk_id in enumerate(id_list):
            parts[shardset.shard_of_id(chunk_id, count)].append(k)
    else:
        now = job.shard_statuses()
        cpt = int(now[0].config.get("chunks_per_task") or 1)
        base = sum(st.tasks for st in now)
        for k in range(len(encoded)):
            parts[(base + k // cpt) % count].append(k)
    deadline = None if timeout is None else time.monotonic() + timeout
    added = skipped = 0
    firsts: list[int] = []
    for shard, part in zip(job.shards, parts, strict=True):
        if not part:
            continue
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        got = shard.append(
            [decoded[k] for k in part],
            None if id_list is None else [id_list[k] for k in part],
            block=block,
            timeout=left,
            source=source,
        )
        added += got.tasks
        skipped += got.skipped
        if got.first_task is not None:
            firsts.append(cast(ShardSet, job.sset).global_id(shard.name, got.first_task))
    return AppendResult(added, skipped, min(firsts, default=None), job.status().backlog)


def _checkpoints(job: Job) -> list[dict[str, Any]]:
    """The sharded job's sealed checkpoints, oldest first."""
    conn = job.connection
    require(conn, job.name)
    with translate(conn.url):
        raw = conn.redis.hgetall(shard_set_key(job.name, conn.prefix))
    return [json.loads(raw[f]) for f in sorted(raw) if f.startswith(CKPT_FIELD)]


def _rewind_cut(job: Job, ckpt: CheckpointRef, once: bool = False, key: str = "") -> bool:
    """Put every shard back to its part of the cut ``ckpt`` (its id or its record),
    then run the barrier step, all under the barrier lock; after it every unfinished
    shard is at the same pass.

    Returns:
        True when some shard was rewound, False when ``once`` found all already there.
    """
    name = job.name
    ckpt = checkpoint_id(name, ckpt)
    ids: dict[str, str] = job.checkpoint_record(ckpt).get("shard_ids") or {}
    with barrier_lock(job.connection, name, "rewind", CUT_LOCK_MS, CUT_WAIT_S) as keep_lock:
        if keep_lock is None:
            raise errors.TaskqError(
                f"job {name!r}: a barrier step or checkpoint holds the barrier (over "
                f"{CUT_WAIT_S:g} s); nothing rewound, try again"
            )
        moved = []
        for shard in job.shards:
            moved.append(shard.rewind(ids.get(shard.name, ckpt), once=once, key=key))
            keep_lock()
        job._step()  # a cut that straddled a half-done step: finish it
    live = [s for s in job.shard_statuses() if s.state != "completed"]
    if len({s.pass_no for s in live}) > 1:
        raise errors.TaskqError(
            f"job {name!r}: rewound to {ckpt}, but the shards are at passes "
            f"{sorted({s.pass_no for s in live})}; run `taskq pass next {name}` or "
            f"rewind again"
        )
    return any(moved)


#: How a sharded job runs each verb of ``Job`` (one entry per ``@verb``): a new verb is a
#: method and, for sharded jobs, one line here.
def _no_policy(job: Job, *_: Any, **__: Any) -> Any:
    """A policy blob on a sharded job's checkpoint: not built (refused)."""
    raise errors.InvalidInput(f"job {job.name!r}: a sharded checkpoint carries no policy blob")


def _not_mixed(job: Job, *_: Any, **__: Any) -> Any:
    """A mixed job's verbs on a sharded job: refused (a mixed job is one engine job;
    docs/mixing.md)."""
    raise errors.InvalidInput(f"job {job.name!r} is sharded, not a mixed job (docs/mixing.md)")


ROUTES: dict[str, Route] = {
    "status": Route(OWN, _status),
    "samples": Route(EVERY, _samples),
    "audit": Route(EVERY, _audit),
    "task": Route(TASK, Job.globalize),
    "tasks_page": Route(OWN, _tasks_page),
    "events": Route(OWN, _events),
    "latest_events": Route(EVERY, _latest_events),
    "first_lease_ms": Route(EVERY, _earliest),
    "workers": Route(EVERY, _each_shard),
    "next": Route(OWN, _next),
    "reset": Route(OWN, _reset),
    "retry": Route(OWN, _retry),
    "revoke": Route(TASK),
    "drain": Route(OWN, _drain),
    "reap": Route(EVERY, _reaped),
    "advance_clock": Route(EVERY, _first),
    "append": Route(OWN, _append_spread),
    "files_appended": Route(HOME),
    "file_appended": Route(HOME),
    "follow_record": Route(HOME),
    "forget_files": Route(HOME),
    "seal": Route(EVERY, _sealed),
    "trim": Route(EVERY, summed),
    "pause": Route(LIVE),
    "resume": Route(LIVE),
    "cancel": Route(OWN, _cancel),
    "delete": Route(OWN, _delete),
    "checkpoint": Route(OWN, _checkpoint_cut),
    "checkpoints": Route(OWN, _checkpoints),
    "checkpoint_policy": Route(OWN, _no_policy),
    "rewind": Route(OWN, _rewind_cut),
    "set_weights": Route(OWN, _not_mixed),
    "mix_sequence": Route(OWN, _not_mixed),
    "mix_status": Route(OWN, _not_mixed),
}


def advance_all(conn: Connection) -> dict[str, int]:
    """The barrier step for every sharded job in the index (for a reaper's tick): a job
    whose trainers all died at a pass boundary moves on without them.

    Returns:
        Sharded job -> the pass it advanced to, for those that moved.
    """
    moved = {}
    for name in list_sets(conn):
        try:
            to = Job(conn, require(conn, name)).advance()
        except errors.JobNotFound:
            continue  # deleted meanwhile, or a shard missing (status shows which)
        if to is not None:
            moved[name] = to
    return moved


def _check_append(
    job: str, chunks: Iterable[Any], ids: Sequence[str] | None
) -> tuple[list[str], list[str] | None]:
    """The chunks' JSON and the ids, checked whole before anything is written.

    Raises:
        InvalidInput: one line naming the first bad chunk or id.
    """
    if isinstance(chunks, (str, bytes, dict)):
        raise errors.InvalidInput(f"job {job}: append takes a list of chunks, not one chunk")
    encoded = [encode_chunk(job, i, chunk) for i, chunk in enumerate(chunks)]
    if ids is None:
        return encoded, None
    if isinstance(ids, (str, bytes)):
        raise errors.InvalidInput(f"job {job}: ids must be a list of strings, one per chunk")
    id_list = list(ids)
    if len(id_list) != len(encoded):
        raise errors.InvalidInput(
            f"job {job}: {len(id_list)} ids for {len(encoded)} chunks; give one id per chunk"
        )
    for i, chunk_id in enumerate(id_list):
        check_chunk_id(job, i, chunk_id)
    return encoded, id_list


#: A JSON string escape (``\uXXXX``, or a backslash and one character), read left to right so
#: an escaped backslash is never taken for the start of an escape.
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)")


def _lone_surrogate(text: str) -> bool:
    """Whether the JSON ``text`` (ASCII, as ``json.dumps`` writes it) escapes a UTF-16
    surrogate that is not half of a pair: Redis's cjson refuses such a text."""
    pending_high = -1  # the end of a high surrogate's escape, waiting for its low half
    for m in _ESCAPE.finditer(text):
        code = int(m.group(1), 16) if m.group(1) else -1
        if pending_high >= 0:
            if m.start() == pending_high and 0xDC00 <= code <= 0xDFFF:
                pending_high = -1
                continue
            return True
        if 0xD800 <= code <= 0xDBFF:
            pending_high = m.end()
        elif 0xDC00 <= code <= 0xDFFF:
            return True
    return pending_high >= 0


def encode_chunk(job: str, i: int, chunk: Any) -> str:
    """Chunk ``i`` of an append as the JSON the engine stores, checked as the engine
    checks it (append.lua decodes it with Redis's cjson).

    Raises:
        InvalidInput: not JSON (or NaN, or nested deeper than Python encodes), a lone
            surrogate in a string, more than ``APPEND_BYTES`` bytes.
    """
    try:
        text = json.dumps(chunk, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise errors.InvalidInput(f"job {job}: chunk {i} is not JSON: {e}") from e
    if "\\ud" in text and _lone_surrogate(text):  # (json.dumps writes lower-case hex)
        raise errors.InvalidInput(
            f"job {job}: chunk {i} holds a lone UTF-16 surrogate (not Unicode text; Redis "
            f"refuses its JSON)"
        )
    if len(text) > APPEND_BYTES:  # ASCII: its length is its bytes
        raise errors.InvalidInput(f"job {job}: chunk {i} is over {APPEND_BYTES} bytes of JSON")
    return text


def check_chunk_id(job: str, i: int, chunk_id: Any, what: str = "") -> None:
    """Refuse id ``i`` of an append (or ``what``: its source) unless it is a string of
    1-1024 bytes of UTF-8.

    Raises:
        InvalidInput: one line naming it.
    """
    what = what or f"id {i}"
    if isinstance(chunk_id, str):
        try:
            size = len(chunk_id.encode())
        except UnicodeEncodeError:
            raise errors.InvalidInput(
                f"job {job}: {what} holds a lone UTF-16 surrogate (not Unicode text), got "
                f"{_short(chunk_id)}"
            ) from None
        if 1 <= size <= 1024:
            return
    raise errors.InvalidInput(
        f"job {job}: {what} must be a string of 1-1024 bytes, got {_short(chunk_id)}"
    )


def check_file_keys(job: str, file_keys: Iterable[Any]) -> list[str]:
    """The keys of files in a follower's record, refused unless each is a string of
    UTF-8 text other than the record's watermark field (a file named by bytes that are
    not UTF-8 comes to Python with lone surrogates, which Redis cannot be sent).

    Raises:
        InvalidInput: one line naming the first bad key; nothing is sent.
    """
    keys = list(file_keys)
    for key in keys:
        if not isinstance(key, str) or not key or key == FOLLOW_WATERMARK:
            raise errors.InvalidInput(
                f"job {job}: a file key is a non-empty string other than "
                f"{FOLLOW_WATERMARK!r}, got {_short(key)}"
            )
        try:
            key.encode()
        except UnicodeEncodeError:
            raise errors.InvalidInput(
                f"job {job}: file key {_short(key)} holds a lone UTF-16 surrogate (not "
                "Unicode text: a name whose bytes are not UTF-8)"
            ) from None
    return keys


def _append_pages(encoded: list[str], cpt: int, max_backlog: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of whole tasks, each within one append call's bounds (and the
    backlog's, so a page can go in once the backlog is empty)."""
    per_page = (APPEND_MAX // cpt) * cpt or APPEND_MAX
    if max_backlog > 0:
        per_page = min(per_page, max(1, max_backlog * cpt))
    pages: list[tuple[int, int]] = []
    lo = 0
    while lo < len(encoded):
        hi, size = lo, 0
        while hi < len(encoded) and hi - lo < per_page:
            size += len(encoded[hi].encode())
            if hi > lo and size > APPEND_BYTES:
                break
            hi += 1
        # whole tasks when the bytes cut a page short (a task of big chunks may span two)
        if hi < len(encoded) and hi - lo > cpt:
            hi -= (hi - lo) % cpt
        pages.append((lo, hi))
        lo = hi
    return pages


def check_page(state: str, count: int) -> None:
    if state not in ("todo", "leased", "done", "dead"):
        raise errors.InvalidInput(f"state must be todo, leased, done or dead, not {state!r}")
    if not 1 <= int(count) <= PAGE_MAX:
        raise errors.InvalidInput(f"count must be in [1, {PAGE_MAX}], got {count}")


def check_limit(limit: int) -> int:
    if int(limit) < 1:
        raise errors.InvalidInput(f"limit must be >= 1, got {limit}")
    return int(limit)


# -- creating a job --------------------------------------------------------------------
def create(
    conn: Connection,
    name: str,
    chunks: Iterable[Any],
    cfg: JobConfig,
    replace: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> JobStatus:
    """Create (or replace) job ``name`` from ``chunks`` with the settings ``cfg``:
    everything checked first (name, settings, chunks, a Redis that may evict keys, no job
    in the way), staged, flipped live at once; ``cfg.shards`` > 1: a sharded job
    (``_create_sharded``). A stream may start empty.

    Args:
        progress: called with (tasks_written, total) while staging (a plain job).

    Returns:
        The new job's status (a sharded job's: a ``ShardedStatus``).

    Raises:
        InvalidInput: bad name, config or chunks (nothing written); InvalidConfig (a
            subclass) for a setting out of range or a Redis that may evict keys.
        JobExists: the name is taken (by the other kind too) and ``replace`` is false.
        ConnectionLost: Redis is unreachable.
    """
    if cfg.shards != 1 and (not valid_job_name(name) or len(name) > MAX_SHARDED_NAME):
        raise errors.InvalidInput(
            f"bad sharded job name {_short(name)}: use 1-{MAX_SHARDED_NAME} of A-Z a-z 0-9 . _ -"
        )
    keys = conn.keys(name)
    validate_config(cfg)
    chunk_list = list(chunks)
    spec, mix_sizes, fields = None, None, None
    if cfg.mix is not None:  # its tasks are its sources' (admin/mix.py)
        if chunk_list:
            raise errors.InvalidInput("a mixed job takes its tasks from its sources: no chunks")
        check_name(name)
        (tasks, nchunks), fields, spec, mix_sizes = mix.read_sources(conn, name, cfg)
    elif cfg.stream and not chunk_list:
        tasks, nchunks = [], 0
    else:
        tasks, nchunks = encode_tasks(chunk_list, cfg.chunks_per_task)
    if cfg.shards != 1 and not cfg.stream and not cfg.shards <= len(tasks):
        raise errors.InvalidInput(f"shards must be 2..{len(tasks)} (the tasks), got {cfg.shards}")
    if not conn.allow_eviction:
        with translate(conn.url):
            check_memory_policy(stats.memory_policy(conn.redis), conn.url)
    old = shardset.load(conn, name)
    with translate(conn.url):
        plain = conn.redis.exists(keys.meta)
    if cfg.shards != 1:
        if plain:
            raise errors.JobExists(f"job {name!r} exists as a job of one shard")
        if old is not None and not replace:
            raise errors.JobExists(f"sharded job {name!r} exists")
        return _create_sharded(conn, name, chunk_list, len(tasks), cfg, replace, old)
    if old is not None:  # no plain job beside a sharded one
        raise errors.JobExists(
            f"job {name!r} exists as a sharded job (replace it with shards >= 2, or "
            f"delete it first)"
        )
    if plain and not replace:
        raise errors.JobExists(f"job {name!r} exists")
    incarnation = secrets.token_hex(8)
    staging = keys.staging_chunks(incarnation)
    extra = [staging, keys.staging_sizes(incarnation)]
    try:
        with translate(conn.url):
            if mix_sizes is not None:  # (lib/mix.lua reads them: create.lua renames it)
                blocks = list(mix_sizes.items())
                for start in range(0, len(blocks), STAGING_BATCH // 64):
                    pipe = conn.redis.pipeline(transaction=False)
                    pipe.hset(extra[1], mapping=dict(blocks[start : start + STAGING_BATCH // 64]))
                    pipe.expire(extra[1], STAGING_TTL_S)
                    pipe.execute()
            for start in range(0, len(tasks), STAGING_BATCH):
                batch = tasks[start : start + STAGING_BATCH]
                pipe = conn.redis.pipeline(transaction=False)
                pipe.hset(
                    staging,
                    mapping={
                        (fields[start + i] if fields else str(start + i)): t
                        for i, t in enumerate(batch)
                    },
                )
                pipe.expire(staging, STAGING_TTL_S)
                pipe.execute()
                if progress:
                    progress(start + len(batch), len(tasks))
        tt = cfg.task_timeout
        meta = {
            F.INC: incarnation,
            F.STATE: "running",
            F.REASON: "",
            F.PASS: 0,
            F.PASSES: -1 if cfg.passes is None else cfg.passes,
            F.ROUND: 1,
            F.N: len(tasks),
            F.NCHUNKS: nchunks,
            F.CPT: cfg.chunks_per_task,
            F.TTL: int(cfg.worker_ttl * 1000),
            F.HBI: int(cfg.heartbeat_interval * 1000),
            F.TT: "auto" if tt == "auto" else "none" if tt is None else str(int(float(tt) * 1000)),
            F.MAXF: cfg.max_failures,
            F.MAXA: cfg.max_attempts,
            F.SHUFFLE: int(cfg.shuffle),
            F.SEED: cfg.seed % 65521,
            F.SEED_FULL: cfg.seed,
            F.ADVANCE: int(cfg.auto_advance),
            F.MCLOCK: int(cfg.manual_clock),
            F.CURSOR: 0,
            F.NDONE: 0,
            F.NLEASED: 0,
            F.NRESERVED: 0,
            F.OFFSET: 0,
            F.GEN: 0,
            F.EVMAX: 10000,
            F.AUTO_TT: 0,
            F.ACKED_JOB: 0,
            F.FSEQ: 0,
            F.BACKUP_K: cfg.backup_factor if cfg.backup_leases else 0,
            F.SPLIT: 1 if cfg.split_tails else 0,
            F.SORDER: "shuffled" if cfg.shuffle_samples else "chunks",
            F.PN: len(tasks),
            F.STREAM: "open" if cfg.stream else "",
            F.MAX_BACKLOG: cfg.max_backlog or 0,
        }
        if spec is not None:  # the order of a pass is the mix schedule (lib/mix.lua)
            meta[F.SHUFFLE], meta[F.MIX] = "m", spec.to_json()
            meta[F.N] = meta[F.PN] = spec.stride  # (N fixed at create: the slot's stride)
        args: list[Any] = [int(replace), len(tasks)]
        for k, v in meta.items():
            args += [k, v]
        conn.run(name, "create", args, extra_keys=extra)
    except BaseException:
        with translate(conn.url):
            conn.redis.unlink(*extra)
        raise
    with translate(conn.url):
        conn.redis.sadd(jobs_index(conn.prefix), name)
    return Job(conn, name).status()


def _create_sharded(
    conn: Connection,
    name: str,
    chunks: list[Any],
    tasks: int,
    cfg: JobConfig,
    replace: bool,
    old: ShardSet | None,
) -> JobStatus:
    """``create`` of a sharded job of ``cfg.shards`` shards, ``chunks`` checked.

    The shard-set record is written first (a create that dies half-way leaves a set
    naming its shards: status shows the missing ones, create --replace or delete cleans
    up), then each shard is created as a plain job with a manual pass boundary (the
    barrier step starts the next pass when ``cfg.auto_advance``), global task ``i`` in
    shard ``i % S``, ``max_backlog`` divided among them (``ceil(max / S)`` each). A
    replace drops the old shards no longer named.
    """
    shards, cpt = cfg.shards, cfg.chunks_per_task
    names = shardset.place(conn, name, shards)
    with translate(conn.url):
        taken = [
            s
            for s in names
            if (old is None or s not in old.shards) and conn.redis.exists(conn.keys(s).meta)
        ]
    if taken:
        raise errors.JobExists(f"job {taken[0]!r} exists: it would be a shard of {name!r}")
    # global task i -> shard i % S: each shard's chunks regroup into the same tasks
    per_shard: list[list[Any]] = [[] for _ in range(shards)]
    for i in range(tasks):
        per_shard[i % shards].extend(chunks[i * cpt : (i + 1) * cpt])
    record = {
        "shards": json.dumps(names),
        "tasks": tasks,
        "passes": -1 if cfg.passes is None else cfg.passes,
        "advance": int(cfg.auto_advance),
        "inc": secrets.token_hex(8),
        "created_ms": int(time.time() * 1000),
    }
    key = shard_set_key(name, conn.prefix)
    with translate(conn.url):
        # the record first: a create that dies half-way leaves a set that names its shards
        conn.redis.delete(key)
        conn.redis.hset(key, mapping=record)
        conn.redis.sadd(shard_sets_index(conn.prefix), name)
    per_max = None if cfg.max_backlog is None else -(-cfg.max_backlog // shards)
    shard_cfg = dataclasses.replace(cfg, auto_advance=False, shards=1, max_backlog=per_max)
    for shard, shard_chunks in zip(names, per_shard, strict=True):
        create(conn, shard, shard_chunks, shard_cfg, replace=replace)
    for stale in set(old.shards if old else []) - set(names):
        try:
            Job(conn, stale).delete()
        except errors.JobNotFound:
            pass
    return Job(conn, require(conn, name)).status()
