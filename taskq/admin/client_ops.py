"""The operations part of ``Client``: passes, retries, revokes, drains, checkpoints, the
clock, reaping.

``Operations`` moves a live job: ``next_pass`` and ``reset_pass`` (compare-and-set on the
pass), ``retry`` of dead tasks, ``revoke`` and ``drain``, the checkpoint verbs, the manual
clock of tests and one ``reap`` step. It holds the handle opener (``Client.job``) and
nothing else: each verb is the job handle's (jobs.py: plain, or sharded_job.py over every
shard).

Data flow: client.py -> client_ops.py -> the job's handle (jobs.py / sharded_job.py) ->
engine/transport.py, checkpoints.py -> Redis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from taskq.admin import checkpoints
from taskq.admin.caller import Job


class Operations:
    """The running-job part of ``Client``.

    Args:
        open_job: the handle of a job by name (``Client.job``).
    """

    def __init__(self, open_job: Callable[[str], Job]) -> None:
        self._open = open_job

    # -- passes -------------------------------------------------------------------
    def next_pass(self, name: str, expected_pass: int | None = None, force: bool = False) -> int:
        """Start the next pass of a job waiting at a manual boundary.

        Args:
            expected_pass: the pass the caller believes current (compare-and-set);
                the current one when None.
            force: skip what is left of an incomplete pass (recorded as skipped).

        Returns:
            The pass number after the call.

        Raises:
            PassIncomplete: work left and no force. PassMismatch: ``expected_pass`` is not
            the current pass (the message says which is, and whether it moved on or was
            never reached). JobCompleted, JobCancelled, JobNotFound.
        """
        return self._open(name).next(expected_pass, force)

    def reset_pass(self, name: str, expected_pass: int | None = None) -> int:
        """Restart the current pass (a new attempt; its leases become stale).

        Returns:
            The pass restarted.

        Raises:
            PassMismatch: ``expected_pass`` is not the current pass. JobNotFound, ...
        """
        return self._open(name).reset(expected_pass)

    # -- tasks and workers --------------------------------------------------------
    def retry(self, name: str, task_ids: Sequence[int] | None = None) -> int:
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
        return self._open(name).retry(task_ids)

    def revoke(self, name: str, task_id: int) -> bool:
        """Send one task's lease back to the front (nothing counted).

        Returns:
            True if revoked, False if the task is not leased.

        Raises:
            InvalidInput: no such task. JobNotFound.
        """
        return self._open(name).revoke(task_id)

    def drain(self, name: str, worker_id: str) -> None:
        """Ask a worker to finish its current task and leave."""
        self._open(name).drain(worker_id)

    # -- checkpoints (taskq/admin/checkpoints.py) ----------------------------------------
    def checkpoint(
        self, name: str, keep: int = checkpoints.DEFAULT_KEEP, ckpt: str | None = None
    ) -> dict[str, Any]:
        """Record the job's position (pass, done set, progress, counters) under an id (a
        sharded job: one id over every shard, ``sharded_admin.checkpoint``).

        Args:
            keep: sealed checkpoints kept per job (the oldest beyond it go), 1-1000.
            ckpt: the id (default: a new time-ordered one).

        Returns:
            The checkpoint's record; ``record["id"]`` names it (``rewind`` takes either).

        Raises:
            InvalidInput, JobNotFound, JobCancelled; TaskqError while a rewind runs.
        """
        return self._open(name).checkpoint(keep, ckpt)

    def checkpoints(self, name: str) -> list[dict[str, Any]]:
        """The job's sealed checkpoints, oldest first.

        Raises:
            JobNotFound.
        """
        return self._open(name).checkpoints()

    def rewind(
        self, name: str, ckpt: str | dict[str, Any], once: bool = False, key: str = ""
    ) -> bool:
        """Put the job back to checkpoint ``ckpt`` (see ``checkpoints.rewind``; a sharded
        job: every shard to the same cut, ``sharded_admin.rewind``).

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
        return self._open(name).rewind(ckpt, once, key)

    def advance_clock(self, name: str, ms: int, silent: bool = False) -> int:
        """Tests only: move a manual-clock job's clock by ``ms``.

        Args:
            silent: the advance is not traffic (so the silence rule may apply).
        """
        return self._open(name).advance_clock(ms, silent)

    def reap(
        self, name: str, budget: int = 1000, lock_ms: int = 2000, owner: str = ""
    ) -> tuple[int, bool, bool]:
        """Reclaim expired leases of ``name`` once: at most ``min(budget, MAX_RECLAIM)``
        (one call stays short whatever the budget). Returns (reclaimed, more_left,
        locked_by_another_reaper)."""
        return self._open(name).reap(budget, lock_ms, owner)
