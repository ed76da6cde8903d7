"""A loop waiting on a job whose live tasks are all dead: say so, and wait or raise.

A pass whose every live task died (each failed ``max_failures`` times: unreadable data, a
bug in the loop) does not advance: the job waits with reason ``all_dead`` until an
operator retries the tasks or cancels the job (docs/design.md). A loop with nothing to
lease would wait there in silence; ``AllDeadWatch`` names the dead tasks, their last
error and the two commands, once per ``LOG_EVERY_S`` (``on_all_dead="wait"``), or raises
``AllTasksDead`` with that text (``"raise"``).

Data flow: trainer/iteration.py (``taskq.Trainer``'s loops) and torchdata/feeder.py
(``taskq.torch``) -> alldead.py -> the job handle's dead-task listing (admin/).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from taskq import errors

log = logging.getLogger("taskq.trainer")

#: what a loop does on a job whose live tasks are all dead
ON_ALL_DEAD = ("wait", "raise")
#: seconds between two lines of a waiting loop
LOG_EVERY_S = 60.0
#: dead tasks named in the line (the rest counted)
_NAMED = 5


def check_mode(on_all_dead: str) -> str:
    """``on_all_dead`` checked.

    Raises:
        InvalidInput: not one of ``ON_ALL_DEAD``.
    """
    if on_all_dead not in ON_ALL_DEAD:
        raise errors.InvalidInput(f"on_all_dead must be one of {ON_ALL_DEAD}, not {on_all_dead!r}")
    return on_all_dead


class AllDeadWatch:
    """What one loop does while its job waits with reason ``all_dead``.

    Args:
        job: the job's handle (``Client.job(name)`` or a plain job's): its dead tasks
            are listed from it (one bounded call).
        on_all_dead: "wait" (a line per ``every`` seconds) or "raise".
        every: seconds between two lines.
    """

    def __init__(self, job: Any, on_all_dead: str, every: float = LOG_EVERY_S) -> None:
        self.job = job
        self.mode = check_mode(on_all_dead)
        self.every = every
        self._said_at: float | None = None

    def seen(self, pass_no: int) -> None:
        """The job waits with reason ``all_dead`` in pass ``pass_no``: the line (at most
        one per ``every`` seconds), or the error.

        Raises:
            AllTasksDead: ``on_all_dead="raise"``.
        """
        now = time.monotonic()
        if self.mode == "wait" and self._said_at is not None and now - self._said_at < self.every:
            return
        text = self.describe(pass_no)
        if self.mode == "raise":
            raise errors.AllTasksDead(text)
        self._said_at = now
        log.warning("%s (waiting; the next line in %.0f s)", text, self.every)

    def moved_on(self) -> None:
        """The job is no longer waiting on dead tasks: a new wait says so at once."""
        self._said_at = None

    def describe(self, pass_no: int) -> str:
        """One line: the job, the dead tasks (a few named, with the last error of the
        first), and the commands to retry them or cancel the job."""
        name = self.job.name
        try:
            rows = self.job.tasks("dead", limit=_NAMED + 1, details=True)
        except errors.TaskqError as e:  # the line still says what to do
            listed = f"(the listing failed: {e})"
        else:
            ids = ", ".join(str(r["id"]) for r in rows[:_NAMED])
            more = " and more" if len(rows) > _NAMED else ""
            error = next((r.get("last_error") for r in rows if r.get("last_error")), None)
            listed = f"tasks {ids}{more}" + (f"; last error: {error}" if error else "")
        return (
            f"job {name!r}: every live task of pass {pass_no} is dead ({listed}); nothing "
            f"comes until they are retried or the job is cancelled: `taskq tasks retry "
            f"{name}` (after fixing their cause) or `taskq job cancel {name}`"
        )
