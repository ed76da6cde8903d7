"""A piece of a task is the same samples whoever reads it, and only a consumer that reads
ranges is handed one (docs/design.md, "Sample order" and "Tail splitting").

One test per case: a taskq.torch loader and a plain range loop on one job (SIGTERM of the
loader mid-pass), ``taskq work`` beside a split task's head piece, the README's
whole-task loop idle beside a range reader, a ``split_tails=False`` loop, a size a chunk
declares that its data contradicts. Each counts samples: none missing, none twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import stop_process, wait_until
from test_split import job_of, read_some, write_jsonl

import taskq
from taskq.data import read_task

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ranges(client: taskq.Client, job: str, wid: str, **kw: Any) -> taskq.Trainer:
    """A trainer whose loop reads ``[task.start, task.end)`` (``read_task(task)``)."""
    return taskq.Trainer(job, client=client, worker_id=wid, heartbeat=False, ranges=True, **kw)


def assert_each_once(taken: list[int], n: int) -> None:
    """Each of the samples 0..n-1 taken once: none missing, none twice."""
    seen = Counter(taken)
    missing = sum(1 for i in range(n) if seen[i] == 0)
    twice = sum(1 for c in seen.values() if c > 1)
    assert (missing, twice) == (0, 0), f"{missing} samples missing, {twice} taken twice"


def split_and_hand_back_head(
    client: taskq.Client, job: str, keep_tail: bool
) -> tuple[taskq.Trainer, taskq.Task | None, list[int]]:
    """``a`` reads 10 of a task of 100, ``b`` splits it (tail [55, 100)), ``a`` confirms
    the split and hands its head back (released): the head piece [11, 55) is in the
    front. With ``keep_tail`` b holds its tail (returned), else it hands it back unread.
    Returns (b, b's tail or None, what a took)."""
    a, b = ranges(client, job, "a"), ranges(client, job, "b")
    task = a.lease(timeout=0)
    assert task is not None
    got_a: list[Any] = []
    it = read_some(a, task, 10, got_a)
    a.flush_progress()
    got: list[taskq.Task | None] = []
    leaser = threading.Thread(target=lambda: got.append(b.lease(timeout=20)))
    leaser.start()
    wait_until(lambda: client.status(job, summaries=0).counters["splits"] == 1, 10)
    got_a.append(next(it))
    a.progress(task, 11)
    a.flush_progress()
    assert task.end == 55
    a.progress(task, 11)  # recorded under the end it honours: the split is confirmed
    a.flush_progress()
    leaser.join(10)
    tail = got[0]
    assert tail is not None and (tail.start, tail.end) == (55, 100)
    if not keep_tail:
        b.release(tail)
        tail = None
    a.release(task)
    a.close()
    return b, tail, [s["i"] for s in got_a]


# -- case 1: a shuffling taskq.torch loader and a plain range loop on one job ---------------
@pytest.mark.parametrize("shuffle_samples", [False, True])
def test_a_torch_loader_and_a_range_loop_read_a_task_alike(
    client, url, job_name, tmp_path, shuffle_samples
):
    """8 tasks of 50; the default loader (``shuffle=True``) is SIGTERMed after 5 batches
    and a plain loop reading ``[task.start, task.current_end)`` does the rest: every
    sample once, in the chunks' order (the default) or the job's permutation."""
    chunks = []
    for k in range(8):
        path = tmp_path / f"p{k}.jsonl"
        path.write_text("".join(json.dumps({"i": 50 * k + j}) + "\n" for j in range(50)))
        chunks.append({"format": "jsonl", "path": str(path), "offset": 0, "length": 10**6})
    client.create_job(job_name, chunks=chunks, shuffle_samples=shuffle_samples, seed=3)
    out = tmp_path / "loader.txt"
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "piece_meaning_proc.py"), url, job_name, str(out)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        stop_process(proc)
    taken = [i for line in out.read_text().splitlines() for i in json.loads(line)]
    assert len(taken) == 50  # five batches of 10
    with taskq.Trainer(job_name, url=url, ranges=True) as t:
        for task in t:
            if shuffle_samples:
                assert task.order is not None
            taken += [s["i"] for s in read_task(task.chunks, task.start, end=task.current_end)]
    assert client.status(job_name, summaries=0).state == "completed"
    assert_each_once(taken, 400)


# -- case 2: taskq work and a head piece ---------------------------------------------------
def _work(url: str, job: str, out: Path, *flags: str) -> subprocess.Popen[str]:
    """``taskq work JOB [flags] -- python -c <append stdin's task JSON to out>``."""
    script = f"import sys; open({str(out)!r}, 'a').write(sys.stdin.read() + '\\n')"
    return subprocess.Popen(
        [sys.executable, "-c", "from taskq.cli.main import main; main()", "work", job]
        + ["--url", url, *flags, "--", sys.executable, "-c", script],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_taskq_work_is_never_handed_a_head_piece(client, url, job_name, tmp_path):
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    b, tail, took_a = split_and_hand_back_head(client, job_name, keep_tail=True)
    out = tmp_path / "work.txt"
    proc = _work(url, job_name, out)
    try:
        # the worker joins and finds only the head piece [11, 55): it waits
        wait_until(lambda: client.status(job_name, summaries=0).workers == 2, 10)
        c = ranges(client, job_name, "c")
        head = c.lease(timeout=0)
        assert head is not None and (head.start, head.end) == (11, 55)
        took_c = [s["i"] for s in read_task(head)]
        assert tail is not None
        took_b = [s["i"] for s in read_task(tail)]
        b.ack(tail)
        c.ack(head)
        assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        stop_process(proc)
    assert not out.exists()  # CMD never ran: no piece for a whole-task reader
    assert_each_once(took_a + took_b + took_c, 100)
    assert client.audit(job_name)["ok"]


def test_taskq_work_with_ranges_gets_the_head_pieces_end(client, url, job_name, tmp_path):
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    b, tail, took_a = split_and_hand_back_head(client, job_name, keep_tail=True)
    assert tail is not None
    took_b = [s["i"] for s in read_task(tail)]
    b.ack(tail)
    out = tmp_path / "work.txt"
    proc = _work(url, job_name, out, "--ranges")
    try:
        assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        stop_process(proc)
    (raw,) = [line for line in out.read_text().splitlines() if line.strip()]
    given = json.loads(raw)
    assert (given["start"], given["end"], given["order"]) == (11, 55, None)
    took_work = [s["i"] for s in read_task(given["chunks"], given["start"], end=given["end"])]
    assert_each_once(took_a + took_b + took_work, 100)
    assert client.status(job_name, summaries=0).state == "completed"


# -- case 3: the README's two-line loop idle beside a range reader -------------------------
def test_the_readme_loop_never_splits_a_range_readers_task(client, job_name, tmp_path):
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a = ranges(client, job_name, "a")
    task = a.lease(timeout=0)
    assert task is not None
    got_a: list[Any] = []
    it = read_some(a, task, 10, got_a)
    a.flush_progress()  # its size is known: a range reader's task could be split
    readme = taskq.Trainer(job_name, client=client, worker_id="readme", heartbeat=False)
    assert readme.lease(timeout=0.3) is None  # whole tasks only: no tail for it
    got_a += list(it)
    a.ack(task)
    readme.close()
    st = client.status(job_name, summaries=0)
    assert st.state == "completed" and st.counters["splits"] == 0
    assert_each_once([s["i"] for s in got_a], 100)


# -- case 4: a split_tails=False loop (honours task.start, reads to the end) ---------------
def test_a_loop_that_reads_to_the_end_gets_a_head_piece_only_whole(client, job_name, tmp_path):
    """With the tail held, the head piece waits for a range reader; with the tail handed
    back unread, the split is undone and the loop gets the rest of the task whole."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    b, tail, took_a = split_and_hand_back_head(client, job_name, keep_tail=True)
    d = taskq.Trainer(job_name, client=client, worker_id="d", heartbeat=False, split_tails=False)
    assert d.lease(timeout=0.3) is None  # the head [11, 55) is a piece: not for d
    assert tail is not None
    b.release(tail)  # unread: the split can be undone
    task = d.lease(timeout=0)
    assert task is not None and task.start == 11 and task.end in (None, 100)
    took_d = [s["i"] for s in read_task(task.chunks, task.start)]  # to the chunks' end
    d.ack(task)
    d.close()
    b.close()
    assert client.status(job_name, summaries=0).state == "completed"
    assert_each_once(took_a + took_d, 100)
    assert client.audit(job_name)["ok"]


# -- case 5: a declared size the data contradicts ------------------------------------------
def test_a_declared_size_the_data_contradicts_is_an_error(client, job_name, tmp_path):
    chunks = write_jsonl(tmp_path / "a.jsonl", 120)
    chunks[0]["samples"] = 100  # a descriptor that says 100 of a 120-record file
    job_of(client, job_name, chunks)
    a, b = ranges(client, job_name, "a"), ranges(client, job_name, "b")
    task = a.lease(timeout=0)
    assert task is not None
    # measured before the first report of its size: never a split boundary
    with pytest.raises(taskq.DataError, match="holds 120 samples, its descriptor says 100"):
        read_task(task)
    assert b.lease(timeout=0.3) is None and client.status(job_name).counters["splits"] == 0
    # read whole, the same error at the chunk's end
    with pytest.raises(taskq.DataError, match="holds 120 samples, its descriptor says 100"):
        list(read_task(task.chunks))
    a.fail(task, "bad size")
    a.close()
    b.close()


def test_a_fixed_range_reader_at_the_tail_takes_no_new_split(client, job_name, tmp_path):
    """``Trainer(ranges=True, split_tails=False)`` (what ``taskq work --ranges`` is): idle
    beside a range reader's running task, it splits nothing (its range could not follow
    a moving end) and waits."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a = ranges(client, job_name, "a")
    task = a.lease(timeout=0)
    assert task is not None
    got_a: list[Any] = []
    it = read_some(a, task, 10, got_a)
    a.flush_progress()
    fixed = ranges(client, job_name, "fixed", split_tails=False)
    assert fixed.lease(timeout=0.3) is None
    got_a += list(it)
    a.ack(task)
    fixed.close()
    a.close()
    st = client.status(job_name, summaries=0)
    assert st.state == "completed" and st.counters["splits"] == 0
    assert_each_once([s["i"] for s in got_a], 100)


def test_a_whole_task_reader_woken_for_a_head_piece_passes_the_wake_on(client, job_name, tmp_path):
    """A whole-task reader and a range reader both wait (the whole-task reader first);
    a split task's head piece [11, 55) goes back to the front (its holder releases it,
    the tail held): its wake-up reaches the whole-task reader, which leaves the piece and
    passes the wake-up on, so the range reader takes the piece at once (before, it
    noticed it only at its wait bound: its whole timeout here, the job on a manual
    clock)."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = ranges(client, job_name, "a"), ranges(client, job_name, "b")
    task = a.lease(timeout=0)
    assert task is not None
    it = read_some(a, task, 10, [])
    a.flush_progress()
    got: dict[str, taskq.Task | None] = {}
    leaser = threading.Thread(target=lambda: got.update(b=b.lease(timeout=20)))
    leaser.start()
    wait_until(lambda: client.status(job_name, summaries=0).counters["splits"] == 1, 10)
    next(it)
    a.progress(task, 11)
    a.flush_progress()
    a.progress(task, 11)  # recorded under the end it honours: the split is confirmed
    a.flush_progress()
    leaser.join(10)
    assert got["b"] is not None and (got["b"].start, got["b"].end) == (55, 100)
    whole = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False)
    c = ranges(client, job_name, "c")
    waiting = client.connection.keys(job_name).waiting

    def wait_for_work(name: str, t: taskq.Trainer) -> None:
        try:
            got[name] = t.lease(timeout=15)
        except taskq.errors.JobCompleted:
            got[name] = None

    threads = []
    for k, (name, t) in enumerate((("w", whole), ("c", c)), 1):
        threads.append(threading.Thread(target=wait_for_work, args=(name, t)))
        threads[-1].start()
        assert wait_until(lambda k=k: client.redis.zcard(waiting) == k, 10)
    a.release(task)  # the head piece [11, 55) to the front, a waiter woken
    assert wait_until(lambda: "c" in got, 5), "the range reader did not take the head piece"
    piece = got["c"]
    assert piece is not None and (piece.id, piece.start, piece.end) == (task.id, 11, 55)
    threads[1].join(5)
    assert "w" not in got  # still waiting: nothing for a whole-task reader
    c.ack(piece)
    b.ack(got["b"])
    threads[0].join(20)
    assert got["w"] is None  # the job completed under it
    assert client.status(job_name, summaries=0).state == "completed"
    for t in (a, b, whole, c):
        t.close()
