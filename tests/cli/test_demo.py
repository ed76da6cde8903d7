"""``taskq demo`` as a real subprocess of the installed entry point."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
import redis
from support import ENTRY_POINT, wait_until

import taskq


@pytest.mark.slow
def test_demo_acks_every_task_once_per_pass_under_a_minute(url: str, client: taskq.Client) -> None:
    began = time.monotonic()
    r = subprocess.run(
        [ENTRY_POINT, "demo", "--url", url, "--trainers", "3", "--passes", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    took = time.monotonic() - began
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "every task acked exactly once per pass: yes (2 passes x 60 tasks" in out
    assert "SIGKILL trainer" in out and "scale up" in out and "scale down" in out
    assert re.search(
        r"max lateness: \d+\.\d+s \(how long an expired lease waited past its "
        r"deadline",
        out,
    )
    assert "start: 3 trainer(s) [0, 1, 2]" in out  # every trainer the summary counts
    assert re.search(r"trainers: [3-9] started", out)
    killed = re.search(r"SIGKILLed \S+: (.*)", out)
    assert killed and (
        "was leased again" in killed.group(1) or "held no task" in killed.group(1)
    ), out
    assert re.search(r"total time: \d+\.\ds", out)
    left = re.search(
        r"job (demo-[0-9a-f]+) is left in Redis at (\S+)\n"
        r"inspect: taskq --url (\S+) job status demo-.*\n"
        r"remove:  taskq --url (\S+) job delete demo-",
        out,
    )
    assert left and left.group(2) == left.group(3) == left.group(4) == url, out
    assert took < 60, f"demo took {took:.1f}s"
    job = re.search(r"job (demo-[0-9a-f]+):", out)
    assert job is not None
    report = client.audit(job.group(1))
    assert report["ok"] and [p["done"] for p in report["passes"]] == [60, 60]
    assert client.status(job.group(1)).workers == 0  # every trainer left or was reaped


def _descendants(root: int) -> set[int]:
    """Every live process below ``root`` (the demo's fork server, trainers, reaper, Redis)."""
    parent: dict[int, int] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                # the command name may hold spaces: the ppid is the 2nd field after ')'
                parent[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(pid)
        except OSError:
            continue
    return alive


@pytest.mark.slow
def test_demo_ctrl_c_stops_its_redis_and_trainers() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TASKQ_REDIS_URL"}
    proc = subprocess.Popen(
        [ENTRY_POINT, "demo", "--tasks", "997", "--step", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd="/",
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        m = re.search(r"started redis-server at (redis://\S+)", first)
        assert m, first
        server = redis.Redis.from_url(m.group(1))
        # redis-server, the fork server, the reaper and 3 trainers
        assert wait_until(lambda: len(_descendants(proc.pid)) >= 6, timeout=20)
        started = _descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert wait_until(lambda: not _alive(started), timeout=10), _alive(started)
    with pytest.raises(redis.exceptions.ConnectionError):
        server.ping()


@pytest.mark.slow
def test_torch_demo_trains_through_a_sigkill_and_a_join_with_every_sample_audited(
    url: str, client: taskq.Client
) -> None:
    """``taskq demo --torch`` through the entry point: 3 trainers (2 loader workers
    each) over generated Parquet/JSONL files, one SIGKILLed and one added mid-pass; the
    loss per pass is printed and falls; every sample of each pass was taken, re-reads
    only of the killed trainer's; the job's own audit agrees."""
    r = subprocess.run(
        [ENTRY_POINT, "demo", "--torch", "--url", url],
        capture_output=True,
        text=True,
        timeout=240,
        cwd="/",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "3 trainers x 2 DataLoader workers" in out
    # passes counted from 0, as the CLI counts them; "1 task", "2 tasks"
    kill = re.search(
        r"pass 0, \d+ of 12 tasks done: SIGKILL trainer 0 \((\d+) samples into the (\d+) tasks? it holds",
        out,
    )
    assert kill and int(kill.group(1)) > 0, out  # killed with work in progress
    assert (kill.group(2) == "1") == ("the 1 task it holds" in out), out
    assert "add trainer 3" in out
    assert "leaked semaphore" not in r.stderr, r.stderr
    losses = [float(x) for x in re.findall(r"pass \d: loss (\d+\.\d+)", out)]
    assert len(losses) == 2 and losses[1] < losses[0], out
    assert re.search(r"^pass 0: .*distinct 720 of 720", out, re.M)
    assert re.search(r"^pass 1: .*distinct 720 of 720", out, re.M)
    assert not re.search(r"\b1 (task|sample)s\b", out), out
    assert (
        "every sample taken once per pass (re-reads only of what the killed trainer "
        "took after its last progress record): yes (2 passes x 720 samples)" in out
    )
    job = re.search(r"job (demo-torch-[0-9a-f]+):", out)
    assert job is not None
    report = client.audit(job.group(1))
    assert report["ok"] and [p["done"] for p in report["passes"]] == [12, 12]
