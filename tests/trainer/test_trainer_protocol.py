"""The trainer's wire protocol and its seams against a real redis-server: leasing in one
thread while another acks, ``Trainer.state`` after a pass or a job ends, a full Redis
(``maxmemory`` + ``noeviction``), the heartbeat's log, the typed decoders, and an import
graph of taskq/ without cycles."""

from __future__ import annotations

import logging
import queue
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
from support import RedisServer, wait_until
from test_imports import import_graph

import taskq
from taskq import errors
from taskq.engine.contract import Code
from taskq.trainer.protocol import HeartbeatReply, JobInfo, heartbeat_args, heartbeat_pairs

ROOT = Path(__file__).resolve().parents[2]


def make_job(client: taskq.Client, name: str, n: int, **kw: Any) -> None:
    kw.setdefault("worker_ttl", 2.0)
    kw.setdefault("heartbeat_interval", 0.2)
    client.create_job(name, [{"i": i} for i in range(n)], **kw)


# -- one thread leases, another acks (a torch loader's feeder thread) -------------------
@pytest.mark.parametrize("heartbeat", ["thread", "process"])
def test_lease_in_a_feeder_thread_while_the_main_thread_acks_and_fails(
    client: taskq.Client, url: str, job_name: str, heartbeat: str
) -> None:
    """A feeder thread calls ``lease()`` while the main thread acks (and fails some tasks
    once) on the same Trainer: every task is acked exactly once, nothing is stale, and
    nothing is left held. (Found: an ack reply landing before the reply of a lease sent
    earlier let the heartbeat claim that lease's reply, so the server revoked it.)"""
    n = 120
    make_job(client, job_name, n, heartbeat_interval=0.05)  # beats often land in between
    acked: list[int] = []
    failed_once: set[int] = set()
    feeder_error: list[BaseException] = []
    with taskq.Trainer(job_name, url=url, heartbeat=heartbeat, handle_signals=False) as t:
        handoff: queue.Queue[taskq.Task | None] = queue.Queue(maxsize=4)

        def feed() -> None:
            try:
                while True:
                    task = t.lease(timeout=2)
                    if task is not None:
                        handoff.put(task)
            except taskq.JobCompleted:
                pass
            except BaseException as e:  # reported by the main thread
                feeder_error.append(e)
            finally:
                handoff.put(None)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        while (task := handoff.get(timeout=30)) is not None:
            if task.id % 10 == 0 and task.id not in failed_once:
                failed_once.add(task.id)
                t.fail(task, "first try fails")
            else:
                t.ack(task)
                acked.append(task.id)
        feeder.join(10)
        assert t.held == []
    assert not feeder_error, feeder_error
    assert sorted(acked) == list(range(n))
    status = client.status(job_name)
    assert status.state == "completed"
    assert status.counters["acked"] == n
    assert status.counters["failed"] == len(failed_once) == n // 10
    assert client.redis.hget(client.keys(job_name).meta, "c_stale") in (None, "0")


# -- state and pass_no ---------------------------------------------------------------------
def test_state_tells_a_finished_pass_from_a_completed_job(
    client: taskq.Client, url: str, job_name: str
) -> None:
    """After a pass's iterator ends, ``state`` is not "completed" until the last pass ends;
    ``pass_no`` follows the passes."""
    make_job(client, job_name, 3, passes=2)
    seen: list[tuple[int, str, int]] = []
    with taskq.Trainer(job_name, url=url, handle_signals=False) as t:
        assert (t.state, t.pass_no) == ("running", 0)
        for epoch in t.passes():
            tasks = [task.pass_no for task in epoch]
            seen.append((len(tasks), t.state, t.pass_no))
    assert [s for _, s, _ in seen] == ["running", "completed"]
    assert [k for k, _, _ in seen] == [3, 3]
    assert seen[-1][2] == 1


def test_state_says_cancelled_when_iteration_ends_on_a_cancel(
    client: taskq.Client, url: str, job_name: str
) -> None:
    """A cancel ends the pass's iterator like a finished pass; ``state`` says which."""
    make_job(client, job_name, 5, passes=3)
    with taskq.Trainer(job_name, url=url, handle_signals=False) as t:
        got = 0
        for epochs, epoch in enumerate(t.passes(), 1):  # noqa: B007
            for _ in epoch:
                got += 1
                if got == 2:
                    client.cancel_job(job_name)
        assert t.state == "cancelled"
        assert epochs == 1 and got == 2
        with pytest.raises(AttributeError):
            t.state = "running"  # type: ignore[misc]


# -- a full Redis ---------------------------------------------------------------------------
@pytest.fixture
def small_redis() -> Any:
    server = RedisServer()
    yield server
    server.cleanup()


def fill_until_full(r: redis.Redis) -> int:
    """Write 2 MB of junk, then cap memory 1 MB below what is used (``noeviction``): every
    write is refused until the junk is deleted. Returns how many junk keys there are."""
    blob = "x" * 65536
    count = 32
    for i in range(count):
        r.set(f"junk:{i}", blob)
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", str(int(r.info("memory")["used_memory"]) - 1_000_000))
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.set("junk:probe", blob)
    return count


def free_junk(r: redis.Redis, count: int) -> None:
    r.delete(*[f"junk:{i}" for i in range(count)])


def test_out_of_memory_is_a_clear_retryable_error(
    small_redis: RedisServer, job_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A full Redis: ``lease()`` retries with backoff (logging the cause), raises
    ``RedisOutOfMemory`` (a ``ConnectionLost``) naming it after ``reconnect_timeout``,
    and succeeds once memory is freed while it retries."""
    client = taskq.connect(small_redis.url)
    make_job(client, job_name, 2)
    r = redis.Redis(port=small_redis.port, decode_responses=True)
    with taskq.Trainer(
        job_name, url=small_redis.url, heartbeat=False, handle_signals=False, reconnect_timeout=0.5
    ) as t:
        junk = fill_until_full(r)
        with caplog.at_level(logging.WARNING, logger="taskq.trainer"):
            with pytest.raises(errors.RedisOutOfMemory) as e:
                t.lease(timeout=0)
        message = str(e.value)
        assert isinstance(e.value, errors.ConnectionLost)
        assert "out of memory" in message and "maxmemory" in message
        assert f"127.0.0.1:{small_redis.port}" in message and "\n" not in message
        assert any(
            "out of memory" in rec.getMessage() and "retrying" in rec.getMessage()
            for rec in caplog.records
            if rec.name == "taskq.trainer"
        )

        t.reconnect_timeout = 30.0
        threading.Timer(0.5, free_junk, args=(r, junk)).start()
        task = t.lease(timeout=5)
        assert task is not None
        t.ack(task)


def oom_errors(r: redis.Redis) -> int:
    """Calls the server refused with OOM so far (its INFO errorstats)."""
    return int(r.info("errorstats").get("errorstat_OOM", {}).get("count", 0))


def test_heartbeat_logs_one_line_per_change_of_state(
    small_redis: RedisServer, job_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """While Redis is full the heartbeat thread logs one line (the error, no traceback),
    not one per beat; when it can write again, one "recovered" line."""
    client = taskq.connect(small_redis.url)
    make_job(client, job_name, 1, worker_ttl=5.0, heartbeat_interval=0.1)
    r = redis.Redis(port=small_redis.port, decode_responses=True)
    with (
        caplog.at_level(logging.INFO, logger="taskq.heartbeat"),
        taskq.Trainer(job_name, url=small_redis.url, handle_signals=False) as t,
    ):
        sent = t.heartbeats_sent
        assert wait_until(lambda: t.heartbeats_sent > sent, 5)
        junk = fill_until_full(r)
        ooms = oom_errors(r)
        assert wait_until(lambda: oom_errors(r) >= ooms + 5, 10), "five failing beats"
        stuck = t.heartbeats_sent
        free_junk(r, junk)
        assert wait_until(lambda: t.heartbeats_sent > stuck + 2, 5)
    lines = [rec for rec in caplog.records if rec.name == "taskq.heartbeat"]
    texts = [rec.getMessage() for rec in lines]
    assert len(lines) == 2, texts
    assert "heartbeat failing: RedisOutOfMemory" in texts[0] and "out of memory" in texts[0]
    assert texts[1].endswith("heartbeat recovered")
    assert not any(rec.exc_info for rec in lines)


# -- the typed decoders ------------------------------------------------------------------------
def test_heartbeat_args_and_pairs_read_back() -> None:
    args = heartbeat_args("ji", "w", "inc", "s" * 32, 7, [(3, 11), (9, 12)])
    assert args == ["ji", "w", "inc", 7, 2, 3, 11, 9, 12, "s" * 32]
    assert heartbeat_pairs(args) == [(3, 11), (9, 12)]
    assert heartbeat_pairs(heartbeat_args("ji", "w", "inc", "s" * 32, 0, [])) == []


def test_heartbeat_reply_decodes_full_and_code_only_replies() -> None:
    full = HeartbeatReply.decode([0, ["4", 5], ["2", "17", "waiting", "manual_advance"]])
    assert full == HeartbeatReply(Code.OK, [4, 5], JobInfo(2, 17, "waiting", "manual_advance"))
    assert HeartbeatReply.decode([-1]) == HeartbeatReply(Code.JOB_NOT_FOUND, [], None)


# -- the import graph ---------------------------------------------------------------------------
def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return seen


@pytest.mark.parametrize(
    "module",
    ["taskq.trainer.core", "taskq.trainer.heartbeat", "taskq.trainer.protocol", "taskq.models"],
)
def test_the_trainers_modules_are_on_no_import_cycle(module: str) -> None:
    """No import (``TYPE_CHECKING`` ones included) leads from the module back to itself:
    the heartbeat knows the trainer through ``HeartbeatHost``, not by importing it."""
    graph = import_graph()  # tests/test_imports.py's parser
    back = sorted(m for m in _reaches(graph, module) if module in _reaches(graph, m))
    assert module not in _reaches(graph, module), f"{module} is on a cycle with {back}"
