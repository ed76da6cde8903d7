"""The reading part of ``Client``: status, tasks, workers, events and the audit of a job.

``Reads`` holds the handle opener (``Client.job``, client_handles.py) and nothing else:
each read is the job handle's (jobs.py, sharded_job.py), plain or sharded alike.

Data flow: client.py -> client_reads.py -> the job's handle (jobs.py / sharded_job.py)
-> stats.py -> Redis (reads only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from taskq.admin.caller import Job
from taskq.admin.jobs import iter_tasks
from taskq.engine.contract import PAGE_MAX
from taskq.models import JobStatus


class Reads:
    """The reading part of ``Client``.

    Args:
        open_job: the handle of a job by name (``Client.job``).
    """

    def __init__(self, open_job: Callable[[str], Job]) -> None:
        self._open = open_job

    # -- reading ------------------------------------------------------------------
    def status(self, name: str, summaries: int = 20) -> JobStatus:
        """A snapshot of ``name`` (O(1) in its number of tasks; a sharded job: the sums,
        each shard's status in ``.shards``).

        Raises:
            JobNotFound: no such job.
        """
        return self._open(name).status(summaries)

    def task(self, name: str, task_id: int, history: int = 20) -> dict[str, Any]:
        """One task of ``name``: state (todo, leased, done, dead), chunks, lease holder,
        failures, attempts, last error, and its latest ``history`` events (a sharded
        job: ``task_id`` is the task's id in the whole job).

        Raises:
            InvalidInput: no such task. JobNotFound, CorruptData.
        """
        return self._open(name).task(task_id, history)

    def tasks_page(
        self, name: str, state: str = "leased", cursor: str = "0", count: int = PAGE_MAX
    ) -> tuple[list[dict[str, Any]], str]:
        """One page of the tasks of the current pass in ``state`` (one bounded call).

        Args:
            name: the job.
            state: todo | leased | done | dead.
            cursor: "0" for the first page, then the cursor the last page returned.
            count: the most rows of this page, 1..``PAGE_MAX`` (a page may hold fewer and
                still not be the last one, as SCAN's do).

        Returns:
            (rows, next cursor); the listing is complete when the cursor is "0".

        Raises:
            InvalidInput: a bad state, cursor or count. JobNotFound.
        """
        return self._open(name).tasks_page(state, cursor, count)

    def iter_tasks(self, name: str, state: str = "leased") -> Iterator[dict[str, Any]]:
        """Every task of the current pass in ``state``, page by page (each page one
        bounded call; a task changing state meanwhile may be listed twice or missed)."""
        return iter_tasks(self._open(name), state)

    def tasks(
        self, name: str, state: str = "leased", limit: int = 100, details: bool = False
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` tasks of the current pass in ``state`` (todo|leased|done|dead),
        read page by page (no call lists more than ``PAGE_MAX``).

        Args:
            details: add each task's ``chunks`` and ``last_error`` (from the newest
                events; bounded).
        """
        return self._open(name).tasks(state, limit, details)

    def workers(self, name: str) -> list[dict[str, Any]]:
        """The registered workers of ``name`` with their lease counts (a sharded job:
        every shard's, each row naming its ``shard``)."""
        return self._open(name).workers()

    def events(
        self, name: str, since: str = "-", count: int = 100, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        """Events after ``since`` ("-" for the oldest kept), oldest first."""
        return self._open(name).events(since, count, block_ms)

    def latest_events(
        self, name: str, kind: str, limit: int, scan: int = 1000
    ) -> list[dict[str, str]]:
        """The newest ``limit`` events of type ``kind`` among the newest ``scan`` events,
        oldest first (bounded)."""
        return self._open(name).latest_events(kind, limit, scan)

    def first_lease_ms(self, name: str) -> int | None:
        """When pass 0's first lease was granted (server ms), if still in the events."""
        return self._open(name).first_lease_ms()

    def audit(self, name: str) -> dict[str, Any]:
        """Per pass: done, dead, skipped, stale rejected, resets, longest lateness; and a
        check that the counters agree with the sets they count (a sharded job: every
        shard's, and whether the shards agree)."""
        return self._open(name).audit()
