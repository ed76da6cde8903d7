"""The reaper against a real redis-server: expiry by worker loss and by task timeout,
lateness records, racing and restarted reapers, a Redis restart (the silence rule),
Redis unreachable, broken jobs, and timed SIGKILL-recovery trials with a ~1 s ttl.

Jobs use the manual clock wherever time only needs to pass on the server; the Redis
restart and the timed trials need real time and use short ttls instead.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from functools import partial
from typing import Any

import pytest
import support
from redis.backoff import ConstantBackoff
from support import free_port, wait_until

import taskq
from taskq.engine.contract import HIST_BOUNDS_MS
from taskq.keys import jobs_index
from taskq.ops.reaper import EXIT_GAVE_UP, EXIT_OK, Reaper

# subprocesses import this checkout's taskq whatever the working directory
SUBPROCESS_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        filter(
            None,
            [
                os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                os.environ.get("PYTHONPATH"),
            ],
        )
    ),
}


make_job = partial(
    support.make_job, manual_clock=True, worker_ttl=2.0, heartbeat_interval=0.5, task_timeout=None
)


def trainer(client: taskq.Client, job: str, wid: str) -> taskq.Trainer:
    return taskq.Trainer(job, client=client, worker_id=wid, heartbeat=False)


def counters(client: taskq.Client, job: str) -> dict[str, int]:
    return client.status(job, summaries=0).counters


def events(client: taskq.Client, job: str, kind: str) -> list[dict[str, str]]:
    return [f for _, f in client.events(job, count=100_000) if f["type"] == kind]


def lease_all(client: taskq.Client, job: str, workers: int, each: int) -> list[taskq.Trainer]:
    """``workers`` heartbeat-less trainers leasing ``each`` tasks apiece."""
    trainers = [trainer(client, job, f"w{i}") for i in range(workers)]
    for t in trainers:
        for _ in range(each):
            assert t.lease(timeout=0) is not None
    return trainers


def assert_each_redispatched_once(client: taskq.Client, job: str, n: int) -> None:
    """Every one of the ``n`` leases expired once, was counted once, went back once."""
    keys = client.keys(job)
    assert counters(client, job)["expired_worker_lost"] == n
    expired = events(client, job, "expired")
    tasks = [e["task"] for e in expired]
    assert len(tasks) == n and set(tasks) == {str(i) for i in range(n)}, "one event per lease"
    attempts = {k: v for k, v in client.redis.hgetall(keys.counts).items() if k[:2] == "a:"}
    assert len(attempts) == n and set(attempts.values()) == {"1"}, "one expiry charged each"
    assert client.redis.zcard(keys.front) == n
    s = client.status(job, summaries=0)
    assert (s.todo, s.leased) == (n, 0)
    assert s.histograms["redispatch_lateness"]["count"] == n


# -- expiry and its records ----------------------------------------------------------------
def test_silent_trainer_is_lost_after_ttl_and_the_reaper_redispatches(client, job_name):
    make_job(client, job_name, n=3, worker_ttl=2.0)
    lost = trainer(client, job_name, "lost")
    task = lost.lease(timeout=0)
    reaper = Reaper(client, jobs=[job_name])

    client.advance_clock(job_name, 2000)  # at the deadline, not past it
    assert reaper.tick() == {job_name: 0}
    client.advance_clock(job_name, 250)
    assert reaper.tick() == {job_name: 1}

    s = client.status(job_name, summaries=0)
    assert (s.todo, s.leased) == (3, 0), "the task is back in todo"
    assert s.counters["expired_worker_lost"] == 1 and s.counters["expired_task_timeout"] == 0
    late = s.histograms["redispatch_lateness"]
    assert late["count"] == 1 and late["sum_s"] == pytest.approx(0.25)
    assert late["counts"][HIST_BOUNDS_MS.index(250)] == 1, "250 ms late, in the 250 ms bucket"
    [expired] = events(client, job_name, "expired")
    assert expired["task"] == str(task.id) and expired["reason"] == "worker_lost"
    assert expired["worker"] == "lost" and expired["lateness_ms"] == "250"
    assert [e["worker"] for e in events(client, job_name, "worker_lost")] == ["lost"]
    [row] = [r for r in client.tasks(job_name, "todo") if r["id"] == task.id]
    assert row["attempts"] == 1 and row["failures"] == 0, "a loss charges an attempt"

    other = trainer(client, job_name, "other")
    assert other.lease(timeout=0).id == task.id, "re-dispatched work goes to the front"
    with pytest.raises(taskq.LeaseLost):
        lost.ack(task)


def test_task_timeout_expires_a_stuck_but_alive_trainer(client, job_name):
    make_job(client, job_name, n=2, worker_ttl=5.0, task_timeout=3.0)
    stuck = trainer(client, job_name, "stuck")
    task = stuck.lease(timeout=0)
    reaper = Reaper(client, jobs=[job_name])
    client.advance_clock(job_name, 2000)
    stuck.heartbeat()  # alive all along: only the task timeout can end this lease
    assert reaper.tick() == {job_name: 0}
    client.advance_clock(job_name, 1040)
    assert reaper.tick() == {job_name: 1}

    s = client.status(job_name, summaries=0)
    assert s.counters["expired_task_timeout"] == 1 and s.counters["expired_worker_lost"] == 0
    assert s.histograms["redispatch_lateness"]["count"] == 1
    [expired] = events(client, job_name, "expired")
    assert expired["reason"] == "task_timeout" and expired["lateness_ms"] == "40"
    [row] = [r for r in client.tasks(job_name, "todo") if r["id"] == task.id]
    assert row["failures"] == 1, "a task timeout counts a failure"
    assert [w["alive"] for w in client.workers(job_name)] == [True], "the worker is not lost"
    assert stuck.heartbeat() == [task.id] and task.revoked.is_set()


def test_a_lost_lease_at_its_attempt_cap_goes_dead(client, job_name):
    make_job(client, job_name, n=2, worker_ttl=1.0, max_attempts=1)
    task = trainer(client, job_name, "w").lease(timeout=0)
    client.advance_clock(job_name, 1001)
    assert Reaper(client, jobs=[job_name]).tick() == {job_name: 1}
    s = client.status(job_name, summaries=0)
    assert (s.dead, s.todo, s.leased) == (1, 1, 0)
    assert [e["task"] for e in events(client, job_name, "dead")] == [str(task.id)]


def test_each_tick_logs_one_line_when_it_did_something(client, job_name, caplog):
    make_job(client, job_name, n=30, worker_ttl=1.0)
    lease_all(client, job_name, workers=3, each=10)
    client.advance_clock(job_name, 1001)
    reaper = Reaper(client, jobs=[job_name], batch=7, max_batches=2)
    with caplog.at_level(logging.INFO, logger="taskq.reaper"):
        assert reaper.tick() == {job_name: 14} and reaper.backlog == [job_name]
        assert reaper.tick() == {job_name: 14}
        assert reaper.tick() == {job_name: 2} and reaper.backlog == []
        assert reaper.tick() == {job_name: 0}
    lines = [r.getMessage() for r in caplog.records if r.name == "taskq.reaper"]
    assert len(lines) == 3 and all("re-dispatched" in line for line in lines)
    assert f"{job_name}=14" in lines[0] and "work left" in lines[0]
    assert counters(client, job_name)["expired_worker_lost"] == 30


def test_backlog_is_reported_only_while_work_is_left(client, job_name):
    timeouts, idle = f"{job_name}-tt", f"{job_name}-idle"
    make_job(client, timeouts, n=10, worker_ttl=5.0, task_timeout=1.0)
    lease_all(client, timeouts, workers=1, each=10)
    client.advance_clock(timeouts, 1001)
    reaper = Reaper(client, jobs=[timeouts], batch=15, max_batches=1)
    assert reaper.tick() == {timeouts: 10} and reaper.backlog == [], "all done in one batch"

    make_job(client, idle, n=1, worker_ttl=1.0)
    for i in range(3):
        trainer(client, idle, f"idle{i}")  # lost holding nothing
    client.advance_clock(idle, 1001)
    reaper = Reaper(client, jobs=[idle], batch=2, max_batches=1)
    assert reaper.tick() == {idle: 0} and reaper.backlog == [idle], "a third lost worker left"
    assert len(client.workers(idle)) == 1
    assert reaper.tick() == {idle: 0} and reaper.backlog == []
    assert client.workers(idle) == []


# -- several reapers -----------------------------------------------------------------------
def test_a_second_reaper_skips_a_job_another_holds_the_lock_of(client, job_name):
    make_job(client, job_name, n=3, worker_ttl=1.0)
    lease_all(client, job_name, workers=1, each=3)
    client.advance_clock(job_name, 1001)
    first = Reaper(client, jobs=[job_name], batch=1, max_batches=1, lock_ms=5000)
    second = Reaper(client, jobs=[job_name], batch=1, max_batches=1, lock_ms=5000)
    assert first.reaper_id != second.reaper_id
    assert first.tick() == {job_name: 1}
    assert second.tick() == {job_name: 0} and second.locked == [job_name], "no stampede"
    assert first.tick() == {job_name: 1} and first.locked == []


def test_two_reapers_racing_over_1000_expired_leases_redispatch_each_once(client, job_name):
    n = 1000
    make_job(client, job_name, n=n, worker_ttl=2.0)
    lease_all(client, job_name, workers=50, each=20)
    client.advance_clock(job_name, 2001)
    # a lock of 1 ms lets both reapers really interleave: only atomicity stands between
    # them and a double dispatch
    reapers = [
        Reaper(
            taskq.connect(client.url.replace("***", "")),
            jobs=[job_name],
            batch=37,
            max_batches=1,
            lock_ms=1,
        )
        for _ in range(2)
    ]
    totals = [0, 0]
    start = threading.Barrier(2)

    def work(i: int) -> None:
        start.wait()
        idle_ticks = 0
        while idle_ticks < 20:
            did = reapers[i].tick()[job_name]
            totals[i] += did
            idle_ticks = 0 if did else idle_ticks + 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    print(f"reclaimed per reaper: {totals}")
    assert sum(totals) == n, "each lease reclaimed by exactly one reaper"
    assert_each_redispatched_once(client, job_name, n)


REAPER_PROC = """
import logging, sys
import taskq
from taskq.keys import jobs_index
from taskq.ops.reaper import Reaper
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
url, job, batch, lock_ms = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sys.exit(Reaper(taskq.connect(url), jobs=[job], interval=0.05, batch=batch, max_batches=1,
                lock_ms=lock_ms).run())
"""


def test_reaper_killed_mid_run_and_restarted_redispatches_each_lease_once(url, client, job_name):
    n = 1000
    make_job(client, job_name, n=n, worker_ttl=2.0)
    lease_all(client, job_name, workers=50, each=20)
    client.advance_clock(job_name, 2001)
    first = subprocess.Popen(
        [sys.executable, "-c", REAPER_PROC, url, job_name, "1", "1000"],
        stderr=subprocess.DEVNULL,
        env=SUBPROCESS_ENV,
    )
    try:
        assert wait_until(lambda: counters(client, job_name)["expired_worker_lost"] >= 50, 20)
    finally:
        first.kill()
        first.wait(10)
    at_kill = counters(client, job_name)["expired_worker_lost"]
    assert 0 < at_kill < n, "killed mid-run"

    standby = Reaper(client, jobs=[job_name])
    assert standby.tick() == {job_name: 0} and standby.locked == [job_name], (
        "the dead reaper's lock holds until it lapses"
    )

    second = subprocess.Popen(
        [sys.executable, "-c", REAPER_PROC, url, job_name, "1000", "1000"],
        stderr=subprocess.PIPE,
        text=True,
        env=SUBPROCESS_ENV,
    )
    try:
        assert wait_until(lambda: counters(client, job_name)["expired_worker_lost"] >= n, 20)
        second.send_signal(signal.SIGTERM)  # it stops after the tick (and its log line)
        _, err = second.communicate(timeout=10)
    finally:
        second.kill()
    assert second.returncode == EXIT_OK, err
    assert "SIGTERM received" in err and "stopped" in err
    # one reap call ends at most MAX_RECLAIM leases: the restarted reaper's ticks add up
    assert sum(int(x) for x in re.findall(r"re-dispatched (\d+) lease", err)) == n - at_kill
    assert_each_redispatched_once(client, job_name, n)


def test_sigterm_stops_run_after_the_tick_and_restores_the_handlers(client, job_name):
    make_job(client, job_name, n=1)
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    started = time.monotonic()
    code = Reaper(client, jobs=[job_name], interval=0.05).run()
    timer.join()
    assert code == EXIT_OK and time.monotonic() - started < 5
    assert signal.getsignal(signal.SIGTERM) is before


# -- Redis away ------------------------------------------------------------------------------
def test_redis_restart_gives_workers_a_grace_period_then_real_losses_go_back(
    own_redis, job_name, caplog
):
    c = taskq.connect(own_redis.url)
    make_job(c, job_name, n=3, manual_clock=False, worker_ttl=1.0, heartbeat_interval=0.2)
    alive, gone = trainer(c, job_name, "alive"), trainer(c, job_name, "gone")
    kept, lost = alive.lease(timeout=0), gone.lease(timeout=0)
    reaper = Reaper(
        taskq.connect(own_redis.url, retries=0),
        jobs=[job_name],
        interval=0.1,
        backoff=ConstantBackoff(0.1),
    )
    stop = threading.Event()
    with caplog.at_level(logging.INFO, logger="taskq.reaper"):
        loop = threading.Thread(target=reaper.run, args=(stop,))
        loop.start()
        try:
            alive.heartbeat()
            gone.heartbeat()
            own_redis.stop()  # a clean shutdown: the AOF holds every write
            time.sleep(2.0)  # everyone silent for two ttls: an outage of real time
            own_redis.start()
            restarted = time.monotonic()
            while time.monotonic() - restarted < 0.5:
                assert alive.heartbeat() == []
                assert counters(c, job_name)["expired_worker_lost"] == 0, "silence is not death"
                time.sleep(0.1)  # half a second of real time in which nobody is lost

            def gone_is_lost() -> bool:
                alive.heartbeat()
                return counters(c, job_name)["expired_worker_lost"] >= 1

            assert wait_until(gone_is_lost, 5, interval=0.1), "the real loss goes back"
            recovered_after = time.monotonic() - restarted
        finally:
            stop.set()
            loop.join(10)
    assert counters(c, job_name)["expired_worker_lost"] == 1
    [expired] = events(c, job_name, "expired")
    assert expired["task"] == str(lost.id) and expired["worker"] == "gone"
    assert alive.heartbeat() == [] and not kept.revoked.is_set(), "the live worker kept its task"
    [silence] = events(c, job_name, "silence")
    assert int(silence["gap_ms"]) >= 1500
    assert recovered_after < 1.0 + 3.0
    messages = [r.getMessage() for r in caplog.records if r.name == "taskq.reaper"]
    assert any("Redis unreachable" in m and "retrying" in m for m in messages)
    assert any("reachable again" in m for m in messages)


def test_give_up_after_exits_nonzero_with_a_clear_message(caplog):
    nobody = taskq.connect(f"redis://127.0.0.1:{free_port()}/0", retries=0)
    reaper = Reaper(
        nobody, jobs=["j"], interval=0.05, give_up_after=0.5, backoff=ConstantBackoff(0.05)
    )
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="taskq.reaper"):
        code = reaper.run(threading.Event())
    elapsed = time.monotonic() - started
    assert code == EXIT_GAVE_UP != 0 and 0.5 <= elapsed < 5
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "giving up" in errors[0] and "unreachable" in errors[0]
    assert sum("retrying" in r.getMessage() for r in caplog.records) >= 2


# -- broken jobs -----------------------------------------------------------------------------
def test_vanished_and_corrupt_jobs_are_logged_and_skipped(client, job_name, caplog):
    good, corrupt, odd, gone = (f"{job_name}-{s}" for s in ("good", "bad", "odd", "gone"))
    for name in (good, corrupt, odd, gone):
        make_job(client, name, n=1, worker_ttl=1.0)
        trainer(client, name, "w").lease(timeout=0)
        client.advance_clock(name, 1001)
    client.redis.delete(client.keys(corrupt).workers)
    client.redis.set(client.keys(corrupt).workers, "not a sorted set")  # WRONGTYPE
    client.redis.zadd(client.keys(odd).workers, {"no-incarnation": 0})  # a Lua error
    client.delete_job(gone)
    reaper = Reaper(client, jobs=[gone, corrupt, odd, good])
    with caplog.at_level(logging.INFO, logger="taskq.reaper"):
        assert reaper.tick() == {good: 1}
        assert good in reaper.tick()
    by_job = {
        job: [r for r in caplog.records if r.name == "taskq.reaper" and job + ":" in r.getMessage()]
        for job in (corrupt, odd, gone)
    }
    assert [r.levelno for r in by_job[corrupt]] == [logging.ERROR], "logged once"
    message = by_job[corrupt][0].getMessage()
    assert "cannot reap" in message and ("CorruptData" in message or "WRONGTYPE" in message)
    assert by_job[odd][0].levelno == logging.ERROR
    assert "cannot reap (ResponseError)" in by_job[odd][0].getMessage()
    assert [r.levelno for r in by_job[gone]] == [logging.INFO]
    assert "not found" in by_job[gone][0].getMessage()


def test_all_jobs_mode_skips_a_bad_name_in_the_index(client, job_name, caplog):
    make_job(client, job_name, n=1, worker_ttl=1.0)
    trainer(client, job_name, "w").lease(timeout=0)
    client.advance_clock(job_name, 1001)
    bad = f"bad name {job_name}!"
    client.redis.sadd(jobs_index(client.connection.prefix), bad)
    try:
        with caplog.at_level(logging.INFO, logger="taskq.reaper"):
            result = Reaper(client).tick()
    finally:
        client.redis.srem(jobs_index(client.connection.prefix), bad)
    assert result[job_name] == 1 and bad not in result
    assert any(bad in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


def test_an_unreadable_job_index_is_logged_once_and_the_reaper_goes_on(url, job_name, caplog):
    own = taskq.connect(url, key_prefix=f"tq-{job_name}")  # an index of this test alone
    index = jobs_index(own.connection.prefix)
    own.redis.set(index, "not a set")
    reaper = Reaper(own)
    with caplog.at_level(logging.INFO, logger="taskq.reaper"):
        assert reaper.tick() == {} and reaper.tick() == {}
        own.redis.delete(index)
        make_job(own, job_name, n=1)
        assert reaper.tick() == {job_name: 0}
    messages = [r.getMessage() for r in caplog.records if r.name == "taskq.reaper"]
    assert sum("cannot list jobs" in m for m in messages) == 1
    assert any("readable again" in m for m in messages)


# -- timed trials ----------------------------------------------------------------------------
# One launcher imports taskq once and forks one trainer process per job (ten interpreters
# importing at once take seconds on a small machine); each child leases its job's only
# task, reports its pid, and holds the task, heartbeating, until it is SIGKILLed.
HOLDERS_PROC = """
import os, sys, time
import taskq
url, launcher = sys.argv[1], os.getpid()
for job in sys.argv[2:]:
    if os.fork() == 0:
        task = taskq.Trainer(job, url=url).lease(timeout=10)
        os.write(1, f"HELD {job} {os.getpid()} {task.id}\\n".encode())
        while os.getppid() == launcher:  # ends with the launcher
            time.sleep(0.1)  # until the launcher is gone
        os._exit(0)
time.sleep(120)  # holds until SIGKILLed
"""


def read_held(launcher: subprocess.Popen[str], count: int, timeout: float) -> dict[str, int]:
    """Job -> pid of the holder process, from the launcher's ``HELD job pid task`` lines."""
    lines: queue.Queue[str] = queue.Queue()
    assert launcher.stdout is not None
    out = launcher.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in out], daemon=True).start()
    held: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    while len(held) < count:
        line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        if line.startswith("HELD "):
            _, job, pid, task_id = line.split()
            assert task_id == "0", line
            held[job] = int(pid)
    return held


def test_sigkilled_trainers_task_goes_back_once_to_the_waiting_trainer_or_the_reaper(
    url, client, job_name, capsys
):
    """Ten trials where an idle trainer waits in ``lease()``, and five where nobody asks
    for work, so only the reaper can notice: each SIGKILLed holder's task comes back, once,
    as an expiry of a lost worker. The times are printed, not asserted: how fast is a
    timing goal, which bench/taskq_recovery.py measures (percentiles in one run); a wall
    clock bound here failed under a load of 11 on the 2 cores."""
    ttl, trials, reaper_only = 1.0, 10, 5
    jobs = [f"{job_name}-{i}" for i in range(trials + reaper_only)]
    for name in jobs:
        client.create_job(
            name, chunks=[{"i": 0}], worker_ttl=ttl, heartbeat_interval=0.2, task_timeout=None
        )
    launcher = subprocess.Popen(
        [sys.executable, "-c", HOLDERS_PROC, url, *jobs],
        stdout=subprocess.PIPE,
        text=True,
        env=SUBPROCESS_ENV,
    )
    holder_pid: dict[str, int] = {}
    stop = threading.Event()
    reaper = Reaper(taskq.connect(url), jobs=jobs)  # the default interval, 0.5 s
    loop = threading.Thread(target=reaper.run, args=(stop,))
    recovery: list[float] = []
    by_reaper: list[float] = []
    try:
        holder_pid.update(read_held(launcher, len(jobs), timeout=30))
        loop.start()

        def trial(i: int) -> None:
            idle = taskq.Trainer(jobs[i], url=url)
            got: list[Any] = []
            waiter = threading.Thread(target=lambda: got.append(idle.lease(timeout=ttl + 5)))
            waiter.start()
            time.sleep(0.3 + 0.04 * i)  # blocked by now; kills spread over the heartbeat
            killed = time.monotonic()
            os.kill(holder_pid[jobs[i]], signal.SIGKILL)
            waiter.join(ttl + 10)
            took = time.monotonic() - killed
            assert got and got[0] is not None and got[0].id == 0, f"trial {i}: nothing leased"
            recovery.append(took)
            idle.close()

        def unattended(i: int) -> None:
            observer = taskq.connect(url)
            # kills spread over the heartbeat, as in the trials
            time.sleep(0.3 + 0.08 * (i - trials))
            killed = time.monotonic()
            os.kill(holder_pid[jobs[i]], signal.SIGKILL)
            assert wait_until(
                lambda: observer.status(jobs[i], summaries=0).todo == 1, ttl + 10, interval=0.01
            ), f"trial {i}: never back in todo"
            by_reaper.append(time.monotonic() - killed)

        threads = [threading.Thread(target=trial, args=(i,)) for i in range(trials)]
        threads += [
            threading.Thread(target=unattended, args=(i,))
            for i in range(trials, trials + reaper_only)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(ttl + 20)
    finally:
        stop.set()
        for pid in holder_pid.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        launcher.kill()
        launcher.wait(10)
        if loop.ident:
            loop.join(10)
    assert len(recovery) == trials and len(by_reaper) == reaper_only
    late_ms = {
        name: [int(e["lateness_ms"]) for e in events(client, name, "expired")] for name in jobs
    }
    idle_late = [ms for name in jobs[:trials] for ms in late_ms[name]]
    reaper_late = [ms for name in jobs[trials:] for ms in late_ms[name]]
    with capsys.disabled():
        print(
            f"\nSIGKILL, worker_ttl={ttl}s, reaper every 0.5 s: re-leased by a blocked idle "
            f"trainer in p50 {statistics.median(recovery):.2f}s max {max(recovery):.2f}s "
            f"({trials} trials; lateness p50 {statistics.median(idle_late):.0f} ms); "
            f"back in todo with nobody asking in p50 {statistics.median(by_reaper):.2f}s "
            f"max {max(by_reaper):.2f}s ({reaper_only} trials; lateness p50 "
            f"{statistics.median(reaper_late):.0f} ms max {max(reaper_late)} ms)"
        )
    for name in jobs:
        assert len(late_ms[name]) == 1, f"{name}: one expiry"
        assert late_ms[name][0] >= 0, f"{name}: expired before its deadline"
        assert counters(client, name)["expired_worker_lost"] == 1
