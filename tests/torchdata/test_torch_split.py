"""Tail splitting through taskq.torch: a loader's task split while its DataLoader worker
reads it (by an idle plain Trainer, or an idle loader), every sample delivered once
across the pieces' holders; a split point the worker had already read past (the batches
past it dropped in the loop's process and read by the idle trainer); the cut's rule.

Real parts: the suite's redis-server, real DataLoader worker processes, JSONL and Parquet
files read by ``taskq.data.read_task`` (their chunks say their samples: the tasks can be
split).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from data_files import write_parquet
from support import wait_until
from test_split import write_jsonl

import taskq
import taskq.torch
from taskq.data import build_chunks, read_task


def jsonl_task(path: Path, n: int) -> list[dict[str, Any]]:
    """One task: a JSONL file of ``n`` records ``{"i": k}`` as one chunk that says its
    samples (what lets the engine split it)."""
    return write_jsonl(path, n)


def as_list(samples: list[Any]) -> list[Any]:
    return samples


def make_job(client: taskq.Client, name: str, chunks: list[Any], **kw: Any) -> None:
    kw.setdefault("worker_ttl", 2.0)
    kw.setdefault("heartbeat_interval", 0.3)
    kw.setdefault("task_timeout", None)
    kw.setdefault("split_tails", True)
    client.create_job(name, chunks=chunks, passes=1, **kw)


class IdleTrainer(threading.Thread):
    """A plain Trainer that joins, waits for ``go``, then takes what the job gives it (a tail
    piece) and reads it up to its end, recording the ids it read."""

    def __init__(self, url: str, job: str) -> None:
        super().__init__(daemon=True)
        self.url, self.job = url, job
        self.go = threading.Event()
        self.ids: list[int] = []
        self.pieces: list[tuple[int, int | None]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with taskq.Trainer(
                self.job, url=self.url, worker_id="idle", handle_signals=False, ranges=True
            ) as t:
                self.go.wait(30)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    try:
                        task = t.lease(timeout=1.0)
                    except (taskq.errors.JobCompleted, taskq.errors.JobCancelled):
                        return
                    if task is None:
                        if (
                            taskq.Client(self.url).status(self.job, summaries=0).state
                            == "completed"
                        ):
                            return
                        continue
                    self.pieces.append((task.start, task.end))
                    n = task.start
                    for sample in read_task(task.chunks, task.start, end=lambda t=task: t.end):
                        self.ids.append(sample["i"])
                        n += 1
                        t.progress(task, n)
                    t.ack(task)
        except BaseException as e:
            self.error = e


def run_loader(
    url: str,
    job: str,
    idle: IdleTrainer,
    go_at: int,
    step_s: float,
    commit_every: int = 0,
    **loader_kw: Any,
) -> tuple[list[int], str | None, Counter[str]]:
    """Read the job's pass with a loader of one worker; ``idle`` is let go once the
    loop took ``go_at`` samples; with ``commit_every`` the loader acks on commit, made
    every that many batches and at the end. Returns the ids the loop got, the loader's
    state and its counts."""
    if commit_every:
        loader_kw["acks"] = "commit"
    ds = taskq.torch.TaskDataset(job, url=url, shuffle=False)
    got: list[int] = []
    with taskq.torch.DataLoader(
        ds, batch_size=4, num_workers=1, collate_fn=as_list, **loader_kw
    ) as loader:
        it = iter(loader)  # the worker forks here, before the idle trainer's threads
        idle.start()
        for k, batch in enumerate(it, 1):
            got += [s["i"] for s in batch]
            if len(got) >= go_at:
                idle.go.set()
            time.sleep(step_s)
            if commit_every and k % commit_every == 0:
                loader.commit()
        if commit_every:
            loader.commit()
        state, counts = loader.state, Counter(loader.counts)
    idle.go.set()
    idle.join(30)
    assert not idle.is_alive()
    if idle.error is not None:
        raise idle.error
    return got, state, counts


def idle_ended(idle: IdleTrainer, state: str) -> None:
    """The idle trainer's thread ended without an error, the loader's pass with it."""
    idle.join(30)
    assert not idle.is_alive()
    assert idle.error is None, idle.error
    assert state in ("pass_complete", "completed")


def completed_without_rereads(client: taskq.Client, job: str) -> None:
    """The job completes, its audit ok, no sample of the pass read twice."""
    wait_until(lambda: client.status(job, summaries=0).state == "completed", 5)
    audit = client.audit(job)
    assert audit["ok"], audit["checks"]
    assert audit["passes"][-1]["reread_samples"] == 0


def split_events(client: taskq.Client, job: str) -> list[dict[str, Any]]:
    return [f for _, f in client.events(job, count=10_000) if f["type"] == "split"]


def test_a_loaders_task_split_by_an_idle_trainer_is_delivered_once(client, url, job_name, tmp_path):
    """One task of 200 samples read by a loader at 4 samples / 50 ms; an idle plain
    Trainer comes when 20 were taken: it gets the unread end, the loader stops at the
    split point it learns, every sample is read once, and the pass completes."""
    n = 200
    make_job(client, job_name, jsonl_task(tmp_path / "a.jsonl", n))
    idle = IdleTrainer(url, job_name)
    got, state, _ = run_loader(url, job_name, idle, go_at=20, step_s=0.05)
    assert state == "pass_complete" or state == "completed"
    both = Counter(got) + Counter(idle.ids)
    assert sorted(both) == list(range(n))
    assert set(both.values()) == {1}, "a sample delivered twice"
    assert split_events(client, job_name), "the task was not split"
    assert idle.ids, f"the idle trainer's piece was empty: {idle.pieces}"
    assert max(got) < min(idle.ids)  # the head is the loader's, the tail the idle one's
    wait_until(lambda: client.status(job_name, summaries=0).state == "completed", 5)
    assert client.status(job_name, summaries=0).counters["splits"] == 1
    assert client.audit(job_name)["passes"][-1]["reread_samples"] == 0


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_batches_read_past_the_split_point_go_to_the_idle_trainer(
    client, url, job_name, tmp_path, fmt
):
    """The loader's worker reads far ahead of the loop (prefetch_factor 6 x batches of 4)
    on a short task: when the idle trainer splits it, the worker has read past the point
    the engine picks from the recorded progress. The loop is not handed the batches past
    the point (they stay on torch's queue until the loop's iterator drops them, cut.py):
    the idle trainer reads them again from where the loop stopped, and the loop does not
    step through them. No sample twice, none skipped, the pieces meet. JSONL (a chunk that
    says its samples) and Parquet (row groups of 10: the reader's ranges start inside
    one)."""
    n = 64
    if fmt == "jsonl":
        chunks = jsonl_task(tmp_path / "a.jsonl", n)
    else:
        chunks = build_chunks(write_parquet(tmp_path / "a.parquet", rows=n, row_group_size=10))
    make_job(client, job_name, chunks, chunks_per_task=len(chunks))
    idle = IdleTrainer(url, job_name)
    got, _, counts = run_loader(url, job_name, idle, go_at=28, step_s=0.1, prefetch_factor=6)
    both = Counter(got) + Counter(idle.ids)
    assert sorted(both) == list(range(n))
    assert set(both.values()) == {1}, "a sample delivered twice"
    splits = split_events(client, job_name)
    assert splits, "the task was not split"
    assert counts["samples_handed_on"] > 0, "no batch read past the point was dropped"
    assert max(got) + 1 == min(idle.ids), (max(got), idle.pieces)
    assert max(got) + 1 >= int(splits[0]["at"]), (max(got), splits[0])
    wait_until(lambda: client.status(job_name, summaries=0).state == "completed", 5)
    assert client.audit(job_name)["passes"][-1]["reread_samples"] == 0


@pytest.mark.parametrize("shuffle", [False, True])
def test_an_idle_loader_takes_the_piece_of_a_loaders_task(client, url, job_name, tmp_path, shuffle):
    """Both pieces' holders are loaders: a slow one (a worker process reading far ahead)
    holds the task, an idle one (in-process reader) joins and takes the tail piece when
    the pass has nothing left. Whether the piece has samples or is empty (the slow one's
    worker had read past the split point), it is read and acked: every sample once, both
    loaders' passes end with the job. With ``shuffle=True`` the pieces are positions of
    the task's order, which the job seeds: the same in both loaders although their own
    ``seed`` differs."""
    n = 64
    make_job(client, job_name, jsonl_task(tmp_path / "a.jsonl", n))
    got2: list[int] = []
    errs: list[BaseException] = []

    def idle() -> None:
        try:
            # joins 0.3 s in, while the slow loader's worker is starting on the task (a
            # window of real time: joining at todo == 0, or after the first batch, gives
            # a task that is not split; tests/torchdata/test_torch_split.py's other cases
            # cover those)
            time.sleep(0.3)
            ds = taskq.torch.TaskDataset(
                job_name,
                url=url,
                shuffle=shuffle,
                seed=2,
                trainer_options={"handle_signals": False},
            )
            with taskq.torch.DataLoader(ds, batch_size=8, collate_fn=as_list) as loader:
                for b in loader:
                    got2.extend(s["i"] for s in b)
        except BaseException as e:
            errs.append(e)

    ds = taskq.torch.TaskDataset(job_name, url=url, shuffle=shuffle, seed=1)
    got: list[int] = []
    with taskq.torch.DataLoader(
        ds, batch_size=8, num_workers=1, collate_fn=as_list, prefetch_factor=4
    ) as loader:
        it = iter(loader)
        th = threading.Thread(target=idle, daemon=True)
        th.start()
        for b in it:
            got += [s["i"] for s in b]
            time.sleep(0.1)
    th.join(15)
    assert not th.is_alive(), "the idle loader's pass did not end"
    assert not errs, errs
    both = Counter(got) + Counter(got2)
    assert sorted(both) == list(range(n))
    assert set(both.values()) == {1}, "a sample delivered twice"
    assert split_events(client, job_name), "the task was not split"
    assert client.status(job_name, summaries=0).state == "completed"


def test_the_cut_drops_only_whole_batches_past_the_points():
    """cut.plan over units as workers send them: a batch of one split task past its
    point is dropped (its control entries kept), the task's end is the first position
    dropped and its last kept sample is tagged last; a batch that mixes a sample past
    the point with another task's is delivered whole, and so is everything of that task
    before it; a task with no sample kept gets a "cut" entry (acked at once); a task's
    own "end" and "done" entries are dropped once it is cut."""
    from taskq.torchdata import cut

    a, b = (1, 7), (2, 7)
    units = [
        ([(1, 7, 4, False), (1, 7, 5, False)], [], "A4"),  # below a's point: kept
        ([(1, 7, 6, False), (1, 7, 7, False)], [("done", 9, 1, "3")], "A6"),  # past: dropped
        ([(1, 7, 8, True)], [], "A8"),
        ([], [("end", 1, 7, "9")], None),
        ([(2, 7, 10, False), (2, 7, 11, False)], [], "B10"),  # past b's point, but:
        ([(2, 7, 12, False), (3, 7, 0, False)], [], "B12C0"),  # mixed with c: kept
        ([(2, 7, 13, True)], [], "B13"),  # after the last kept unit of b: dropped
        ([(3, 7, 1, True)], [("done", 3, 7, "2")], "C1"),
    ]
    out, ends = cut.plan(units, {a: 6, b: 10})
    assert ends == {a: 6, b: 13}
    assert [u[2] for u in out] == ["A4", None, None, None, "B10", "B12C0", None, "C1"]
    assert out[0][0][-1] == (1, 7, 5, True)  # a's last kept sample ends its reading
    assert out[1][1] == [("done", 9, 1, "3")]  # another task's entry survives the drop
    assert out[3][1] == []  # a's reader's "end" entry: the cut is its end
    assert out[5][0][0] == (2, 7, 12, True)  # b's reading ends in the mixed batch
    assert out[7][1] == [("done", 3, 7, "2")]  # c was not cut: its entries stay

    # nothing of a kept in these units: it is acked at its cut by a "cut" entry
    out, ends = cut.plan([([(1, 7, 6, False)], [], "A6"), ([(1, 7, 7, True)], [], "A7")], {a: 5})
    assert ends == {a: 6}
    assert out[0] == ([], [("cut", 1, 7, "6")], None) and out[1] == ([], [], None)

    # what shows a task's reading ended, for the units taken ahead
    assert cut.ended(([(1, 7, 3, True)], [], "x"), a, 2)
    assert not cut.ended(([(1, 7, 3, False)], [], "x"), a, 2)
    assert cut.ended(([], [("end", 1, 7, "2")], None), a, 2)  # honours the point itself
    assert not cut.ended(([], [("end", 1, 7, "5")], None), a, 2)  # read past: its last comes


def test_an_in_process_readers_split_is_confirmed_while_the_loop_trains(
    client, url, job_name, tmp_path
):
    """A loader without worker processes (its reader runs only while the loop fetches a
    batch) holds a task of 200 samples; after 5 batches the loop stops fetching (a long
    step) and an idle plain Trainer splits the task. The split is confirmed and the tail
    leased with the loop still in that step: no batch more fetched (its feeder reports
    the end the reader will honour, max(the point, its next position), without waiting
    for the reader to run). Before, the confirmation came with the loop's next batches,
    however long its step. Then every sample once, the pieces meeting."""
    n = 200
    make_job(client, job_name, jsonl_task(tmp_path / "a.jsonl", n))
    idle = IdleTrainer(url, job_name)
    ds = taskq.torch.TaskDataset(job_name, url=url, shuffle=False)
    got: list[int] = []
    with taskq.torch.DataLoader(ds, batch_size=4, num_workers=0, collate_fn=as_list) as loader:
        it = iter(loader)
        for _ in range(5):
            got += [s["i"] for s in next(it)]
        held = len(got)
        idle.start()
        idle.go.set()
        # the step: no batch fetched until the idle trainer holds its piece
        confirmed = wait_until(lambda: bool(idle.pieces) or idle.error is not None, 15)
        assert idle.error is None, idle.error
        assert confirmed, "the split was not confirmed while the loop held still"
        assert len(got) == held
        start, _ = idle.pieces[0]
        assert start >= held
        for batch in it:
            got += [s["i"] for s in batch]
        state = loader.state
    idle_ended(idle, state)
    both = Counter(got) + Counter(idle.ids)
    assert sorted(both) == list(range(n))
    assert set(both.values()) == {1}, "a sample delivered twice"
    assert max(got) + 1 == min(idle.ids) == start, (max(got), idle.pieces)
    wait_until(lambda: client.status(job_name, summaries=0).state == "completed", 5)
    assert client.audit(job_name)["passes"][-1]["reread_samples"] == 0


def test_a_task_an_in_process_reader_has_not_opened_is_split_at_once(
    client, url, job_name, tmp_path
):
    """A loader without worker processes reads one task of 100 to its end, its feeder then
    starts the other (the reader opens it at the loop's next fetch), and the loop stops
    fetching (a long step). An idle plain Trainer splits that task: the feeder reports
    the point as the end the reader honours (a task not opened is read to the end its cell
    says when it is opened), so the split is confirmed and the tail leased with the loop
    still in its step. Before, the confirmation waited for the loop's next fetch. Then
    every sample once, the pieces meeting."""
    chunks = []
    for k, base in enumerate((0, 1000)):
        path = tmp_path / f"{k}.jsonl"
        path.write_text("".join(json.dumps({"i": base + j}) + "\n" for j in range(100)))
        chunks += build_chunks(str(path), records_per_chunk=100)
    make_job(client, job_name, chunks)
    idle = IdleTrainer(url, job_name)
    ds = taskq.torch.TaskDataset(job_name, url=url, shuffle=False)
    got: list[int] = []
    with taskq.torch.DataLoader(ds, batch_size=4, num_workers=0, collate_fn=as_list) as loader:
        it = iter(loader)
        for _ in range(25):
            got += [s["i"] for s in next(it)]
        assert len({i // 1000 for i in got}) == 1 and len(got) == 100
        other = 1 - got[0] // 1000  # the task not begun (task k holds base k * 1000)

        def stepped(task: int, *kinds: str) -> bool:
            return any(
                f["type"] == "step" and str(task) in f.get(kind, "").split(",")
                for _, f in client.events(job_name, count=1000)
                for kind in kinds
            )

        assert wait_until(lambda: stepped(other, "leased", "started"), 10), "not started"
        idle.start()
        idle.go.set()
        # the step: no batch fetched until the idle trainer holds its piece
        confirmed = wait_until(lambda: bool(idle.pieces) or idle.error is not None, 10)
        assert idle.error is None, idle.error
        assert confirmed, "the split was not confirmed while the loop held still"
        start, end = idle.pieces[0]
        assert end == 100 and 0 < start < 100  # halfway (no task time known yet)
        for batch in it:
            got += [s["i"] for s in batch]
        state = loader.state
    idle_ended(idle, state)
    both = Counter(got) + Counter(idle.ids)
    assert sorted(both) == list(range(100)) + list(range(1000, 1100))
    assert set(both.values()) == {1}, "a sample delivered twice"
    base = other * 1000
    assert sorted(idle.ids) == list(range(base + start, base + 100))
    assert [i for i in got if i // 1000 == other] == list(range(base, base + start))
    completed_without_rereads(client, job_name)


def test_an_in_process_reader_split_below_its_look_ahead_delivers_no_lone_sample(
    client, url, job_name, tmp_path
):
    """A loader without worker processes reads a task of 40 in batches of 4; the loop
    takes 9 (36 samples: its reader looked sample 36 ahead, to know the last) and holds
    still. An idle plain Trainer splits the task halfway from the progress reported (at
    most 32: the point at most 36). The reader is ended at its looked-ahead sample, which
    it does not deliver: the tail starts at 36 and the loop gets no batch more. Before,
    it honoured the position after it (37): a batch of the lone sample 36, a whole step
    of the loop (of a straggler's, at a pass's tail) for one sample. Then every sample
    once, the pieces meeting."""
    n = 40
    make_job(client, job_name, jsonl_task(tmp_path / "a.jsonl", n))
    idle = IdleTrainer(url, job_name)
    ds = taskq.torch.TaskDataset(job_name, url=url, shuffle=False)
    batches: list[list[int]] = []
    with taskq.torch.DataLoader(ds, batch_size=4, num_workers=0, collate_fn=as_list) as loader:
        it = iter(loader)
        for _ in range(9):
            batches.append([s["i"] for s in next(it)])
        idle.start()
        idle.go.set()
        # the step: no batch fetched until the idle trainer holds its piece
        confirmed = wait_until(lambda: bool(idle.pieces) or idle.error is not None, 15)
        assert idle.error is None, idle.error
        assert confirmed, "the split was not confirmed while the loop held still"
        assert idle.pieces[0] == (36, n)
        for batch in it:
            batches.append([s["i"] for s in batch])
        state = loader.state
    idle_ended(idle, state)
    assert [len(b) for b in batches] == [4] * 9, "a batch more for the looked-ahead sample"
    assert [i for b in batches for i in b] + idle.ids == list(range(n))
    completed_without_rereads(client, job_name)


def test_a_loader_at_the_tail_takes_no_more_while_its_task_is_unread(
    client, url, job_name, tmp_path
):
    """Three tasks of 40: a plain Trainer reserves two, a loader without worker processes
    leases the third (nothing left to lease: it is at the pass's tail) and its loop holds
    still in a step after two batches. While its task is unread it takes nothing more: the
    other trainer's reserve stays stealable by whoever is idle first. Before, the loader
    looked for work every half second at the tail and stole a reserved task as a started
    lease, which then waited behind its own, out of any idle trainer's reach. Once its
    task is read it takes the reserve; every sample once."""
    chunks = []
    for k in range(3):
        path = tmp_path / f"{k}.jsonl"
        path.write_text("".join(json.dumps({"i": 100 * k + j}) + "\n" for j in range(40)))
        chunks += build_chunks(str(path))
    make_job(client, job_name, chunks)
    other = taskq.Trainer(job_name, url=url, handle_signals=False, ranges=True)
    try:
        reserved = other.lease_many(2, timeout=0, reserve=True)
        assert len(reserved) == 2
        ds = taskq.torch.TaskDataset(job_name, url=url, shuffle=False)
        got: list[int] = []
        with taskq.torch.DataLoader(ds, batch_size=4, num_workers=0, collate_fn=as_list) as loader:
            it = iter(loader)
            for _ in range(2):
                got += [s["i"] for s in next(it)]
            time.sleep(1.5)  # the step: three of the tail's looks for work before
            stolen = [f for _, f in client.events(job_name, count=1000) if f["type"] == "stolen"]
            assert stolen == [], "a reserved task taken while the loader's task was unread"
            for batch in it:
                got += [s["i"] for s in batch]
            state = loader.state
        assert state in ("pass_complete", "completed")
        assert sorted(got) == [100 * k + j for k in range(3) for j in range(40)]
        stolen = [f for _, f in client.events(job_name, count=1000) if f["type"] == "stolen"]
        assert sorted(f["task"] for f in stolen) == sorted(str(t.id) for t in reserved)
    finally:
        other.close()
    assert client.status(job_name, summaries=0).state == "completed"
