"""What the reaper logs: one INFO line per tick that re-dispatched something, naming the
job, the tasks and why; nothing for an idle tick. Real redis-server, manual clock."""

from __future__ import annotations

import logging

import pytest

import taskq
from taskq.ops.reaper import Reaper


def test_one_info_line_per_tick_that_did_something(
    client: taskq.Client, job_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    client.create_job(
        job_name,
        [{"i": i} for i in range(3)],
        manual_clock=True,
        worker_ttl=2.0,
        heartbeat_interval=0.5,
        task_timeout=None,
    )
    trainer = taskq.Trainer(job_name, client=client, worker_id="w-lost", heartbeat=False)
    held = sorted(t.id for t in (trainer.lease(timeout=0), trainer.lease(timeout=0)) if t)
    assert len(held) == 2
    reaper = Reaper(client, jobs=[job_name], interval=0.1)
    with caplog.at_level(logging.INFO, logger="taskq.reaper"):
        assert reaper.tick() == {job_name: 0}
        assert [r for r in caplog.records if r.name == "taskq.reaper"] == []
        client.advance_clock(job_name, 3000)
        assert reaper.tick() == {job_name: 2}
        assert reaper.tick() == {job_name: 0}
    lines = [r.getMessage() for r in caplog.records if r.name == "taskq.reaper"]
    assert len(lines) == 1, lines
    assert lines[0].startswith("re-dispatched 2 lease(s) in ")
    for task in held:
        assert f"task {task} (worker_lost, worker w-lost, " in lines[0]
    assert f"{job_name}=2: task {held[0]}" in lines[0]
    trainer.close()
