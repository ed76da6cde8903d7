"""taskq.torch resuming, with real trainer processes (tests/torch_resume_proc.py), real
DataLoader workers, real JSONL files and a real redis-server: the loader records how far
the loop got into a task, a SIGKILLed loader's task resumes there in the next one; a
checkpoint taken at step k is restored once by a new topology of trainers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from support import wait_until
from torch_helpers import make_job, write_jsonl

import taskq

PROC = str(Path(__file__).with_name("torch_resume_proc.py"))


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, PROC, *args], stdout=subprocess.PIPE,
                            text=True)


def _wait_line(proc: subprocess.Popen[str], word: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == word, (line, proc.poll())


def _rows(path: Path) -> list[tuple[int, int]]:
    return [(int(f), int(i)) for f, i in
            (line.split() for line in path.read_text().splitlines() if line != "CKPT")]


def _recorded(client: taskq.Client, job: str) -> dict[str, int]:
    return {k: int(v) for k, v in client.redis.hgetall(client.keys(job).progress).items()}


@pytest.mark.parametrize("shuffle", [False, True])
def test_sigkilled_loader_task_resumes_where_the_loop_got(
        client: taskq.Client, url: str, job_name: str, tmp_path: Path, shuffle: bool) -> None:
    """One task of 400 rows: a loader process (2 workers, batches of 4) takes 30 batches
    and is SIGKILLed; the progress recorded with its heartbeats reached the 29 batches
    whose step finished (not one Redis call per sample: the heartbeat carries it). The
    next loader resumes the task there: together they took every row, and the rows taken
    twice are only those after the last record (the batch of the step in flight)."""
    chunks = write_jsonl(tmp_path / "data", 1, 400)
    make_job(client, job_name, chunks)
    flags = ["--shuffle"] if shuffle else []
    first = _start(url, job_name, str(tmp_path / "a.rows"), "2", "--stop", "30", *flags)
    try:
        _wait_line(first, "STOPPED")
        assert wait_until(lambda: _recorded(client, job_name).get("0", 0) >= 29 * 4, 10.0), \
            _recorded(client, job_name)
        recorded = _recorded(client, job_name)["0"]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert recorded == 29 * 4  # a step not finished is not recorded
    second = _start(url, job_name, str(tmp_path / "b.rows"), "2", *flags)
    try:
        _wait_line(second, "DONE")
    finally:
        second.kill()
        second.wait()
    a, b = _rows(tmp_path / "a.rows"), _rows(tmp_path / "b.rows")
    assert len(a) == 30 * 4 and len(b) == 400 - recorded
    assert set(a) | set(b) == {(0, i) for i in range(400)}
    assert set(a) & set(b) == set(a[recorded:])  # re-read: only what was not recorded
    if not shuffle:
        assert min(i for _, i in b) == recorded  # the reader began there
    passes = client.audit(job_name)["passes"]
    assert passes[0]["resumed"] == 1 and passes[0]["resumed_samples"] == recorded
