"""taskq.testing, the helpers users' tests get: the pytest plugin's fixtures (a real
server, a client, unique job names) and the manual clock."""

from __future__ import annotations

import pytest

import taskq
from taskq.testing import ManualClock, RedisServer, wait_until


def test_plugin_fixtures_give_a_real_server_and_unique_names(
    taskq_server: RedisServer, taskq_client: taskq.Client, taskq_job_name: str
) -> None:
    assert taskq_client.redis.ping()
    assert taskq_server.url.startswith("redis://127.0.0.1:")
    taskq_client.create_job(taskq_job_name, [{"i": 0}])
    assert taskq_client.job(taskq_job_name).status().todo == 1


def test_manual_clock_expires_a_lease_without_waiting(
    taskq_client: taskq.Client, taskq_job_name: str
) -> None:
    taskq_client.create_job(taskq_job_name, [{"i": 0}], manual_clock=True, task_timeout=30)
    job = taskq_client.job(taskq_job_name)
    trainer = taskq.Trainer(taskq_job_name, client=taskq_client, heartbeat=False)
    assert trainer.lease(timeout=0) is not None
    assert job.status().leased == 1
    assert ManualClock(job).advance(31) >= 31_000
    assert wait_until(lambda: job.reap()[0] == 1, timeout=5)
    status = job.status()
    assert (status.leased, status.todo) == (0, 1)
    trainer.close()


def test_manual_clock_refuses_a_job_without_one_and_a_bad_step(
    taskq_client: taskq.Client, taskq_job_name: str
) -> None:
    taskq_client.create_job(taskq_job_name, [{"i": 0}])
    job = taskq_client.job(taskq_job_name)
    with pytest.raises(taskq.InvalidInput):
        ManualClock(job).advance(1)
    with pytest.raises(taskq.InvalidInput):
        ManualClock(job).advance(0)
