"""The handle of a sharded job: the verbs of ``caller.Job`` over one ``PlainJob`` per shard.

``ShardedJob`` is what ``Client.job(name)`` returns for a sharded job (client_handles.py
decides). It holds no state of its own beyond the shard-set record it was opened with:
each verb is the shards' verbs composed, through the barrier (sharded.py) and the cut
(sharded_admin.py) where passes are concerned. Task ids are global (task ``i`` of the
whole job is task ``i // S`` of shard ``i % S``); rows of tasks, workers and events name
their ``shard``.

Data flow: client_handles.py (``open_job``) -> sharded_job.py -> sharded.py,
sharded_admin.py, shardset.py -> jobs.py (``PlainJob`` per shard) -> Redis.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Iterable, Sequence
from typing import Any

from taskq import errors
from taskq.admin import checkpoints, sharded, sharded_admin, shardset
from taskq.admin.caller import Caller
from taskq.admin.jobs import (
    CheckpointRef,
    PlainJob,
    check_limit,
    check_page,
    checkpoint_id,
    iter_tasks,
)
from taskq.admin.shardset import ShardSet
from taskq.engine.connection import translate
from taskq.engine.contract import PAGE_MAX
from taskq.models import AppendResult, JobStatus

#: How often ``events(block_ms=...)`` looks at the shards' streams while it waits (no
#: one blocking read spans slots).
EVENTS_POLL_S = 0.1


class ShardedJob:
    """A sharded job (``Client.job(name)`` of one): the ``caller.Job`` verbs over every shard.

    Args:
        client: the admin client.
        sset: the job's shard-set record.
    """

    sharded = True

    def __init__(self, client: Caller, sset: ShardSet) -> None:
        self.client = client
        self.name = sset.name
        self.sset = sset
        self.shards = [PlainJob(client, s) for s in sset.shards]

    def __repr__(self) -> str:
        return f"ShardedJob({self.name!r}, shards={len(self.shards)})"

    def parts(self) -> list[str]:
        """The shards' job names, shard ``k`` at index ``k``."""
        return list(self.sset.shards)

    def _of(self, task_id: int) -> tuple[PlainJob, int]:
        shard, local = self.sset.locate(int(task_id))
        return self.shards[self.sset.shards.index(shard)], local

    def _globalize(self, shard: PlainJob, row: dict[str, Any]) -> dict[str, Any]:
        """A shard's task row with the task's global id (``shard_task``: its id there)."""
        local = int(row["id"])
        gid = self.sset.global_id(shard.name, local)
        return {**row, "id": gid, "shard": shard.name, "shard_task": local}

    # -- reading ------------------------------------------------------------------
    def status(self, summaries: int = 20) -> JobStatus:
        """The sums, each shard's status in ``.shards`` (a ``ShardedStatus``).

        Raises:
            JobNotFound: a shard is missing.
        """
        return shardset.status(self.client, self.name, self.sset)

    def audit(self) -> dict[str, Any]:
        """Every shard's audit and whether the shards agree (``shardset.audit``)."""
        return shardset.audit(self.client, self.name)

    def task(self, task_id: int, history: int = 20) -> dict[str, Any]:
        """Global task ``task_id``: its shard's view of it, with its global id.

        Raises:
            InvalidInput: no such task.
        """
        shard, local = self._of(task_id)
        return self._globalize(shard, shard.task(local, history))

    def tasks_page(
        self, state: str = "leased", cursor: str = "0", count: int = PAGE_MAX
    ) -> tuple[list[dict[str, Any]], str]:
        """One page of one shard's tasks in ``state`` (global ids); the cursor
        ``"<shard index>:<its cursor>"`` goes on through the shards, ``"0"`` at the end.

        Raises:
            InvalidInput: a bad state, cursor or count.
        """
        check_page(state, count)
        k, _, inner = cursor.partition(":") if cursor != "0" else ("0", "", "0")
        if not k.isdigit() or int(k) >= len(self.shards) or not inner:
            raise errors.InvalidInput(f"job {self.name}: bad cursor {cursor[:40]!r}")
        shard = self.shards[int(k)]
        rows, nxt = shard.tasks_page(state, inner, count)
        if nxt != "0":
            nxt = f"{k}:{nxt}"
        elif int(k) + 1 < len(self.shards):
            nxt = f"{int(k) + 1}:0"
        return [self._globalize(shard, r) for r in rows], nxt

    def tasks(
        self, state: str = "leased", limit: int = 100, details: bool = False
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` tasks of the current pass in ``state``, shard after shard."""
        limit = check_limit(limit)
        if not details:
            return list(itertools.islice(iter_tasks(self, state), limit))
        rows: list[dict[str, Any]] = []
        for shard in self.shards:
            if len(rows) >= limit:
                break
            part = shard.tasks(state, limit - len(rows), details=True)
            rows += [self._globalize(shard, r) for r in part]
        return rows

    def events(
        self, since: str = "-", count: int = 100, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        """Every shard's events after ``since``, merged by id (each names its ``shard``;
        ids are the shards' own, in time order across masters whose clocks agree).
        ``block_ms`` waits for new ones, looking every ``EVENTS_POLL_S``."""
        if block_ms is None:
            return self._merged(since, count)
        start = self._newest() if since == "-" else since
        deadline = time.monotonic() + block_ms / 1000.0
        while True:
            got = self._merged(start, count)
            if got or time.monotonic() >= deadline:
                return got
            time.sleep(EVENTS_POLL_S)

    def _newest(self) -> str:
        """The newest event id over the shards (where a wait for new ones starts)."""
        with translate(self.client.url):
            newest = [self.client.redis.xrevrange(s.keys.events, count=1) for s in self.shards]
        ids = [e[0][0] for e in newest if e]
        return max(ids, key=_event_order) if ids else "0-0"

    def _merged(self, since: str, count: int) -> list[tuple[str, dict[str, str]]]:
        parts = [
            [(i, {**f, "shard": s.name}) for i, f in s.events(since, count)] for s in self.shards
        ]
        merged = heapq.merge(*parts, key=lambda e: _event_order(e[0]))
        return list(itertools.islice(merged, count))

    def latest_events(self, kind: str, limit: int, scan: int = 1000) -> list[dict[str, str]]:
        """The newest ``limit`` events of ``kind`` over the shards, oldest first."""
        rows = [
            {**e, "shard": s.name} for s in self.shards for e in s.latest_events(kind, limit, scan)
        ]
        rows.sort(key=lambda e: _event_order(str(e.get("id", "0-0"))))
        return rows[-limit:] if limit > 0 else []

    def first_lease_ms(self) -> int | None:
        """The earliest of the shards' first leases."""
        found = [ms for ms in (s.first_lease_ms() for s in self.shards) if ms is not None]
        return min(found) if found else None

    def workers(self) -> list[dict[str, Any]]:
        """Every shard's registered workers (a trainer shows once per shard it is on),
        each row naming its ``shard``."""
        return [{**w, "shard": s.name} for s in self.shards for w in s.workers()]

    # -- passes -------------------------------------------------------------------
    def next(self, expected_pass: int | None = None, force: bool = False) -> int:
        """Start the next pass of every shard (``sharded.next_pass``)."""
        return sharded.next_pass(self.client, self.name, expected_pass, force)

    def reset(self, expected_pass: int | None = None) -> int:
        """Restart the current pass in every shard (``sharded.reset_pass``)."""
        return sharded.reset_pass(self.client, self.name, expected_pass)

    # -- tasks and workers --------------------------------------------------------
    def retry(self, task_ids: Sequence[int] | None = None) -> int:
        """Retry dead tasks (global ids; all when None) in every shard."""
        return sharded.retry(self.client, self.name, task_ids)

    def revoke(self, task_id: int) -> bool:
        """Send global task ``task_id``'s lease back to its shard's front."""
        shard, local = self._of(task_id)
        return shard.revoke(local)

    def drain(self, worker_id: str) -> None:
        """Ask a worker to finish and leave, on every shard it is registered on.

        Raises:
            InvalidInput: no shard has such a worker.
        """
        found = False
        for shard in self.shards:
            if any(w["id"] == worker_id for w in shard.workers()):
                shard.drain(worker_id)
                found = True
        if not found:
            raise errors.InvalidInput(f"job {self.name}: no worker {worker_id!r}")

    def reap(
        self, budget: int = 1000, lock_ms: int = 2000, owner: str = ""
    ) -> tuple[int, bool, bool]:
        """One reap of every shard: (reclaimed in all, more left in any, any locked)."""
        results = [s.reap(budget, lock_ms, owner) for s in self.shards]
        return (
            sum(r[0] for r in results),
            any(r[1] for r in results),
            any(r[2] for r in results),
        )

    def advance_clock(self, ms: int, silent: bool = False) -> int:
        """Tests only: move every shard's manual clock by ``ms`` (the first's new time)."""
        return [s.advance_clock(ms, silent) for s in self.shards][0]

    # -- the job's life -----------------------------------------------------------
    def pause(self) -> None:
        """Pause every unfinished shard."""
        sharded_admin.pause(self.client, self.name)

    def resume(self) -> None:
        """Resume every unfinished shard."""
        sharded_admin.resume(self.client, self.name)

    def cancel(self) -> None:
        """Cancel every shard."""
        sharded.cancel(self.client, self.name)

    def delete(self) -> None:
        """Delete every shard and the record."""
        sharded.delete(self.client, self.name)

    def replace(self, chunks: Iterable[Any], **settings: Any) -> JobStatus:
        """Create the job again from ``chunks`` (a new incarnation), over as many shards
        as now unless ``shards=`` says otherwise."""
        settings.setdefault("shards", len(self.shards))
        if settings["shards"] == 1:
            raise errors.InvalidInput(
                f"job {self.name!r} is a sharded job: replace it with shards >= 2, or "
                f"delete it first to make a job of one shard of that name"
            )
        return self.client.create_job(self.name, chunks, replace=True, **settings)

    # -- checkpoints --------------------------------------------------------------
    def checkpoint(
        self, keep: int = checkpoints.DEFAULT_KEEP, ckpt: str | None = None
    ) -> dict[str, Any]:
        """One cut across every shard (``sharded_admin.checkpoint``)."""
        return sharded_admin.checkpoint(self.client, self.name, keep, ckpt)

    # -- appending: not spread over shards yet (a task's global id is its place in the
    # shards' fixed layout, shardset.py), so refused before anything is written
    def _no_append(self) -> errors.InvalidInput:
        return errors.InvalidInput(
            f"job {self.name}: a sharded job takes no appends yet; make a stream or a job "
            f"you append to one shard (shards=1)"
        )

    def append(
        self,
        chunks: Iterable[Any],
        ids: Sequence[str] | None = None,
        block: bool = True,
        timeout: float | None = None,
    ) -> AppendResult:
        """Refused: a sharded job's layout is fixed at its create."""
        raise self._no_append()

    def seal(self) -> int:
        """Refused: a sharded job is never a stream."""
        raise self._no_append()

    def files_appended(self, file_keys: Sequence[str]) -> list[bool]:
        """Refused (see ``append``)."""
        raise self._no_append()

    def file_appended(self, file_key: str, chunks: int) -> None:
        """Refused (see ``append``)."""
        raise self._no_append()

    def checkpoints(self) -> list[dict[str, Any]]:
        """The sharded checkpoints, oldest first."""
        return sharded_admin.listing(self.client, self.name)

    def rewind(self, ckpt: CheckpointRef, once: bool = False, key: str = "") -> bool:
        """Every shard back to the cut (its id or its record), at one pass."""
        return sharded_admin.rewind(
            self.client, self.name, checkpoint_id(self.name, ckpt), once, key
        )


def _event_order(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return (int(ms or 0), int(seq or 0))
