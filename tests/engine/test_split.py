"""Tail splitting: at a pass's tail an idle trainer takes the unread end of a started task
(lib/split.lua); each sample is read once, the pass completes when every piece is acked.

Trainers run without their heartbeat thread on the manual clock (every step explicit),
except the SIGKILL test, which kills a real trainer subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

from data_files import write_parquet
from support import SLOW_TASK_ROWS, slow_reader_of_one_task, stop_process, wait_until

import taskq
from taskq.data import build_chunks, read_task

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_jsonl(path: Path, n: int) -> list[dict[str, Any]]:
    """A JSONL file of ``n`` records ``{"i": k}``, as one chunk that says its samples."""
    path.write_text("".join(json.dumps({"i": k}) + "\n" for k in range(n)))
    return [
        {
            "format": "jsonl",
            "path": str(path),
            "offset": 0,
            "length": path.stat().st_size,
            "samples": n,
        }
    ]


def trainer(client: taskq.Client, job: str, wid: str) -> taskq.Trainer:
    return taskq.Trainer(job, client=client, worker_id=wid, heartbeat=False, ranges=True)


def job_of(client: taskq.Client, name: str, chunks: list[Any], **kw: Any) -> None:
    kw.setdefault("manual_clock", True)
    kw.setdefault("task_timeout", None)
    kw.setdefault("split_tails", True)
    client.create_job(name, chunks=chunks, **kw)


def read_some(t: taskq.Trainer, task: taskq.Task, k: int, out: list[Any]) -> Any:
    """Read ``k`` samples of ``task`` from its start into ``out`` (honouring its end),
    recording progress after each; returns the iterator (to read on)."""
    it = read_task(task.chunks, task.start, end=task.current_end)
    n = task.start
    for sample in it:
        out.append(sample)
        n += 1
        t.progress(task, n)
        if n - task.start >= k:
            break
    return it


def read_rest(t: taskq.Trainer, task: taskq.Task, it: Any, out: list[Any], n: int) -> None:
    for sample in it:
        out.append(sample)
        n += 1
        t.progress(task, n)


def ids(samples: list[Any]) -> list[int]:
    return [s["i"] for s in samples]


def start_split(
    client: taskq.Client, job: str, a: taskq.Trainer, b: taskq.Trainer, p: int, timeout: float = 20
) -> tuple[taskq.Task, Any, list[Any], list[Any], threading.Thread]:
    """``a`` leases the task, reads ``p`` samples and reports them with the size; ``b``'s
    lease, in a thread, splits the task (its point: halfway through what is left). Returns
    (a's task, a's iterator, what a read, what b's lease gave once it returns: the piece,
    None or the ``JobCompleted`` it raised, the leasing thread)."""
    task = a.lease(timeout=0)
    assert task is not None
    got_a: list[Any] = []
    it = read_some(a, task, p, got_a)
    a.flush_progress()
    got: list[Any] = []

    def lease() -> None:
        try:
            got.append(b.lease(timeout=timeout))
        except taskq.JobCompleted as e:
            got.append(e)

    leaser = threading.Thread(target=lease)
    leaser.start()
    assert wait_until(lambda: client.status(job, summaries=0).counters["splits"] == 1, 10)
    return task, it, got_a, got, leaser


def test_a_split_while_the_holder_reads_jsonl(client, job_name, tmp_path):
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    # nothing in todo: b splits the running task; the piece is handed out once a knows
    # where to stop (the split is confirmed)
    task, _, got_a, got, leaser = start_split(client, job_name, a, b, 10)
    assert task.end is None  # a has not heard of the split yet
    it_a = read_task(task.chunks, 10, end=task.current_end)
    got_a.append(next(it_a))
    a.progress(task, 11)
    a.flush_progress()  # a's next report: its reply says the end
    assert task.end == 55  # m = 10 + ceil(90 / 2)
    a.progress(task, 11)  # recorded under the end it now honours: confirms the split
    a.flush_progress()
    leaser.join(10)
    piece = got[0]
    assert piece is not None and piece.id == task.id
    assert (piece.start, piece.end) == (55, 100)
    got_b: list[Any] = []
    it_b = read_task(piece.chunks, piece.start, end=piece.current_end)
    read_rest(b, piece, it_b, got_b, piece.start)
    read_rest(a, task, it_a, got_a, 11)
    assert ids(got_a) == list(range(55))
    assert ids(got_b) == list(range(55, 100))
    b.ack(piece)
    assert client.status(job_name, summaries=0).state == "running"  # one piece left
    a.ack(task)
    st = client.status(job_name, summaries=0)
    assert st.state == "completed"
    audit = client.audit(job_name)
    assert audit["ok"], audit


def split_between(
    client: taskq.Client, job: str, a: taskq.Trainer, b: taskq.Trainer, p: int
) -> tuple[taskq.Task, taskq.Task, list[Any], Any]:
    """``a`` leases the task and takes ``p`` samples, ``b`` splits it; ``a`` learns its end
    and confirms it (one more sample taken, recorded under the end). Returns (a's task,
    b's piece, what a took, a's iterator, positioned at sample p + 1)."""
    task, _, got_a, got, leaser = start_split(client, job, a, b, p)
    it = read_task(task.chunks, p, end=task.current_end)
    got_a.append(next(it))
    a.progress(task, p + 1)
    a.flush_progress()
    assert task.end is not None
    a.progress(task, p + 1)
    a.flush_progress()
    leaser.join(20)
    piece = got[0]
    assert piece is not None and piece.id == task.id
    return task, piece, got_a, it


def test_a_split_while_the_holder_reads_parquet(client, job_name, tmp_path):
    path = write_parquet(tmp_path / "d.parquet", rows=200, row_group_size=30)
    chunks = build_chunks(path)
    job_of(client, job_name, chunks, chunks_per_task=len(chunks))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, got_a, it_a = split_between(client, job_name, a, b, 20)
    assert (task.end, piece.start, piece.end) == (110, 110, 200)  # 20 + ceil(180 / 2)
    got_b: list[Any] = []
    read_rest(b, piece, read_task(piece.chunks, piece.start, end=piece.current_end), got_b, 110)
    read_rest(a, task, it_a, got_a, 21)
    assert ids(got_a) == list(range(110)) and ids(got_b) == list(range(110, 200))
    # batches are cut at the end too
    batches = list(read_task(task.chunks, 100, end=task.current_end, batch_rows=7))
    assert sum(x.num_rows for x in batches) == 10
    a.ack(task)
    b.ack(piece)
    assert client.status(job_name, summaries=0).state == "completed"
    assert client.audit(job_name)["ok"]


def test_both_pieces_holders_race_to_ack(client, job_name, tmp_path):
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, _, _ = split_between(client, job_name, a, b, 10)
    a.progress(task, task.end)
    b.progress(piece, piece.end)
    go = threading.Barrier(2)
    errors: list[BaseException] = []

    def ack(t: taskq.Trainer, x: taskq.Task) -> None:
        go.wait()
        try:
            t.ack(x)
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [
        threading.Thread(target=ack, args=(a, task)),
        threading.Thread(target=ack, args=(b, piece)),
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert errors == []
    st = client.status(job_name, summaries=0)
    assert st.state == "completed" and st.counters["acked"] == 1  # (tasks, not pieces)
    audit = client.audit(job_name)
    assert audit["ok"] and audit["passes"][-1]["acked"] == 1


def test_a_report_already_past_the_split_point_wins(client, job_name, tmp_path):
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, it, got_a, got, leaser = start_split(client, job_name, a, b, 10)  # split point 55
    # a read on past 55 before it heard of the split: its report wins
    n = 10
    for sample in it:
        got_a.append(sample)
        n += 1
        a.progress(task, n)
        if n == 70:
            break
    a.flush_progress()
    assert task.end == 70  # the split point moved up to the report
    a.progress(task, 70)  # under the end it now knows: confirmed
    a.flush_progress()
    assert list(it) == []  # the reader stops at the end
    leaser.join(20)
    piece = got[0]
    assert piece is not None and (piece.start, piece.end) == (70, 100)
    got_b: list[Any] = []
    read_rest(b, piece, read_task(piece.chunks, piece.start, end=piece.current_end), got_b, 70)
    assert ids(got_a) == list(range(70)) and ids(got_b) == list(range(70, 100))
    a.ack(task)
    b.ack(piece)
    assert client.status(job_name, summaries=0).state == "completed"
    assert client.audit(job_name)["passes"][-1]["reread_samples"] == 0


def test_a_head_acked_before_it_knew_the_split_point_undoes_the_split(client, job_name, tmp_path):
    """The head's holder reads the whole task and acks it before it heard of the split:
    the pending tail, never granted (a piece is leased once its split is confirmed), is
    undone, the task done once. That is splitting's bookkeeping, not a fault: no revoked
    or stale count, an event split_undone; the idle trainer read nothing."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, it, got_a, got, leaser = start_split(client, job_name, a, b, 10, timeout=3)
    assert client.redis.hget(client.keys(job_name).leases, f"b:{task.id}") is None
    read_rest(a, task, it, got_a, 10)  # the whole task: a never heard of the split
    assert ids(got_a) == list(range(100))
    a.ack(task)
    leaser.join(20)
    # the pending piece was never granted: b read nothing
    assert len(got) == 1 and (got[0] is None or isinstance(got[0], taskq.JobCompleted))
    st = client.status(job_name, summaries=0)
    assert st.state == "completed"
    assert (st.counters["revoked"], st.counters["stale"]) == (0, 0), st.counters
    kinds = [f["type"] for _, f in client.events(job_name)]
    assert "split_undone" in kinds and "revoked" not in kinds and "stale" not in kinds
    assert client.audit(job_name)["ok"]


def test_no_split_with_split_tails_off_or_a_size_unknown(client, job_name, tmp_path):
    for name, chunks, kw in (
        (job_name, write_jsonl(tmp_path / "a.jsonl", 100), {"split_tails": False}),
        (job_name + "-u", [{"i": 0}], {}),
    ):
        job_of(client, name, chunks, **kw)
        a, b = trainer(client, name, "a"), trainer(client, name, "b")
        task = a.lease(timeout=0)
        a.progress(task, 10)
        a.flush_progress()
        assert b.lease(timeout=0) is None
        assert client.status(name, summaries=0).counters["splits"] == 0


def test_the_holder_sigkilled_after_a_split(client, url, job_name, tmp_path):
    """A real trainer reads its task slowly; another splits it, then the first is
    SIGKILLed: its piece goes back after its ttl, is re-leased from its last record up to
    the split point; every sample is taken, none at or past the split point twice."""
    rows = SLOW_TASK_ROWS
    proc, out = slow_reader_of_one_task(
        client, url, job_name, tmp_path, "split_proc.py", split_tails=True
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("LEASED"), line
        assert wait_until(
            lambda: int(client.redis.hget(client.keys(job_name).progress, "0") or 0) >= 10
        )
        with taskq.Trainer(job_name, client=client, worker_id="second", ranges=True) as b:
            piece = b.lease(timeout=10)  # confirmed once the first one knows its end
            assert piece is not None and piece.end == rows and 10 < piece.start < rows
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            second = [r["i"] for r in read_task(piece.chunks, piece.start, end=piece.current_end)]
            b.ack(piece)
            head = b.lease(timeout=10)  # the first one's piece, after its ttl
            assert head is not None and head.id == piece.id and head.end == piece.start
            third = [r["i"] for r in read_task(head.chunks, head.start, end=head.current_end)]
            b.ack(head)
    finally:
        stop_process(proc)
    first = [int(x) for x in out.read_text().split()]
    assert second == list(range(piece.start, rows))
    assert third == list(range(head.start, piece.start))
    assert max(first) < piece.start  # the first one stopped before the split point
    assert sorted(set(first) | set(third) | set(second)) == list(range(rows))
    # what the first one took past its last record is taken again, and never more
    assert set(first) & set(third) == set(range(head.start, max(first) + 1))
    assert client.status(job_name, summaries=0).state == "completed"
    assert client.audit(job_name)["ok"]


def test_an_operator_revoke_sends_each_piece_back_with_what_it_read(client, job_name, tmp_path):
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, _, _ = split_between(client, job_name, a, b, 10)  # head [0, 55), tail [55, 100)
    b.progress(piece, 60)
    b.flush_progress()
    client.revoke(job_name, task.id)  # both pieces go back: the head to the front, the tail
    c, d = trainer(client, job_name, "c"), trainer(client, job_name, "d")  # to the orphans,
    pieces = [(c, c.lease(timeout=0)), (d, d.lease(timeout=0))]  # each from its progress
    assert sorted((p.start, p.end) for _, p in pieces if p) == [(11, 55), (60, 100)]
    for t, p in pieces:
        assert p is not None
        t.ack(p)
    assert client.status(job_name, summaries=0).state == "completed"
    assert client.audit(job_name)["ok"]


def test_a_tail_piece_alone_is_revoked_once_its_head_is_acked(client, job_name, tmp_path):
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, _, _ = split_between(client, job_name, a, b, 10)
    a.progress(task, task.end)
    a.ack(task)
    client.revoke(job_name, task.id)  # the task's live lease is its tail piece
    again = trainer(client, job_name, "c").lease(timeout=0)
    assert again is not None and (again.start, again.end) == (55, 100)


def test_a_loop_that_reads_to_the_chunks_end_is_never_split(client, job_name, tmp_path):
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task = a.lease(timeout=0)
    assert task is not None
    for n, _ in enumerate(read_task(task.chunks, task.start), 1):  # no end asked
        a.progress(task, n)
        if n == 10:
            break
    a.flush_progress()
    assert b.lease(timeout=0) is None  # nothing to split: its size was never sent
    assert client.status(job_name, summaries=0).counters["splits"] == 0


def test_a_head_acked_after_reading_past_an_end_it_learnt_late_moves_the_point(
    client, job_name, tmp_path
):
    """The loop read the whole task before the reply telling its end came back (its report
    still in the buffer at the ack): the ack reports how far it got, so the split point
    moves up to it and the tail is left nothing to read twice; the empty tail ends with
    the head's ack (undone, never handed out), which completes the job at once."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, _, _, got, leaser = start_split(client, job_name, a, b, 10)
    a.progress(task, 11)
    a.flush_progress()
    assert task.end == 55
    for n, _ in enumerate(read_task(task.chunks, 11), 12):  # read on, ahead of the news
        a.progress(task, n)
    a.ack(task)
    assert client.status(job_name, summaries=0).state == "completed"
    leaser.join(20)
    assert isinstance(got[0], taskq.JobCompleted)  # the pending piece was never handed out
    assert client.audit(job_name)["passes"][-1]["reread_samples"] == 0


def test_a_task_with_its_head_acked_and_its_tail_out_is_in_flight_not_todo(
    client, job_name, tmp_path
):
    """Status where splitting meets the counts: a split task whose head is acked while its
    tail piece is leased is leased, not todo (its tail stands for it); the tail released
    makes it todo (an orphan to lease); the orphan leased again, in flight again; the tail
    acked, done, nothing leased. Two tasks: the other one is todo all along."""
    chunks = write_jsonl(tmp_path / "a.jsonl", 100) + write_jsonl(tmp_path / "b.jsonl", 100)
    job_of(client, job_name, chunks, chunks_per_task=1)
    a, b, c = (trainer(client, job_name, w) for w in ("a", "b", "c"))
    other = c.lease(timeout=0)  # the second task, held apart so the first is the tail
    assert other is not None
    task, piece, _, _ = split_between(client, job_name, a, b, 10)

    def counts() -> tuple[int, int, int]:
        st = client.status(job_name, summaries=0)
        return st.todo, st.leased, st.done

    assert counts() == (0, 2, 0)
    a.progress(task, task.end)
    a.ack(task)  # the head: its task is not done, its tail is out
    assert counts() == (0, 2, 0)
    b.release(piece)  # the tail goes back: the task is to do (its orphan)
    assert counts() == (1, 1, 0)
    again = b.lease(timeout=0)
    assert again is not None and again.id == task.id and again.start == piece.start
    assert counts() == (0, 2, 0)
    b.progress(again, again.end)
    b.ack(again)
    c.ack(other)
    assert counts() == (0, 0, 2)
    assert client.status(job_name, summaries=0).state == "completed"


def test_a_head_naming_an_end_past_the_pending_point_confirms_it_there(client, job_name, tmp_path):
    """A reader that read past the split point before it learnt it honours what it read
    (taskq.torch's readers, whose loop's progress lags them): one report naming that end
    moves the point up to it and confirms it in the same call, while the loop's progress
    is still below the point, so the tail is leased without waiting for that progress
    (before, the point stayed pending until a report of progress past it)."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, it, got_a, got, leaser = start_split(client, job_name, a, b, 10)  # split point 55
    n = 10
    for sample in it:  # read on to 70, the loop's progress at 40 only
        got_a.append(sample)
        n += 1
        if n == 70:
            break
    a.progress(task, 40, end=70)
    a.flush_progress()
    assert task.end == 70  # moved up and confirmed there
    assert wait_until(lambda: bool(got), 10), "the tail was not leased"
    leaser.join(20)
    piece = got[0]
    assert piece is not None and (piece.start, piece.end) == (70, 100)
    moved = [f for _, f in client.events(job_name, count=1000) if f["type"] == "split_moved"]
    assert [f["at"] for f in moved] == ["70"]
    got_b: list[Any] = []
    read_rest(b, piece, read_task(piece.chunks, piece.start, end=piece.current_end), got_b, 70)
    a.progress(task, 70)
    a.ack(task)
    b.ack(piece)
    assert ids(got_a) == list(range(70)) and ids(got_b) == list(range(70, 100))
    assert client.status(job_name, summaries=0).state == "completed"
    assert client.audit(job_name)["passes"][-1]["reread_samples"] == 0
