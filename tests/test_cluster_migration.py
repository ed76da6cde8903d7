"""A slot migrating under a running job is a pause, not a crash (docs/operations.md).

On the suite's cluster (3 masters and a spare that holds no slot, module fixture), a
plain job's slot, or the slot of one shard of a sharded job, moves to another master
mid-pass while 3 trainer processes, ``taskq reaper`` and ``taskq exporter`` run: by
``CLUSTER SETSLOT`` + ``MIGRATE`` key by key with pauses (a slow move), or by
``redis-cli --cluster reshard`` (what an operator runs). No process exits, every
(pass, task) is acked once, the longest gap between two acks stays within the move's
length + 2 s, the CLI answers or prints one line (never a traceback) and ``/metrics``
answers 200 throughout. Slots moved stay moved: each test picks its job's slot anew.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from chaos import ReaperProc, run_cli
from redis.crc import key_slot
from support import LOOPBACK, ROOT, RedisClusterProcs, free_port, stop_process, wait_until

import taskq
from taskq.admin import sharded_create
from taskq.keys import JobKeys

#: Seconds between two keys of a slot moved by hand.
KEY_PAUSE_S = 0.1
#: Slots ``redis-cli --cluster reshard`` moves (the lowest of the job's master).
RESHARD_SLOTS = 16
#: A job's tasks: its pass outlasts the move (3 trainers at ~10 ms a task).
TASKS = 1200
#: What the longest gap between acks may exceed the move by.
GAP_MARGIN_S = 2.0
#: The CLI commands run (in turn) while the slot moves.
CLI_COMMANDS = (("job", "status"), ("workers", "list"), ("job", "audit"), ("job", "list"))


def slot_of(job: str) -> int:
    """The slot every key of plain job ``job`` lives in."""
    return key_slot(JobKeys(job).meta.encode())


def master_of(cluster: RedisClusterProcs, slot: int) -> tuple[int, int]:
    """(port of the master serving ``slot``, the lowest slot that master serves)."""
    rows = cluster.node(cluster.servers[0].port).execute_command("CLUSTER", "SLOTS")
    port = next(int(r[2][1]) for r in rows if int(r[0]) <= slot <= int(r[1]))
    return port, min(int(r[0]) for r in rows if int(r[2][1]) == port)


def first_slots(cluster: RedisClusterProcs, slot: int) -> bool:
    """Whether ``slot`` is among the ``RESHARD_SLOTS`` that a reshard of its master's
    slots moves first (its lowest), and that master is not the spare."""
    assert cluster.spare is not None
    port, lowest = master_of(cluster, slot)
    return port != cluster.spare.port and lowest <= slot < lowest + RESHARD_SLOTS


def node_id(cluster: RedisClusterProcs, port: int) -> str:
    return str(cluster.node(port).cluster("myid"))


def move_by_hand(cluster: RedisClusterProcs, slot: int, to_port: int) -> float:
    """Move ``slot`` to the master at ``to_port`` as ``redis-cli`` does, one key per
    ``MIGRATE`` with ``KEY_PAUSE_S`` between keys; returns the move's length (seconds)."""
    from_port, _ = master_of(cluster, slot)
    src, dst = cluster.node(from_port), cluster.node(to_port)
    started = time.monotonic()
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(cluster, from_port))
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(cluster, to_port))
    while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1):
        src.execute_command("MIGRATE", LOOPBACK, to_port, "", 0, 5000, "KEYS", *keys)
        time.sleep(KEY_PAUSE_S)
    assert cluster.spare is not None
    ports = {to_port, from_port} | {s.port for s in [*cluster.servers, cluster.spare]}
    for port in [to_port, from_port, *sorted(ports - {to_port, from_port})]:
        cluster.node(port).execute_command(
            "CLUSTER", "SETSLOT", slot, "NODE", node_id(cluster, to_port)
        )
    return time.monotonic() - started


def move_by_reshard(cluster: RedisClusterProcs, slot: int, to_port: int) -> float:
    """``redis-cli --cluster reshard`` of the lowest ``RESHARD_SLOTS`` slots of ``slot``'s
    master (``slot`` among them) to ``to_port``; returns its length (seconds)."""
    from_port, _ = master_of(cluster, slot)
    started = time.monotonic()
    subprocess.run(
        [
            cluster.cli,
            "--cluster",
            "reshard",
            cluster.first,
            "--cluster-from",
            node_id(cluster, from_port),
            "--cluster-to",
            node_id(cluster, to_port),
            "--cluster-slots",
            str(RESHARD_SLOTS),
            "--cluster-yes",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    took = time.monotonic() - started
    assert master_of(cluster, slot)[0] == to_port, "the reshard did not move the job's slot"
    return took


class Observer:
    """While a slot moves: the CLI's commands in turn, and ``/metrics``, in a loop."""

    def __init__(self, url: str, job: str, metrics_port: int) -> None:
        self.url, self.job, self.metrics_port = url, job, metrics_port
        self.cli: list[tuple[str, int, str, str]] = []
        self.scrapes: list[int] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run_cli),
            threading.Thread(target=self._scrape),
        ]

    def _run_cli(self) -> None:
        i = 0
        while not self._stop.is_set():
            noun, verb = CLI_COMMANDS[i % len(CLI_COMMANDS)]
            args = [noun, verb] if verb == "list" and noun == "job" else [noun, verb, self.job]
            out = run_cli(self.url, *args, timeout=60)
            self.cli.append((" ".join(args), out.returncode, out.stdout, out.stderr))
            i += 1

    def _scrape(self) -> None:
        while not self._stop.is_set():
            url = f"http://{LOOPBACK}:{self.metrics_port}/metrics"
            try:
                with urllib.request.urlopen(url, timeout=30) as resp:
                    resp.read()
                    self.scrapes.append(resp.status)
            except urllib.error.HTTPError as e:
                self.scrapes.append(e.code)
            self._stop.wait(0.1)

    def __enter__(self) -> Observer:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(90)

    def check(self) -> None:
        """Every CLI run answered, or said why in one line; every scrape was a 200."""
        assert self.cli and self.scrapes
        for command, code, stdout, stderr in self.cli:
            assert "Traceback" not in stderr, f"taskq {command}: {stderr}"
            if code == 0:
                assert stdout.strip(), f"taskq {command}: no answer"
            else:
                lines = stderr.strip().splitlines()
                assert len(lines) == 1 and lines[0].startswith("taskq: error:"), stderr
        assert set(self.scrapes) == {200}, self.scrapes


class Fleet:
    """3 trainer processes of one job, ``taskq reaper`` and ``taskq exporter``."""

    def __init__(self, url: str, job: str, sharded: bool, log: Path) -> None:
        self.log = log
        log.touch()
        script = "sharded_proc.py" if sharded else "trainer_proc.py"
        args = [sys.executable, str(ROOT / "tests" / script), url, job]
        args += ["--sleep", "0.01", "--log", str(log), "--stamp"]
        self.trainers = [
            subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for _ in range(3)
        ]
        self.reaper = ReaperProc(url, interval=0.2)
        self.metrics_port = free_port()
        self.exporter = subprocess.Popen(
            [Path(sys.executable).with_name("taskq"), "--url", url, "exporter"]
            + ["--addr", LOOPBACK, "--port", str(self.metrics_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def acks(self) -> list[tuple[int, int, float]]:
        """(pass, task, time) of every ack logged so far."""
        out = []
        for line in self.log.read_text().splitlines():
            fields = line.split()
            out.append((int(fields[0]), int(fields[1]), float(fields[-1])))
        return out

    def running(self) -> list[str]:
        """What exited (with its stderr's tail); [] while all run."""
        gone = []
        for proc in [*self.trainers, self.exporter, self.reaper.proc]:
            if proc.poll() is not None:
                tail = proc.stderr.read()[-2000:] if proc.stderr else ""
                gone.append(f"{proc.args} exited {proc.returncode}: {tail}")
        return gone

    def stop(self) -> None:
        for proc in [*self.trainers, self.exporter]:
            stop_process(proc, 5)
        self.reaper.stop()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[..., Fleet]]:
    started: list[Fleet] = []

    def start(url: str, job: str, sharded: bool = False) -> Fleet:
        started.append(Fleet(url, job, sharded, tmp_path / "acks.log"))
        return started[-1]

    yield start
    for f in started:
        f.stop()


def a_job(cluster: RedisClusterProcs, stem: str, sharded: bool, reshard: bool) -> tuple[str, int]:
    """A job name, and the slot to move (a shard's for a sharded job) that a reshard of
    ``RESHARD_SLOTS`` would move, if ``reshard``."""
    client = taskq.connect(cluster.url)
    for i in range(20000):
        name = f"{stem}-{i}"
        if sharded:
            slots = [slot_of(shard) for shard in sharded_create.place(client, name, 3)]
        else:
            slots = [slot_of(name)]
        for slot in slots:
            if master_of(cluster, slot)[0] != cluster.spare.port and (
                not reshard or first_slots(cluster, slot)
            ):
                return name, slot
    raise AssertionError("no job name found")


@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "sharded"])
@pytest.mark.parametrize("how", ["by-hand", "reshard"])
def test_a_slot_migrating_mid_pass_is_a_pause_not_a_crash(
    cluster: RedisClusterProcs, fleet: Callable[..., Fleet], sharded: bool, how: str
) -> None:
    assert cluster.spare is not None
    job, slot = a_job(cluster, f"mig-{how}-{'s' if sharded else 'p'}", sharded, how == "reshard")
    client = taskq.connect(cluster.url)
    client.create_job(job, [{"i": i} for i in range(TASKS)], shards=3 if sharded else 1)
    f = fleet(cluster.url, job, sharded)
    assert wait_until(lambda: len(f.acks()) >= TASKS // 5 or f.running(), timeout=60)
    assert not f.running()
    with Observer(cluster.url, job, f.metrics_port) as seen:
        wait_until(lambda: len(seen.cli) >= 1 and seen.scrapes, timeout=30)
        move = move_by_hand if how == "by-hand" else move_by_reshard
        took = move(cluster, slot, cluster.spare.port)
        during = len(f.acks())
        assert not f.running()
    seen.check()
    assert during < TASKS, "the pass ended before the move did: no pause was seen"
    assert wait_until(lambda: len(f.acks()) >= TASKS or f.running(), timeout=120)
    acks = f.acks()
    assert sorted((p, t) for p, t, _ in acks) == [(0, t) for t in range(TASKS)]
    times = sorted(at for _, _, at in acks)
    gap = max(b - a for a, b in zip(times, times[1:], strict=False))
    print(f"{how} {'sharded' if sharded else 'plain'}: move {took:.2f} s, longest gap {gap:.2f} s")
    assert gap <= took + GAP_MARGIN_S
    assert wait_until(lambda: all(p.poll() is not None for p in f.trainers), timeout=30)
    assert [p.returncode for p in f.trainers] == [0, 0, 0]
    assert f.reaper.alive() and f.exporter.poll() is None
