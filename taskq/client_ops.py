"""Operating a running job: passes, retries, revokes, drains, checkpoints, the clock, reaping.

``ClientOps`` is the part of ``Client`` (client.py) that moves a live job: ``next_pass``
and ``reset_pass`` (compare-and-set on the pass), ``retry`` of dead tasks, ``revoke`` and
``drain``, the checkpoint verbs (checkpoints.py; a sharded job's through
sharded_admin.py), the manual clock of tests and one ``reap`` step. Each is one bounded
script call (``retry`` of many tasks: one per batch).

Data flow: CLI / user code -> client.py -> client_ops.py -> scripts.py (checkpoints.py)
-> Redis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from . import checkpoints, errors
from .client_jobs import ClientJobs
from .scripts import MAX_RETRY, Code

if TYPE_CHECKING:
    # the modules called here take a Client: these methods only run as part of one
    from .client import Client


class ClientOps(ClientJobs):
    """The running-job part of ``Client``."""

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
        if expected_pass is None:
            expected_pass = self.status(name, summaries=0).pass_no
        try:
            reply = self.run(name, "advance", ["", expected_pass, int(force)])
        except errors.PassMismatch as e:
            raise errors.PassMismatch(self._mismatch(name, expected_pass)) from e
        _refuse_half_rewind(name, reply, 3)
        return int(reply[1])

    def _mismatch(self, name: str, expected: int) -> str:
        current = self.status(name, summaries=0).pass_no
        if expected > current:
            return (
                f"job {name}: pass {expected} is not reached yet (the current pass is "
                f"{current}); nothing changed"
            )
        return (
            f"job {name}: pass {expected} is over, the pass moved on to {current} "
            f"meanwhile; nothing changed"
        )

    def reset_pass(self, name: str, expected_pass: int | None = None) -> int:
        """Restart the current pass (a new attempt; its leases become stale).

        Returns:
            The pass restarted.

        Raises:
            PassMismatch: ``expected_pass`` is not the current pass. JobNotFound, ...
        """
        try:
            reply = self.run(name, "reset", ["", -1 if expected_pass is None else expected_pass])
        except errors.PassMismatch as e:
            assert expected_pass is not None
            raise errors.PassMismatch(self._mismatch(name, expected_pass)) from e
        _refuse_half_rewind(name, reply, 2)
        return int(reply[1])

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
        total = 0
        if task_ids:
            ids = sorted({int(t) for t in task_ids})
            for task_id in ids:
                state = self.task(name, task_id, history=0)["state"]
                if state != "dead":
                    raise errors.InvalidInput(
                        f"job {name}: task {task_id} is {state}, not "
                        f"dead; only dead tasks are retried (nothing "
                        f"retried)"
                    )
            for start in range(0, len(ids), MAX_RETRY):
                batch = ids[start : start + MAX_RETRY]
                reply = self.run(name, "retry", ["", len(batch), *batch])
                _refuse_half_rewind(name, reply, 3)
                total += int(reply[1])
            return total
        while True:
            reply = self.run(name, "retry", ["", 0])
            _refuse_half_rewind(name, reply, 3)
            total += int(reply[1])
            if int(reply[1]) == 0 or int(reply[2]) == 0:
                return total

    def revoke(self, name: str, task_id: int) -> bool:
        """Send one task's lease back to the front (nothing counted).

        Returns:
            True if revoked, False if the task is not leased.

        Raises:
            InvalidInput: no such task. JobNotFound.
        """
        self.task(name, task_id, history=0)  # no such task: an error, not "not leased"
        reply = self.run(name, "revoke", ["", int(task_id)])
        return int(reply[0]) == Code.OK

    def drain(self, name: str, worker_id: str) -> None:
        """Ask a worker to finish its current task and leave."""
        self.run(name, "drain", ["", worker_id])

    # -- checkpoints (taskq/checkpoints.py) ----------------------------------------
    def checkpoint(
        self, name: str, keep: int = checkpoints.DEFAULT_KEEP, ckpt: str | None = None
    ) -> dict[str, Any]:
        """Record the job's position (pass, done set, progress, counters) under an id (a
        sharded job: one id over every shard, ``sharded_admin.checkpoint``).

        Args:
            keep: sealed checkpoints kept per job (the oldest beyond it go), 1-1000.
            ckpt: the id (default: a new time-ordered one).

        Returns:
            The checkpoint's record; ``record["id"]`` names it.

        Raises:
            InvalidInput, JobNotFound, JobCancelled; TaskqError while a rewind runs.
        """
        if self._sharded(name):
            from . import sharded_admin

            return sharded_admin.checkpoint(cast("Client", self), name, keep, ckpt)
        return checkpoints.checkpoint(cast("Client", self), name, keep, ckpt)

    def checkpoints(self, name: str) -> list[dict[str, Any]]:
        """The job's sealed checkpoints, oldest first.

        Raises:
            JobNotFound.
        """
        if self._sharded(name):
            from . import sharded_admin

            return sharded_admin.listing(cast("Client", self), name)
        return checkpoints.listing(cast("Client", self), name)

    def rewind(self, name: str, ckpt: str, once: bool = False, key: str = "") -> bool:
        """Put the job back to checkpoint ``ckpt`` (see ``checkpoints.rewind``; a sharded
        job: every shard, then the barrier step, ``sharded_admin.rewind``).

        Args:
            once: skip when the job's last rewind went to ``ckpt`` under the same ``key``
                (a restart's id), or without a key when nothing was acked since
                (restarted trainers loading the same state).
            key: see ``once``.

        Returns:
            True when rewound, False when ``once`` skipped it.

        Raises:
            InvalidInput (unknown checkpoint), JobNotFound, JobCancelled.
        """
        if self._sharded(name):
            from . import sharded_admin

            return sharded_admin.rewind(cast("Client", self), name, ckpt, once, key)
        return checkpoints.rewind(cast("Client", self), name, ckpt, once, key)

    def advance_clock(self, name: str, ms: int, silent: bool = False) -> int:
        """Tests only: move a manual-clock job's clock by ``ms``.

        Args:
            silent: the advance is not traffic (so the silence rule may apply).
        """
        reply = self.run(name, "clock", ["", int(ms), int(silent)])
        return int(reply[1])

    def reap(
        self, name: str, budget: int = 1000, lock_ms: int = 2000, owner: str = ""
    ) -> tuple[int, bool, bool]:
        """Reclaim expired leases of ``name`` once: at most ``min(budget, MAX_RECLAIM)``
        (one call stays short whatever the budget). Returns (reclaimed, more_left,
        locked_by_another_reaper)."""
        reply = self.run(name, "reap", ["", budget, lock_ms, owner or "reaper"])
        if int(reply[0]) == Code.LOCKED:
            return 0, False, True
        return int(reply[1]), bool(int(reply[2])), False


def _refuse_half_rewind(name: str, reply: Any, at: int) -> None:
    """Raise when a verb was refused because a rewind of the job is half done (its reply
    names the checkpoint at index ``at``)."""
    if int(reply[0]) == Code.LOCKED:
        ckpt = reply[at]
        raise errors.TaskqError(
            f"job {name}: a rewind to checkpoint {ckpt} is half done (its position is half "
            f"copied); finish it first with `taskq job rewind {name} {ckpt}`; nothing changed"
        )
