"""One hierarchy for every error taskq raises.

Scripts return numeric codes; ``engine/contract.py`` maps them to these classes in one table.
Redis connection errors are translated at the boundary into ``ConnectionLost`` with the
URL's password masked (``RedisOutOfMemory``, a kind of it, when Redis is full).
"""

from __future__ import annotations


class TaskqError(Exception):
    """Base class of every taskq error."""


class InvalidInput(TaskqError, ValueError):
    """A bad argument, config value, job name or manifest; nothing was written."""


class InvalidConfig(InvalidInput):
    """A job or worker setting out of range (the CLI reports it as a usage error)."""


class JobNotFound(TaskqError):
    """The job does not exist, or was deleted or replaced (a new incarnation)."""


class JobExists(TaskqError):
    """A job of that name exists and ``replace=True`` was not given."""


class JobCompleted(TaskqError):
    """The job finished its last pass: there will never be work again."""


class JobCancelled(TaskqError):
    """The job was cancelled: there will never be work again."""


class AllTasksDead(TaskqError):
    """Every live task of the job's pass is dead: no work comes until an operator retries
    them (``taskq tasks retry JOB``) or cancels the job (the message names both)."""


class LeaseLost(TaskqError):
    """A write about a task whose lease this trainer no longer holds (stale).

    The server changed nothing and counted the write as stale.
    """

    def __init__(self, message: str, task_ids: list[int] | None = None) -> None:
        super().__init__(message)
        self.task_ids = task_ids or []


class PassMismatch(TaskqError):
    """An advance named a pass that is not the current one (another advancer won)."""


class PassIncomplete(TaskqError):
    """``pass next`` without ``force`` while the current pass still has work."""


class WorkerLost(TaskqError):
    """The server declared this worker incarnation lost; it must re-register."""


class Draining(TaskqError):
    """The worker was asked to drain: finish the current task, then leave."""


class BacklogFull(TaskqError):
    """An append would take a job's backlog (tasks appended and not done) past its
    ``max_backlog``: nothing of the refused page was written (the message says how many
    tasks went in before it)."""


class ConnectionLost(TaskqError):
    """Redis could not serve the call now (the URL is given with its password masked).

    Transient: unreachable, loading, failing over, or (``RedisOutOfMemory``) full. A
    trainer retries it with backoff for up to its ``reconnect_timeout``, the reaper for
    as long as it runs.
    """


class RedisOutOfMemory(ConnectionLost):
    """Redis refused a write: it reached ``maxmemory`` and evicts nothing (``noeviction``).

    A ``ConnectionLost``, so everything that retries an unreachable Redis (a trainer's
    calls up to ``reconnect_timeout``, the reaper's loop) retries this too, with backoff:
    memory comes back when jobs are deleted, or ``maxmemory`` is raised, without the
    trainers restarting. The message names the server and says what to do.
    """


class CorruptData(TaskqError):
    """A key under the taskq prefix holds data taskq cannot read (names the key)."""


class DataError(TaskqError):
    """Data a reader could not read or decode (``taskq.data``): names the path, where in
    it (byte offset, row group, tar member) and the underlying library's error text.

    A trainer passes ``str(e)`` to ``Trainer.fail`` so the text shows in the events.
    """

    def __init__(self, path: str, where: str = "", reason: str = "") -> None:
        # the three parts are the args, so the error pickles (DataLoader workers send
        # theirs to the main process); one argument alone is a whole message
        super().__init__(path, where, reason)
        self.path = path
        self.where = where
        self.reason = reason

    def __str__(self) -> str:
        return ": ".join(part for part in (self.path, self.where, self.reason) if part)
