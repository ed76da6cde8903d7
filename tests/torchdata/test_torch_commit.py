"""taskq.torch with ``acks="commit"``, over real JSONL files, real DataLoader workers and a
real redis-server: nothing is acked or recorded before ``commit()``; a trainer SIGKILLed
after a commit has exactly its uncommitted samples read again; two trainers with the
global pass end and commits run several passes; the held bound is one clear error."""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import wait_until
from torch_helpers import gather, jsonl_reader, make_job, rows_of, write_jsonl

import taskq
import taskq.torch

PROC = str(Path(__file__).resolve().parents[1].joinpath("torch_resume_proc.py"))


def _loader(url: str, job: str, **kw: Any) -> taskq.torch.DataLoader:
    ds = taskq.torch.TaskDataset(job, url=url, reader=jsonl_reader, shuffle=False)
    kw.setdefault("num_workers", 2)
    return taskq.torch.DataLoader(ds, batch_size=kw.pop("batch_size", 4), acks="commit", **kw)


def _recorded(client: taskq.Client, job: str) -> dict[int, int]:
    return {int(k): int(v) for k, v in client.redis.hgetall(client.keys(job).progress).items()}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_commit_acks_exactly_what_was_taken_before_it(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, num_workers: int
) -> None:
    """6 tasks of 10 rows, batches of 4: after 5 batches and several heartbeat
    intervals nothing is acked or recorded; commit() acks the tasks the loop took to their
    end and records the rows taken of the others; the iteration ending with uncommitted
    tasks makes the next iter() refuse until commit() (which acks the rest), and
    state_dict() commits too."""
    chunks = write_jsonl(tmp_path, 6, 10)
    make_job(client, job_name, chunks, passes=2)
    with _loader(url, job_name, num_workers=num_workers) as loader:
        it = iter(loader)
        rows = [r for _ in range(5) for r in rows_of(next(it))]
        time.sleep(1.0)  # three heartbeat intervals: with acks="taken" progress is sent
        assert client.status(job_name).done == 0 and _recorded(client, job_name) == {}
        per_task = Counter(f for f, _ in rows)
        assert loader.commit() == sum(1 for n in per_task.values() if n == 10)
        st = client.status(job_name)
        assert st.done == sum(1 for n in per_task.values() if n == 10)
        assert _recorded(client, job_name) == {f: n for f, n in per_task.items() if n < 10}
        assert loader.commit() == 0  # nothing more taken
        rows += [r for b in it for r in rows_of(b)]
        assert sorted(rows) == [(f, i) for f in range(6) for i in range(10)]
        assert client.status(job_name).done < 6  # the rest waits for a commit
        with pytest.raises(taskq.TaskqError, match=r"loader\.commit\(\)"):
            iter(loader)
        assert loader.commit() > 0
        assert wait_until(lambda: client.status(job_name).pass_no == 1, 10.0)
        assert client.status(job_name).leased == 0
        # pass 1: three batches, then the checkpoint commits them
        it = iter(loader)
        taken = Counter(f for _ in range(3) for f, _ in rows_of(next(it)))
        loader.state_dict()
        st = client.status(job_name)
        assert st.done == sum(1 for n in taken.values() if n == 10)
        assert _recorded(client, job_name) == {f: n for f, n in taken.items() if n < 10}
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]


def _commit_run(url: str, job: str, out: Path, *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, PROC, url, job, str(out), "2", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize("shuffle", [False, True])
def test_sigkilled_trainer_rereads_exactly_what_it_did_not_commit(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, shuffle: bool
) -> None:
    """4 tasks of 60 rows: a trainer (2 workers, batches of 4) commits after step 20,
    takes 10 more batches and is SIGKILLed. The next trainer reads every row the first
    did not commit, none it did: the 40 rows after the commit are read twice, nothing
    committed is lost or repeated, though the killed trainer's leases come back only after
    the next trainer's first iteration ended."""
    chunks = write_jsonl(tmp_path / "data", 4, 60)
    # the killed trainer's leases outlive the second trainer's first iteration (worker_ttl 6 s):
    # it ends "exhausted" holding uncommitted tasks, commits, and its next iteration takes
    # the late work of the same pass
    make_job(client, job_name, chunks, worker_ttl=6.0)
    flags = ["--shuffle"] if shuffle else []
    first = _commit_run(
        url, job_name, tmp_path / "a.rows", "--commit-at", "20", "--stop", "30", *flags
    )
    try:
        assert first.stdout is not None
        assert first.stdout.readline().split()[:1] == ["STOPPED"]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    lines = (tmp_path / "a.rows").read_text().splitlines()
    cut = lines.index("COMMIT")
    committed = {tuple(map(int, x.split())) for x in lines[:cut]}
    uncommitted = {tuple(map(int, x.split())) for x in lines[cut + 1 :]}
    assert len(committed) == 20 * 4 and len(uncommitted) == 10 * 4
    second = _commit_run(url, job_name, tmp_path / "b.rows", "--commit-at", "1", *flags)
    try:
        assert second.stdout is not None
        assert second.stdout.readline().split()[:1] == ["DONE"]
    finally:
        second.kill()
        second.wait()
    again = [
        tuple(map(int, x.split()))
        for x in (tmp_path / "b.rows").read_text().splitlines()
        if x != "COMMIT"
    ]
    everything = {(f, i) for f in range(4) for i in range(60)}
    assert len(again) == len(set(again)) == 240 - 80
    assert set(again) == everything - committed
    assert uncommitted <= set(again)
    assert client.status(job_name).state == "completed"


def _rank(url: str, job: str, every: int, passes: int, out: Any) -> None:
    """A trainer of the global pass end committing every ``every`` steps (and after each
    epoch); puts (rows per epoch, states) on ``out``."""
    ds = taskq.torch.TaskDataset(job, url=url, reader=jsonl_reader)
    rows: list[list[tuple[int, int]]] = []
    states = []
    with taskq.torch.DataLoader(
        ds, batch_size=4, num_workers=1, acks="commit", tasks_ahead=2
    ) as loader:
        for _ in range(passes):
            got: list[tuple[int, int]] = []
            for step, batch in enumerate(loader, 1):
                got += rows_of(batch)
                time.sleep(0.01)
                if step % every == 0:
                    loader.commit()
            loader.commit()
            rows.append(got)
            states.append(loader.state)
    out.put((every, rows, states))


def test_two_trainers_global_pass_end_with_commits_run_every_pass(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """Two trainer processes over 3 passes of 8 tasks, pass_end global, one committing
    every step, the other every 3 steps: neither hangs at a pass end (an iterator with
    uncommitted tasks ends instead of waiting for the others), every row is read once
    per pass, and the audit counts every task acked once per pass."""
    sizes = [9, 14, 6, 11, 8, 13, 7, 10]
    chunks = write_jsonl(tmp_path / "data", len(sizes), sizes)
    make_job(client, job_name, chunks, passes=3)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(url, job_name, e, 3, out)) for e in (1, 3)]
    for p in procs:
        p.start()
    results = {every: (rows, states) for every, rows, states in gather(procs, out, 90, "trainer")}
    everything = sorted((f, i) for f, n in enumerate(sizes) for i in range(n))
    for pass_no in range(3):
        assert sorted(results[1][0][pass_no] + results[3][0][pass_no]) == everything
    # an iterator ends "exhausted" when it would wait for the pass end with tasks to commit
    for _, states in results.values():
        assert set(states) <= {"pass_complete", "exhausted", "completed"}, states
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]
    assert [(p["pass"], p["done"], p["stale"]) for p in audit["passes"]] == [
        (n, len(sizes), 0) for n in range(3)
    ]
    assert audit["state"] == "completed"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_too_many_uncommitted_tasks_is_one_clear_error(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, num_workers: int
) -> None:
    """80 tasks of 2 rows, never committed: the loader leases no more than one trainer
    may hold (64), the loop waiting for more gets a TaskqError telling to commit more
    often, and everything it held is given back (nothing acked)."""
    chunks = write_jsonl(tmp_path, 80, 2)
    make_job(client, job_name, chunks)
    with _loader(url, job_name, batch_size=2, num_workers=num_workers) as loader:
        taken = 0
        with pytest.raises(taskq.TaskqError, match=r"commit\(\) more often"):
            for _ in loader:
                taken += 1
        assert taken <= 64
    assert wait_until(lambda: client.status(job_name).leased == 0, 10.0)
    st = client.status(job_name)
    assert st.done == 0 and st.todo == 80
