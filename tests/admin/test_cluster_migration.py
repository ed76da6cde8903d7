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
import redis
from chaos import ReaperProc, run_cli, taskq_cmd
from redis.crc import key_slot
from support import (
    LOOPBACK,
    ROOT,
    RedisClusterProcs,
    free_port,
    one_error_line,
    stop_process,
    wait_until,
)

import taskq
from taskq.admin.shardset import place
from taskq.engine.connection import translate
from taskq.keys import JobKeys
from taskq.ops.exporter import TaskqCollector

#: Seconds between two keys of a slot moved by hand.
KEY_PAUSE_S = 0.1
#: Seconds a move by hand stalls half-way (a big key's MIGRATE), the CLI running.
STALL_S = 2.0
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


def move_by_hand(
    cluster: RedisClusterProcs, slot: int, to_port: int, midway: Callable[[], None]
) -> float:
    """Move ``slot`` to the master at ``to_port`` as ``redis-cli`` does, one key per
    ``MIGRATE`` with ``KEY_PAUSE_S`` between keys, calling ``midway`` once half the keys
    moved; returns the move's length (seconds)."""
    from_port, _ = master_of(cluster, slot)
    src, dst = cluster.node(from_port), cluster.node(to_port)
    started = time.monotonic()
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(cluster, from_port))
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(cluster, to_port))
    left = int(src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
    moved = 0
    while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1):
        src.execute_command("MIGRATE", LOOPBACK, to_port, "", 0, 5000, "KEYS", *keys)
        moved += 1
        if moved == max(1, left // 2):
            midway()
        time.sleep(KEY_PAUSE_S)  # the move's pace: the traffic meets the slot mid-move
    assert cluster.spare is not None
    ports = {to_port, from_port} | {s.port for s in [*cluster.servers, cluster.spare]}
    for port in [to_port, from_port, *sorted(ports - {to_port, from_port})]:
        cluster.node(port).execute_command(
            "CLUSTER", "SETSLOT", slot, "NODE", node_id(cluster, to_port)
        )
    return time.monotonic() - started


def move_by_reshard(
    cluster: RedisClusterProcs, slot: int, to_port: int, midway: Callable[[], None]
) -> float:
    """``redis-cli --cluster reshard`` of the lowest ``RESHARD_SLOTS`` slots of ``slot``'s
    master (``slot`` among them) to ``to_port``; returns its length (seconds). (It moves a
    slot in milliseconds: ``midway`` is not called.)"""
    from_port, _ = master_of(cluster, slot)
    started = time.monotonic()
    out = subprocess.run(
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
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr
    assert master_of(cluster, slot)[0] == to_port, "the reshard did not move the job's slot"
    return took


class Observer:
    """While a slot moves: the CLI's commands in turn, and ``/metrics``, in a loop; and
    every command at once with a scrape (``burst``) when the move is half-way."""

    def __init__(self, url: str, job: str, metrics_port: int) -> None:
        self.url, self.job, self.metrics_port = url, job, metrics_port
        self.cli: list[tuple[str, int, str, str]] = []
        self.scrapes: list[int] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(self._run_cli,))]
        self._threads.append(threading.Thread(target=self._loop, args=(self._scrape,)))

    def _loop(self, fn: Callable[[int], None]) -> None:
        i = 0
        while not self._stop.is_set():
            fn(i)
            i += 1
            self._stop.wait(0.05)

    def _run_cli(self, i: int) -> None:
        noun, verb = CLI_COMMANDS[i % len(CLI_COMMANDS)]
        args = [noun, verb] if (noun, verb) == ("job", "list") else [noun, verb, self.job]
        out = run_cli(self.url, *args, timeout=60)
        self.cli.append((" ".join(args), out.returncode, out.stdout, out.stderr))

    def _scrape(self, i: int = 0) -> None:
        url = f"http://{LOOPBACK}:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                resp.read()
                self.scrapes.append(resp.status)
        except urllib.error.HTTPError as e:
            self.scrapes.append(e.code)

    def burst(self) -> None:
        """Every CLI command and a scrape at once, then ``STALL_S`` before the move goes
        on, so that they meet the slot split between two masters."""
        for i in range(len(CLI_COMMANDS)):
            self._threads.append(threading.Thread(target=self._run_cli, args=(i,)))
        self._threads.append(threading.Thread(target=self._scrape))
        for t in self._threads[-len(CLI_COMMANDS) - 1 :]:
            t.start()
        time.sleep(STALL_S)  # the window in which they meet the split slot

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
    """3 trainer processes of one job, ``taskq reaper`` and ``taskq exporter``, each with
    its stdout and stderr in a file of ``logs`` (``report`` shows their tails)."""

    def __init__(self, url: str, job: str, sharded: bool, logs: Path) -> None:
        self.url, self.job, self.logs = url, job, logs
        self.log = logs / "acks.log"
        self.log.touch()
        script = "sharded_proc.py" if sharded else "trainer_proc.py"
        args = [sys.executable, str(ROOT / "tests" / script), url, job]
        args += ["--sleep", "0.01", "--log", str(self.log), "--stamp"]
        #: name -> (process, its stdout file, its stderr file)
        self.procs: dict[str, tuple[subprocess.Popen[bytes], Path, Path]] = {}
        self.trainers = [self._start(f"trainer{i}", args) for i in range(3)]
        self.reaper = ReaperProc(url, interval=0.2, log_path=logs / "reaper.err")
        self.procs["reaper"] = (self.reaper.proc, logs / "reaper.out", logs / "reaper.err")
        self.metrics_port = free_port()
        self.exporter = self._start(
            "exporter",
            [*taskq_cmd(), "--url", url, "exporter", "--addr", LOOPBACK]
            + ["--port", str(self.metrics_port)],
        )

    def _start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        out, err = self.logs / f"{name}.out", self.logs / f"{name}.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            proc = subprocess.Popen(args, stdout=stdout, stderr=stderr)
        self.procs[name] = (proc, out, err)
        return proc

    def acks(self) -> list[tuple[int, int, float]]:
        """(pass, task, time) of every ack logged so far."""
        out = []
        for line in self.log.read_text().splitlines():
            fields = line.split()
            out.append((int(fields[0]), int(fields[1]), float(fields[-1])))
        return out

    def running(self) -> list[str]:
        """The names of the processes that exited; [] while all run."""
        return [name for name, (proc, _, _) in self.procs.items() if proc.poll() is not None]

    def report(self) -> str:
        """What a failure needs to be understood: the acks logged, each process's exit
        code (or that it runs) with the tails of its stdout and stderr, and the job's
        status as ``taskq job status`` prints it."""
        lines = [f"{len(self.acks())} of {TASKS} acks logged"]
        for name, (proc, out, err) in self.procs.items():
            code = proc.poll()
            lines.append(
                f"--- {name} (pid {proc.pid}): " + ("running" if code is None else f"exited {code}")
            )
            for what, path in (("stdout", out), ("stderr", err)):
                text = path.read_text(errors="replace") if path.exists() else ""
                tail = text.splitlines()[-12:]
                lines += [f"  {what}: {line}" for line in tail] or [f"  {what}: (empty)"]
        try:
            status = run_cli(self.url, "job", "status", self.job, timeout=30)
            lines += ["--- taskq job status", status.stdout.rstrip(), status.stderr.rstrip()]
        except subprocess.TimeoutExpired:
            lines.append("--- taskq job status: no answer in 30 s")
        return "\n".join(lines)

    def stop(self) -> None:
        for proc in [*self.trainers, self.exporter]:
            stop_process(proc, 5)
        self.reaper.stop()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[..., Fleet]]:
    started: list[Fleet] = []

    def start(url: str, job: str, sharded: bool = False) -> Fleet:
        started.append(Fleet(url, job, sharded, tmp_path))
        return started[-1]

    yield start
    for f in started:
        f.stop()


def a_job(
    cluster: RedisClusterProcs, stem: str, sharded: bool, reshard: bool
) -> tuple[str, int, int]:
    """A job name (of 3 shards if ``sharded``), the slot to move and its shard's index
    (0 for a plain job), on a master that is not the spare; with ``reshard``, a slot that
    a reshard of ``RESHARD_SLOTS`` of its master moves."""
    assert cluster.spare is not None
    client = taskq.connect(cluster.url)
    for i in range(20000):
        name = f"{stem}-{i}"
        shards = place(client.connection, name, 3) if sharded else [name]
        for k, shard in enumerate(shards):
            slot = slot_of(shard)
            if master_of(cluster, slot)[0] != cluster.spare.port and (
                not reshard or first_slots(cluster, slot)
            ):
                return name, slot, k
    raise AssertionError("no job name found")


def longest_gap(times: list[float]) -> tuple[float, float]:
    """(the longest gap between two of ``times``, the time it began)."""
    times = sorted(times)
    return max((b - a, a) for a, b in zip(times, times[1:], strict=False))


@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "sharded"])
@pytest.mark.parametrize("how", ["by-hand", "reshard"])
def test_a_slot_migrating_mid_pass_is_a_pause_not_a_crash(
    cluster: RedisClusterProcs, fleet: Callable[..., Fleet], sharded: bool, how: str
) -> None:
    assert cluster.spare is not None
    job, slot, shard = a_job(
        cluster, f"mig-{how}-{'s' if sharded else 'p'}", sharded, how == "reshard"
    )
    client = taskq.connect(cluster.url)
    client.create_job(job, [{"i": i} for i in range(TASKS)], shards=3 if sharded else 1)
    f = fleet(cluster.url, job, sharded)
    assert wait_until(lambda: len(f.acks()) >= TASKS // 5 or f.running(), timeout=60), f.report()
    assert not f.running(), f.report()
    with Observer(cluster.url, job, f.metrics_port) as seen:
        assert wait_until(lambda: seen.cli and seen.scrapes, timeout=30)
        move = move_by_hand if how == "by-hand" else move_by_reshard
        began = time.time()
        took = move(cluster, slot, cluster.spare.port, seen.burst)
        during = len(f.acks())
        assert not f.running(), f"{f.report()}\n(at the end of the move, {took:.2f} s)"
    seen.check()
    assert during < TASKS, "the pass ended before the move did: not mid-pass"
    finished = wait_until(lambda: len(f.acks()) >= TASKS or f.running(), timeout=120)
    # trainers leave once the pass is complete: only an exit before it is one too early
    assert finished and len(f.acks()) >= TASKS, f"{f.report()}\n(the move took {took:.2f} s)"
    acks = f.acks()
    assert sorted((p, t) for p, t, _ in acks) == [(0, t) for t in range(TASKS)], f.report()
    gap, at = longest_gap([at for _, _, at in acks])
    # the moved shard's own acks (global task i is in shard i % 3)
    moved_gap, _ = longest_gap([at for _, t, at in acks if not sharded or t % 3 == shard])
    answered = sum(code == 0 for _, code, _, _ in seen.cli)
    said = (
        f"{how}, {'sharded' if sharded else 'plain'}: move {took:.2f} s, longest gap "
        f"{gap:.2f} s ({at - began:+.2f} s into it), {moved_gap:.2f} s on the moved slot; "
        f"CLI {answered}/{len(seen.cli)} answered"
    )
    print(said)
    assert max(gap, moved_gap) <= took + GAP_MARGIN_S, f"{said}\n{f.report()}"
    assert wait_until(lambda: all(p.poll() is not None for p in f.trainers), timeout=30), f.report()
    assert [p.returncode for p in f.trainers] == [0, 0, 0], f.report()
    assert f.reaper.alive() and f.exporter.poll() is None, f.report()


def test_a_move_stuck_half_way_is_one_line_everywhere_until_it_is_finished(
    cluster: RedisClusterProcs,
) -> None:
    """A reshard killed half-way leaves the slot split (``TRYAGAIN`` for good): a trainer
    gives up after its ``reconnect_timeout`` with ``ConnectionLost``, the CLI prints one
    line and exits 1, the exporter's scrape leaves the job out and counts it; once the
    move is finished, all of them work again."""
    assert cluster.spare is not None
    job, slot, _ = a_job(cluster, "stuck", False, False)
    client = taskq.connect(cluster.url)
    client.create_job(job, [{"i": i} for i in range(20)], worker_ttl=60.0)
    trainer = taskq.Trainer(job, client=client, heartbeat=False, reconnect_timeout=1.0)
    held = trainer.lease(timeout=0)
    assert held is not None
    split, finish = threading.Event(), threading.Event()

    def stall() -> None:
        split.set()
        finish.wait(60)

    moving = threading.Thread(target=move_by_hand, args=(cluster, slot, cluster.spare.port, stall))
    moving.start()
    try:
        assert split.wait(30)
        with pytest.raises(taskq.ConnectionLost, match="slot is moving between masters"):
            trainer.ack(held)
        out = run_cli(cluster.url, "job", "status", job, timeout=60)
        assert out.returncode == 1 and "Traceback" not in out.stderr
        assert one_error_line(out.stderr).startswith("taskq: error: Redis Cluster at")
        collector = TaskqCollector(client, jobs=[job])
        families = {f.name: f for f in collector.collect()}
        assert not families["taskq_tasks"].samples
        assert families["taskq_exporter_scrape_errors"].samples[0].value >= 1
    finally:
        finish.set()
        moving.join(30)
    trainer.ack(held)  # the same lease, acked once the slot has moved
    assert client.status(job).counters["acked"] == 1
    assert run_cli(cluster.url, "job", "status", job).returncode == 0
    trainer.close()


@pytest.mark.parametrize(
    "error, transient",
    [
        (redis.exceptions.ClusterError("TTL exhausted."), True),
        (redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"), True),
        (redis.exceptions.AskError("3999 127.0.0.1:7001"), True),
        (redis.exceptions.MovedError("3999 127.0.0.1:7001"), True),
        (redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"), True),
        (redis.exceptions.SlotNotCoveredError("Slot 3999 is not covered"), True),
        (redis.exceptions.RedisClusterException("No targets were found"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_cluster_errors_are_taskq_errors_and_the_passing_ones_connection_lost(
    error: Exception, transient: bool
) -> None:
    with pytest.raises(taskq.TaskqError) as raised:
        with translate("redis+cluster://127.0.0.1:7000"):
            raise error
    assert isinstance(raised.value, taskq.ConnectionLost) == transient
    assert "redis+cluster://127.0.0.1:7000" in str(raised.value)
    assert "\n" not in str(raised.value)
