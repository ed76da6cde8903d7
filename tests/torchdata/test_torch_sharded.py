"""taskq.torch over a sharded job, on a real local 3-master Redis Cluster: trainer
processes with real DataLoader workers read every sample once per pass, the loader's
state_dict / load_state_dict rewinds every shard, and the loader works the same on a
plain job and a 3-shard one."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import RedisClusterProcs, wait_until
from torch_helpers import gather, jsonl_reader, rows_of, write_jsonl

import taskq
import taskq.torch
from taskq.data import build_chunks

KINDS = ["plain", "sharded"]


@pytest.fixture(scope="module")
def curl(cluster: RedisClusterProcs) -> str:
    return str(cluster.url)


@pytest.fixture
def job_name(job_name: str) -> str:
    """A unique name short enough for a sharded job (its shards add a suffix)."""
    return job_name[:20] + job_name[-8:]


def _create(
    client: taskq.Client, name: str, chunks: list[dict[str, Any]], kind: str, **kw: Any
) -> None:
    kw.setdefault("worker_ttl", 2.0)
    kw.setdefault("heartbeat_interval", 0.3)
    client.create_job(name, chunks, shards=3 if kind == "sharded" else 1, **kw)


def _loader(url: str, job: str, num_workers: int, **kw: Any) -> taskq.torch.DataLoader:
    ds = taskq.torch.TaskDataset(
        job,
        url=url,
        reader=jsonl_reader,
        seed=3,
        shuffle=kw.pop("shuffle", True),
        interleave=kw.pop("interleave", 2),
    )
    return taskq.torch.DataLoader(ds, batch_size=4, num_workers=num_workers, **kw)


def _everything(files: int, lines: int) -> list[tuple[int, int]]:
    return sorted((f, i) for f in range(files) for i in range(lines))


def _trainer_proc(url: str, job: str, ready: Any, out: Any) -> None:
    """One trainer process: a loader with 2 workers for two passes; puts (rows of each
    pass, states after each, the tasks acked)."""
    try:
        with _loader(url, job, 2) as loader:
            passes, states = [], []
            ready.wait(20)  # both processes begin together (a fork may start late)
            for _ in range(2):
                rows: list[tuple[int, int]] = []
                for batch in loader:
                    rows += rows_of(batch)
                    time.sleep(0.01)  # a step: the processes share the tasks
                passes.append(rows)
                states.append(loader.state)
            out.put((passes, states, loader.counts["tasks_acked"]))
    except BaseException as e:  # the test names it
        out.put(repr(e))
        raise


def test_two_processes_by_two_workers_read_every_sample_once_per_pass(
    cclient: taskq.Client, curl: str, job_name: str, tmp_path: Path
) -> None:
    """2 trainer processes x 2 DataLoader workers over a 3-shard job, 2 passes: in each
    pass the two processes together read every row exactly once; each pass ends for
    both (the barrier), the second with the job completed; the audit shows every task
    done once per pass."""
    files, lines = 18, 12
    chunks = write_jsonl(tmp_path / "data", files, lines)
    _create(cclient, job_name, chunks, "sharded", passes=2)
    assert cclient.job(job_name).sharded
    ctx = multiprocessing.get_context("fork")
    out, ready = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_trainer_proc, args=(curl, job_name, ready, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = gather(procs, out, 40, "trainer")
    assert all(isinstance(r, tuple) for r in results), results
    for pass_no in range(2):
        rows = [row for passes, _, _ in results for row in passes[pass_no]]
        assert sorted(rows) == _everything(files, lines), f"pass {pass_no}"
    # both began together (a barrier): both took part in the first pass
    assert all(passes[0] for passes, _, _ in results), [len(p[0]) for p, _, _ in results]
    for _, states, _ in results:  # each saw the first pass end (the barrier) in time
        assert states == ["pass_complete", "completed"]
    assert sum(acked for _, _, acked in results) == 2 * files
    st = cclient.status(job_name)
    assert st.state == "completed"
    audit = cclient.audit(job_name)
    assert audit["ok"], audit["checks"]


@pytest.mark.parametrize("kind", KINDS)
def test_one_loader_reads_a_job_of_either_kind(
    cclient: taskq.Client, curl: str, job_name: str, tmp_path: Path, kind: str
) -> None:
    """The loader's happy path (2 workers, two passes) is the same on a plain job and a
    3-shard one: every row once per pass, "pass_complete" then "completed"; the sharded
    trainer behind it takes its leases over the shards (``Trainer.sharded``)."""
    files, lines = 6, 10
    chunks = write_jsonl(tmp_path / "data", files, lines)
    _create(cclient, job_name, chunks, kind, passes=2)
    with _loader(curl, job_name, 2) as loader:
        epochs, states, kinds = [], [], []
        for _ in range(2):
            rows: list[tuple[int, int]] = []
            for batch in loader:
                rows += rows_of(batch)
                cur = loader.current
                if cur is not None and cur.feeder.trainer is not None:
                    kinds.append(cur.feeder.trainer.sharded)
            epochs.append(sorted(rows))
            states.append(loader.state)
        assert list(loader) == []
    assert epochs == [_everything(files, lines)] * 2
    assert states == ["pass_complete", "completed"]
    assert set(kinds) == {kind == "sharded"}
    assert loader.counts["tasks_acked"] == 2 * files
    audit = cclient.audit(job_name)
    assert audit["ok"], audit["checks"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_samples_figure_sums_a_jobs_shards(
    cclient: taskq.Client, curl: str, job_name: str, tmp_path: Path, kind: str
) -> None:
    """``job.samples()`` on the cluster (chunks of 10 records, 6 tasks): 0 of 60 at
    first; a trainer acks 2 tasks (of whichever shards): 20 of 60; the loader's
    ``progress()`` reads the pass's end as 60 of 60."""
    write_jsonl(tmp_path / "data", 6, 10)
    chunks = build_chunks(str(tmp_path / "data" / "*.jsonl"), records_per_chunk=10)
    _create(cclient, job_name, chunks, kind)
    job = cclient.job(job_name)
    assert job.samples() == (0, 60)
    with taskq.Trainer(job_name, url=curl) as trainer:
        for _ in range(2):
            task = trainer.lease(timeout=5)
            assert task is not None
            trainer.ack(task)
    assert job.samples() == (20, 60)
    ds = taskq.torch.TaskDataset(job_name, url=curl)
    with taskq.torch.DataLoader(ds, batch_size=5) as loader:
        assert sum(len(b["i"]) for b in loader) == 40
        end = loader.progress()
    assert (end.samples_done, end.samples_total) == (60, 60)


@pytest.mark.parametrize("kind", KINDS)
def test_load_state_dict_rewinds_the_job_once(
    cclient: taskq.Client, curl: str, job_name: str, tmp_path: Path, kind: str
) -> None:
    """A loader's state_dict mid-pass and a new loader's load_state_dict (a restart) put
    the job (every shard of a sharded one) back to that point: the rows the loop took
    after the checkpoint come again, those before do not; a second loader loading the
    same state under the same key does not rewind again."""
    files, lines = 9, 6
    chunks = write_jsonl(tmp_path / "data", files, lines)
    _create(cclient, job_name, chunks, kind, passes=1)
    before: list[tuple[int, int]] = []
    after: list[tuple[int, int]] = []
    with _loader(curl, job_name, 0, shuffle=False) as loader:
        it = iter(loader)
        for _ in range(5):
            before += rows_of(next(it))
        state = loader.state_dict()
        for _ in range(4):
            after += rows_of(next(it))
    assert state["job"] == job_name
    with (
        _loader(curl, job_name, 0, shuffle=False) as second,
        _loader(curl, job_name, 0, shuffle=False) as third,
    ):
        assert second.load_state_dict(state, key="restart-1") is True
        assert third.load_state_dict(state, key="restart-1") is False
        rest: list[tuple[int, int]] = []
        for batch in second:
            rest += rows_of(batch)
        assert second.state == "completed"
    # nothing the checkpoint counted comes again; everything else does, once
    assert not set(before) & set(rest)
    assert sorted(before + rest) == _everything(files, lines)
    assert set(after) <= set(rest)
    if kind == "sharded":
        assert cclient.status(job_name).state == "completed"


def test_sharded_lease_many_starts_acks_and_expects_a_pass(
    cclient: taskq.Client, job_name: str
) -> None:
    """A sharded job's ``Trainer.lease_many`` as the feeder calls it: reserved tasks (not
    started) from home, then the other shards'; ``n=0`` calls that only start or only
    ack, each on the task's shard; ``expect_pass=0`` gives [] once pass 0 is over on
    every shard, and ``expect_pass=1`` then the next pass's tasks (the barrier step run)."""
    _create(cclient, job_name, [{"i": i} for i in range(6)], "sharded", passes=2)
    with taskq.Trainer(job_name, client=cclient, heartbeat=False, home=0) as tr:
        assert tr.sharded
        got: list[taskq.Task] = []
        while len(got) < 6:
            more = tr.lease_many(6, timeout=2, expect_pass=0, reserve=True)
            assert more, got
            got += more
        assert {t.job for t in got} == set(tr.shards)
        assert not any(t.started for t in got)
        assert sorted(tr.global_id(t) for t in got) == list(range(6))
        assert tr.lease_many(0, timeout=0, expect_pass=0, starts=got) == []
        assert all(t.started and not t.revoked.is_set() for t in got)
        assert cclient.status(job_name).leased == 6
        with pytest.raises(taskq.InvalidInput):
            tr.lease_many(0, timeout=0)
        assert tr.lease_many(0, timeout=0, expect_pass=0, acks=got) == []
        assert tr.held == []
        assert cclient.status(job_name).done == 6
        t0 = time.monotonic()
        assert tr.lease_many(4, timeout=5, expect_pass=0) == []
        assert time.monotonic() - t0 < 4  # the pass is over: no wait for the timeout
        nxt = tr.lease_many(6, timeout=5, expect_pass=1)
        assert nxt and all(t.pass_no == 1 and t.started for t in nxt)
        assert cclient.status(job_name).pass_no == 1
        t0 = time.monotonic()  # a caller still expecting pass 0 is told at once
        assert tr.lease_many(1, timeout=5, expect_pass=0) == []
        assert time.monotonic() - t0 < 4
        tr.release(nxt)


@pytest.mark.parametrize("kind", KINDS)
def test_a_trainer_added_when_todo_is_empty_takes_read_ahead(
    cclient: taskq.Client, curl: str, job_name: str, tmp_path: Path, kind: str
) -> None:
    """A loader has leased every task of the pass, most of it reserved read-ahead; a
    trainer added then (todo empty on every shard) takes some of it (the server's steal,
    on whichever shard it is) and the loader never reads what was taken: every row once."""
    files, lines = 12, 12
    _create(cclient, job_name, write_jsonl(tmp_path / "data", files, lines), kind)
    added_rows: list[tuple[int, int]] = []

    def added_trainer() -> None:
        with taskq.Trainer(job_name, url=curl, handle_signals=False) as trainer:
            while True:
                try:
                    task = trainer.lease(timeout=1.0)
                except taskq.JobCompleted:
                    return
                if task is None:
                    return
                added_rows.extend((r["f"], r["i"]) for r in jsonl_reader(task.chunks, task.start))
                trainer.ack(task)

    rows: list[tuple[int, int]] = []
    thread = threading.Thread(target=added_trainer)
    with _loader(curl, job_name, 2, tasks_ahead=12, interleave=1) as loader:
        for batch in loader:
            rows += rows_of(batch)
            if thread.ident is None and cclient.status(job_name).todo == 0:
                thread.start()  # todo is empty: the loader holds every task
            time.sleep(0.03)
        assert loader.state == "completed"
    thread.join(10)
    assert added_rows, "the added trainer took nothing in the pass"
    assert sorted(rows + added_rows) == _everything(files, lines)
    assert cclient.status(job_name).counters["stolen"] >= 1  # reserved read-ahead
    audit = cclient.audit(job_name)
    assert audit["ok"], audit["checks"]


@pytest.mark.parametrize("kind", KINDS)
def test_acks_commit_holds_until_commit(
    cclient: taskq.Client, curl: str, job_name: str, tmp_path: Path, kind: str
) -> None:
    """acks="commit" on either kind: nothing is acked until ``commit()``; committing every
    few batches, the pass has every row once and every task done once."""
    files, lines = 6, 8
    _create(cclient, job_name, write_jsonl(tmp_path / "data", files, lines), kind)
    rows: list[tuple[int, int]] = []
    with _loader(curl, job_name, 2, acks="commit") as loader:
        for k, batch in enumerate(loader):
            rows += rows_of(batch)
            if k == 3:
                assert cclient.status(job_name).done == 0  # nothing committed yet
            if k % 4 == 3:
                loader.commit()
        loader.commit()
        assert loader.state == "completed"
    assert sorted(rows) == _everything(files, lines)
    st = cclient.status(job_name)
    assert (st.state, st.done) == ("completed", files)


@pytest.mark.parametrize("kind,commit_every", [("plain", 3), ("sharded", 0), ("sharded", 3)])
def test_a_loaders_task_split_on_either_kind_with_either_acks(
    cclient: taskq.Client, curl: str, job_name: str, tmp_path: Path, kind: str, commit_every: int
) -> None:
    """Tail splitting where it meets sharding and acks="commit": a loader (one worker,
    reading ahead) holds a long task of a job of either kind (and two of one sample, so
    three shards have a task), an idle plain Trainer joins when the loop took 20 samples
    and is given the long task's unread end; with acks="commit" the loader's head is
    acked at a commit. Every sample once across the two, the split counted, the job
    completed and its audit clean. (The plain job with the loader's default acks:
    tests/torchdata/test_torch_split.py.) The loop takes 4 samples a 0.1 s step: when
    the long task is not on the idle trainer's home shard, it first steals a task of one
    sample and reaches the long task's shard through its idle rounds (its split then
    came 14-38 samples later than from home, its piece leased 0.9-1.7 s after the
    split, against 0.16-0.19 s; the same on the tree before the loader's one table): at
    0.05 s a step the loop could read the whole task first under load."""
    from test_torch_split import IdleTrainer, run_loader

    sizes = [160, 1, 1]
    chunks, base = [], 0
    for f, n in enumerate(sizes):
        path = tmp_path / f"{f}.jsonl"
        path.write_text("".join(json.dumps({"i": base + k}) + "\n" for k in range(n)))
        size = path.stat().st_size
        chunks.append(
            {"format": "jsonl", "path": str(path), "offset": 0, "length": size, "samples": n}
        )
        base += n
    _create(cclient, job_name, chunks, kind, task_timeout=None, split_tails=True)
    idle = IdleTrainer(curl, job_name)
    got, _, _ = run_loader(curl, job_name, idle, go_at=20, step_s=0.1, commit_every=commit_every)
    both = Counter(got) + Counter(idle.ids)
    assert sorted(both) == list(range(base))
    assert set(both.values()) == {1}, "a sample delivered twice"
    assert [i for i in idle.ids if i < sizes[0]], f"no piece of the long task: {idle.pieces}"
    wait_until(lambda: cclient.status(job_name, summaries=0).state == "completed", 10)
    assert cclient.status(job_name, summaries=0).counters["splits"] >= 1
    audit = cclient.audit(job_name)
    assert audit["ok"], audit["checks"]
