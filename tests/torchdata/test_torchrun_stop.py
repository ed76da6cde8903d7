"""Stopping a real ``torchrun`` run (2 ranks, gloo, CPU, 2 DataLoader workers each) over a
taskq job the way docs/torch.md says: SIGTERM to the torchrun agent's pid.

torch's elastic agent starts each rank in a session of its own (its process group holds
the rank and its DataLoader workers) and, on SIGTERM, sends SIGTERM to every rank's group,
then SIGKILL after its shutdown timeout. A signal to the agent's own process group reaches
only the agent: SIGKILL there would leave the ranks training.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import wait_until
from torch_helpers import make_job, write_jsonl

import taskq

HERE = Path(__file__).resolve().parents[1]


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (read from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
def test_sigterm_to_the_torchrun_agent_stops_every_rank_and_loader_worker(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """Once the ranks have acked tasks, SIGTERM to the agent: the agent, both ranks and
    their 4 DataLoader workers are gone, the ranks released what they held (nothing
    leased, no worker registered), no rank takes another sample; a trainer started after
    finishes the pass, and the audit counts every task acked once with no stale ack (a
    rank still alive would have acked beside it)."""
    chunks = write_jsonl(tmp_path / "data", 120, 6)  # ~20 s of steps: the stop comes mid-pass
    make_job(client, job_name, chunks)
    log = tmp_path / "samples.log"
    agent_log = tmp_path / "torchrun.log"
    env = dict(os.environ, PYTHONPATH=str(HERE), OMP_NUM_THREADS="1")
    with open(agent_log, "wb") as err:
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                str(HERE / "torchrun_proc.py"),
                url,
                job_name,
                str(log),
            ],
            env=env,
            stdout=err,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the test's own cleanup only; the stop is the agent's
        )
    ranks: list[int] = []
    workers: list[int] = []
    try:
        started = wait_until(
            lambda: client.status(job_name).done >= 2 and len(children(agent.pid)) == 2,
            timeout=120,
            interval=0.1,
        )
        assert started, agent_log.read_text()[-3000:]
        ranks = children(agent.pid)
        assert wait_until(lambda: sum(len(children(r)) for r in ranks) == 4, timeout=30)
        workers = [w for r in ranks for w in children(r)]
        assert {line.split()[1] for line in log.read_text().splitlines()} == {
            str(r) for r in ranks
        }  # both ranks train

        agent.send_signal(signal.SIGTERM)
        agent.wait(60)
        taken = lines(log)
        assert wait_until(lambda: not any(map(running, ranks + workers)), timeout=30)
        assert lines(log) == taken, "a rank took samples after the agent exited"
        status = client.status(job_name)
        assert (status.leased, status.workers) == (0, 0)
        assert status.done < len(chunks)  # stopped mid-pass

        with taskq.Trainer(job_name, url=url) as trainer:  # the pass goes on without the run
            for _task in trainer:
                pass
        assert lines(log) == taken, "a rank took samples after the stop"
        audit = client.audit(job_name)
        assert audit["ok"], audit["checks"]
        assert [(p["done"], p["stale"]) for p in audit["passes"]] == [(len(chunks), 0)]
    finally:
        for pid in [agent.pid, *ranks]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        agent.wait(10)
