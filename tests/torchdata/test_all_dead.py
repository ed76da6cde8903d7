"""A loop whose job has no live task left (every task dead: the job waits with reason
``all_dead`` for an operator): ``taskq.torch``'s loop raises ``AllTasksDead`` by default
and, with ``on_all_dead="wait"``, logs one line naming the dead tasks and the commands to
retry or cancel; ``taskq.Trainer``'s loop does the same the other way round (it waits by
default). Real redis-server, real files no reader can read (taskq/trainer/alldead.py)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from support import wait_until

import taskq
from taskq.admin import shardset

pytest.importorskip("torch")
pytest.importorskip("pyarrow")

import taskq.torch  # noqa: E402
from taskq.data import build_chunks  # noqa: E402


def _unreadable_job(client: taskq.Client, job: str, tmp_path: Path) -> None:
    """A job of 3 tasks, one JSONL file each, whose lines are not JSON: every read of
    every task raises ``DataError``, so each task is dead after ``max_failures`` (3)."""
    for i in range(3):
        (tmp_path / f"part-{i}.jsonl").write_text("{not json\n" * 10)
    chunks = build_chunks(str(tmp_path / "part-*.jsonl"))
    assert len(chunks) == 3
    client.create_job(
        job, chunks, chunks_per_task=1, max_failures=3, worker_ttl=2.0, heartbeat_interval=0.2
    )


def _says_what_to_do(text: str, job: str) -> None:
    assert "every live task of pass 0 is dead" in text, text
    assert "tasks 0, 1, 2" in text and "JSONDecodeError" in text, text
    assert f"taskq tasks retry {job}" in text and f"taskq job cancel {job}" in text, text


@pytest.mark.timeout(60)
def test_torch_loop_raises_all_tasks_dead_when_every_task_is_dead(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """The default (``on_all_dead="raise"``): the loop raises ``AllTasksDead`` naming
    the tasks, their last error and both commands, instead of waiting in silence."""
    _unreadable_job(client, job_name, tmp_path)
    loader = taskq.torch.DataLoader(taskq.torch.TaskDataset(job_name, url=url), batch_size=4)
    with pytest.raises(taskq.AllTasksDead) as e:
        for _ in loader:
            pass
    loader.close()
    _says_what_to_do(str(e.value), job_name)
    st = client.status(job_name)
    assert (st.state, st.reason, st.dead) == ("waiting", "all_dead", 3)
    assert client.workers(job_name) == []  # the loader left the job


@pytest.mark.timeout(60)
def test_torch_loop_waiting_on_dead_tasks_says_so_once_and_ends_on_cancel(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``on_all_dead="wait"``: one warning (not one per poll) naming the dead tasks and
    the commands; the loop goes on waiting, and ``taskq job cancel`` ends it."""
    caplog.set_level(logging.WARNING, logger="taskq")
    _unreadable_job(client, job_name, tmp_path)
    loader = taskq.torch.DataLoader(
        taskq.torch.TaskDataset(job_name, url=url), batch_size=4, on_all_dead="wait"
    )
    out: list[BaseException] = []

    def loop() -> None:
        try:
            for _ in loader:
                pass
        except BaseException as e:  # handed to the test
            out.append(e)

    thread = threading.Thread(target=loop)
    thread.start()

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if "is dead" in r.getMessage()]

    try:
        assert wait_until(lambda: lines(), 30.0)
        _says_what_to_do(lines()[0], job_name)
        assert thread.is_alive()
        client.cancel_job(job_name)
        thread.join(30)
        assert not thread.is_alive() and out == []
        assert loader.state == "cancelled"
        assert len(lines()) == 1, lines()  # once a minute: this test is shorter
    finally:
        if thread.is_alive():
            client.cancel_job(job_name)
            thread.join(30)
        loader.close()


def _corrupt_job(client: taskq.Client, job: str) -> None:
    """3 tasks whose chunks JSON is unreadable: the trainer's iterator fails each at
    every lease and goes on; dead after 3 failures."""
    client.create_job(
        job, [{"i": i} for i in range(3)], max_failures=3, worker_ttl=2.0, heartbeat_interval=0.2
    )
    client.redis.hset(client.keys(job).chunks, mapping={str(i): "{not json" for i in range(3)})


@pytest.mark.timeout(60)
def test_trainer_loop_with_raise_raises_all_tasks_dead(client: taskq.Client, job_name: str) -> None:
    """``Trainer(on_all_dead="raise")``: the ``for task in trainer`` loop raises."""
    _corrupt_job(client, job_name)
    with taskq.Trainer(job_name, client=client, on_all_dead="raise") as trainer:
        with pytest.raises(taskq.AllTasksDead) as e:
            for _ in trainer:
                pass
    text = str(e.value)
    assert "every live task of pass 0 is dead" in text and "tasks 0, 1, 2" in text, text
    assert f"taskq tasks retry {job_name}" in text and "not JSON" in text, text


@pytest.mark.timeout(60)
def test_trainer_loop_waits_by_default_saying_so_and_resumes_after_a_retry(
    client: taskq.Client, job_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The Trainer's default (``"wait"``): one warning naming the tasks and commands; the
    loop is still there for the operator's ``taskq tasks retry`` (the chunks fixed
    meanwhile), after which it trains the tasks and ends with the job."""
    caplog.set_level(logging.WARNING, logger="taskq")
    _corrupt_job(client, job_name)
    seen: list[int] = []
    with taskq.Trainer(job_name, client=client) as trainer:
        thread = threading.Thread(target=lambda: seen.extend(t.id for t in trainer))
        thread.start()
        try:
            assert wait_until(
                lambda: any("is dead" in r.getMessage() for r in caplog.records), 30.0
            )
            [line] = [r.getMessage() for r in caplog.records if "is dead" in r.getMessage()]
            assert f"taskq job cancel {job_name}" in line and "tasks 0, 1, 2" in line, line
            client.redis.hset(
                client.keys(job_name).chunks, mapping={str(i): '[{"i": 0}]' for i in range(3)}
            )
            assert client.retry(job_name) == 3
            thread.join(30)
        finally:
            if thread.is_alive():
                client.cancel_job(job_name)
                thread.join(30)
    assert sorted(seen) == [0, 1, 2]
    assert client.status(job_name).state == "completed"


@pytest.mark.timeout(60)
def test_sharded_trainer_loop_with_raise_raises_all_tasks_dead(
    client: taskq.Client, job_name: str
) -> None:
    """A sharded job (2 shards) whose every task is dead: the sharded trainer's loop
    raises with ``on_all_dead="raise"`` (its idle round reads every shard's status)."""
    client.create_job(job_name, [{"i": i} for i in range(4)], shards=2, max_failures=1)
    for shard in shardset.require(client, job_name).shards:
        with taskq.Trainer(shard, client=client, heartbeat=False) as tr:
            for task in iter(lambda: tr.lease(timeout=0), None):  # noqa: B023
                tr.fail(task, "boom")
    assert client.job(job_name).status().reason == "all_dead"
    with taskq.Trainer(job_name, client=client, on_all_dead="raise") as trainer:
        with pytest.raises(taskq.AllTasksDead) as e:
            for _ in trainer:
                pass
    text = str(e.value)
    assert "every live task of pass 0 is dead" in text and "boom" in text, text
    assert f"taskq job cancel {job_name}" in text, text


def test_on_all_dead_must_be_wait_or_raise(client: taskq.Client, url: str, job_name: str) -> None:
    client.create_job(job_name, [{"i": 0}])
    with pytest.raises(taskq.InvalidInput, match="on_all_dead"):
        taskq.Trainer(job_name, client=client, on_all_dead="ignore")
    with pytest.raises(taskq.InvalidInput, match="on_all_dead"):
        taskq.torch.DataLoader(taskq.torch.TaskDataset(job_name, url=url), on_all_dead="x")
