"""Chaos scenarios 3, 4 and 7 (issue 7): Redis crashes, rollbacks, partitions, outages, and
seeded random schedules, each ending with the audit.

Real redis-server (``own_redis``: AOF, ``appendfsync everysec``), real trainer processes
(``chaos.Fleet``), a real ``taskq reaper`` subprocess connected straight to Redis, and a
loopback TCP proxy (``tcp_proxy.TcpProxy``) between some trainers and Redis, all run by
``chaos_rig.Rig``. Everything started is stopped by the ``rig`` fixture, even on failure;
on failure the rig prints its timeline (and the seed and schedule of a random run).

The long form of scenario 7 (many seeds) is ``bench/chaos_random_long.py``.

Data flow: test -> chaos_rig.py -> chaos.py / tcp_proxy.py -> trainers -> taskq -> Redis <- reaper.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chaos import read_logs, wait_for
from chaos_rig import HBI_S, TTL_S, Rig, random_scenario
from support import RedisServer

import taskq
from taskq.testing import trainer_worker

pytestmark = pytest.mark.chaos


@pytest.fixture
def rig(own_redis: RedisServer, tmp_path: Path, job_name: str) -> Iterator[Rig]:
    r = Rig(own_redis, tmp_path, job_name)
    try:
        yield r
    finally:
        r.close()


def acked(rig: Rig) -> int:
    return rig.counters()["acked"]


# -- scenario 3: Redis crashes ---------------------------------------------------------------
def test_redis_kill9_mid_pass_loses_nothing_and_counts_each_task_once(rig: Rig) -> None:
    """kill -9 redis-server mid-pass (AOF everysec), restart it on the same port: trainers
    and the reaper reconnect, every pass completes, each task counted once per pass."""
    n, passes = 40, 3
    with rig.explained():
        rig.create_job(n, passes)
        rig.start_reaper()
        rig.spawn(n=3, step_s=0.04)
        wait_for(lambda: acked(rig) >= n + n // 3, 30, what="pass 1 under way")
        status = rig.client.status(rig.job, summaries=0)
        rig.note(
            f"before the crash: pass {status.pass_no}, done {status.done}, "
            f"acked {status.counters['acked']}"
        )
        rig.crash_redis(down_s=1.0)
        status = rig.client.status(rig.job, summaries=0)
        rig.note(
            f"after the restart: pass {status.pass_no}, done {status.done}, "
            f"acked {status.counters['acked']}"
        )
        result = rig.finish(60)
        assert result["passes"] == passes
        assert result["acked"] == n * passes, result
        assert all(t.exitcode == 0 for t in rig.trainers()), [
            (t.worker_id, t.exitcode) for t in rig.trainers()
        ]
        assert rig.reaper is not None and rig.reaper.alive(), "the reaper exited"
        assert "Traceback" not in (rig.workdir / "reaper.log").read_text()


def test_restart_from_older_aof_copy_tokens_grow_and_acks_after_it_rerun_once(rig: Rig) -> None:
    """Restart from an older copy of the whole appendonlydir (a failover to a lagging
    replica): every token leased afterwards is larger than every token seen before; a
    probe's lease granted after the copy is stale afterwards (LeaseLost, nothing counted);
    every task acked after the copy is re-run after the restart, and the audit counts each
    task once per pass."""
    n, passes = 60, 3
    with rig.explained():
        # no backup leases: the probe's task must stay the probe's across the rollback
        rig.create_job(n, passes, backup_leases=False)
        rig.start_reaper()
        rig.spawn(n=3, step_s=0.06)
        wait_for(lambda: acked(rig) >= n // 6, 30, what="pass 0 under way")
        copy = rig.copy_aof()
        t_copy = rig.note("copy taken")
        acked_at_copy = acked(rig)
        # a lease granted after the copy, held across the rollback
        probe = rig.probe("probe", via_proxy=False)
        held = probe.lease(timeout=10)
        assert held is not None
        rig.note(f"probe holds task {held.id} (pass {held.pass_no}, token {held.token})")
        # (pass 0 cannot end while the probe holds its task: the fleet idles at its end)
        wait_for(lambda: acked(rig) >= acked_at_copy + n // 2, 30, what="work acked after the copy")
        time.sleep(1.0)  # work goes on past the 0.5 s the check leaves before the kill
        last_token_before = int(rig.client.redis.hget(rig.client.keys(rig.job).meta, "last_token"))
        t_kill = time.time()
        acked_before_kill = acked(rig)
        rig.restart_from(copy)
        t_restart = time.time()
        acked_after = acked(rig)
        rig.note(
            f"acked {acked_before_kill} before the rollback, {acked_after} after "
            f"(copy had {acked_at_copy})"
        )
        assert acked_after < acked_before_kill, "the restart did not roll anything back"

        # the probe's lease does not exist on the rolled-back server: stale, not counted
        stale_before = rig.counters()["stale"]
        with pytest.raises(taskq.LeaseLost):
            probe.ack(held)
        assert rig.counters()["stale"] == stale_before + 1
        rig.note("probe's ack after the rollback: LeaseLost, counted stale")
        probe.close()

        result = rig.finish(60)
        assert result["passes"] == passes and result["acked"] >= n * passes, result
        records = read_logs(rig.logs())
        before = [r for r in records if r["t"] < t_kill]
        seen_max = max([int(r["token"]) for r in before] + [held.token, last_token_before])
        after = [r for r in records if r["start"] > t_restart]
        assert after, "nothing was leased after the restart"
        low = [r for r in after if int(r["token"]) <= seen_max]
        assert not low, f"tokens leased after the restart not above {seen_max}: {low[:5]}"
        # every task whose body ended after the copy (its ack after it) ran again after
        # the restart; acks in flight at the kill may have been retried, so leave those out
        rerun = {(r["pass"], r["task"]) for r in after}
        acked_after_copy = {
            (r["pass"], r["task"]) for r in records if t_copy + 0.2 < r["t"] < t_kill - 0.5
        }
        assert acked_after_copy, "no work between the copy and the rollback"
        missing = sorted(acked_after_copy - rerun)
        assert not missing, f"acked after the copy, not re-run after the rollback: {missing}"
        redone = [r for r in after if (r["pass"], r["task"]) == (held.pass_no, held.id)]
        assert redone and all(int(r["token"]) > held.token for r in redone), redone
        rig.note(
            f"{len(acked_after_copy)} task(s) acked after the copy were re-run; "
            f"{len(after)} leases after the restart, all tokens > {seen_max}"
        )


def test_rollback_across_a_pass_boundary_gives_the_next_pass_iterator_the_redo(rig: Rig) -> None:
    """After a restart from a copy taken before the end of pass 0, a trainer whose per-pass
    iterator already expects pass 1 (``lease(expect_pass=1)``, what ``passes()`` sends) is
    given the pass-0 work the rollback undid, instead of waiting for pass 1 for ever; the
    job then completes and the audit counts each task once per pass."""
    with rig.explained():
        rig.create_job(2, 2)
        probe = rig.probe("probe", via_proxy=False)
        first = probe.lease(timeout=5)
        assert first is not None
        rig.log_probe_task(probe, first)
        probe.ack(first)
        copy = rig.copy_aof()
        second = probe.lease(timeout=5)
        assert second is not None
        rig.log_probe_task(probe, second)
        probe.ack(second)
        assert rig.client.status(rig.job, summaries=0).pass_no == 1
        rig.restart_from(copy)
        assert rig.client.status(rig.job, summaries=0).pass_no == 0
        redo = probe.lease(timeout=5, expect_pass=1)
        assert redo is not None, "the pass-1 iterator was given nothing: it would wait for ever"
        assert (redo.pass_no, redo.id) == (0, second.id) and redo.token > second.token
        rig.log_probe_task(probe, redo)
        probe.ack(redo)
        rig.note("the redo of pass 0 went to the trainer expecting pass 1")
        for task in probe.passes().__next__():  # the rest of pass 1
            rig.log_probe_task(probe, task)
        result = rig.finish(10)
        assert result["passes"] == 2 and result["acked"] == 4, result


def test_trainer_started_while_redis_is_down_registers_when_it_returns(
    own_redis: RedisServer, job_name: str
) -> None:
    """A trainer constructed while Redis is away (a pod scheduled during a restart) waits
    for it, like every other call, instead of failing at once."""
    client = taskq.connect(own_redis.url)
    client.create_job(
        job_name, [{"i": i} for i in range(2)], worker_ttl=TTL_S, heartbeat_interval=HBI_S
    )
    own_redis.kill()
    back = threading.Timer(1.0, own_redis.start)
    back.start()
    try:
        t0 = time.monotonic()
        with taskq.Trainer(
            job_name, url=own_redis.url, reconnect_timeout=20, handle_signals=False
        ) as trainer:
            registered_s = time.monotonic() - t0
            task = trainer.lease(timeout=5)
            assert task is not None
            trainer.ack(task)
        print(f"\nTrainer() with Redis down for 1 s: registered after {registered_s:.2f} s")
        assert 0.9 < registered_s < 10
    finally:
        back.join()


# -- scenario 4: partition and outage --------------------------------------------------------
def _lost_workers(rig: Rig) -> set[str]:
    return {e["worker"] for e in rig.events("worker_lost")}


def _processed_by(rig: Rig, worker_prefix: str, after: float) -> set[tuple[int, int]]:
    return {
        (int(r["pass"]), int(r["task"]))
        for r in read_logs(rig.logs())
        if r["worker"].startswith(worker_prefix) and r["start"] > after
    }


def test_partition_cut_trainers_lost_redispatched_then_stale_and_rejoin(rig: Rig) -> None:
    """Cut trainers off through the proxy for longer than the ttl while Redis and the
    reaper stay up: the server declares them lost and re-dispatches what they held to the
    trainer connected directly; meanwhile the cut probe flags its task ``at_risk`` (not
    revoked: only the server decides); after the cut its ack is stale (LeaseLost), the
    cut trainers re-register and carry on, and the audit counts each task once."""
    n, passes = 40, 2
    with rig.explained():
        rig.create_job(n, passes)
        rig.start_reaper()
        rig.spawn(n=1, step_s=0.15)
        cut = rig.spawn(proxied=True, n=2, step_s=0.15)
        probe = rig.probe("probe", via_proxy=True)
        held = probe.lease(timeout=10)
        assert held is not None
        first_incarnation = probe.incarnation
        wait_for(lambda: all(t.records() for t in cut), 20, what="the cut trainers working")
        cut_ids = {t.worker_id for t in cut} | {"probe"}
        t_cut = rig.note("proxy cut")
        rig.proxy.cut()
        holding = {(held.pass_no, held.id)} | {
            (rig.client.status(rig.job, summaries=0).pass_no, t["id"])
            for t in rig.client.tasks(rig.job, "leased", 1000)
            if t["worker"] in cut_ids
        }
        rig.note(f"cut trainers hold {sorted(holding)}")

        wait_for(held.at_risk.is_set, TTL_S + 3, what="the cut probe's task at risk")
        rig.note("probe: task at_risk")
        assert not held.revoked.is_set(), "revoked while out of contact: only the server decides"
        wait_for(
            lambda: cut_ids <= _lost_workers(rig),
            TTL_S + 5,
            what="the server to declare the cut trainers lost",
        )
        rig.note(f"declared lost: {sorted(cut_ids)}")
        wait_for(
            lambda: holding <= _processed_by(rig, "d", t_cut),
            15,
            what=f"the direct trainer to run what the cut ones held {sorted(holding)}",
        )
        rig.note("what they held ran on the direct trainer")
        assert rig.proxy.is_cut and time.time() - t_cut < 9, "cut too long for the test"

        rig.proxy.restore()
        t_restore = rig.note("proxy restored (held bytes delivered late)")
        wait_for(held.revoked.is_set, 10, what="the probe told its lease is gone")
        stale_before = rig.counters()["stale"]
        with pytest.raises(taskq.LeaseLost):
            probe.ack(held)
        assert rig.counters()["stale"] == stale_before + 1
        assert probe.incarnation != first_incarnation, "the probe did not re-register"
        rig.note("probe: late ack stale (LeaseLost), re-registered")
        again = probe.lease(timeout=10)
        if again is not None:
            rig.log_probe_task(probe, again)
            probe.ack(again)
            rig.note(f"probe carried on: acked task {again.id}")

        result = rig.finish(60)
        assert result["passes"] == passes and result["acked"] == n * passes, result
        assert result["stale"] >= 1
        joined = [e["worker"] for e in rig.events("worker_joined")]
        for t in cut:
            assert joined.count(t.worker_id) >= 2, f"{t.worker_id} did not re-register"
            assert t.exitcode == 0, (t.worker_id, t.exitcode)
            assert _processed_by(rig, t.worker_id, t_restore), (
                f"{t.worker_id} did not carry on after the cut"
            )
        lost = rig.counters()["expired_worker_lost"]
        assert lost >= len(holding), f"expired_worker_lost {lost} < held {len(holding)}"


def test_redis_stopped_longer_than_ttl_loses_nobody_and_records_stay_right(rig: Rig) -> None:
    """SIGSTOP redis-server for longer than the ttl (everyone silenced, the reaper too):
    on return the silence rule gives every worker another ttl, so nobody is declared lost
    (expired_worker_lost stays 0, no worker_lost event); the probe's task was at risk on
    the client side, the server's answer clears it and its ack counts; audit per pass."""
    n, passes = 40, 2
    with rig.explained():
        rig.create_job(n, passes)
        rig.start_reaper()
        rig.spawn(n=3, step_s=0.1)
        probe = rig.probe("probe", via_proxy=False)
        held = probe.lease(timeout=10)
        assert held is not None
        wait_for(lambda: acked(rig) >= 10, 20, what="work under way")
        rig.pause_redis()
        wait_for(held.at_risk.is_set, TTL_S + 3, what="the probe's task at risk")
        rig.note("probe: task at_risk")
        # Redis paused past the ttl: the outage
        time.sleep(max(0.0, TTL_S + 1.5 - (time.time() - rig.timeline[-2][0])))
        rig.resume_redis()
        wait_for(lambda: not held.at_risk.is_set(), 10, what="the server's answer")
        rig.note("probe: at_risk cleared by the server's answer")
        assert not held.revoked.is_set()
        rig.log_probe_task(probe, held)
        probe.ack(held)  # still this probe's lease: counted
        rig.note("probe: ack after the outage counted")

        result = rig.finish(60)
        assert result["passes"] == passes and result["acked"] == n * passes, result
        counters = rig.counters()
        assert counters["expired_worker_lost"] == 0, counters
        assert rig.events("worker_lost") == []
        gaps = [int(e["gap_ms"]) for e in rig.events("silence")]
        rig.note(f"silence events: {gaps} ms")
        assert gaps and max(gaps) > TTL_S * 1000, gaps
        assert all(t.exitcode == 0 for t in rig.trainers())


def test_granted_task_pass_is_its_replys_not_a_late_heartbeats(
    own_redis: RedisServer, job_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a random schedule (a prefetching trainer logged a task of pass 4 as pass
    3): a heartbeat answered before the pass changed can apply its older pass from the
    heartbeat thread between a lease reply and the tasks built from it. Each granted
    task's ``pass_no`` is the pass its own reply names."""
    client = taskq.connect(own_redis.url)
    client.create_job(
        job_name, [{"i": i} for i in range(2)], passes=2, worker_ttl=TTL_S, heartbeat_interval=HBI_S
    )
    with taskq.Trainer(
        job_name, url=own_redis.url, heartbeat=False, handle_signals=False
    ) as trainer:
        trainer.ack(trainer.lease(timeout=5))
        last = trainer.lease(timeout=5)
        assert last is not None and last.pass_no == 0
        real_note_info = trainer_worker(trainer).view.note

        def note_then_late_heartbeat(info: list[Any]) -> None:
            real_note_info(info)
            real_note_info([0, *info[1:]])  # the heartbeat thread's older answer lands

        monkeypatch.setattr(trainer_worker(trainer).view, "note", note_then_late_heartbeat)
        # ack the last task of pass 0 and lease the first of pass 1 in one call
        reply = trainer_worker(trainer).calls.step([last], [], 1, "S", -1)
        code, granted = reply[0], reply[1]
        assert granted, code
        assert [t.pass_no for t in granted] == [1] * len(granted)


@pytest.mark.parametrize("seed", [7, 1234, 99001])
def test_random_schedule_ends_with_a_clean_audit(rig: Rig, seed: int) -> None:
    """Joins, SIGTERM leaves, SIGKILLs, SIGSTOP pauses shorter and longer than the ttl,
    proxy cuts and kill -9 restarts of Redis drawn from ``random.Random(seed)`` over a
    few passes: every trainer not removed ends normally, and the audit counts every
    task once per pass."""
    result = random_scenario(rig, seed, duration_s=14.0, n=30, passes=6)
    print(
        f"\nseed {seed}: acked {result['acked']} stale {result['stale']} dead "
        f"{result['dead']} processed {result['processed']} duplicates "
        f"{result['duplicates']} max lateness {result['max_lateness_ms']} ms"
    )
