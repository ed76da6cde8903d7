"""Progress inside a task: recorded by its holder (fenced like an ack), handed to the next
holder as ``task.start``, kept across re-dispatch and a Redis restart, audited per pass.

Most tests drive trainers without their heartbeat thread on the manual clock (every step
explicit); the SIGKILL test runs a real trainer subprocess reading a real Parquet file.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from pathlib import Path

import pytest
from support import (
    SLOW_TASK_ROWS,
    RedisServer,
    manual_job,
    quiet_trainer,
    slow_reader_of_one_task,
    stop_process,
    wait_until,
)

import taskq
from taskq.data import read_task
from taskq.ops import acl
from taskq.testing import trainer_worker

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


make_job, trainer = manual_job, quiet_trainer


def holding(client: taskq.Client, job: str, n: int = 1) -> tuple[taskq.Trainer, taskq.Task]:
    """A job of ``n`` tasks and trainer ``a`` holding the first."""
    make_job(client, job, n=n)
    a = trainer(client, job, "a")
    task = a.lease(timeout=0)
    assert task is not None
    return a, task


def progress_of(client: taskq.Client, job: str) -> dict[str, str]:
    return client.redis.hgetall(client.keys(job).progress)


def lose(client: taskq.Client, job: str) -> None:
    """Every worker of ``job`` misses its ttl (the manual clock jumps past it)."""
    client.advance_clock(job, 6000)
    client.reap(job)


# -- recording and handing over ----------------------------------------------------
def test_progress_is_buffered_until_the_heartbeat_then_recorded(client, job_name):
    a, task = holding(client, job_name, n=4)
    assert task.start == 0
    for n in range(1, 8):
        a.progress(task, n)
    assert progress_of(client, job_name) == {}  # nothing sent per sample
    a.heartbeat()
    assert progress_of(client, job_name) == {str(task.id): "7"}


def test_a_flush_waits_for_the_heartbeat_send_in_flight(client, job_name):
    """``flush_progress`` (what a checkpoint runs first) returns only once the progress
    recorded so far is on the server, even when the heartbeat thread took it from the
    buffer a moment before and its send is still on the way: else the checkpoint that
    follows records less than the loop took, and a rewind reads those samples again."""
    a, task = holding(client, job_name, n=4)
    a.progress(task, 5)
    client.redis.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
    # the heartbeat thread's send (the flush a heartbeat ends with), held up
    beat = threading.Thread(target=a.flush_progress)
    beat.start()
    try:
        # the beat took the buffer and waits in the paused server
        wait_until(lambda: trainer_worker(a).progress.unsent() == 0, timeout=5)
        a.flush_progress()
        assert progress_of(client, job_name) == {str(task.id): "5"}
    finally:
        client.redis.execute_command("CLIENT", "UNPAUSE")
        beat.join(timeout=10)


def test_next_holder_starts_where_the_lost_one_recorded(client, job_name):
    a, task = holding(client, job_name)
    a.progress(task, 7)
    a.heartbeat()
    lose(client, job_name)
    b = trainer(client, job_name, "b")
    again = b.lease(timeout=0)
    assert (again.id, again.start) == (task.id, 7)
    b.progress(again, 10)
    b.ack(again)
    assert progress_of(client, job_name) == {}  # a done task's progress is spent
    assert client.status(job_name).state == "completed"


def test_stale_holder_cannot_move_progress_and_its_claim_is_counted_reread(client, job_name):
    a, task = holding(client, job_name)
    a.progress(task, 5)
    a.heartbeat()
    lose(client, job_name)  # a's lease expired; a does not know yet
    a.progress(task, 9)
    assert a.flush_progress() == [task.id]  # refused: stale
    assert progress_of(client, job_name) == {str(task.id): "5"}
    b = trainer(client, job_name, "b")
    again = b.lease(timeout=0)
    assert again.start == 5  # samples 5..8 were taken by a and will be read again by b
    b.ack(again)
    summary = client.audit(job_name)["passes"][-1]
    assert (summary["resumed"], summary["resumed_samples"], summary["reread_samples"]) == (1, 5, 4)


def test_a_backup_holder_records_progress_fenced_by_its_own_token(client, job_name):
    """At a pass's tail an idle trainer takes a backup lease of the straggler: its
    progress reports are recorded (not answered stale); a report under the straggler's
    token from the backup holder, or under the backup's token from the straggler's
    holder, is refused; when both leases end the next holder starts at the furthest."""
    make_job(client, job_name, n=12, backup_leases=True, worker_ttl=5.0)
    fast, slow = trainer(client, job_name, "fast"), trainer(client, job_name, "slow")
    straggler = slow.lease(timeout=0)
    for _ in range(11):
        task = fast.lease(timeout=0)
        client.advance_clock(job_name, 100)  # the median task time: 100 ms
        fast.ack(task)
    client.advance_clock(job_name, 300)
    slow.heartbeat()
    backup = fast.lease(timeout=0)
    assert backup is not None and backup.id == straggler.id and backup.token != straggler.token
    fast.progress(backup, 7)
    assert fast.flush_progress() == []  # recorded, not stale
    assert progress_of(client, job_name) == {str(backup.id): "7"}
    slow.progress(straggler, 4)  # the straggler's holder is behind: changes nothing
    assert slow.flush_progress() == []
    assert progress_of(client, job_name) == {str(backup.id): "7"}
    # the backup's token from the other holder (and the other way round) is refused
    keys = client.keys(job_name)
    for who, tok in ((slow, backup.token), (fast, straggler.token)):
        mixed = dataclasses.replace(backup, token=tok)
        who.progress(mixed, 9)
        assert who.flush_progress() == [backup.id]
    assert client.redis.hget(keys.progress, str(backup.id)) == "7"
    fast.release(backup)
    slow.release(straggler)
    again = trainer(client, job_name, "c").lease(timeout=0)
    assert again.id == backup.id and again.start == 7


@pytest.mark.parametrize("end", ["release", "close"])
def test_release_and_close_send_progress_first(client, job_name, end):
    a, task = holding(client, job_name)
    a.progress(task, 3)
    if end == "release":  # no heartbeat in between
        a.release(task)
    else:
        a.close()
    b = trainer(client, job_name, "b")
    assert b.lease(timeout=0).start == 3


def test_progress_only_moves_forward(client, job_name):
    a, task = holding(client, job_name)
    a.progress(task, 6)
    a.heartbeat()
    a.progress(task, 2)  # a late, smaller report changes nothing
    a.heartbeat()
    assert progress_of(client, job_name) == {str(task.id): "6"}


def test_progress_is_per_pass_attempt(client, job_name):
    make_job(client, job_name, n=2, passes=2)
    a = trainer(client, job_name, "a")
    t0 = a.lease(timeout=0)
    a.progress(t0, 3)
    a.heartbeat()
    client.reset_pass(job_name)  # a new attempt of the pass reads every task from 0
    assert progress_of(client, job_name) == {}
    got = [a.lease(timeout=0) for _ in range(2)]
    assert [t.start for t in got] == [0, 0]


@pytest.mark.parametrize("n", [-1, 1.5, "3", True])
def test_bad_progress_is_refused_before_anything_is_sent(client, job_name, n):
    a, task = holding(client, job_name)
    with pytest.raises(taskq.InvalidInput):
        a.progress(task, n)


def test_progress_script_checks_its_arguments_before_writing(client, job_name):
    a, task = holding(client, job_name)
    base = [a.job_incarnation, "a", a.incarnation]
    for bad in (
        [1, task.id, task.token],
        [2, task.id, task.token, 3],
        [1, task.id, task.token, -3],
        [1, "x", task.token, 3],
    ):
        with pytest.raises(taskq.InvalidInput):
            client.connection.run(job_name, "progress", base + bad)
    assert progress_of(client, job_name) == {}


# -- durability ---------------------------------------------------------------------
def test_progress_survives_a_redis_restart(own_redis: RedisServer, job_name):
    client = taskq.connect(own_redis.url)
    a, task = holding(client, job_name)
    a.progress(task, 11)
    a.heartbeat()
    # a restart: what the AOF holds comes back (a SIGKILL may lose the last second of any
    # write under appendfsync everysec, progress as much as an ack)
    own_redis.restart(kill=False)
    client = taskq.connect(own_redis.url)
    lose(client, job_name)
    b = trainer(client, job_name, "b")
    assert b.lease(timeout=0).start == 11


# -- a real trainer SIGKILLed at 90 % ----------------------------------------------------
def test_task_of_a_trainer_sigkilled_at_90_percent_is_finished_from_there(
    client, url, job_name, tmp_path: Path
):
    rows = SLOW_TASK_ROWS
    # split_tails off: the second trainer resumes the whole rest (not a split piece)
    proc, out = slow_reader_of_one_task(
        client, url, job_name, tmp_path, "progress_proc.py", split_tails=False
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("AT90"), line
        recorded = int(line.split()[2])
        # the heartbeat thread sends the buffered progress within one interval
        assert wait_until(lambda: int(progress_of(client, job_name).get("0", 0)) >= recorded)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        stop_process(proc)
    first = [int(x) for x in out.read_text().split()]
    with taskq.Trainer(job_name, client=client, worker_id="second") as b:
        task = b.lease(timeout=10)  # after the dead trainer's ttl
        assert task is not None and task.start >= 0.9 * rows
        second = [row["i"] for row in read_task(task.chunks, task.start)]
        b.ack(task)
    summary = client.audit(job_name)["passes"][-1]
    assert (summary["resumed"], summary["resumed_samples"]) == (1, task.start)
    assert second == list(range(task.start, rows))
    assert sorted(set(first) | set(second)) == list(range(rows))
    # what the first one took past its last record is read again, and never more
    assert set(first) & set(second) == set(range(task.start, len(first)))
    assert client.status(job_name).state == "completed"


def test_with_a_helper_process_the_loop_sends_progress_once_per_interval(client, url, job_name):
    client.create_job(
        job_name, chunks=[{"i": 0}], worker_ttl=2.0, heartbeat_interval=0.2, task_timeout=None
    )
    with taskq.Trainer(job_name, url=url, worker_id="p", heartbeat="process") as a:
        task = a.lease(timeout=5)
        a.progress(task, 3)
        # the helper process heartbeats; the loop's own call sends once an interval passed
        assert wait_until(
            lambda: (a.progress(task, 6), progress_of(client, job_name))[1] == {str(task.id): "6"}
        )


def test_a_per_job_trainer_credential_may_record_progress_and_end_passes(
    client, url, job_name, redis_server
):
    make_job(client, job_name, n=2, passes=2, manual_clock=False)
    rule = acl.trainer_rule(job_name, password="pw-progress-s3cr3t")
    acl.apply(client.redis, rule)
    host = url.split("//", 1)[1]
    own = f"redis://{rule.user}:pw-progress-s3cr3t@{host}"
    with taskq.Trainer(job_name, url=own, heartbeat=False) as t:
        first = t.lease(timeout=1)
        t.progress(first, 2)
        assert t.heartbeat() == []
        t.release(first)
        again = t.lease(timeout=1)
        assert (again.id, again.start) == (first.id, 2)
        t.ack(again)
        seen = [again.id] + [task.id for task in t]  # the ack ending pass 0 clears progress
    assert sorted(seen) == [0, 0, 1, 1]
    assert client.status(job_name).state == "completed"
