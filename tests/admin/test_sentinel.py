"""Sentinel: a master, a replica and three sentinels on loopback; the master is SIGKILLed
mid-pass, the replica is promoted, the trainers carry on and the job's records stay right.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from support import SERVER_BINARY, RedisServer, free_port, stop_process, wait_until

import taskq

SERVICE = "mymaster"


class SentinelProc:
    """One ``redis-server --sentinel`` watching ``SERVICE`` (quorum 2, 1 s down-after)."""

    def __init__(self, master_port: int) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="taskq-sentinel-"))
        conf = self.dir / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
            f"logfile {self.dir / 'sentinel.log'}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 5000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        self.proc = subprocess.Popen(
            [SERVER_BINARY, str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not wait_until(self.ping, timeout=10):
            self.cleanup()
            raise RuntimeError(f"sentinel on {self.port} did not start")

    def ping(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
        except redis.exceptions.RedisError:
            return False

    def master_port(self) -> int:
        host, port = redis.Redis(port=self.port, decode_responses=True).execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE
        )
        return int(port)

    def cleanup(self) -> None:
        stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelSetup:
    def __init__(self) -> None:
        self.master = RedisServer()
        self.replica: RedisServer | None = None
        self.sentinels: list[SentinelProc] = []
        try:
            self.replica = RedisServer(extra=["--replicaof", "127.0.0.1", str(self.master.port)])
            assert wait_until(
                lambda: self.master.client().info("replication")["connected_slaves"] == 1,
                timeout=15,
            )
            self.sentinels = [SentinelProc(self.master.port) for _ in range(3)]
            # every sentinel must know the others and the replica before a failover works
            assert wait_until(self.sentinels_ready, timeout=20, interval=0.1)
        except BaseException:
            self.cleanup()
            raise

    def sentinels_ready(self) -> bool:
        for s in self.sentinels:
            info = redis.Redis(port=s.port, decode_responses=True).execute_command(
                "SENTINEL", "MASTER", SERVICE
            )
            fields = (
                dict(zip(info[::2], info[1::2], strict=False)) if isinstance(info, list) else info
            )
            if int(fields["num-other-sentinels"]) < 2 or int(fields["num-slaves"]) < 1:
                return False
        return True

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def cleanup(self) -> None:
        for s in self.sentinels:
            s.cleanup()
        for server in (self.replica, self.master):
            if server is not None:
                server.cleanup()


@pytest.fixture
def sentinel_setup() -> Iterator[SentinelSetup]:
    setup = SentinelSetup()
    yield setup
    setup.cleanup()


def test_sentinel_url_finds_the_master(sentinel_setup: SentinelSetup, job_name: str) -> None:
    client = taskq.connect(sentinel_setup.url)
    client.create_job(job_name, [{"i": i} for i in range(3)])
    assert sentinel_setup.master.client().exists(client.keys(job_name).meta) == 1
    with pytest.raises(taskq.InvalidInput, match="service_name"):
        taskq.connect("redis+sentinel://127.0.0.1:1")


def test_failover_mid_pass_trainers_carry_on_and_records_stay_right(
    sentinel_setup: SentinelSetup, job_name: str
) -> None:
    tasks, trainers = 300, 2
    admin = taskq.connect(sentinel_setup.url)
    admin.create_job(job_name, [{"i": i} for i in range(tasks)])
    assert admin.redis.wait(1, 5000) == 1  # the replica has the job before the crash
    old_port = sentinel_setup.master.port
    seen: list[tuple[float, int, int]] = []  # (time, task id, token)
    problems: list[BaseException] = []
    lock = threading.Lock()

    def work() -> None:
        try:
            with taskq.Trainer(job_name, url=sentinel_setup.url, prefetch=1) as trainer:
                for task in trainer:
                    time.sleep(0.01)  # a training step
                    with lock:
                        seen.append((time.monotonic(), task.id, task.token))
        except BaseException as e:  # reported by the main thread
            problems.append(e)

    threads = [threading.Thread(target=work) for _ in range(trainers)]
    for t in threads:
        t.start()
    assert wait_until(lambda: len(seen) >= tasks // 3, timeout=30)
    sentinel_setup.master.kill()
    killed_at = time.monotonic()
    done_at_kill = len(seen)
    assert wait_until(
        lambda: sentinel_setup.sentinels[0].master_port() != old_port, timeout=30, interval=0.1
    ), "no failover"
    failover_s = time.monotonic() - killed_at
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads)
    assert not problems, problems
    assert done_at_kill < tasks  # the kill really was mid-pass

    status = admin.status(job_name)
    assert sentinel_setup.replica is not None
    assert admin.redis.connection_pool.get_master_address()[1] == sentinel_setup.replica.port
    assert (status.state, status.done, status.leased, status.todo) == ("completed", tasks, 0, 0)
    audit = admin.audit(job_name)
    assert audit["ok"], audit
    # at least once: every task processed; a few acks lost with the old master re-ran
    assert {task_id for _, task_id, _ in seen} == set(range(tasks))
    # fencing: every lease granted by the new master has a larger token than any granted
    # by the old one (the first few started after the kill may be prefetched before it)
    before = [tok for at, _, tok in seen if at < killed_at]
    after = sorted((at, tok) for at, _, tok in seen if at > killed_at)[trainers * 2 :]
    assert after and min(tok for _, tok in after) > max(before)
    print(f"failover {failover_s:.1f}s, {done_at_kill} done at kill, {len(seen) - tasks} re-run")
