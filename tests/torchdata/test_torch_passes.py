"""What a training loop can tell of its pass: which pass a batch belongs to under
``pass_end="local"`` (``loader.batch_pass``), and how far the job is through it
(``loader.progress()``), over real JSONL files, a real redis-server and real trainers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from torch_helpers import jsonl_reader, make_job, rows_of, write_jsonl

import taskq
import taskq.torch
from taskq.data import build_chunks


def test_a_batch_of_the_last_pass_in_the_next_epoch_says_so(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """pass_end="local": another trainer holds one task of pass 0 while the loader's
    epoch 0 ends ("exhausted"), then gives it back; epoch 1 serves it first: its batches
    report pass 0, every other batch of the epoch pass 1."""
    chunks = write_jsonl(tmp_path, 4, 8)
    make_job(client, job_name, chunks, passes=2)
    ds = taskq.torch.TaskDataset(job_name, url=url, reader=jsonl_reader, interleave=1)
    with (
        taskq.Trainer(job_name, url=url) as other,
        taskq.torch.DataLoader(ds, batch_size=4, pass_end="local") as loader,
    ):
        held = other.lease(timeout=5)
        assert held is not None and held.pass_no == 0
        held_file = held.chunks[0]["path"]
        held_f = int(Path(held_file).stem.split("-")[1])
        first = [rows_of(b) for b in loader]
        assert loader.state == "exhausted" and loader.pass_no == 0
        assert sorted({f for rows in first for f, _ in rows}) == sorted({0, 1, 2, 3} - {held_f})
        other.release(held)
        seen: list[tuple[int | None, set[int]]] = []
        for batch in loader:
            seen.append((loader.batch_pass, {f for f, _ in rows_of(batch)}))
            assert loader.batch_passes == {loader.batch_pass: len(batch["i"])}
        assert loader.pass_no == 1
    old = [files for p, files in seen if p == 0]
    new = [files for p, files in seen if p == 1]
    assert len(old) + len(new) == len(seen) == 2 + 8
    assert old == [{held_f}, {held_f}]  # the task given back, of pass 0, flagged
    assert sorted(f for files in new for f in files) == sorted([0, 1, 2, 3] * 2)


def test_with_ahead_the_pass_named_is_the_stepped_batchs(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """A framework fetching one batch ahead (``ahead=1``, Lightning) steps on the batch
    before the one it fetched last: ``batch_passes`` names that batch (4 samples, not the
    2 of the batch fetched ahead), and after the iteration ended the last one."""
    chunks = write_jsonl(tmp_path, 1, 6)
    for ahead, after_two in ((1, {0: 4}), (0, {0: 2})):
        job = f"{job_name}-{ahead}"
        make_job(client, job, chunks, passes=1)
        ds = taskq.torch.TaskDataset(job, url=url, reader=jsonl_reader)
        with taskq.torch.DataLoader(ds, batch_size=4, pass_end="local", ahead=ahead) as loader:
            it = iter(loader)
            first = next(it)
            assert len(first["i"]) == 4 and loader.batch_passes == {0: 4}
            assert len(next(it)["i"]) == 2
            assert loader.batch_passes == after_two, ahead
            assert next(it, None) is None
            assert loader.batch_passes == {0: 2} and not loader.batch_is_padding


def test_even_steps_and_ahead_need_the_local_pass_end(url: str, job_name: str) -> None:
    """Unset, ``pass_end`` follows them ("local"); "global" given beside them is refused
    (with ``ahead`` the loop would wait for the end of a pass its own last batch holds
    open)."""
    ds = taskq.torch.TaskDataset(job_name, url=url, reader=jsonl_reader)
    with pytest.raises(taskq.InvalidInput, match='even_steps needs pass_end="local"'):
        taskq.torch.DataLoader(ds, even_steps=True, pass_end="global")
    with pytest.raises(taskq.InvalidInput, match='ahead=1 needs pass_end="local"'):
        taskq.torch.DataLoader(ds, ahead=1, pass_end="global")
    assert taskq.torch.DataLoader(ds, even_steps=True).pass_end == "local"
    assert taskq.torch.DataLoader(ds, ahead=1).pass_end == "local"
    assert taskq.torch.DataLoader(ds).pass_end == "global"


def _another_trainer_acks(url: str, job: str, n: int, then_takes: int = 0) -> None:
    """Another trainer acks ``n`` tasks; with ``then_takes``, it records that many samples
    of one more as taken and gives it back."""
    with taskq.Trainer(job, url=url) as other:
        for _ in range(n):
            task = other.lease(timeout=5)
            assert task is not None
            other.ack(task)
        if then_takes:
            task = other.lease(timeout=5)
            assert task is not None
            other.progress(task, then_takes)
            other.release(task)


def test_progress_counts_the_whole_jobs_pass(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """Another trainer finishes 2 of 6 tasks first: the loader's first figure already
    counts them (global); it never goes back, its samples count the loop's rows, and the
    pass's end reads 6 of 6."""
    chunks = write_jsonl(tmp_path, 6, 10)
    make_job(client, job_name, chunks, passes=2)
    _another_trainer_acks(url, job_name, 2)
    ds = taskq.torch.TaskDataset(job_name, url=url, reader=jsonl_reader)
    with taskq.torch.DataLoader(ds, batch_size=5) as loader:
        before = loader.progress()
        assert (before.done, before.total, before.samples) == (2, 6, 0)
        figures, rows = [], 0
        for batch in loader:
            rows += len(batch["i"])
            figures.append(loader.progress())
        end = loader.progress()
    assert rows == 40
    assert all(p.pass_no == 0 and p.total == 6 for p in figures)
    assert [p.done for p in figures] == sorted(p.done for p in figures)
    assert figures[0].done >= 2
    assert [p.samples for p in figures] == list(range(5, 45, 5))
    assert (end.pass_no, end.done, end.total, end.samples) == (0, 6, 6, 40)
    assert (before.samples_done, before.samples_total) == (None, None)  # sizes unknown


def test_progress_counts_the_passs_samples_when_the_chunks_say_their_sizes(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """Chunks that say their size (JSONL, 10 records each): another trainer acks 2 of 6
    tasks and records 4 samples of a third before giving it back: the loader's first
    figure reads 24 of 60 samples (over every trainer); it never goes back, and the
    pass's end reads 60 of 60."""
    write_jsonl(tmp_path, 6, 10)
    chunks = build_chunks(str(tmp_path / "*.jsonl"), records_per_chunk=10)
    make_job(client, job_name, chunks, passes=2)
    _another_trainer_acks(url, job_name, 2, then_takes=4)
    ds = taskq.torch.TaskDataset(job_name, url=url)
    with taskq.torch.DataLoader(ds, batch_size=6) as loader:
        before = loader.progress()
        assert (before.samples_done, before.samples_total) == (24, 60)
        figures, rows = [], 0
        for batch in loader:
            rows += len(batch["i"])
            figures.append(loader.progress())
        end = loader.progress()
    assert rows == 36
    done = [p.samples_done for p in figures]
    assert done == sorted(done) and all(24 <= n <= 60 for n in done if n is not None), done
    assert (end.samples_done, end.samples_total, end.done, end.total) == (60, 60, 6, 6)


def test_the_pass_end_comes_from_the_lease_replies_not_status_reads(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow loop at its pass's tail (everything leased, its own tasks still read): the
    feeder polls with a lease every 0.5 s and learns the pass end from the replies. The
    job's status is read once at the iteration's start and once where the readers stop
    (the tail: is anything left in the queue?), however long the tail lasts."""
    from taskq.admin.jobs import Job

    chunks = write_jsonl(tmp_path, 4, 8)
    make_job(client, job_name, chunks, passes=1)
    reads: list[str] = []
    real_status = Job.status

    def status(job: Job, *args: object, **kw: object) -> object:
        reads.append(job.name)
        return real_status(job, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Job, "status", status)
    ds = taskq.torch.TaskDataset(job_name, url=url, reader=jsonl_reader, interleave=1)
    with taskq.torch.DataLoader(ds, batch_size=2) as loader:
        rows = []
        for batch in loader:
            rows += rows_of(batch)
            time.sleep(0.15)  # 16 batches: a tail of ~2 s, 4 polls of the pass or more
        assert loader.state == "completed"
    assert sorted(rows) == [(f, i) for f in range(4) for i in range(8)]
    assert reads.count(job_name) <= 2, reads
