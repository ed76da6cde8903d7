"""Fixtures: a real server per session (started here), a fresh job name per test.

The root conftest of tests/ (pytest's rootdir conftest): every package of tests/ gets them.

The server is ``redis-server`` unless ``TASKQ_TEST_SERVER`` names another binary
(``valkey-server``); the run's header says which one and its version.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Iterator

import pytest

# tests/ mirrors the house (tests/engine, admin, trainer, torchdata, ops, data, cli, streams,
# chaos, frameworks); the shared helpers (support.py, the *_proc.py scripts) sit here, and a
# test module may import another's helpers by name (from test_split import ...), so the
# root and every package are on the path
_TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_TESTS] + sorted(
    os.path.join(_TESTS, d)
    for d in os.listdir(_TESTS)
    if os.path.isdir(os.path.join(_TESTS, d)) and not d.startswith((".", "_"))
)

from support import RedisClusterProcs, RedisServer, server_version  # noqa: E402

import taskq  # noqa: E402


def _warn_on_threaded_fork() -> None:
    # Python 3.12+ warns when a multi-threaded process forks (the child may deadlock on a
    # lock another thread held); say the same on older Pythons, so CI on 3.11 sees it too.
    if threading.active_count() > 1:
        warnings.warn(
            f"This process ({os.getpid()}) is multi-threaded, use of fork() may "
            "lead to deadlocks in the child.",
            DeprecationWarning,
            stacklevel=2,
        )


if sys.version_info < (3, 12):
    os.register_at_fork(before=_warn_on_threaded_fork)


def pytest_report_header() -> str:
    return f"taskq: tests start {server_version()}"


# The suite's short names for taskq.testing's public fixtures (the ones users' tests get).
@pytest.fixture(scope="session")
def redis_server(taskq_server: RedisServer) -> RedisServer:
    """A server the suite started (shared; tests use unique job names)."""
    return taskq_server


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A server of this test alone (AOF on), for kills and restarts."""
    server = RedisServer(aof=True)
    yield server
    server.cleanup()


@pytest.fixture
def url(taskq_url: str) -> str:
    return taskq_url


@pytest.fixture
def client(taskq_client: taskq.Client) -> taskq.Client:
    return taskq_client


@pytest.fixture
def job_name(taskq_job_name: str) -> str:
    """A job name unique to this test."""
    return taskq_job_name


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterProcs]:
    """A local 3-master Redis Cluster for one test module (some modules kill its masters),
    and a spare master holding no slot (``cluster.spare``) that slots can migrate to."""
    procs = RedisClusterProcs(masters=3, spare=True)
    yield procs
    procs.cleanup()


@pytest.fixture(scope="module")
def cclient(cluster: RedisClusterProcs) -> taskq.Client:
    """A Client of the module's cluster."""
    return taskq.connect(cluster.url)
