"""Closed connections against real redis-servers: a SIGKILLed trainer is declared lost
by its closed heartbeat connection long before its ttl, and never a live one: not after a
Redis restart, not after a network blip (a proxy closing every connection), not where
CLIENT LIST is refused or the client is a cluster client (there the ttl decides, as
before). Also the reaper's ACL: CLIENT LIST and no other admin command.

Real time throughout (the connection watch runs on the reaper's monotonic clock), with a
10 s ttl so "before the ttl" is unambiguous; no test asserts a latency goal (bench/ does).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from support import RedisClusterProcs, RedisServer, wait_until
from tcp_proxy import TcpProxy

import taskq
from taskq.ops.reaper import Reaper
from taskq.testing import ManualClock
from taskq.trainer import protocol

HERE = Path(__file__).resolve().parents[1]
ROOT = HERE.parent
TTL, HBI = 10.0, 0.5
#: Quiet for longer than the watch asks before it declares: a quarter of the ttl (and
#: 1.25 heartbeat intervals), with room.
QUIET = TTL / 4 + HBI


def make_job(client: taskq.Client, name: str, n: int = 2, **kw: Any) -> taskq.JobStatus:
    kw.setdefault("worker_ttl", TTL)
    kw.setdefault("heartbeat_interval", HBI)
    kw.setdefault("task_timeout", None)
    return client.create_job(name, chunks=[{"i": i} for i in range(n)], **kw)


def events(client: taskq.Client, job: str, kind: str) -> list[dict[str, str]]:
    return [f for _, f in client.events(job, count=100_000) if f["type"] == kind]


def conn_id(client: taskq.Client, job: str, worker: str) -> str:
    rec = client.redis.hget(client.keys(job).winfo, worker) or ""
    f = rec.split("|")
    return f[7] if len(f) > 7 else ""


class ReaperThread:
    """A Reaper running in a thread of the test until ``stop()``."""

    def __init__(self, client: taskq.Client, job: str, **kw: Any) -> None:
        kw.setdefault("interval", 0.1)
        self.reaper = Reaper(client, jobs=[job], **kw)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self.reaper.run, args=(self._stop,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)


def watching(reaper: ReaperThread, client: taskq.Client, job: str, worker: str) -> bool:
    """Until the watch has seen the worker's current connection under its name."""
    watch = reaper.reaper.watch
    assert watch is not None
    return wait_until(
        lambda: any(
            w == worker and c == conn_id(client, job, worker) for w, _, c in watch.watched(job)
        ),
        5,
    )


def spawn_holder(url: str, job: str, wid: str, *extra: str) -> subprocess.Popen[str]:
    """A trainer process that leases one task and holds it (heartbeating) until killed
    (``--hold``), or with ``--ack-on-stdin`` until told to ack it (``ack_held``)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    mode = list(extra) if "--ack-on-stdin" in extra else ["--hold", *extra]
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "trainer_proc.py"), url, job, "--worker-id", wid, *mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("LEASED"):
            return proc
    raise AssertionError("the trainer process never leased")


def ack_held(proc: subprocess.Popen[str]) -> str:
    """Tell a ``--ack-on-stdin`` trainer process to ack its task; its answer line."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("ack\n")
    proc.stdin.flush()
    answer = proc.stdout.readline().strip()
    proc.wait(10)
    return answer


@pytest.fixture
def holder_cleanup() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)  # a test that failed while it was stopped
            p.kill()
            p.wait(10)


def test_a_sigkilled_trainer_is_lost_by_its_closed_connection_before_its_ttl(
    client, url, job_name, holder_cleanup
):
    make_job(client, job_name, n=1)
    holder = spawn_holder(url, job_name, "victim")
    holder_cleanup.append(holder)
    assert wait_until(lambda: conn_id(client, job_name, "victim") != "", 5), (
        "the heartbeat records its connection id"
    )
    reaper = ReaperThread(client, job_name)
    try:
        # the first heartbeat records the heartbeat's own connection (the registering one
        # becomes the witness)
        assert wait_until(lambda: witness_id(client, job_name, "victim") != "", 5)
        assert watching(reaper, client, job_name, "victim")
        killed = time.monotonic()
        holder.kill()
        holder.wait(10)
        assert wait_until(lambda: client.status(job_name, summaries=0).todo == 1, TTL / 2), [
            f for _, f in client.events(job_name, count=100)
        ]
        took = time.monotonic() - killed
    finally:
        reaper.stop()
    closed = events(client, job_name, "connection_closed")
    assert [e["worker"] for e in closed] == ["victim"]
    expired = events(client, job_name, "expired")
    assert [(e["worker"], e["reason"]) for e in expired] == [("victim", "worker_lost")]
    assert reaper.reaper.watch is not None and reaper.reaper.watch.declared == 1
    assert took < TTL / 2


def test_a_live_trainer_is_never_declared_lost_by_the_watch(client, url, job_name):
    make_job(client, job_name, n=2)
    with taskq.Trainer(job_name, url=url, worker_id="alive") as t:
        task = t.lease(timeout=1)
        assert task is not None
        assert wait_until(lambda: conn_id(client, job_name, "alive") != "", 5)
        reaper = ReaperThread(client, job_name)
        try:
            assert wait_until(lambda: witness_id(client, job_name, "alive") != "", 5)
            assert watching(reaper, client, job_name, "alive"), "the watch judges it"
            time.sleep(4 * HBI)  # a window of real time: the watch must declare nobody
        finally:
            reaper.stop()
        assert reaper.reaper.watch is not None and reaper.reaper.watch.off == ""
        assert not task.revoked.is_set()
    assert events(client, job_name, "connection_closed") == []


def test_the_recorded_connection_is_the_one_the_heartbeats_go_out_on(client, url, job_name):
    make_job(client, job_name, n=2)
    with taskq.Trainer(job_name, url=url, worker_id="beating") as t:
        assert t.lease(timeout=1) is not None
        # the record is written by a heartbeat (register names a pooled connection first)
        cid = {"": ""}

        def heartbeat_named() -> bool:
            cid[""] = conn_id(client, job_name, "beating")
            clients = {c["id"]: c for c in client.redis.client_list()}
            return cid[""] in clients and clients[cid[""]]["cmd"] == "fcall"

        # the connection the record names carries the heartbeats (its last command is an
        # FCALL), not an idle pooled one that happened to be named
        assert wait_until(heartbeat_named, 10), cid


def test_a_redis_restart_declares_nobody_lost(own_redis, job_name):
    client = taskq.connect(own_redis.url)
    make_job(client, job_name, n=2)
    with taskq.Trainer(job_name, url=own_redis.url, worker_id="alive") as t:
        task = t.lease(timeout=1)
        assert task is not None
        first = conn_id(client, job_name, "alive")
        assert wait_until(lambda: conn_id(client, job_name, "alive") != "", 5)
        reaper = ReaperThread(client, job_name)
        try:
            assert wait_until(lambda: witness_id(client, job_name, "alive") != "", 5)
            assert watching(reaper, client, job_name, "alive"), "the watch judges it"
            own_redis.restart()  # every connection drops at once, the reaper's too
            # the trainer reconnects and records its new connection; ids restart from 1
            assert wait_until(lambda: conn_id(client, job_name, "alive") not in ("", first), 5)
            time.sleep(4 * HBI)  # a window of real time: the watch must declare nobody
        finally:
            reaper.stop()
        assert not task.revoked.is_set()
        t.ack(task)  # still its lease
    assert events(client, job_name, "connection_closed") == []
    assert client.status(job_name, summaries=0).counters["expired_worker_lost"] == 0


def test_a_network_blip_declares_nobody_lost(redis_server, client, job_name, monkeypatch):
    # a reconnect redis-py's retry hides is noticed by the next heartbeat (own_resets),
    # not only at the 10 s recheck of the id
    monkeypatch.setattr(protocol, "CONN_RECHECK_S", 3600.0)
    make_job(client, job_name, n=2)
    proxy = TcpProxy(redis_server.port)
    try:
        with taskq.Trainer(job_name, url=proxy.url, worker_id="blip") as t:
            task = t.lease(timeout=1)
            assert task is not None
            assert wait_until(lambda: conn_id(client, job_name, "blip") != "", 5)
            before = conn_id(client, job_name, "blip")
            reaper = ReaperThread(client, job_name)  # straight to Redis
            try:
                assert wait_until(lambda: witness_id(client, job_name, "blip") != "", 5)
                assert watching(reaper, client, job_name, "blip"), "the watch judges it"
                before = conn_id(client, job_name, "blip")
                for _ in range(3):  # the proxy closes every connection, three times
                    proxy.cut()
                    time.sleep(0.05)  # the blip itself: 50 ms without a connection
                    proxy.restore(deliver=False)
                    assert wait_until(lambda b=before: conn_id(client, job_name, "blip") != b, 5), (
                        "the next heartbeat records the new connection"
                    )
                    before = conn_id(client, job_name, "blip")
                time.sleep(4 * HBI)  # a window of real time: the watch must declare nobody
            finally:
                reaper.stop()
            assert not task.revoked.is_set()
            t.ack(task)
    finally:
        proxy.stop()
    assert events(client, job_name, "connection_closed") == []


def conn_named(client: taskq.Client, cid: str, name: str) -> bool:
    """Whether connection ``cid`` is open and named ``name``."""
    return [c.get("name") for c in client.redis.client_list(client_id=[cid])] == [name]


def witness_id(client: taskq.Client, job: str, worker: str) -> str:
    """The record's 9th field: the connection the worker registered on, once its
    heartbeats go out on another."""
    f = str(client.redis.hget(client.keys(job).winfo, worker) or "").split("|")
    return f[8] if len(f) > 8 else ""


def incarnation_of(client: taskq.Client, job: str, worker: str) -> str:
    return str(client.redis.hget(client.keys(job).winfo, worker) or "").split("|")[0]


def resumes_on_a_new_connection(
    client: taskq.Client, job: str, worker: str, old: str, inc: str, proc: subprocess.Popen[str]
) -> None:
    """After its stall, the trainer's next heartbeat records a new connection (not ``old``),
    named as its trainer's, and its lease is still its own: its ack is accepted."""
    assert wait_until(lambda: conn_id(client, job, worker) not in ("", old), 5), (
        "the next heartbeat records its new connection"
    )
    assert conn_named(client, conn_id(client, job, worker), f"taskq-trainer-{inc}")
    assert ack_held(proc).startswith("ACKED"), "its lease is still its own"


def assert_nobody_declared_lost(client: taskq.Client, job: str, reaper: ReaperThread) -> None:
    """No connection_closed event, no lease expired as worker_lost, no loss declared."""
    assert events(client, job, "connection_closed") == []
    assert client.status(job, summaries=0).counters["expired_worker_lost"] == 0
    assert reaper.reaper.watch is not None and reaper.reaper.watch.declared == 0


def test_a_stall_under_redis_timeout_is_not_declared_lost_inside_the_ttl(
    own_redis, job_name, holder_cleanup
):
    """A trainer with its own 20 s ttl (long steps) on a job of default settings, stopped
    for 8 s while Redis's `timeout 3` closes its idle connections: the closes are no
    evidence (the watch last saw the connection idle, not beating); nobody is declared
    lost, the next heartbeat records the new connection, and the ack is accepted."""
    client = taskq.connect(own_redis.url)
    make_job(client, job_name, n=1, worker_ttl=5.0, heartbeat_interval=1.0)
    proc = spawn_holder(own_redis.url, job_name, "slow", "--ack-on-stdin", "--worker-ttl", "20")
    holder_cleanup.append(proc)
    reaper = ReaperThread(client, job_name, interval=0.5)  # the default interval
    try:
        assert watching(reaper, client, job_name, "slow")
        stopped = conn_id(client, job_name, "slow")
        inc = incarnation_of(client, job_name, "slow")
        client.redis.config_set("timeout", 3)
        proc.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        assert wait_until(lambda: not client.redis.client_list(client_id=[stopped]), 7.5), (
            "Redis's timeout closes the stopped trainer's heartbeat connection"
        )
        # stopped 8 s in all: past Redis's timeout 3, inside the 20 s ttl
        time.sleep(max(0.0, 8.0 - (time.monotonic() - t0)))
        proc.send_signal(signal.SIGCONT)
        resumes_on_a_new_connection(client, job_name, "slow", stopped, inc, proc)
    finally:
        reaper.stop()
    assert_nobody_declared_lost(client, job_name, reaper)


def test_a_killed_heartbeat_connection_and_a_stall_are_not_declared_lost(
    client, url, job_name, holder_cleanup
):
    """Default ttl and heartbeat; the trainer stopped, its heartbeat connection killed
    (CLIENT KILL), 2 s later it resumes: the connection it registered on is still open
    (another of its process), so the close is no evidence; the next heartbeat records
    the new connection and the ack is accepted. (The SIGKILL test above is the contrast:
    there every connection of the process closes at once.)"""
    make_job(client, job_name, n=1, worker_ttl=5.0, heartbeat_interval=1.0)
    proc = spawn_holder(url, job_name, "cut", "--ack-on-stdin")
    holder_cleanup.append(proc)
    reaper = ReaperThread(client, job_name, interval=0.5)
    try:
        # the first heartbeat records its own connection; the registering one is kept
        assert wait_until(lambda: witness_id(client, job_name, "cut") != "", 5)
        assert watching(reaper, client, job_name, "cut")
        killed = conn_id(client, job_name, "cut")
        inc = incarnation_of(client, job_name, "cut")
        proc.send_signal(signal.SIGSTOP)  # no heartbeat can slip in between
        assert client.redis.client_kill_filter(_id=killed) == 1
        time.sleep(2.0)  # the stall: 2 s stopped, inside the 5 s ttl
        proc.send_signal(signal.SIGCONT)
        resumes_on_a_new_connection(client, job_name, "cut", killed, inc, proc)
    finally:
        reaper.stop()
    assert_nobody_declared_lost(client, job_name, reaper)


@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server with deploy/redis/acl.conf (test passwords) and a reaper user
    that lacks CLIENT LIST (as on a managed service that refuses it)."""
    acl = (ROOT / "deploy" / "redis" / "acl.conf").read_text()
    acl = acl.replace(">CHANGE_ME_", ">pw_")
    # RedisServer.start() checks readiness with INFO as the default user
    acl = acl.replace(
        "user default on nopass resetkeys resetchannels -@all +ping",
        "user default on nopass resetkeys resetchannels -@all +ping +info",
    )
    nolist = next(line for line in acl.splitlines() if line.startswith("user reaper "))
    nolist = nolist.replace("user reaper ", "user reaper2 ").replace(" +client|list", "")
    aclfile = tmp_path / "acl.conf"
    aclfile.write_text(acl + "\n" + nolist + "\n")
    server = RedisServer(extra=["--aclfile", str(aclfile)])
    yield server
    server.cleanup()


def user_url(server: RedisServer, user: str) -> str:
    return f"redis://{user}:pw_{'reaper' if user == 'reaper2' else user}@127.0.0.1:{server.port}/0"


def test_the_reaper_role_may_list_clients_and_nothing_more(acl_server):
    r = redis.Redis.from_url(user_url(acl_server, "reaper"), decode_responses=True)
    own = r.client_id()
    assert [c["id"] for c in r.client_list(client_id=[own])] == [str(own)]
    for command in (
        ("CLIENT", "KILL", "ID", "999999"),
        ("CLIENT", "PAUSE", "1"),
        ("CLIENT", "NO-EVICT", "on"),
        ("INFO",),
        ("CONFIG", "GET", "port"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.execute_command(*command)
    trainer = redis.Redis.from_url(user_url(acl_server, "trainer"), decode_responses=True)
    assert trainer.client_setname("taskq-trainer-x") and trainer.client_id() > 0
    with pytest.raises(redis.exceptions.NoPermissionError):
        trainer.client_list()


def test_refused_client_list_falls_back_to_the_ttl_and_says_so_once(
    acl_server, job_name, caplog, holder_cleanup
):
    admin = taskq.connect(user_url(acl_server, "admin"))
    make_job(admin, job_name, n=1, worker_ttl=2.0)
    holder = spawn_holder(user_url(acl_server, "trainer"), job_name, "victim")
    holder_cleanup.append(holder)
    assert wait_until(lambda: conn_id(admin, job_name, "victim") != "", 5)
    caplog.set_level(logging.WARNING, logger="taskq.reaper")
    reaper = ReaperThread(taskq.connect(user_url(acl_server, "reaper2")), job_name)
    try:
        watch = reaper.reaper.watch
        assert watch is not None
        assert wait_until(lambda: "CLIENT LIST refused" in watch.off, 5), "it looked once"
        holder.kill()
        holder.wait(10)
        assert wait_until(lambda: admin.status(job_name, summaries=0).todo == 1, 10), (
            "the ttl still decides"
        )
    finally:
        reaper.stop()
    assert "CLIENT LIST refused" in watch.off
    assert events(admin, job_name, "connection_closed") == []
    said = [r for r in caplog.records if "closed connections are not watched" in r.message]
    assert len(said) == 1, "logged once, not every tick"


def test_a_cluster_client_turns_the_watch_off(job_name, caplog):
    cluster = RedisClusterProcs(masters=3)
    try:
        client = taskq.connect(cluster.url)
        make_job(client, job_name, n=1)
        caplog.set_level(logging.WARNING, logger="taskq.reaper")
        reaper = Reaper(client, jobs=[job_name])
        reaper.tick()
        reaper.tick()
        assert reaper.watch is not None and "Cluster" in reaper.watch.off
        said = [r for r in caplog.records if "closed connections are not watched" in r.message]
        assert len(said) == 1
    finally:
        cluster.cleanup()


def test_an_id_never_seen_under_the_workers_name_is_not_judged(client, url, job_name):
    """After a restart an old id may name another connection: a recorded id whose
    connection carries another name is never taken for the worker's."""
    make_job(client, job_name, n=1, manual_clock=True)
    t = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False, ranges=True)
    other = redis.Redis.from_url(url, decode_responses=True)
    other.client_setname("someone-else")
    foreign = str(other.client_id())
    keys = client.keys(job_name)  # the worker's record names a connection not its own
    rec = client.redis.hget(keys.winfo, "w").split("|")
    client.redis.hset(keys.winfo, "w", "|".join(rec[:7] + [foreign]))
    reaper = Reaper(client, jobs=[job_name], conn_grace=0.0)
    reaper.tick()
    other.close()  # that connection goes away
    assert wait_until(lambda: not client.redis.client_list(client_id=[foreign]), 5)
    ManualClock(client.job(job_name)).advance(QUIET)  # quiet for longer than the watch asks
    for _ in range(3):
        reaper.tick()
    assert events(client, job_name, "connection_closed") == []
    assert reaper.watch is not None and reaper.watch.declared == 0
    # the same, seen under the worker's name first, is judged: the gate is the name
    mine = redis.Redis.from_url(url, decode_responses=True)
    mine.client_setname(f"taskq-trainer-{t.incarnation}")
    own = str(mine.client_id())
    client.redis.hset(keys.winfo, "w", "|".join(rec[:7] + [own]))
    reaper.tick()
    mine.close()
    assert wait_until(lambda: not client.redis.client_list(client_id=[own]), 5)
    reaper.tick()
    assert [e["worker"] for e in events(client, job_name, "connection_closed")] == ["w"]


def test_a_trainer_killed_right_after_its_connection_changed_is_still_judged(client, url, job_name):
    """The heartbeat's connection replaces the one the worker registered on; a trainer
    killed before the watch looked again is judged by the new id (same process)."""
    make_job(client, job_name, n=1, manual_clock=True)
    t = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False, ranges=True)
    keys = client.keys(job_name)
    rec = client.redis.hget(keys.winfo, "w").split("|")
    first = redis.Redis.from_url(url, decode_responses=True)
    first.client_setname(f"taskq-trainer-{t.incarnation}")
    second = redis.Redis.from_url(url, decode_responses=True)
    second.client_setname(f"taskq-trainer-{t.incarnation}")
    client.redis.hset(keys.winfo, "w", "|".join(rec[:7] + [str(first.client_id())]))
    reaper = Reaper(client, jobs=[job_name], conn_grace=0.0)
    reaper.tick()  # sees the first connection under the worker's name
    gone = str(second.client_id())
    client.redis.hset(keys.winfo, "w", "|".join(rec[:7] + [gone]))  # then a new one
    second.close()
    first.close()
    assert wait_until(lambda: not client.redis.client_list(client_id=[gone]), 5)
    reaper.tick()  # the next look finds it gone, a moment after the first was seen beating
    ManualClock(client.job(job_name)).advance(QUIET)  # quiet for longer than the watch asks
    reaper.tick()
    assert [e["worker"] for e in events(client, job_name, "connection_closed")] == ["w"]


def test_a_reconnect_is_recorded_by_the_next_heartbeat_and_the_witness_stays(
    client, job_name, monkeypatch
):
    monkeypatch.setattr(protocol, "CONN_RECHECK_S", 3600.0)  # not the periodic recheck
    make_job(client, job_name, n=1)
    t = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False, ranges=True)
    registered = conn_id(client, job_name, "w")
    t.heartbeat()  # on the client's kept connection, not the pooled one register named
    first = conn_id(client, job_name, "w")
    assert first not in ("", registered)
    assert witness_id(client, job_name, "w") == registered
    assert client.redis.client_kill_filter(_id=first) == 1
    t.heartbeat()  # finds it closed and goes out on a pooled connection
    t.heartbeat()  # names the reconnected one and records it
    now = conn_id(client, job_name, "w")
    assert now not in ("", first, registered)
    assert conn_named(client, now, f"taskq-trainer-{t.incarnation}")
    assert witness_id(client, job_name, "w") == registered, "the witness stays the first one"


def named_connection(url: str, name: str) -> tuple[redis.Redis, str]:
    r = redis.Redis.from_url(url, decode_responses=True)
    r.client_setname(name)
    return r, str(r.client_id())


def gone(client: taskq.Client, *ids: str) -> bool:
    return wait_until(lambda: not client.redis.client_list(client_id=list(ids)), 5)


def test_a_closed_heartbeat_connection_is_no_evidence_while_the_witness_is_open(
    client, url, job_name
):
    make_job(
        client, job_name, n=1, worker_ttl=4.0, manual_clock=True
    )  # the watch asks 1 s of quiet
    t = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False, ranges=True)
    keys = client.keys(job_name)
    rec = client.redis.hget(keys.winfo, "w").split("|")
    name = f"taskq-trainer-{t.incarnation}"
    beat, beat_id = named_connection(url, name)
    witness, wit_id = named_connection(url, name)
    client.redis.hset(keys.winfo, "w", "|".join(rec[:7] + [beat_id, wit_id]))
    reaper = Reaper(client, jobs=[job_name], conn_grace=0.0)
    reaper.tick()  # both seen under the worker's name, beating
    beat.close()
    assert gone(client, beat_id)
    reaper.tick()  # gone, the witness open: a CLIENT KILL, not a death
    ManualClock(client.job(job_name)).advance(1.2)  # quiet for longer than the watch asks
    reaper.tick()
    assert events(client, job_name, "connection_closed") == []
    # the contrast: every connection of the process closes at once (a SIGKILL)
    beat, beat_id = named_connection(url, name)
    client.redis.hset(keys.winfo, "w", "|".join(rec[:7] + [beat_id, wit_id]))
    reaper.tick()
    beat.close()
    witness.close()
    assert gone(client, beat_id, wit_id)
    reaper.tick()
    assert [e["worker"] for e in events(client, job_name, "connection_closed")] == ["w"]


def test_a_connection_closed_after_it_was_seen_idle_is_no_evidence(client, url, job_name):
    """Redis's `timeout` closes a stalled trainer's connection only once it has been idle
    for longer than the timeout: the watch saw it idle, and the close says nothing."""
    make_job(
        client, job_name, n=1, worker_ttl=6.0, manual_clock=True
    )  # the watch asks 1.5 s of quiet
    t = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False, ranges=True)
    keys = client.keys(job_name)
    rec = client.redis.hget(keys.winfo, "w").split("|")
    idle, idle_id = named_connection(url, f"taskq-trainer-{t.incarnation}")
    client.redis.hset(keys.winfo, "w", "|".join(rec[:7] + [idle_id]))
    reaper = Reaper(client, jobs=[job_name], conn_grace=0.0)
    reaper.tick()
    assert wait_until(
        lambda: int(client.redis.client_list(client_id=[idle_id])[0]["idle"]) >= 2, 5, 0.05
    )
    reaper.tick()  # seen idle for 2 s: not carrying heartbeats (the interval is 0.5 s)
    idle.close()
    assert gone(client, idle_id)
    reaper.tick()
    # quiet for longer than the watch asks (1.5 s), inside the ttl
    ManualClock(client.job(job_name)).advance(2.5)
    reaper.tick()
    assert events(client, job_name, "connection_closed") == []
    assert reaper.watch is not None and reaper.watch.declared == 0
