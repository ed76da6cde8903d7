"""taskq.torch resuming, with real trainer processes (tests/torch_resume_proc.py), real
DataLoader workers, real JSONL files and a real redis-server: the loader records how far
the loop got into a task, a SIGKILLed loader's task resumes there in the next one; a
checkpoint taken at step k is restored once by a new topology of trainers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from support import wait_until
from torch_helpers import make_job, write_jsonl

import taskq

PROC = str(Path(__file__).resolve().parents[1].joinpath("torch_resume_proc.py"))


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, PROC, *args], stdout=subprocess.PIPE, text=True)


def _wait_line(proc: subprocess.Popen[str], word: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.split()[:1] == [word], (line, proc.poll())


def _rows(path: Path) -> list[tuple[int, int]]:
    return [
        (int(f), int(i))
        for f, i in (line.split() for line in path.read_text().splitlines() if line != "CKPT")
    ]


def _recorded(client: taskq.Client, job: str) -> dict[str, int]:
    return {k: int(v) for k, v in client.redis.hgetall(client.keys(job).progress).items()}


@pytest.mark.parametrize("shuffle", [False, True])
def test_sigkilled_loader_task_resumes_where_the_loop_got(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, shuffle: bool
) -> None:
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
        assert wait_until(lambda: _recorded(client, job_name).get("0", 0) >= 29 * 4, 10.0), (
            _recorded(client, job_name)
        )
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


def test_checkpoint_then_sigkill_all_then_restart_with_another_topology(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """3 trainers (2 DataLoader workers each) over 9 tasks x 40 rows; at step 8 each
    syncs and rank 0 checkpoints (loader.state_dict(), the model's sample count beside
    it); every trainer is SIGKILLed 4 steps later. 2 trainers with 4 workers each load
    the state (one rewind for the restart key) and finish the pass: counted from the
    checkpoint every row is consumed exactly once, and the model's count (checkpoint +
    after the restart) is the number of rows."""
    chunks = write_jsonl(tmp_path / "data", 9, 40)
    make_job(client, job_name, chunks)
    run = tmp_path / "run"
    run.mkdir()
    procs = [
        _start(
            url,
            job_name,
            str(run / f"r{r}.rows"),
            "2",
            "--ckpt",
            "8",
            "--extra",
            "4",
            "--ranks",
            "3",
            "--rank",
            str(r),
            "--shuffle",
        )
        for r in range(3)
    ]
    try:
        for p in procs:
            _wait_line(p, "STOPPED")
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
    before, after_ckpt = [], []
    for r in range(3):
        lines = (run / f"r{r}.rows").read_text().splitlines()
        cut = lines.index("CKPT")
        before += [tuple(map(int, x.split())) for x in lines[:cut]]
        after_ckpt += lines[cut + 1 :]
    assert len(before) == 3 * 8 * 4 and after_ckpt  # work was lost after the checkpoint
    state_file = run / "r0.rows.ckpt"
    saved = json.loads(state_file.read_text())
    assert saved["data"]["job"] == job_name and saved["seen"] == len(before)
    again = [
        _start(
            url,
            job_name,
            str(tmp_path / f"s{r}.rows"),
            "4",
            "--state",
            str(state_file),
            "--key",
            "restart-1",
            "--shuffle",
        )
        for r in range(2)
    ]
    seen = 0
    try:
        for p in again:
            assert p.stdout is not None
            line = p.stdout.readline().split()
            assert line[:1] == ["DONE"], line
            seen += int(line[1]) - saved["seen"]
    finally:
        for p in again:
            p.kill()
            p.wait()
    after = [r for i in range(2) for r in _rows(tmp_path / f"s{i}.rows")]
    consumed = Counter(before + after)
    assert set(consumed) == {(f, i) for f in range(9) for i in range(40)}
    assert max(consumed.values()) == 1, [k for k, v in consumed.items() if v > 1][:10]
    assert saved["seen"] + seen == 9 * 40  # the model's count matches the data
    assert client.status(job_name).state == "completed"
    assert len(client.latest_events(job_name, "rewind_started", 10, 100000)) == 1
