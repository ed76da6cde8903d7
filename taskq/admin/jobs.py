"""The handle of one plain job (``PlainJob``), its creation, and what both kinds of
handle share.

``PlainJob`` is one job of the engine (one hash slot, one script call per state change);
``ShardedJob`` (sharded.py) composes one ``PlainJob`` per shard behind the same verbs
(``caller.Job``), as redis-py keeps ``Redis`` and ``RedisCluster`` as two
implementations of one command surface. Which of the two ``Client.job(name)`` returns is
decided there, from the shard-set record. Every ``Client`` method and CLI command taking
a job name goes through the handle. ``create`` writes a new job: every setting checked
before the first write, the chunks staged in pipelined batches and flipped live by one
``create`` script call.

Data flow: client.py / sharded.py -> jobs.py (``PlainJob``, ``create``) ->
engine/connection.py (``run``: one call per verb), stats.py (reads), checkpoints.py -> Redis.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from taskq import errors
from taskq.admin import checkpoints, mix, shardset, stats
from taskq.admin.caller import CheckpointRef as CheckpointRef
from taskq.admin.caller import Job as Job
from taskq.config import check_memory_policy, encode_tasks, validate_config
from taskq.engine.connection import Connection, translate
from taskq.engine.contract import APPEND_BYTES, APPEND_MAX, MAX_RETRY, PAGE_MAX, TRIM_MAX, Code
from taskq.keys import MetaField as F
from taskq.keys import jobs_index, valid_job_name
from taskq.mix import MixSpec
from taskq.models import AppendResult, FollowRecord, JobConfig, JobStatus, SealResult

STAGING_TTL_S = 3600
STAGING_BATCH = 500  # fields per HSET while staging: each one a short command
#: ``create_job``'s settings that are not the job's ``JobConfig``.
CREATE_EXTRAS = ("progress", "backup_leases", "backup_factor", "stream", "max_backlog")
#: The longest one wait of a blocked append for an ack (then it asks again).
_APPEND_BLOCK_MS = 5000
#: The field of a follower's record holding its watermark (a file key always holds "|").
FOLLOW_WATERMARK = "watermark"
#: Fields per HSCAN / HDEL page of a follower's record.
FOLLOW_PAGE = 1000


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


class PlainJob:
    """One job of the engine (a shard is one too): each verb one bounded script call
    (``retry`` of many tasks: one per batch; checkpoints: their bounded steps).

    Args:
        connection: the engine's connection.
        name: the job's name (checked).
    """

    sharded = False

    def __init__(self, connection: Connection, name: str) -> None:
        self.connection = connection
        self.name = name
        self.keys = connection.keys(name)

    def __repr__(self) -> str:
        return f"PlainJob({self.name!r})"

    def parts(self) -> list[str]:
        """``[name]``: a plain job is one engine job."""
        return [self.name]

    # -- a mixed job (docs/mixing.md; mix.py) -----------------------------------------
    def set_weights(self, weights: Mapping[str, object], at: int | None = None) -> int:
        """A mixed job's weights from slot ``at`` on (None: the first slot not charged).

        Returns:
            The slot from which they hold (``at`` when not charged yet, else the first
            slot not charged).

        Raises:
            InvalidInput: not a mixed job; a source missing or unknown; a bad weight or
                slot. JobNotFound, JobCancelled.
        """
        return mix.set_weights(self.connection, self.name, weights, at)

    def mix_sequence(self, pass_no: int | None = None) -> list[dict[str, Any]]:
        """The slots a mixed job charged in a pass (default: the current one), in order:
        ``{"slot", "pass", "position", "source", "source_task", "task"}``.

        Raises:
            InvalidInput: not a mixed job. JobNotFound.
        """
        return mix.sequence(self.connection, self.name, pass_no)

    def mix_status(self) -> dict[str, Any]:
        """A mixed job per source: weight, charged and acked this pass, tasks.

        Raises:
            InvalidInput: not a mixed job. JobNotFound.
        """
        return mix.status(self.connection, self.name)

    # -- reading ------------------------------------------------------------------
    def status(self, summaries: int = 20) -> JobStatus:
        """A snapshot (O(1) in the number of tasks).

        Raises:
            JobNotFound: no such job.
        """
        with translate(self.connection.url, self.keys, self.connection.redis):
            return stats.snapshot(self.connection, self.name, summaries=summaries)

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

    def audit(self) -> dict[str, Any]:
        """Per pass: done, dead, skipped, stale rejected, resets, longest lateness; and a
        check that the counters agree with the sets they count."""
        with translate(self.connection.url, self.keys, self.connection.redis):
            return stats.audit(self.connection, self.name)

    def task(self, task_id: int, history: int = 20) -> dict[str, Any]:
        """One task: state, chunks, holder, failures, attempts, last error, its events.

        Raises:
            InvalidInput: no such task. JobNotFound, CorruptData.
        """
        with translate(self.connection.url, self.keys, self.connection.redis):
            return stats.task_detail(self.connection, self.name, int(task_id), history=history)

    def tasks_page(
        self, state: str = "leased", cursor: str = "0", count: int = PAGE_MAX
    ) -> tuple[list[dict[str, Any]], str]:
        """One page of the current pass's tasks in ``state`` (``Client.tasks_page``)."""
        check_page(state, count)
        reply = self.connection.run(self.name, "peek", [state, cursor, int(count)])
        return stats.parse_tasks(reply[1], state), str(reply[2])

    def tasks(
        self, state: str = "leased", limit: int = 100, details: bool = False
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` tasks of the current pass in ``state`` (``Client.tasks``)."""
        rows = list(itertools.islice(iter_tasks(self, state), check_limit(limit)))
        if details and rows:
            with translate(self.connection.url, self.keys, self.connection.redis):
                stats.add_details(self.connection, self.name, rows)
        return rows

    def events(
        self, since: str = "-", count: int = 100, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        """Events after ``since`` ("-" for the oldest kept), oldest first."""
        key = self.keys.events
        redis_client = self.connection.redis
        with translate(self.connection.url):
            if block_ms is not None:
                start = "$" if since == "-" else since
                reply = redis_client.xread({key: start}, count=count, block=block_ms)
                return [(i, f) for _, entries in reply for i, f in entries]
            lo = since if since == "-" else "(" + since
            return list(redis_client.xrange(key, min=lo, max="+", count=count))

    def latest_events(self, kind: str, limit: int, scan: int = 1000) -> list[dict[str, str]]:
        """The newest ``limit`` events of type ``kind`` among the newest ``scan``."""
        with translate(self.connection.url, self.keys, self.connection.redis):
            return stats.latest_of_type(self.connection, self.name, kind, limit, scan)

    def first_lease_ms(self) -> int | None:
        """When pass 0's first lease was granted (server ms), if still in the events."""
        with translate(self.connection.url, self.keys, self.connection.redis):
            return stats.first_lease_ms(self.connection, self.name)

    def workers(self) -> list[dict[str, Any]]:
        """The registered workers with their lease counts."""
        with translate(self.connection.url, self.keys, self.connection.redis):
            return stats.workers(self.connection, self.name)

    # -- passes -------------------------------------------------------------------
    def next(self, expected_pass: int | None = None, force: bool = False) -> int:
        """Start the next pass at a manual boundary (``Client.next_pass``)."""
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

    def reset(self, expected_pass: int | None = None) -> int:
        """Restart the current pass (``Client.reset_pass``)."""
        expect = -1 if expected_pass is None else expected_pass
        try:
            reply = self.connection.run(self.name, "reset", ["", expect])
        except errors.PassMismatch as e:
            raise errors.PassMismatch(self._mismatch(expect)) from e
        refuse_half_rewind(self.name, reply, 2)
        return int(reply[1])

    # -- tasks and workers --------------------------------------------------------
    def retry(self, task_ids: Sequence[int] | None = None) -> int:
        """Put dead tasks (all when ``task_ids`` is None) back at the front
        (``Client.retry``)."""
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

    def revoke(self, task_id: int) -> bool:
        """Send one task's lease back to the front; False if it is not leased."""
        self.task(task_id, history=0)  # no such task: an error, not "not leased"
        reply = self.connection.run(self.name, "revoke", ["", int(task_id)])
        return int(reply[0]) == Code.OK

    def drain(self, worker_id: str) -> None:
        """Ask a worker to finish its current task and leave."""
        self.connection.run(self.name, "drain", ["", worker_id])

    def reap(
        self, budget: int = 1000, lock_ms: int = 2000, owner: str = ""
    ) -> tuple[int, bool, bool]:
        """Reclaim expired leases once (``Client.reap``)."""
        reply = self.connection.run(self.name, "reap", ["", budget, lock_ms, owner or "reaper"])
        if int(reply[0]) == Code.LOCKED:
            return 0, False, True
        return int(reply[1]), bool(int(reply[2])), False

    def advance_clock(self, ms: int, silent: bool = False) -> int:
        """Tests only: move a manual-clock job's clock by ``ms``."""
        reply = self.connection.run(self.name, "clock", ["", int(ms), int(silent)])
        return int(reply[1])

    # -- appending ----------------------------------------------------------------
    def append(
        self,
        chunks: Iterable[Any],
        ids: Sequence[str] | None = None,
        block: bool = True,
        timeout: float | None = None,
        source: str | None = None,
    ) -> AppendResult:
        """Add chunks to the job as new tasks: they join the current pass (after its own
        order) and every later one (docs/streams.md).

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

    def files_appended(self, file_keys: Sequence[str]) -> list[bool]:
        """Whether each file (``path|size|version``) was appended whole by a follower
        (``taskq job follow``), from the job's ``follow`` hash (one HMGET per
        ``FOLLOW_PAGE`` files, pipelined)."""
        keys = list(file_keys)
        if not keys:
            return []
        with translate(self.connection.url, self.keys, self.connection.redis):
            pipe = self.connection.redis.pipeline(transaction=False)
            for lo in range(0, len(keys), FOLLOW_PAGE):
                pipe.hmget(self.keys.follow, keys[lo : lo + FOLLOW_PAGE])
            pages = pipe.execute()
        return [g is not None for page in pages for g in page]

    def file_appended(self, file_key: str, chunks: int) -> None:
        """Note that a file's ``chunks`` chunks were all appended (after its last page:
        a follower stopped before it appends the file again, and the chunk ids skip
        what went in)."""
        with translate(self.connection.url, self.keys, self.connection.redis):
            self.connection.redis.hset(self.keys.follow, file_key, chunks)

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

    def forget_files(self, watermark: tuple[float, str] | None, file_keys: Sequence[str]) -> None:
        """Move a follower's watermark (every file at or below its ``(mtime, path)`` was
        appended) and drop the record of files it covers or that are gone: the watermark
        is written first, so a stop between the two leaves fields to drop, never a file
        unrecorded. Pages of ``FOLLOW_PAGE`` fields per HDEL."""
        redis = self.connection.redis
        with translate(self.connection.url, self.keys, redis):
            pipe = redis.pipeline(transaction=False)
            if watermark is not None:
                pipe.hset(self.keys.follow, FOLLOW_WATERMARK, json.dumps(list(watermark)))
            keys = list(file_keys)
            for lo in range(0, len(keys), FOLLOW_PAGE):
                pipe.hdel(self.keys.follow, *keys[lo : lo + FOLLOW_PAGE])
            pipe.execute()

    def seal(self) -> SealResult:
        """Close a stream job: nothing more is appended; its pass ends once every task
        appended is done (the job completes after its last pass; a stream of no task
        completes at the seal). Idempotent: sealing a sealed stream changes nothing.

        Returns:
            The number of tasks the stream holds (an int), with ``already_sealed``: the
            stream was sealed before this call.

        Raises:
            InvalidInput: not a stream job. JobNotFound, JobCancelled.
        """
        reply = self.connection.run(self.name, "seal", [""])
        return SealResult(int(reply[1]), bool(int(reply[2])))

    def trim(self, steps: int = 8) -> int:
        """Up to ``steps`` bounded steps of a stream's trim (the reaper runs it every
        tick): each moves the watermark over up to ``TRIM_MAX`` finished tasks; the done
        ones' descriptors and records go, the dead ones are set aside with theirs
        (docs/streams.md, "Trimming behind a watermark"). A job that is not a stream, or
        not in its last pass, is left as it is.

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
    def pause(self) -> None:
        """No new leases; held ones are kept (``Client.pause_job``)."""
        self.connection.run(self.name, "pause", [""])

    def resume(self) -> None:
        """End a pause (``Client.resume_job``)."""
        self.connection.run(self.name, "resume", [""])

    def cancel(self) -> None:
        """Cancel: every lease is revoked (``Client.cancel_job``)."""
        self.connection.run(self.name, "cancel", [""])

    def delete(self) -> None:
        """Delete every key of the job (``Client.delete_job``)."""
        conn = self.connection
        try:
            conn.run(self.name, "delete", [""])
        finally:
            with translate(conn.url):
                if not conn.redis.exists(self.keys.meta):
                    conn.redis.srem(jobs_index(conn.prefix), self.name)

    def replace(self, chunks: Iterable[Any], **settings: Any) -> JobStatus:
        """Create the job again from ``chunks`` (a new incarnation); the settings are
        ``Client.create_job``'s (``shards`` 1 only: a sharded job of this name is made
        after ``delete``)."""
        if settings.pop("shards", 1) != 1:
            raise errors.InvalidInput(
                f"job {self.name!r} is a job of one shard: delete it first to make a "
                f"sharded job of that name"
            )
        cfg, extras = config_of(settings)
        return create(self.connection, self.name, chunks, cfg, replace=True, **extras)

    # -- checkpoints --------------------------------------------------------------
    def checkpoint(
        self, keep: int = checkpoints.DEFAULT_KEEP, ckpt: str | None = None
    ) -> dict[str, Any]:
        """Record the job's position under an id (``Client.checkpoint``)."""
        return checkpoints.checkpoint(self.connection, self.name, keep, ckpt)

    def checkpoints(self) -> list[dict[str, Any]]:
        """The sealed checkpoints, oldest first."""
        return checkpoints.listing(self.connection, self.name)

    def rewind(self, ckpt: CheckpointRef, once: bool = False, key: str = "") -> bool:
        """Put the job back to a checkpoint: its id or its record (``Client.rewind``)."""
        return checkpoints.rewind(
            self.connection, self.name, checkpoint_id(self.name, ckpt), once, key
        )


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


def iter_tasks(job: Job, state: str) -> Iterator[dict[str, Any]]:
    """Every task of the current pass in ``state``, page by page (each page one bounded
    call; a task changing state meanwhile may be listed twice or missed)."""
    cursor = "0"
    while True:
        rows, cursor = job.tasks_page(state, cursor)
        yield from rows
        if cursor == "0":
            return


def config_of(settings: dict[str, Any]) -> tuple[JobConfig, dict[str, Any]]:
    """``create_job``'s keyword settings as (the ``JobConfig``, the ``CREATE_EXTRAS``).

    Raises:
        InvalidInput: a setting ``create_job`` does not take.
    """
    extras = {k: settings.pop(k) for k in CREATE_EXTRAS if k in settings}
    unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(JobConfig)})
    if unknown:
        raise errors.InvalidInput(f"unknown job setting(s): {', '.join(unknown)}")
    return JobConfig(**settings), extras


def create(
    conn: Connection,
    name: str,
    chunks: Iterable[Any],
    cfg: JobConfig,
    replace: bool = False,
    progress: Callable[[int, int], None] | None = None,
    backup_leases: bool = False,
    backup_factor: float = 2.0,
    stream: bool = False,
    max_backlog: int | None = None,
    mix: MixSpec | None = None,
    encoded: tuple[list[str], int] | None = None,
) -> JobStatus:
    """Create (or replace) plain job ``name``: checked first, staged, flipped live at once
    (``Client.create_job``, whose arguments these are; a stream may start empty). A mixed
    job (admin/mix.py) passes its sources' ``mix`` and their tasks ``encoded`` already.

    Returns:
        The new job's status.

    Raises:
        InvalidInput: bad name, config or chunks (nothing written); InvalidConfig (a
            subclass) for a setting out of range or a Redis that may evict keys.
        JobExists: the name is taken (by a sharded job too) and ``replace`` is false.
        ConnectionLost: Redis is unreachable.
    """
    keys = conn.keys(name)
    validate_config(cfg)
    if (
        not isinstance(backup_factor, (int, float))
        or isinstance(backup_factor, bool)
        or not math.isfinite(backup_factor)
        or backup_factor <= 1
    ):
        raise errors.InvalidConfig(f"backup_factor must be a number > 1, got {backup_factor!r}")
    if max_backlog is not None and (
        isinstance(max_backlog, bool) or not isinstance(max_backlog, int) or max_backlog < 1
    ):
        raise errors.InvalidConfig(f"max_backlog must be an integer >= 1, got {max_backlog!r}")
    if encoded is not None:
        tasks, nchunks = encoded
    elif stream:
        chunks = list(chunks)
        tasks, nchunks = encode_tasks(chunks, cfg.chunks_per_task) if chunks else ([], 0)
    else:
        tasks, nchunks = encode_tasks(chunks, cfg.chunks_per_task)
    if not conn.allow_eviction:
        with translate(conn.url):
            check_memory_policy(stats.memory_policy(conn.redis), conn.url)
    if shardset.load(conn, name) is not None:  # no plain job beside a sharded one
        raise errors.JobExists(
            f"job {name!r} exists as a sharded job (replace it with shards >= 2, or "
            f"delete it first)"
        )
    with translate(conn.url):
        if not replace and conn.redis.exists(keys.meta):
            raise errors.JobExists(f"job {name!r} exists")
    incarnation = secrets.token_hex(8)
    staging = keys.staging_chunks(incarnation)
    try:
        with translate(conn.url):
            for start in range(0, len(tasks), STAGING_BATCH):
                batch = tasks[start : start + STAGING_BATCH]
                pipe = conn.redis.pipeline(transaction=False)
                pipe.hset(staging, mapping={str(start + i): t for i, t in enumerate(batch)})
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
            F.BACKUP_K: backup_factor if backup_leases else 0,
            F.SPLIT: 1 if cfg.split_tails else 0,
            F.SORDER: "shuffled" if cfg.shuffle_samples else "chunks",
            F.PN: len(tasks),
            F.STREAM: "open" if stream else "",
            F.MAX_BACKLOG: max_backlog or 0,
        }
        if mix is not None:  # the order of a pass is the mix schedule (lib/mix.lua)
            meta[F.SHUFFLE], meta[F.MIX] = "m", mix.to_json()
        args: list[Any] = [int(replace), len(tasks)]
        for k, v in meta.items():
            args += [k, v]
        conn.run(name, "create", args, extra_keys=[staging])
    except BaseException:
        with translate(conn.url):
            conn.redis.unlink(staging)
        raise
    with translate(conn.url):
        conn.redis.sadd(jobs_index(conn.prefix), name)
    return PlainJob(conn, name).status()
