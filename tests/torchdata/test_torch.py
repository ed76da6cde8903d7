"""taskq.torch over real JSONL files, a real redis-server and real DataLoader workers:
passes, the ack rule, shuffling, bad data, a SIGKILLed worker, Redis load per process."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import tarfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import RedisServer, wait_until
from torch_helpers import jsonl_reader, make_job, per_file, rows_of, write_jsonl

import taskq
import taskq.data
import taskq.torch
from taskq.admin import checkpoints


def _loader(url: str, job: str, num_workers: int, **kw: Any) -> taskq.torch.DataLoader:
    ds_kw = {
        k: kw.pop(k) for k in ("shuffle", "seed", "interleave", "transform", "reader") if k in kw
    }
    ds_kw.setdefault("reader", jsonl_reader)
    ds = taskq.torch.TaskDataset(job, url=url, **ds_kw)
    return taskq.torch.DataLoader(
        ds, batch_size=kw.pop("batch_size", 4), num_workers=num_workers, **kw
    )


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
def test_passes_deliver_every_sample_once_and_end_with_the_job(
    client: taskq.Client,
    url: str,
    job_name: str,
    tmp_path: Path,
    num_workers: int,
    persistent: bool,
) -> None:
    """Two passes of 6 tasks x 10 rows: each epoch yields every row once, the first ends
    'pass_complete', the second 'completed'; a third iter ends at once; audit: 6 + 6."""
    chunks = write_jsonl(tmp_path, 6, 10)
    make_job(client, job_name, chunks, passes=2, shuffle_samples=True)
    extra = {"persistent_workers": True} if persistent else {}
    with _loader(url, job_name, num_workers, seed=7, **extra) as loader:
        epochs, states, passes = [], [], []
        for _ in range(2):
            rows: list[tuple[int, int]] = []
            for batch in loader:
                rows += rows_of(batch)
            epochs.append(rows)
            states.append(loader.state)
            passes.append(loader.pass_no)
        assert list(loader) == []
        assert loader.state == "completed"
    want = sorted((f, i) for f in range(6) for i in range(10))
    assert [sorted(r) for r in epochs] == [want, want]
    assert states == ["pass_complete", "completed"]
    assert passes == [0, 1]
    # the job's seeded order inside a task (shuffle_samples), new per pass
    file0 = [[i for f, i in rows if f == 0] for rows in epochs]
    assert file0[0] != list(range(10)) and file0[0] != file0[1]
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]
    assert [(p["pass"], p["done"], p["stale"]) for p in audit["passes"]] == [(0, 6, 0), (1, 6, 0)]
    assert loader.counts["tasks_acked"] == 12 and loader.counts["samples"] == 120


def test_interleaving_mixes_tasks_within_a_batch(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """interleave=3: batches hold rows of several tasks; shuffle=False reads one task at a
    time in file order."""
    chunks = write_jsonl(tmp_path, 6, 12)
    make_job(client, job_name, chunks, passes=2)
    mixed = []
    with _loader(url, job_name, 0, interleave=3, batch_size=6) as loader:
        for b in loader:
            mixed.append(len(per_file(rows_of(b))))
            time.sleep(0.02)  # a step: the feeder has tasks queued ahead
    assert max(mixed) >= 2
    with _loader(url, job_name, 0, shuffle=False, batch_size=6) as loader:
        batches = [rows_of(b) for b in loader]
    assert all(len(per_file(b)) == 1 for b in batches)
    assert all([i for _, i in b] == sorted(i for _, i in b) for b in batches)


def test_task_is_acked_only_after_the_loop_took_its_last_sample(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """A batch holding a task's last row is out: not acked while the step runs; the next
    next() acks it."""
    chunks = write_jsonl(tmp_path, 3, 4)
    make_job(client, job_name, chunks)
    with _loader(url, job_name, 0, shuffle=False, batch_size=4) as loader:
        it = iter(loader)
        first = rows_of(next(it))
        assert per_file(first) == {first[0][0]: 4}  # the whole task: its last row is in it
        time.sleep(0.5)  # the feeder acts on its own; the step is still "running"
        assert client.status(job_name).done == 0
        next(it)
        assert wait_until(lambda: client.status(job_name).done == 1, 5.0)
        assert [t["id"] for t in client.tasks(job_name, "done")] == [first[0][0]]
        assert sum(len(rows_of(b)) for b in it) == 4
        assert loader.state == "completed"


def test_bad_data_fails_the_task_until_dead_and_the_pass_completes(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """A missing file, a corrupt Parquet file, a truncated tar member and a bad JSON row:
    each task fails with the reader's error text, is dead at max_failures, the loop sees
    every good row and the pass completes."""
    chunks = write_jsonl(tmp_path, 6, 5)
    chunks[1]["path"] = str(tmp_path / "missing.jsonl")
    Path(chunks[2]["path"]).write_text('{"f": 2, "i": 0}\n{"f": 2, "i"\n')
    bad_parquet = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"f": [3] * 50, "i": list(range(50))}), bad_parquet)
    data = bad_parquet.read_bytes()
    bad_parquet.write_bytes(data[:8] + b"\x00" * 64 + data[72:])  # pages overwritten
    chunks[3] = {"path": str(bad_parquet), "format": "parquet"}
    tar_path = tmp_path / "rows.tar"
    body = "".join(json.dumps({"f": 4, "i": i}) + "\n" for i in range(200)).encode()
    with tarfile.open(tar_path, "w") as tar:
        info = tarfile.TarInfo("rows.jsonl")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    tar_path.write_bytes(tar_path.read_bytes()[: 512 + len(body) // 2])  # member cut short
    chunks[4] = {"path": str(tar_path), "format": "tar"}
    good_parquet = tmp_path / "good.parquet"
    pq.write_table(pa.table({"f": [5] * 5, "i": list(range(5))}), good_parquet)
    chunks[5] = {"path": str(good_parquet), "format": "parquet"}
    make_job(client, job_name, chunks, max_failures=2)
    with _loader(url, job_name, 2, batch_size=3) as loader:
        rows = [r for b in loader for r in rows_of(b)]
        assert loader.state == "completed"
        assert loader.counts["tasks_failed"] == 8
    assert per_file(rows) == {0: 5, 5: 5}
    st = client.status(job_name)
    assert (st.done, st.dead) == (2, 4)
    texts = [
        f.get("error", "") for _, f in client.events(job_name, count=500) if f["type"] == "failed"
    ]
    for kind in ("FileNotFoundError", "JSONDecodeError", "ReadError"):
        assert sum(kind in t for t in texts) == 2, (kind, texts)
    assert sum("ArrowInvalid" in t or "OSError" in t for t in texts) == 2, texts


def test_on_error_raise_stops_the_loop_with_the_readers_text(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    chunks = write_jsonl(tmp_path, 2, 3)
    chunks[0]["path"] = str(tmp_path / "missing.jsonl")
    make_job(client, job_name, chunks, max_failures=3)
    with _loader(url, job_name, 0, on_error="raise", shuffle=False) as loader:
        with pytest.raises(taskq.CorruptData, match="FileNotFoundError"):
            for _ in loader:
                pass
    st = client.status(job_name)
    assert st.leased == 0 and st.counters.get("failed", 1) >= 1


# the new workers are forked while the loader's feeder and heartbeat threads run
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.parametrize("shuffle,persistent", [(False, False), (True, False), (True, True)])
def test_sigkilled_worker_is_replaced_and_the_loop_ends_normally(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, shuffle: bool, persistent: bool
) -> None:
    """A DataLoader worker is SIGKILLed (as the OOM killer does) while its batches are
    buffered: the loop sees no exception and ends with the pass complete, every sample
    taken, none twice but possibly the batch in the step at that moment; the loader
    counts one worker restart, and only the task the dead worker was reading (if any)
    was given back (released), not the whole holding. The next pass (persistent workers
    or not) reads every sample once again."""
    sizes = [24] * 8
    chunks = write_jsonl(tmp_path, 8, sizes)
    make_job(client, job_name, chunks, passes=2)
    taken: list[tuple[int, int]] = []
    step_batch: list[tuple[int, int]] = []
    extra = {"persistent_workers": True} if persistent else {}
    with _loader(
        url, job_name, 2, batch_size=4, prefetch_factor=4, interleave=1, shuffle=shuffle, **extra
    ) as loader:
        it = iter(loader)
        for n, batch in enumerate(it):
            rows = rows_of(batch)
            taken += rows
            if n == 3:
                assert wait_until(lambda: it.feeder.held.count() >= 2, 5.0)
                os.kill(it.worker_pids[0], signal.SIGKILL)
                step_batch = rows
                time.sleep(0.5)  # its batches stay buffered, unread by the loop
            time.sleep(0.01)
        assert loader.state == "pass_complete"
        assert loader.counts["worker_restarts"] == 1
        # the task the dead worker was reading, if any (interleave=1): not all held
        assert loader.counts["tasks_given_back"] <= 1
        again = [r for b in loader for r in rows_of(b)]
        assert loader.state == "completed"
    everything = {(f, i) for f in range(8) for i in range(24)}
    assert set(taken) == everything
    twice = [r for r, k in Counter(taken).items() if k > 1]
    assert set(twice) <= set(step_batch), twice
    assert sorted(again) == sorted(everything)
    st = client.status(job_name)
    assert st.counters["released"] == loader.counts["tasks_given_back"]
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]
    assert [(p["done"], p["stale"]) for p in audit["passes"]] == [(8, 0), (8, 0)]


def _fcalls(server: RedisServer) -> int:
    stats = server.client().info("commandstats")
    return sum(
        int(v["calls"])
        for k, v in stats.items()
        if k.split("|")[0] in ("cmdstat_fcall", "cmdstat_evalsha")
    )


def test_redis_calls_do_not_grow_with_num_workers(own_redis: RedisServer, tmp_path: Path) -> None:
    """The same job read by a loader with 0 and with 2 workers at the same step rate:
    script calls per second (heartbeats, leases, acks; INFO commandstats) within 1.5x."""
    client = taskq.connect(own_redis.url)
    chunks = write_jsonl(tmp_path, 12, 8)
    rates = {}
    for nw in (0, 2):
        job = f"calls-{nw}"
        make_job(client, job, chunks, heartbeat_interval=0.2, worker_ttl=2.0)
        own_redis.client().config_resetstat()
        before, t0 = _fcalls(own_redis), time.monotonic()
        with _loader(own_redis.url, job, nw, batch_size=4) as loader:
            for _ in loader:
                time.sleep(0.08)  # the step bounds the rate, whatever num_workers
        rates[nw] = (_fcalls(own_redis) - before) / (time.monotonic() - t0)
    assert rates[2] <= 1.5 * rates[0], rates
    assert rates[0] > 0


def test_local_pass_end_ends_when_nothing_is_left_to_lease(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """pass_end='local': the iteration ends once this loader took all it could while
    another trainer still holds a task; the next iteration waits for the next pass."""
    chunks = write_jsonl(tmp_path, 4, 3)
    make_job(client, job_name, chunks, passes=2)
    other = taskq.Trainer(job_name, url=url)
    held = other.lease(timeout=2.0)
    assert held is not None
    with _loader(url, job_name, 0, pass_end="local") as loader:
        rows = [r for b in loader for r in rows_of(b)]
        assert loader.state == "exhausted" and len(rows) == 9
        assert client.status(job_name).pass_no == 0
        other.ack(held)
        rows2 = [r for b in loader for r in rows_of(b)]
        assert len(rows2) == 12 and loader.pass_no == 1
    other.close()


def test_a_missing_job_raises_from_the_loop(url: str, job_name: str) -> None:
    ds = taskq.torch.TaskDataset(job_name, url=url, reader=jsonl_reader)
    with taskq.torch.DataLoader(ds, num_workers=2) as loader, pytest.raises(taskq.JobNotFound):
        next(iter(loader))


def test_plain_iteration_is_refused_and_json_rows_are_real(tmp_path: Path) -> None:
    chunks = write_jsonl(tmp_path, 1, 2)
    assert [json.loads(x) for x in Path(chunks[0]["path"]).read_text().splitlines()] == [
        {"f": 0, "i": 0},
        {"f": 0, "i": 1},
    ]
    ds = taskq.torch.TaskDataset("x", reader=jsonl_reader)
    with pytest.raises(taskq.InvalidInput):
        iter(ds)
    with pytest.raises(taskq.InvalidInput):
        taskq.torch.DataLoader(ds, shuffle=True)


def test_global_pass_end_waits_for_everyone_and_reads_late_work_in_process(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """Another trainer holds a task while the loader's workers finish the rest: the
    iteration does not end; when that task comes back it is read in the main process and
    the iteration ends with the pass (here the job) complete."""
    chunks = write_jsonl(tmp_path, 4, 3)
    make_job(client, job_name, chunks)
    other = taskq.Trainer(job_name, url=url)
    held = other.lease(timeout=2.0)
    assert held is not None
    released_at: list[float] = []

    def give_back() -> None:
        released_at.append(time.monotonic())
        other.release(held)

    timer = threading.Timer(1.5, give_back)
    timer.start()
    try:
        with _loader(url, job_name, 2) as loader:
            rows = [r for b in loader for r in rows_of(b)]
            ended_at = time.monotonic()
            assert loader.state == "completed"
    finally:
        timer.join()
        other.close()
    assert ended_at > released_at[0]
    assert sorted(rows) == [(f, i) for f in range(4) for i in range(3)]
    assert client.audit(job_name)["passes"][0]["done"] == 4


def test_cancelling_the_job_ends_the_iteration_at_once(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    chunks = write_jsonl(tmp_path, 20, 20)
    make_job(client, job_name, chunks)
    with _loader(url, job_name, 2) as loader:
        n = 0
        for _ in loader:
            n += 1
            if n == 2:
                client.cancel_job(job_name)
                cancelled_at = time.monotonic()
            time.sleep(0.02)
        assert loader.state == "cancelled"
        assert time.monotonic() - cancelled_at < 5.0
        assert n < 50  # of 100 batches: the rest was never delivered
        assert list(loader) == [] and loader.state == "cancelled"


def test_break_releases_what_was_held_and_the_next_iteration_finishes_the_pass(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """`break` in the second step (no task taken whole), then iterate again: nothing of
    the broken iteration was acked, its tasks went back at once with the progress of the
    step that finished (its rows do not come again, the broken step's rows do), the pass
    completes, and no feeder thread is left."""
    chunks = write_jsonl(tmp_path, 6, 8)
    make_job(client, job_name, chunks)
    with _loader(url, job_name, 2, batch_size=4) as loader:
        steps = []
        for n, batch in enumerate(loader):
            steps.append(rows_of(batch))
            if n == 1:
                break
        assert client.status(job_name).done == 0
        rest = [r for b in loader for r in rows_of(b)]  # the first iteration is closed here
        assert loader.state == "completed"
    assert not set(rest) & set(steps[0])
    assert set(steps[1]) <= set(rest)
    assert set(rest) | set(steps[0]) == {(f, i) for f in range(6) for i in range(8)}
    audit = client.audit(job_name)
    assert audit["ok"] and audit["passes"][0]["done"] == 6
    assert not [t for t in threading.enumerate() if t.name.startswith("taskq-feeder")]


def test_after_pause_and_resume_the_loader_reads_ahead_again(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """The job is paused during the pass and resumed 1 s later: the loader does not take
    the pause for the pass's tail (its workers go on, several tasks leased ahead at once
    after the resume, not one at a time), and the pass completes with every row once."""
    chunks = write_jsonl(tmp_path, 24, 8)
    make_job(client, job_name, chunks)
    rows: list[tuple[int, int]] = []
    held_after: list[int] = []
    resumed = threading.Event()

    def resume() -> None:
        client.resume_job(job_name)
        resumed.set()

    timer = threading.Timer(1.0, resume)
    with _loader(url, job_name, 2, batch_size=4) as loader:
        it = iter(loader)
        for n, batch in enumerate(it):
            rows += rows_of(batch)
            if n == 2:
                client.pause_job(job_name)
                timer.start()
            if resumed.is_set():
                held_after.append(it.feeder.held.count())
                assert it.feeder.phase == "feed" or client.status(job_name).todo == 0
            time.sleep(0.02)
        assert loader.state == "completed"
    timer.join()
    assert sorted(rows) == [(f, i) for f in range(24) for i in range(8)]
    assert held_after and max(held_after) >= 3, held_after


def test_a_trainer_added_when_todo_is_empty_takes_samples_in_that_pass(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """A loader (2 workers, a slow step) has leased every task of the pass, most of them
    read-ahead it has not begun; a trainer added then (todo empty) takes some of that
    read-ahead in the same pass (stolen, since it was reserved, not started) and reads
    it; the loader never reads what was taken from it: every row once in the pass."""
    chunks = write_jsonl(tmp_path, 12, 16)
    make_job(client, job_name, chunks)
    added_rows: list[tuple[int, int]] = []
    added_tasks: list[int] = []

    def added_trainer() -> None:
        with taskq.Trainer(job_name, url=url, handle_signals=False) as trainer:
            while True:
                try:
                    task = trainer.lease(timeout=1.0)
                except taskq.JobCompleted:
                    return
                if task is None:
                    return
                added_tasks.append(task.id)
                added_rows.extend((r["f"], r["i"]) for r in jsonl_reader(task.chunks, task.start))
                trainer.ack(task)

    rows: list[tuple[int, int]] = []
    thread = threading.Thread(target=added_trainer)
    with _loader(url, job_name, 2, batch_size=4, tasks_ahead=12, interleave=1) as loader:
        for batch in loader:
            rows += rows_of(batch)
            if thread.ident is None and client.status(job_name).todo == 0:
                thread.start()  # todo is empty: the loader holds every task
            time.sleep(0.03)
        assert loader.state == "completed"
    thread.join(10)
    assert added_tasks and added_rows, "the added trainer took nothing in the pass"
    assert sorted(rows + added_rows) == [(f, i) for f in range(12) for i in range(16)]
    assert client.status(job_name).counters["stolen"] >= 1  # reserved read-ahead
    audit = client.audit(job_name)
    assert audit["ok"] and audit["passes"][0]["done"] == 12


def test_local_pass_end_after_load_state_dict_does_not_wait_for_a_dead_peers_tasks(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """Two peers hold tasks when the run is restarted from a checkpoint: one dead (no
    heartbeats) and one stuck (heartbeats go on, as a rank blocked in a collective).
    After load_state_dict, a pass_end='local' loader reads every row the checkpoint left,
    theirs included, and ends within seconds, not after task_timeout (30 s) or
    worker_ttl (30 s); its next iteration ends the job."""
    chunks = write_jsonl(tmp_path, 8, 6)
    make_job(client, job_name, chunks, worker_ttl=30.0, task_timeout=30.0)
    first = taskq.Trainer(job_name, url=url, handle_signals=False)
    task = first.lease(timeout=2.0)
    assert task is not None
    first.ack(task)
    first.close()
    state = checkpoints.state_of(job_name, client.checkpoint(job_name))
    dead = taskq.Trainer(job_name, url=url, heartbeat=False, handle_signals=False)
    stuck = taskq.Trainer(job_name, url=url, handle_signals=False)
    held = [dead.lease(timeout=2.0), stuck.lease(timeout=2.0), stuck.lease(timeout=2.0)]
    assert all(held)
    began = time.monotonic()
    # (no worker processes: forking beside the stuck peer's heartbeat thread is not the point)
    with _loader(url, job_name, 0, pass_end="local") as loader:
        assert loader.load_state_dict(state, key="restart-1")
        rows = [r for b in loader for r in rows_of(b)]
        took = time.monotonic() - began
        assert sorted(rows) == [(f, i) for f in range(8) if f != task.id for i in range(6)]
        assert took < 10.0, took
        assert loader.state == "completed"
        assert list(loader) == []
    stuck.close()
    assert client.status(job_name).state == "completed"


def test_state_dict_counts_the_last_batch_even_when_the_feeder_collected_just_before(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """state_dict() right after a batch: the feeder thread may have taken the main
    thread's acks and progress a moment before the loop settled that batch and asked for
    the checkpoint. The checkpoint still counts the batch (its call takes what was asked
    first): restarted from it, no row taken before comes again and every other row does.
    The feeder is held in that moment here, to make the interleaving certain."""
    from taskq.torchdata.held import HeldTasks

    chunks = write_jsonl(tmp_path, 4, 6)
    make_job(client, job_name, chunks)
    armed = threading.Event()
    real_collect = HeldTasks.collect

    def collect(held: HeldTasks) -> list[Any]:
        got = real_collect(held)
        if armed.is_set():
            armed.clear()  # the main thread settles and asks now: wait for its call
            cur = loader.current
            assert cur is not None and wait_until(lambda: cur.feeder.calls_waiting > 0, 10.0)
        return got

    monkeypatch.setattr(HeldTasks, "collect", collect)
    with _loader(url, job_name, 0, shuffle=False, interleave=1) as loader:
        it = iter(loader)
        before = rows_of(next(it)) + rows_of(next(it)) + rows_of(next(it))
        armed.set()
        assert wait_until(lambda: not armed.is_set(), 10.0)  # the feeder waits in the gap
        state = loader.state_dict()
    with _loader(url, job_name, 0, shuffle=False, interleave=1) as second:
        assert second.load_state_dict(state, key="restart-1")
        rest = [r for b in second for r in rows_of(b)]
    assert not set(before) & set(rest), sorted(set(before) & set(rest))
    assert sorted(before + rest) == [(f, i) for f in range(4) for i in range(6)]


def test_a_splitting_job_whose_chunks_say_no_size_is_told_once(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Chunks of no taskq.data format (bare paths, a reader of one's own) have no size, so
    a job that splits tails never splits their tasks: a slow trainer reads its last ones
    alone. The loader says so once (two passes, one line naming the job and the way out);
    the same rows as Parquet chunks that say their rows get no such line."""
    caplog.set_level(logging.WARNING, logger="taskq")
    make_job(client, job_name, write_jsonl(tmp_path / "bare", 3, 5), passes=2)
    with _loader(url, job_name, 0) as loader:
        rows = [r for _ in range(2) for b in loader for r in rows_of(b)]
    assert len(rows) == 30 and loader.state == "completed"
    told = [r.getMessage() for r in caplog.records if "say no size" in r.getMessage()]
    assert len(told) == 1, told
    assert repr(job_name) in told[0] and "split_tails=False" in told[0]

    caplog.clear()
    sized_job = job_name + "-sized"
    files = []
    for f in range(3):
        path = tmp_path / f"part-{f}.parquet"
        pq.write_table(pa.table({"f": [f] * 5, "i": list(range(5))}), str(path))
        files.append((str(path), 0))
    chunks = taskq.data.reader_for({"format": "parquet"}).chunks(files)
    assert all(c["rows"] == 5 for c in chunks)
    make_job(client, sized_job, chunks)
    with _loader(url, sized_job, 0) as loader:
        assert len([r for b in loader for r in rows_of(b)]) == 15
    assert not [r for r in caplog.records if "say no size" in r.getMessage()]


@pytest.mark.parametrize("persistent", [False, True])
def test_close_leaves_no_task_queue_feeder_thread(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, persistent: bool
) -> None:
    """The task queue to the workers is a multiprocessing queue whose feeder thread lives in
    the training process; ``close()`` closes it, and the thread ends (one alive at the
    next fork, e.g. the next loader's workers, can leave its lock held in the child)."""
    make_job(client, job_name, write_jsonl(tmp_path, 4, 5))
    before = {t.ident for t in threading.enumerate()}
    extra = {"persistent_workers": True} if persistent else {}
    loader = _loader(url, job_name, 2, **extra)
    assert len([r for b in loader for r in rows_of(b)]) == 20
    loader.close()

    def left() -> list[str]:
        return [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]

    assert wait_until(lambda: "QueueFeederThread" not in left(), 10), left()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.parametrize("then", ["close", "iter"])
def test_close_returns_when_a_dead_worker_held_the_task_queues_read_lock(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, then: str
) -> None:
    """The worker of a stream job waits on the task queue for an append, holding the
    queue's read lock, and is SIGKILLed (as the OOM killer does): the lock stays taken.
    Five tasks appended then, each a 30 KiB chunk descriptor, are queued for it, more
    than the queue's pipe holds, with nobody left to read them. ``close()``, or a new
    ``iter()``, returns (a join of the queue's feeder thread would wait for ever on the
    full pipe), and every task is given back by the close."""
    client.create_job(job_name, write_jsonl(tmp_path, 1, 4), stream=True)
    loader = _loader(url, job_name, 1, batch_size=4)
    it = iter(loader)
    assert len(rows_of(next(it))) == 4
    # task 0 read to its end (counted as its reader goes back to the queue for the next)
    assert wait_until(lambda: sum(it.feed.finished) == 1, 10)
    worker = it.worker_pids[0]
    os.kill(worker, signal.SIGKILL)
    big = write_jsonl(tmp_path / "big", 5, 4)
    for chunk in big:
        chunk["pad"] = "x" * 30_000
    client.job(job_name).append(big)
    assert wait_until(lambda: it.feeder.held.count() >= 5, 30)
    closing = threading.Thread(target=loader.close if then == "close" else lambda: iter(loader))
    closing.daemon = True
    closing.start()
    closing.join(30)
    assert not closing.is_alive(), f"{then}() still waits on the task queue after 30 s"
    loader.close()
    st = client.status(job_name)
    assert (st.leased, st.todo + st.done) == (0, 6)
