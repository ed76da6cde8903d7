"""Helpers for tests of code that uses taskq: this project's suite and users' own.

Where it sits: beside the data flow, for tests only. It starts real servers (no fakes:
``RedisServer`` is the dev server of :mod:`taskq.devserver`, a ``redis-server`` or
``valkey-server`` on a free loopback port in a directory of its own), waits on conditions
instead of sleeping (:func:`wait_until`), and moves a job's clock by hand
(:class:`ManualClock`, for a job created with ``manual_clock=True``) so lease expiry and
timeouts are tested without waiting for them; :func:`script_function` names a verb's Redis
function, for tests that call a script raw with arguments of their own. A test that speaks
the engine's protocol by hand reaches a trainer's inside through :func:`lease_secret` and
:func:`trainer_worker` only.

With pytest installed, the module is also a pytest plugin (registered by the
distribution's ``pytest11`` entry point, so installing taskq is enough) with four fixtures:

- ``taskq_server``: one server for the whole session (stopped at its end);
- ``taskq_url``: its URL;
- ``taskq_client``: a :class:`taskq.Client` of it;
- ``taskq_job_name``: a job name unique to the test (tests share the server).

Example (a user's test of their training loop)::

    import taskq
    from taskq.testing import ManualClock, wait_until

    def test_my_loop(taskq_client, taskq_job_name):
        job = taskq_client.create_job(taskq_job_name, [{"i": i} for i in range(4)],
                                      manual_clock=True)
        ...
        ManualClock(job).advance(60)     # every lease past its deadline
        assert wait_until(lambda: job.status().state == "completed")

docs/operations.md ("Testing your own code") says the same.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

from .devserver import RedisCluster, RedisServer, free_port, wait_until
from .engine import library

__all__ = [
    "ManualClock",
    "RedisCluster",
    "RedisServer",
    "free_port",
    "lease_secret",
    "script_function",
    "trainer_worker",
    "wait_until",
]


def trainer_worker(trainer: Any) -> Any:
    """The home worker of a ``taskq.Trainer`` (taskq/trainer/worker.py ``Worker``): its
    parts, ``session``, ``view``, ``leases``, ``calls``, ``progress``, ``heartbeat`` and
    ``plain`` (the plain lease source), for a test that speaks the engine's protocol by
    hand (a call number, a heartbeat's ARGV) or steps in between a reply and what follows
    it. These are the trainer's internals: they change with it, unlike its surface.

    Args:
        trainer: a ``taskq.Trainer`` (a sharded job's: its home shard's worker).

    Returns:
        The worker.
    """
    return trainer._home


def lease_secret(trainer: Any) -> str:
    """The lease secret of a ``taskq.Trainer``'s current worker incarnation (its home
    shard's), which every write of the incarnation sends: for a test that calls a script
    by hand as that trainer. Keep it out of logs and reports, as the trainer does.

    Args:
        trainer: a ``taskq.Trainer``.

    Returns:
        The secret.
    """
    return str(trainer._home.session.secret)


def script_function(verb: str) -> tuple[str, int, bool]:
    """The Redis function of one verb, to call it raw (``FCALL name nkeys keys... args...``).

    Args:
        verb: a verb of taskq/engine/lua (``ack``, ``heartbeat``, ...).

    Returns:
        (function name, number of keys, read-only).

    Raises:
        InvalidInput: no such verb.
    """
    from .errors import InvalidInput

    if verb not in library.VERBS:
        raise InvalidInput(f"no script verb {verb!r}")
    return library.FUNCTIONS[verb]


class ManualClock:
    """The clock of one job created with ``manual_clock=True``: it moves only when told.

    Args:
        job: the job's handle (``client.job(name)``), plain or sharded.
    """

    def __init__(self, job: Any) -> None:
        self.job = job

    def advance(self, seconds: float, silent: bool = False) -> int:
        """Move the job's clock forward.

        Args:
            seconds: how far (> 0).
            silent: count the move as silence (no call reached the job meanwhile), so the
                silence rule of docs/design.md holds back the job's liveness clock; by
                default the move is traffic, and leases expire by it.

        Returns:
            The job's clock after the move, in milliseconds.

        Raises:
            InvalidInput: ``seconds`` is not > 0, or the job has no manual clock.
            JobNotFound: the job does not exist.
        """
        from .errors import InvalidInput

        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds <= 0:
            raise InvalidInput(f"seconds must be a number > 0, got {seconds!r}")
        return int(self.job.advance_clock(int(round(seconds * 1000)), silent))


try:
    import pytest
except ImportError:  # the helpers above need no pytest; the fixtures do
    pytest = None  # type: ignore[assignment]

if pytest is not None:
    _names = itertools.count()

    @pytest.fixture(scope="session")
    def taskq_server() -> Iterator[RedisServer]:
        """A server of the session (``$TASKQ_TEST_SERVER`` or redis-server), stopped at its end."""
        server = RedisServer()
        yield server
        server.cleanup()

    @pytest.fixture
    def taskq_url(taskq_server: RedisServer) -> str:
        """The session server's URL."""
        return taskq_server.url

    @pytest.fixture
    def taskq_client(taskq_url: str) -> Any:
        """A client of the session server."""
        import taskq

        return taskq.connect(taskq_url)

    @pytest.fixture
    def taskq_job_name(request: Any) -> str:
        """A job name unique to this test (tests share the session's server)."""
        base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
        return f"t{next(_names)}-{os.getpid()}-{base}"
