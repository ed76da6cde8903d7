"""``Client(redis_client=...)``: a redis-py client of the caller's own, against real servers.

redis-py builds clients with ``decode_responses=False`` by default, and taskq reads every
reply as str: such a client is refused by the constructor in one line naming the fix,
before anything reaches Redis. A client built with ``decode_responses=True`` (plain, a
Sentinel master, a cluster) runs a job end to end, and the CLI (which makes its own client
from the URL) reads the job it made.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
import redis.asyncio
from click.testing import CliRunner
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel
from support import RedisClusterProcs, RedisServer, free_port, make_job
from taskq.cli.main import cli
from test_sentinel import SERVICE, SentinelProc

import taskq

FIX = r"returns bytes: .*decode_responses=True, or pass url="


def run_to_completion(client: taskq.Client, job: str, n: int) -> None:
    """Make job ``job`` of ``n`` tasks on ``client``, work it with a trainer on the same
    client, and check every task came back once and the job completed."""
    make_job(client, job, n)
    seen = []
    with taskq.Trainer(job, client=client) as trainer:
        for task in trainer:
            assert task.chunks == [{"i": task.id}]
            seen.append(task.id)
    assert sorted(seen) == list(range(n))
    status = client.status(job)
    assert (status.state, status.done) == ("completed", n)


# -- refused ------------------------------------------------------------------------------
def test_bytes_client_is_refused_at_construction_before_any_command(
    own_redis: RedisServer, job_name: str
) -> None:
    observer = redis.Redis(port=own_redis.port, decode_responses=True)
    connections = observer.info("stats")["total_connections_received"]
    given = redis.Redis.from_url(own_redis.url)  # redis-py's default: replies are bytes
    with pytest.raises(taskq.InvalidInput, match=FIX) as caught:
        taskq.Client(redis_client=given)
    message = str(caught.value)
    assert "\n" not in message and "Redis" in message
    assert isinstance(caught.value, ValueError)
    # the given client never connected, and nothing was written
    assert observer.info("stats")["total_connections_received"] == connections
    assert observer.dbsize() == 0


def test_bytes_client_on_a_decoded_pool_is_accepted(redis_server: RedisServer) -> None:
    """What counts is the pool's setting, which is where redis-py keeps it."""
    pool = redis.ConnectionPool.from_url(redis_server.url, decode_responses=True)
    taskq.Client(redis_client=redis.Redis(connection_pool=pool)).ping()
    bytes_pool = redis.ConnectionPool.from_url(redis_server.url)
    with pytest.raises(taskq.InvalidInput, match=FIX):
        taskq.Client(redis_client=redis.Redis(connection_pool=bytes_pool))


def test_bytes_sentinel_master_client_is_refused_without_contacting_anyone() -> None:
    """No sentinel listens on the port: a refusal (not ConnectionLost) shows the check
    reads the client's settings and sends nothing."""
    sentinel = Sentinel([("127.0.0.1", free_port())], socket_timeout=0.5)
    with pytest.raises(taskq.InvalidInput, match=FIX):
        taskq.Client(redis_client=sentinel.master_for(SERVICE))


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (redis.asyncio.Redis(decode_responses=True), "asyncio Redis: taskq calls Redis synch"),
        ("redis://127.0.0.1:6379/0", "is a str, not a redis-py client"),
    ],
    ids=["asyncio", "a-url-string"],
)
def test_clients_taskq_cannot_call_are_refused_in_one_line(given: Any, says: str) -> None:
    with pytest.raises(taskq.InvalidInput, match=says) as caught:
        taskq.Client(redis_client=given)
    assert "\n" not in str(caught.value) and "url=" in str(caught.value)


# -- accepted and working -----------------------------------------------------------------
def test_decoded_client_runs_a_job_end_to_end(redis_server: RedisServer, job_name: str) -> None:
    given = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client = taskq.Client(redis_client=given)
    assert client.redis is given
    run_to_completion(client, job_name, 5)


def test_cli_reads_a_job_made_on_a_given_client(redis_server: RedisServer, job_name: str) -> None:
    """The CLI makes its own (decoded) client from the URL: the check does not touch it."""
    given = redis.Redis.from_url(redis_server.url, decode_responses=True)
    make_job(taskq.Client(redis_client=given), job_name, 3)
    r = CliRunner().invoke(cli, ["--url", redis_server.url, "job", "status", job_name, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tasks"] == 3


def test_decoded_sentinel_master_client_runs_a_job(job_name: str) -> None:
    master = RedisServer()
    sentinel_proc: SentinelProc | None = None
    try:
        sentinel_proc = SentinelProc(master.port)
        sentinel = Sentinel([("127.0.0.1", sentinel_proc.port)], socket_timeout=5)
        given = sentinel.master_for(SERVICE, decode_responses=True)
        run_to_completion(taskq.Client(redis_client=given), job_name, 4)
        assert master.client().exists(taskq.Client(redis_client=given).keys(job_name).meta)
    finally:
        if sentinel_proc is not None:
            sentinel_proc.cleanup()
        master.cleanup()


def test_cluster_client_bytes_refused_decoded_runs_a_job(
    cluster: RedisClusterProcs, job_name: str
) -> None:
    port = cluster.servers[0].port
    with pytest.raises(taskq.InvalidInput, match=r"\(a RedisCluster\) " + FIX):
        taskq.Client(redis_client=RedisCluster(host="127.0.0.1", port=port))
    given = RedisCluster(host="127.0.0.1", port=port, decode_responses=True)
    run_to_completion(taskq.Client(redis_client=given), job_name, 4)
