"""Chaos scenarios 1, 2, 5, 6 (issue 7) in their CI form: real forked trainers, a real
redis-server, a reaper subprocess, signals; each ends with ``chaos.audit_job``.

Scenarios 3, 4, 7 (Redis crash, partition/outage, randomised) are in
``tests/chaos/test_chaos_redis.py``; the long form is ``bench/chaos_long.py``.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from chaos import (
    POISON_KILL,
    POISON_RAISE,
    Fleet,
    ReaperProc,
    acked,
    audit_job,
    held_by,
    run_cli,
    scale_up_down_kill,
    wait_for,
)

import taskq

pytestmark = pytest.mark.chaos

TTL_S = 2.0
HBI_S = 0.5
#: Slack on top of the ttl for a SIGKILLed trainer's task to be leased again: the reaper
#: tick (0.2 s), a survivor finishing its step, and a loaded 2-core machine.
MARGIN_S = 1.5


def _log(msg: str, **data: Any) -> None:
    print(f"[chaos] {msg} " + " ".join(f"{k}={v}" for k, v in data.items()), flush=True)


def test_scale_up_scale_down_and_kill_lose_nothing_and_nobody_hangs(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    summary = scale_up_down_kill(
        client,
        url,
        job_name,
        tmp_path,
        tasks=120,
        passes=3,
        first=6,
        peak=12,
        last=3,
        step_s=0.05,
        up_at=30,
        down_at=150,
        ttl_s=TTL_S,
        hbi_s=HBI_S,
    )
    _log(
        "scenario 1",
        runtime_s=summary["runtime_s"],
        tail_s=summary["tail_s"],
        max_kill_wait_s=summary["max_kill_wait_s"],
        max_term_wait_s=summary["max_term_wait_s"],
        max_lateness_ms=summary["max_lateness_ms"],
        acked=summary["acked"],
        duplicates=summary["duplicates"],
        counters=summary["counters"],
    )
    assert summary["passes"] == 3 and summary["acked"] == 3 * 120
    assert summary["dead"] == []
    assert summary["unaccounted_leases"] == 0, summary["counters"]
    # the longest wait for a removed trainer's task: within the ttl + a margin
    assert summary["max_kill_wait_s"] is None or summary["max_kill_wait_s"] <= TTL_S + MARGIN_S
    # SIGTERM releases at once: leasable by the next survivor that asks
    assert summary["max_term_wait_s"] is None or summary["max_term_wait_s"] <= MARGIN_S
    # the server's own measure: how late past the missed deadline re-dispatch came
    assert summary["max_lateness_ms"] <= MARGIN_S * 1000


def test_paused_trainer_ack_is_stale_and_it_rejoins_with_new_work(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    job = job_name
    # no backup leases: the slow trainer's later acks must not lose to a backup here
    client.create_job(
        job,
        chunks=[{"i": i} for i in range(60)],
        passes=2,
        worker_ttl=TTL_S,
        heartbeat_interval=HBI_S,
        task_timeout=None,
        backup_leases=False,
    )
    with (
        Fleet(url, job, tmp_path) as fleet,
        ReaperProc(url, interval=0.2, jobs=[job], log_path=tmp_path / "reaper.log"),
    ):
        (paused,) = fleet.spawn(1, step_s=1.0, explicit_ack=True, worker_id="paused")
        (other,) = fleet.spawn(1, step_s=0.1, worker_id="other")
        wait_for(lambda: len(paused.records()) >= 1, 30, what="the slow trainer's first task")
        held = wait_for(lambda: held_by(client, job, "paused"), 10, what="a held task")
        stopped_at = paused.stop()
        time.sleep(0.1)  # a call in flight lands; then what it holds is fixed
        held = held_by(client, job, "paused")
        assert len(held) == 1, held
        task_id = held[0]["id"]
        pass_no = client.status(job, summaries=0).pass_no
        incarnation = {w["id"]: w["incarnation"] for w in client.workers(job)}["paused"]

        def finished_by_other() -> bool:
            rows = other.records()
            mine = [
                r
                for r in rows
                if r["task"] == task_id and r["pass"] == pass_no and r["start"] > stopped_at
            ]
            # the row after it means the next call (carrying its ack) was made
            return bool(mine) and any(r["start"] > mine[0]["t"] for r in rows)

        wait_for(finished_by_other, TTL_S + 10, what="the other trainer to finish the task")
        paused_for = time.time() - stopped_at
        # its liveness deadline is its last heartbeat (at most one interval before the stop)
        # plus the ttl: nobody may take the task before that
        assert paused_for > TTL_S - HBI_S, paused_for
        resumed_at = paused.cont()
        wait_for(
            lambda: any(r["start"] > resumed_at for r in paused.records()),
            30,
            what="the resumed trainer to take new work",
        )
        assert fleet.join_all(60), "a trainer hangs"
        assert paused.exitcode == 0 and other.exitcode == 0
        rows = paused.records()
        late = [
            r
            for r in rows
            if r["task"] == task_id and r["pass"] == pass_no and r["start"] < stopped_at
        ]
        assert len(late) == 1 and late[0]["stale"] is True, late
        after = [r for r in rows if r["start"] > resumed_at]
        assert after and not any(r["stale"] for r in after), after
        workers = {w["id"]: w for w in client.workers(job)}
        summary = audit_job(client, job, fleet.logs())
    _log(
        "scenario 2",
        paused_s=round(paused_for, 2),
        stale=summary["stale"],
        tasks_after_resume=len(after),
        counters=summary["counters"],
    )
    assert summary["stale"] >= 1
    assert summary["audit"]["passes"][pass_no]["stale"] >= 1
    # the task is counted once in its pass (audit_job: done == live tasks per pass)
    assert summary["acked"] == 2 * 60
    assert summary["counters"]["expired_worker_lost"] >= 1
    # re-registered under a new incarnation (the worker left at the end, or is listed anew)
    if "paused" in workers:
        assert workers["paused"]["incarnation"] != incarnation


def test_poison_tasks_end_dead_at_their_caps_without_stalling_the_pass(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    job = job_name
    max_attempts, max_failures = 3, 2
    kill_id, raise_id = 7, 13
    chunks: list[Any] = [{"i": i} for i in range(40)]
    chunks[kill_id] = POISON_KILL
    chunks[raise_id] = POISON_RAISE
    # no backup leases: a backup of a poison task would cost one more trainer than the caps
    client.create_job(
        job,
        chunks=chunks,
        passes=2,
        worker_ttl=TTL_S,
        heartbeat_interval=HBI_S,
        task_timeout=None,
        max_attempts=max_attempts,
        max_failures=max_failures,
        backup_leases=False,
    )
    began = time.monotonic()
    max_spawns = 3 + max_attempts + max_failures + 3
    with (
        Fleet(url, job, tmp_path, step_s=0.05) as fleet,
        ReaperProc(url, interval=0.2, jobs=[job], log_path=tmp_path / "reaper.log"),
    ):
        fleet.spawn(3)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if client.status(job, summaries=0).state == "completed":
                break
            dead = [t for t in fleet.trainers if t.exitcode is not None]
            if len(fleet.alive()) < 3 and len(fleet.trainers) < max_spawns:
                fleet.spawn(1)  # respawn, as a cluster would
            elif not fleet.alive() and len(fleet.trainers) >= max_spawns:
                raise AssertionError(f"out of respawns: {[t.exitcode for t in dead]}")
            time.sleep(0.05)
        completed_s = time.monotonic() - began
        assert client.status(job, summaries=0).state == "completed", "the pass stalled"
        assert fleet.join_all(30), "a trainer hangs"
        codes = [t.exitcode for t in fleet.trainers]
        summary = audit_job(client, job, fleet.logs(), expect_dead={kill_id, raise_id})
    dead_rows = {d["id"]: d for d in client.tasks(job, state="dead")}
    _log(
        "scenario 5",
        completed_s=round(completed_s, 2),
        exit_codes=codes,
        dead=dead_rows,
        counters=summary["counters"],
    )
    assert dead_rows[kill_id]["attempts"] == max_attempts
    assert dead_rows[raise_id]["failures"] == max_failures
    # every lease of a poison task cost one trainer: exactly the caps, no more
    assert codes.count(-signal.SIGKILL) == max_attempts
    assert codes.count(1) == max_failures
    assert codes.count(0) == len(codes) - max_attempts - max_failures
    assert summary["counters"]["expired_worker_lost"] == max_attempts
    assert summary["counters"]["dead"] == 2
    # both passes counted every live task once; the second never saw the poison
    assert summary["acked"] == 2 * 38
    # bounded by the poison itself: 3 worker-lost ttls, not a stall
    assert completed_s < max_attempts * (TTL_S + MARGIN_S) + 15


#: Commands a client sends itself (everything else in a waiting trainer's traffic runs
#: inside a script, and INFO's total_commands_processed counts those too).
CLIENT_COMMANDS = ("fcall", "fcall_ro", "blpop", "ping", "info")


def _commands(r: redis.Redis) -> tuple[int, int]:
    """(total_commands_processed, calls of CLIENT_COMMANDS) at one moment."""
    pipe = r.pipeline(transaction=False)
    pipe.info("stats")
    pipe.info("commandstats")
    stats, cmdstats = pipe.execute()
    client_calls = sum(
        int(cmdstats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in CLIENT_COMMANDS
    )
    return int(stats["total_commands_processed"]), client_calls


def _event_time(client: taskq.Client, job: str, kind: str) -> float:
    """The wall time (s) of ``job``'s first event of type ``kind``: the server's clock, in
    the event's stream id (the trainers' logs use the same machine's clock)."""
    last = "-"
    while True:
        page = client.events(job, since=last, count=1000)
        for event_id, event in page:
            if event.get("type") == kind:
                return int(event_id.split("-")[0]) / 1000
        assert len(page) == 1000, f"no {kind} event"
        last = page[-1][0]


def test_manual_advance_waits_without_spinning_and_cancel_ends_every_loop(
    own_redis: Any, job_name: str, tmp_path: Path
) -> None:
    url = own_redis.url
    client = taskq.connect(url)
    job = job_name
    n_tasks = 12
    # no backup leases: the long bodies hold their tasks until the cancel revokes them
    client.create_job(
        job,
        chunks=[{"i": i} for i in range(n_tasks)],
        passes=3,
        worker_ttl=TTL_S,
        heartbeat_interval=HBI_S,
        task_timeout=None,
        auto_advance=False,
        backup_leases=False,
    )
    r = own_redis.client()
    with Fleet(url, job, tmp_path, step_s=0.2) as fleet:
        fleet.spawn(3)
        wait_for(
            lambda: client.status(job, summaries=0).state == "waiting", 30, what="the pass boundary"
        )
        status = client.status(job, summaries=0)
        assert status.reason == "manual_advance" and status.pass_no == 0
        # long bodies that stop only when their lease is revoked; they join at the
        # boundary and wait with the others
        long = fleet.spawn(2, until_revoked_s=60)
        trainers = len(fleet.trainers)
        wait_for(
            lambda: int(r.info("clients")["blocked_clients"]) >= trainers,
            30,
            what="every trainer in the blocking wait",
        )
        (total0, calls0), t0 = _commands(r), time.monotonic()
        time.sleep(2.0)  # the window the call rate is measured over
        (total1, calls1), t1 = _commands(r), time.monotonic()
        rate = (calls1 - calls0 - 2) / (t1 - t0)  # minus our own two INFOs
        total_rate = (total1 - total0 - 2) / (t1 - t0)
        bound = 5 * trainers / HBI_S + 20
        assert len(fleet.alive()) == trainers, "a trainer left at the pass boundary"
        assert acked(client, job) == n_tasks
        assert client.status(job, summaries=0).pass_no == 0
        _log(
            "scenario 6: waiting",
            trainers=trainers,
            client_calls_per_s=round(rate, 1),
            total_commands_per_s=round(total_rate, 1),
            heartbeats_per_s=trainers / HBI_S,
            bound=bound,
        )
        assert rate < bound, f"{rate:.1f} client calls/s while waiting (bound {bound})"
        # with the commands the scripts run (a few dozen per heartbeat): still no spinning
        assert total_rate < 50 * trainers / HBI_S + 100, f"{total_rate:.1f} commands/s"

        advanced = run_cli(url, "pass", "next", job)
        assert advanced.returncode == 0, advanced.stderr
        # the long bodies take two tasks of pass 1 and hold them; the others do the rest
        wait_for(
            lambda: client.status(job, summaries=0).done == n_tasks - 2,
            30,
            what="pass 1 done but for the long bodies' tasks",
        )
        status = client.status(job, summaries=0)
        assert status.pass_no == 1 and status.leased == 2 and status.state == "running"
        holders = {t["worker"] for t in client.tasks(job, state="leased")}
        assert holders == {t.worker_id for t in long}

        cancelled = run_cli(url, "job", "cancel", job)
        assert cancelled.returncode == 0, cancelled.stderr
        assert fleet.join_all(HBI_S + 5), "a trainer's loop did not end after the cancel"
        # measured from the cancel landing (the server's time of its event), not from the
        # CLI's start: the CLI imports taskq first, seconds on a loaded machine
        cancelled_at = _event_time(client, job, "job_cancelled")
        exits = {t.worker_id: t.exit_record() for t in fleet.trainers}
        for t in fleet.trainers:
            assert t.exitcode == 0, (t.worker_id, t.exitcode, exits[t.worker_id])
            assert exits[t.worker_id]["state"] == "cancelled"
        exit_after = max(e["t"] for e in exits.values()) - cancelled_at
        stops = []
        for t in long:
            rows = [x for x in t.records() if x["pass"] == 1]
            assert len(rows) == 1 and rows[0]["revoked"] is True, rows
            stops.append(rows[0]["t"] - cancelled_at)
        summary = audit_job(client, job, fleet.logs(), expect_state="cancelled")
    _log(
        "scenario 6: cancel",
        last_exit_after_s=round(exit_after, 2),
        long_bodies_stopped_after_s=[round(s, 2) for s in stops],
        counters=summary["counters"],
    )
    # the long bodies learn it from their next heartbeat (every 0.5 s), not after their
    # 60 s bodies: the margin is for a loaded machine
    assert max(stops) < HBI_S + 5.0
    assert exit_after < HBI_S + 3.0
