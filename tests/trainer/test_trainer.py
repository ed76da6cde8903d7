"""The trainer client against a real redis-server: iteration, passes, batches, signals,
SIGKILL recovery, revocations, lost replies, prefetch and stealing, Redis restarts."""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import support
from support import RedisServer, wait_until

import taskq
from taskq.engine.contract import Code
from taskq.testing import ManualClock, lease_secret, trainer_worker
from taskq.trainer.protocol import HeartbeatReply, JobInfo, call_heartbeat, heartbeat_args

HERE = Path(__file__).resolve().parents[1]
ROOT = HERE.parent


make_job = partial(support.make_job, worker_ttl=2.0, heartbeat_interval=0.2)


def spawn(url: str, job: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "trainer_proc.py"), url, job, *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def read_until(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        assert line, f"trainer exited ({proc.poll()}) before printing {prefix}"
        if line.startswith(prefix):
            return line.split(maxsplit=1)[1].strip()


def passes_of(client: taskq.Client, job: str) -> list[dict[str, Any]]:
    return [p for p in client.audit(job)["passes"] if p["state"] == "completed"]


# -- iteration, passes, batches ----------------------------------------------------
def test_iteration_across_passes(client: taskq.Client, url: str, job_name: str) -> None:
    make_job(client, job_name, 7, passes=3)
    seen: list[tuple[int, int]] = []
    with taskq.Trainer(job_name, url=url, prefetch=2) as trainer:
        for task in trainer:
            assert task.chunks == [{"i": task.id}]
            seen.append((task.pass_no, task.id))
    for p in range(3):
        assert sorted(i for q, i in seen if q == p) == list(range(7))
    audit = client.audit(job_name)
    assert audit["ok"] and audit["state"] == "completed"
    assert [p["done"] for p in passes_of(client, job_name)] == [7, 7, 7]
    assert audit["counters"]["acked"] == 21 and audit["counters"]["stale"] == 0


def test_passes_is_a_barrier(client: taskq.Client, url: str, job_name: str) -> None:
    """The fast trainer's pass-0 iterator ends only after the slow one acked the last task
    of pass 0, and never yields pass-1 work."""
    make_job(client, job_name, 6, passes=2)
    slow_acked_at: list[float] = []
    fast_ended: list[tuple[int, float, list[int]]] = []
    slow_started = threading.Event()

    def slow() -> None:
        with taskq.Trainer(job_name, url=url) as trainer:
            task = trainer.lease(timeout=5)
            assert task is not None and task.pass_no == 0
            slow_started.set()
            time.sleep(1.0)  # the slow step itself: the fast trainer must wait it out
            # taken before the ack: the fast trainer may see the pass end before this
            # thread runs again after the ack's reply
            slow_acked_at.append(time.monotonic())
            trainer.ack(task)
            # and leaves: were it to run pass 1 too, it could finish that pass (and the job)
            # before the fast trainer wakes, whose passes() would then rightly end after
            # pass 0

    th = threading.Thread(target=slow)
    th.start()
    assert slow_started.wait(10)
    with taskq.Trainer(job_name, url=url) as trainer:
        for pass_iter in trainer.passes():
            pass_nos = []
            for task in pass_iter:
                pass_nos.append(task.pass_no)
            fast_ended.append((len(fast_ended), time.monotonic(), pass_nos))
    th.join(20)
    first_pass_end = fast_ended[0][1]
    assert slow_acked_at and first_pass_end >= slow_acked_at[0]
    assert set(fast_ended[0][2]) == {0}, "the pass-0 iterator yields pass-0 work only"
    assert fast_ended[1][2] == [1] * 6, "the pass-1 iterator yields all of pass 1"
    assert [p["done"] for p in passes_of(client, job_name)] == [6, 6]


def test_passes_waits_at_a_manual_boundary(client: taskq.Client, url: str, job_name: str) -> None:
    make_job(client, job_name, 3, passes=2, auto_advance=False)
    ends: list[float] = []
    with taskq.Trainer(job_name, url=url) as trainer:
        it = trainer.passes()
        assert sorted(t.id for t in next(it)) == [0, 1, 2]
        ends.append(time.monotonic())
        threading.Timer(0.5, client.next_pass, args=(job_name,)).start()
        assert sorted(t.id for t in next(it)) == [0, 1, 2]
        assert time.monotonic() - ends[0] >= 0.4  # blocked until `pass next`
        assert list(it) == []
    assert client.status(job_name).state == "completed"


def test_batches(client: taskq.Client, url: str, job_name: str) -> None:
    make_job(client, job_name, 10)
    sizes = []
    with taskq.Trainer(job_name, url=url) as trainer:
        for batch in trainer.batches(4):
            assert all(t.started for t in batch)
            sizes.append(len(batch))
    assert sizes == [4, 4, 2]
    st = client.status(job_name)
    assert st.state == "completed" and st.counters["acked"] == 10


@pytest.mark.parametrize("call", ["batches", "lease_many"])
def test_more_tasks_than_one_call_leases_is_one_clear_line_before_any_lease(
    client: taskq.Client, url: str, job_name: str, call: str
) -> None:
    """``batches(k)`` and ``lease_many(n)`` above ``MAX_BATCH`` (32) raise InvalidInput
    naming the bound at the call, before any lease; 32 is served."""
    make_job(client, job_name, 40)
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        with pytest.raises(taskq.InvalidInput) as refused:
            if call == "batches":
                trainer.batches(33)
            else:
                trainer.lease_many(33)
        k = "k" if call == "batches" else "n"
        assert str(refused.value).startswith(f"{call}({k}): {k} must be 1 to 32 ")
        assert str(refused.value).endswith("got 33") and "\n" not in str(refused.value)
        assert client.status(job_name).leased == 0
        got = next(trainer.batches(32)) if call == "batches" else trainer.lease_many(32)
        assert len(got) == 32
        trainer.ack(got)


def test_body_error_fails_current_and_releases_reserved(
    client: taskq.Client, url: str, job_name: str
) -> None:
    make_job(client, job_name, 6)
    with pytest.raises(RuntimeError), taskq.Trainer(job_name, url=url, prefetch=2) as trainer:
        for task in trainer:
            failing = task.id
            assert len(trainer.held) == 3  # current + 2 reserved
            raise RuntimeError("bad chunk")
    st = client.status(job_name)
    assert st.leased == 0 and st.counters["failed"] == 1 and st.counters["released"] == 2
    failed = [f for _, f in client.events(job_name, count=1000) if f["type"] == "failed"]
    assert failed[0]["task"] == str(failing) and "RuntimeError: bad chunk" in failed[0]["error"]
    assert st.workers == 0


def test_break_releases_and_ack_before_break_counts(
    client: taskq.Client, url: str, job_name: str
) -> None:
    make_job(client, job_name, 4)
    with taskq.Trainer(job_name, url=url) as trainer:
        for task in trainer:
            trainer.ack(task)  # the documented way to keep the last task's result
            break
    st = client.status(job_name)
    assert st.done == 1 and st.leased == 0 and st.counters["failed"] == 0
    with taskq.Trainer(job_name, url=url) as trainer:
        for _task in trainer:
            break  # not acked: released by the with block
    st = client.status(job_name)
    assert st.done == 1 and st.leased == 0 and st.counters["released"] == 1


def test_keyboard_interrupt_releases_without_failure(
    client: taskq.Client, url: str, job_name: str
) -> None:
    make_job(client, job_name, 3)
    with pytest.raises(KeyboardInterrupt), taskq.Trainer(job_name, url=url) as trainer:
        for _task in trainer:
            raise KeyboardInterrupt
    st = client.status(job_name)
    assert st.leased == 0 and st.counters["failed"] == 0 and st.counters["released"] == 1


# -- signals and crashes -----------------------------------------------------------
def test_sigterm_releases_within_a_second(client: taskq.Client, url: str, job_name: str) -> None:
    make_job(client, job_name, 1, worker_ttl=30.0, heartbeat_interval=1.0)
    proc = spawn(url, job_name, "--hold")
    try:
        held = int(read_until(proc, "LEASED"))
        with taskq.Trainer(job_name, url=url, heartbeat=False) as other:
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            task = other.lease(timeout=5)
            latency = time.monotonic() - t0
            assert task is not None and task.id == held
            other.ack(task)
        print(f"\nSIGTERM -> task leased by another trainer in {latency * 1000:.1f} ms")
        assert latency < 2.0
        assert proc.wait(10) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    st = client.status(job_name)
    assert st.counters["released"] == 1 and st.counters["expired_worker_lost"] == 0


@pytest.mark.parametrize("heartbeat", ["thread", "process"])
def test_sigkill_recovered_by_lazy_reclaim(
    client: taskq.Client, url: str, job_name: str, heartbeat: str
) -> None:
    """No reaper runs: the next lease call reclaims what the killed trainer held, one ttl
    later; a helper heartbeat process dies with its trainer."""
    make_job(client, job_name, 1, worker_ttl=1.0, heartbeat_interval=0.2)
    proc = spawn(url, job_name, "--hold", "--heartbeat", heartbeat)
    try:
        helper = int(read_until(proc, "READY").split()[1])
        held = int(read_until(proc, "LEASED"))
        with taskq.Trainer(job_name, url=url) as other:
            t0 = time.monotonic()
            proc.kill()
            proc.wait(10)
            task = other.lease(timeout=10)
            latency = time.monotonic() - t0
            assert task is not None and task.id == held
            other.ack(task)
        print(f"\nSIGKILL ({heartbeat} heartbeats) -> re-leased in {latency:.2f} s (ttl 1 s)")
        assert latency < 3.0
        if helper:
            assert wait_until(
                lambda: (
                    not os.path.exists(f"/proc/{helper}")
                    or Path(f"/proc/{helper}/stat").read_text().split()[2] == "Z"
                ),
                5,
            )
    finally:
        proc.kill()
    assert client.status(job_name).counters["expired_worker_lost"] == 1


# -- revocation, lost replies, stale acks --------------------------------------------
def test_revoked_lease_seen_by_the_loop(client: taskq.Client, url: str, job_name: str) -> None:
    make_job(client, job_name, 3)
    results: list[tuple[int, bool]] = []
    with taskq.Trainer(job_name, url=url) as trainer:
        for task in trainer:
            if task.id == 0 and task.attempt == 1 and not results:
                assert client.revoke(job_name, task.id)
                assert task.revoked.wait(3), "the heartbeat did not report the revocation"
            results.append((task.id, task.revoked.is_set()))
    assert results[0] == (0, True)
    assert Counter(i for i, _ in results) == Counter({0: 2, 1: 1, 2: 1})
    st = client.status(job_name)
    assert st.counters["acked"] == 3 and st.counters["revoked"] == 1 and st.done == 3


def test_explicit_ack_of_a_lost_lease_raises(client: taskq.Client, url: str, job_name: str) -> None:
    make_job(client, job_name, 2)
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        task = trainer.lease()
        assert task is not None
        client.revoke(job_name, task.id)
        with pytest.raises(taskq.LeaseLost) as e:
            trainer.ack(task)
        assert e.value.task_ids == [task.id] and task.revoked.is_set()
    assert client.status(job_name).counters["stale"] == 1


def test_lost_lease_reply_healed_by_heartbeat(
    client: taskq.Client, url: str, job_name: str
) -> None:
    make_job(client, job_name, 3)
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        lost_call = trainer_worker(trainer).leases.call_no + 1
        trainer_worker(trainer).leases.call_no = lost_call
        keys = client.keys(job_name).script
        reply = client.connection.scripts.call(
            "lease",
            keys,
            [
                trainer.job_incarnation,
                trainer.worker_id,
                trainer.incarnation,
                1,
                lost_call,
                "S",
                -1,
                lease_secret(trainer),
            ],
        )  # granted on the server; the reply is "lost" (dropped here)
        lost_task = int(reply[1][0][0])
        mine = trainer.lease()  # a later reply: last_reply >= lost_call
        assert mine is not None and mine.id != lost_task
        assert client.status(job_name).leased == 2
        trainer.heartbeat()  # lists only `mine`
        st = client.status(job_name)
        assert st.leased == 1 and st.counters["revoked"] == 1
        with taskq.Trainer(job_name, url=url, heartbeat=False) as other:
            again = other.lease()
            assert again is not None and again.id == lost_task
            other.ack(again)
        trainer.ack(mine)


def test_heartbeat_leaves_in_flight_grants_alone(
    client: taskq.Client, url: str, job_name: str
) -> None:
    make_job(client, job_name, 2)
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        call = trainer_worker(trainer).leases.call_no + 5  # a reply that may still be on the wire
        client.connection.scripts.call(
            "lease",
            client.keys(job_name).script,
            [
                trainer.job_incarnation,
                trainer.worker_id,
                trainer.incarnation,
                1,
                call,
                "S",
                -1,
                lease_secret(trainer),
            ],
        )
        trainer.heartbeat()
        assert client.status(job_name).leased == 1


# -- prefetch and stealing -----------------------------------------------------------
def test_prefetch_stealing_with_skewed_speeds(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    n, passes = 24, 2
    make_job(client, job_name, n, passes=passes)
    logs = [tmp_path / f"t{i}.log" for i in range(3)]
    speeds = ["0.6", "0.02", "0.02"]
    t0 = time.monotonic()
    # the slow trainer first, holding its prefetch when the fast ones start (started
    # together, the fast ones could end a pass before a loaded machine's slow one leased)
    procs = [spawn(url, job_name, "--sleep", speeds[0], "--prefetch", "3", "--log", str(logs[0]))]
    try:
        assert wait_until(lambda: client.status(job_name).leased >= 3, 60)
        procs += [
            spawn(url, job_name, "--sleep", s, "--prefetch", "3", "--log", str(lg))
            for s, lg in zip(speeds[1:], logs[1:], strict=True)
        ]
        for p in procs:
            assert p.wait(60) == 0
    finally:
        for p in procs:
            p.kill()
    elapsed = time.monotonic() - t0
    rows = [line.split() for lg in logs for line in lg.read_text().splitlines()]
    per_pass = Counter((int(p), int(i)) for p, i, _ in rows)
    assert set(per_pass) == {(p, i) for p in range(passes) for i in range(n)}
    assert set(per_pass.values()) == {1}, "a task was acked twice in one pass"
    slow_done = len(logs[0].read_text().splitlines())
    audit = client.audit(job_name)
    print(
        f"\nskewed: {elapsed:.1f}s, slow trainer acked {slow_done}/{n * passes}, "
        f"stolen {audit['counters']['stolen']}"
    )
    assert audit["ok"] and [p["done"] for p in passes_of(client, job_name)] == [n] * passes
    assert audit["counters"]["stolen"] > 0 and audit["counters"]["stale"] == 0
    assert audit["counters"]["acked"] == n * passes
    # the slow trainer alone would take 0.6 s x 48 = 29 s; its reserved work was taken
    assert slow_done < 12 and elapsed < 25


def test_never_steals_started_tasks(client: taskq.Client, url: str, job_name: str) -> None:
    make_job(client, job_name, 3)
    with (
        taskq.Trainer(job_name, url=url, prefetch=2, heartbeat=False) as victim,
        taskq.Trainer(job_name, url=url, heartbeat=False) as thief,
    ):
        it = iter(victim)
        first = next(it)
        assert first.started and len(victim.held) == 3
        stolen = [thief.lease(timeout=0), thief.lease(timeout=0)]
        assert {t.id for t in stolen if t} == {1, 2}
        assert thief.lease(timeout=0) is None  # the started one stays
        for t in stolen:
            assert t is not None
            thief.ack(t)
        rest = list(it)  # acks `first`, skips the stolen reserved ones
        assert rest == [] and victim.stolen_from_me == 1
    st = client.status(job_name)
    assert st.state == "completed" and st.counters["acked"] == 3
    assert st.counters["stolen"] == 2 and st.counters["stale"] == 0


# -- Redis down and restarted ---------------------------------------------------------
def test_survives_redis_restart_mid_pass(own_redis: RedisServer, job_name: str) -> None:
    client = taskq.connect(own_redis.url)
    n = 30
    make_job(client, job_name, n, worker_ttl=3.0)
    acked: list[int] = []
    errors: list[BaseException] = []
    restarted = threading.Event()

    def run() -> None:
        try:
            with taskq.Trainer(job_name, url=own_redis.url, reconnect_timeout=30) as t:
                for task in t:
                    time.sleep(0.03)  # a step
                    acked.append(task.id)
                    if len(acked) == 10:  # the pass is still running when Redis restarts
                        restarted.wait(30)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    assert wait_until(lambda: len(acked) >= 10, 20)
    own_redis.restart()
    restarted.set()
    th.join(60)
    assert not th.is_alive() and not errors, errors
    audit = client.audit(job_name)
    print(f"\nrestart: {len(acked)} task bodies run for {n} tasks; audit ok={audit['ok']}")
    assert audit["state"] == "completed" and audit["ok"]
    assert passes_of(client, job_name)[0]["done"] == n
    assert set(acked) == set(range(n))


def test_out_of_contact_sets_at_risk_and_server_decides(
    own_redis: RedisServer, job_name: str
) -> None:
    client = taskq.connect(own_redis.url)
    make_job(client, job_name, 2, worker_ttl=1.0, heartbeat_interval=0.2)
    with taskq.Trainer(job_name, url=own_redis.url) as trainer:
        task = trainer.lease()
        assert task is not None
        own_redis.stop()  # a SIGTERM: Redis fsyncs its AOF (the lease) on the way down
        assert task.at_risk.wait(5), "at_risk not set while out of contact"
        own_redis.start()
        assert wait_until(lambda: not task.at_risk.is_set(), 5)
        assert not task.revoked.is_set()  # the silence was the server's: still ours
        trainer.ack(task)
    assert client.status(job_name).counters["stale"] == 0


# -- GIL-holding steps ----------------------------------------------------------------
def _hold_gil(seconds: float) -> None:
    """A C call made without releasing the GIL (as some extensions do)."""
    ctypes.PyDLL(None).usleep(int(seconds * 1_000_000))


@pytest.mark.parametrize("heartbeat", ["thread", "process"])
def test_gil_holding_step(client: taskq.Client, url: str, job_name: str, heartbeat: str) -> None:
    """A 2.5 s GIL-holding step stops thread heartbeats (ttl 1 s: the lease is lost while
    another process keeps the job's clock going); helper-process heartbeats keep it."""
    make_job(client, job_name, 2, worker_ttl=1.0, heartbeat_interval=0.2)
    neighbour = spawn(url, job_name, "--hold")  # traffic: the silence is not the server's
    try:
        read_until(neighbour, "LEASED")
        with taskq.Trainer(job_name, url=url, heartbeat=heartbeat) as trainer:
            task = trainer.lease()
            assert task is not None
            assert wait_until(lambda: trainer.heartbeats_sent >= 2, 5), "heartbeats flow"
            before = trainer.heartbeats_sent
            _hold_gil(2.5)
            if heartbeat == "thread":
                with pytest.raises(taskq.LeaseLost):
                    trainer.ack(task)
            else:
                assert wait_until(lambda: trainer.heartbeats_sent >= before + 8, 3)
                trainer.ack(task)
    finally:
        neighbour.kill()


def test_one_heartbeat_per_interval(client: taskq.Client, url: str, job_name: str) -> None:
    make_job(client, job_name, 1, heartbeat_interval=0.2)
    with taskq.Trainer(job_name, url=url) as trainer:
        first = trainer.heartbeats_sent
        t0 = time.monotonic()
        assert wait_until(lambda: trainer.heartbeats_sent >= first + 6, 10), "heartbeats flow"
        took = time.monotonic() - t0
    print(f"\n6 heartbeats at a 0.2 s interval in {took:.2f} s")
    # a fixed schedule: never more than one per interval (load only makes it slower)
    assert took >= 5 * 0.2 - 0.02  # (timer granularity)


def test_unreachable_redis_gives_up_after_reconnect_timeout(
    own_redis: RedisServer, job_name: str
) -> None:
    client = taskq.connect(own_redis.url)
    make_job(client, job_name, 1)
    with taskq.Trainer(
        job_name, url=own_redis.url, heartbeat=False, reconnect_timeout=1.0
    ) as trainer:
        own_redis.stop()
        t0 = time.monotonic()
        with pytest.raises(taskq.ConnectionLost):
            trainer.lease(timeout=0)
        elapsed = time.monotonic() - t0
        print(f"\nRedis down: lease gave up after {elapsed:.1f} s (reconnect_timeout 1 s)")
        assert elapsed < 6


# -- heartbeat answers out of order -----------------------------------------------------
def beat_args(t: taskq.Trainer) -> list[Any]:
    """The ARGV of a heartbeat of ``t`` listing nothing."""
    return heartbeat_args(t.job_incarnation, t.worker_id, t.incarnation, lease_secret(t), 0, [])


class _Interleaved(taskq.Trainer):
    """Runs ``before_wait`` between a lease reply and the wait it leads to: the moment a
    heartbeat answer (from the thread or the helper process) can land in."""

    before_wait: Any = None

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        real_wait = trainer_worker(self).plain.wait

        def wait(*args: Any) -> None:
            hook, self.before_wait = self.before_wait, None
            if hook is not None:
                hook(self)
            real_wait(*args)

        trainer_worker(self).plain.wait = wait  # type: ignore[method-assign]


@pytest.mark.parametrize("order", ["stale_answer", "newer_answer"])
def test_heartbeat_answers_do_not_misdirect_the_wait(
    client: taskq.Client, url: str, job_name: str, order: str
) -> None:
    """A heartbeat answer computed before the lease reply (stale) or after a broadcast the
    reply did not see yet (newer) lands before the wait: the trainer still wakes at once on
    `pass next`, and pass, generation and state never go backwards."""
    make_job(client, job_name, 1, passes=2, auto_advance=False)
    with _Interleaved(job_name, url=url, heartbeat=False) as trainer:
        task = trainer.lease(timeout=2)
        assert task is not None
        trainer.ack(task)  # pass 0 done: the job waits for `pass next`

        def stale(t: taskq.Trainer) -> None:
            info = JobInfo(t.pass_no, trainer_worker(t).view.gen - 1, "running", "")
            t.apply_heartbeat(HeartbeatReply(Code.OK, [], info), beat_args(t))
            threading.Timer(0.3, client.next_pass, args=(job_name,)).start()

        def newer(t: taskq.Trainer) -> None:
            client.next_pass(job_name)  # broadcast to the waiters of the reply's generation
            t.heartbeat()  # whose answer (the next generation) lands first

        trainer.before_wait = stale if order == "stale_answer" else newer
        t0 = time.monotonic()
        task = trainer.lease(timeout=4)
        elapsed = time.monotonic() - t0
        print(f"\n{order}: woke after {elapsed:.2f} s")
        assert task is not None and task.pass_no == 1
        assert elapsed < 1.5, "blocked on the wrong broadcast list"
        now = (trainer.pass_no, trainer_worker(trainer).view.gen, trainer.state)
        assert now[:2] == (1, int(client.redis.hget(trainer.keys.meta, "gen")))
        old = JobInfo(0, now[1] - 1, "waiting", "manual_advance")
        trainer.apply_heartbeat(HeartbeatReply(Code.OK, [], old), beat_args(trainer))
        assert (trainer.pass_no, trainer_worker(trainer).view.gen, trainer.state) == now
        trainer.ack(task)


def test_a_beat_made_while_the_rejoin_registers_does_not_declare_it_lost_again(
    client: taskq.Client, url: str, job_name: str
) -> None:
    """A trainer declared lost rejoins. A heartbeat its thread builds while the register
    is on the wire, answered by the server before it, names the old incarnation: the
    REREGISTER it gets is that rejoin's, and applying it later (the thread waited on the
    rejoin) neither registers again nor drops what was leased under the new incarnation
    (the chaos scenario of a SIGSTOPped trainer: its first task after SIGCONT came back
    stale)."""
    make_job(client, job_name, 2, manual_clock=True)
    job = client.job(job_name)
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        first = trainer.incarnation
        ManualClock(job).advance(5)  # past the 2 s ttl
        job.reap()
        assert not client.workers(job_name)  # declared lost
        worker = trainer_worker(trainer)
        real_run = worker.session.run
        early: list[tuple[list[Any], list[Any]]] = []

        def run(verb: str, args: list[Any]) -> Any:
            if verb == "register" and not early:  # the thread's beat, served first
                beat = worker.heartbeat.args()
                early.append(
                    (
                        beat,
                        call_heartbeat(
                            client.connection.scripts, url, worker.session.keys.script, beat
                        ),
                    )
                )
            return real_run(verb, args)

        worker.session.run = run  # type: ignore[method-assign]
        trainer.heartbeat()  # REREGISTER: the rejoin
        second = trainer.incarnation
        assert second != first and len(early) == 1
        task = trainer.lease(timeout=0)
        assert task is not None
        beat, raw = early[0]
        trainer.apply_heartbeat(HeartbeatReply.decode(raw), beat)  # its answer lands now
        assert trainer.incarnation == second
        assert not task.revoked.is_set()
        trainer.ack(task)  # not stale: the lease is the new incarnation's
    st = client.status(job_name)
    assert st.counters["stale"] == 0 and st.counters["acked"] == 1


# -- leaks -------------------------------------------------------------------------------
@pytest.mark.parametrize("heartbeat", ["thread", "process"])
def test_close_stops_heartbeats(
    client: taskq.Client, url: str, job_name: str, heartbeat: str
) -> None:
    make_job(client, job_name, 1, heartbeat_interval=0.1)
    trainer = taskq.Trainer(job_name, url=url, heartbeat=heartbeat)
    thread, helper = (
        trainer_worker(trainer).heartbeat.thread,
        trainer_worker(trainer).heartbeat.helper,
    )
    trainer.close()
    if thread is not None:
        assert not thread.is_alive()
    if helper is not None:
        assert helper.proc.poll() is not None
    sent = trainer.heartbeats_sent
    time.sleep(0.4)  # four intervals of real time in which no heartbeat may go out
    assert trainer.heartbeats_sent == sent


@pytest.mark.parametrize("heartbeat", ["thread", "process"])
def test_dropped_trainer_leaves_nothing_running(
    client: taskq.Client, url: str, job_name: str, heartbeat: str
) -> None:
    """A Trainer garbage-collected without close(): its heartbeat thread ends, its helper
    process exits, and what it held goes back after its ttl."""
    make_job(client, job_name, 1, worker_ttl=1.0)
    trainer = taskq.Trainer(job_name, url=url, heartbeat=heartbeat)
    assert trainer.lease(timeout=2) is not None
    thread = trainer_worker(trainer).heartbeat.thread
    proc = (
        trainer_worker(trainer).heartbeat.helper.proc
        if trainer_worker(trainer).heartbeat.helper is not None
        else None
    )
    ref = weakref.ref(trainer)
    del trainer
    gc.collect()
    assert ref() is None, "something still holds the dropped trainer"
    if proc is not None:
        assert proc.wait(5) is not None
    if thread is not None:
        thread.join(5)
        assert not thread.is_alive()
    with taskq.Trainer(job_name, url=url) as other:
        task = other.lease(timeout=5)
        assert task is not None
        other.ack(task)


def test_lease_with_acks_acks_and_leases_in_one_call(
    client: taskq.Client, url: str, job_name: str
) -> None:
    make_job(client, job_name, 5)
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        first = trainer.lease_many(2, timeout=0)
        assert [t.id for t in first] == [0, 1]
        calls = trainer_worker(trainer).leases.call_no
        nxt = trainer.lease(timeout=0, acks=first)
        assert (
            nxt is not None and nxt.id == 2 and trainer_worker(trainer).leases.call_no == calls + 1
        )
        assert client.status(job_name).counters["acked"] == 2
        client.revoke(job_name, nxt.id)
        rest = trainer.lease_many(5, timeout=0, acks=[nxt])
        assert nxt.revoked.is_set() and sorted(t.id for t in rest) == [2, 3, 4]
        with pytest.raises(taskq.JobCompleted):  # the last acks completed the job
            trainer.lease(timeout=0, acks=rest)
    st = client.status(job_name)
    assert st.counters["acked"] == 5 and st.counters["stale"] == 1 and st.done == 5


@pytest.mark.parametrize("given", ["client", "url"])
def test_heartbeat_thread_sends_buffered_progress(url, client, job_name, given):
    """The heartbeat thread sends what ``progress`` buffered, whether the trainer was
    built on a given ``Client`` (its beats share that client's connection) or a URL."""
    make_job(client, job_name, 2, task_timeout=None)
    kw: dict[str, Any] = {"client": taskq.connect(url)} if given == "client" else {"url": url}
    with taskq.Trainer(job_name, handle_signals=False, **kw) as t:
        task = t.lease(timeout=1)
        assert task is not None
        t.progress(task, 5)
        key = client.keys(job_name).progress
        wait_until(lambda: client.redis.hget(key, str(task.id)) == "5", timeout=5)
        t.progress(task, 9)
        wait_until(lambda: client.redis.hget(key, str(task.id)) == "9", timeout=5)
