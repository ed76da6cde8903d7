"""DDP over a taskq job: 2 ranks of real DistributedDataParallel on gloo, 2 passes,
uneven steps per rank kept aligned by torch.distributed.algorithms.Join; relaunches under
torchrun's default environment, each rewinding to the checkpoint."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from torch_helpers import ddp_rank, gather, jsonl_reader, make_job, restart_rank, write_jsonl

import taskq
import taskq.torch
from taskq.admin import checkpoints


@pytest.mark.parametrize("even", [False, True], ids=["join", "even_steps"])
def test_two_ddp_ranks_two_passes_with_join(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, even: bool
) -> None:
    """Neither rank hangs at a pass end (bounded joins; or ``even_steps``: the rank out
    first steps on padding, so both step equally often), every row is read once per pass
    by exactly one rank, the ranks end with the same weights, and the audit shows every
    task acked once in each pass."""
    sizes = [5, 9, 3, 12, 7, 4, 10, 6]
    chunks = write_jsonl(tmp_path / "data", len(sizes), sizes)
    make_job(client, job_name, chunks, passes=2)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    init = str(tmp_path / "dist-init")
    procs = [
        ctx.Process(target=ddp_rank, args=(r, 2, url, job_name, init, out, even)) for r in range(2)
    ]
    for p in procs:
        p.start()
    results = {rank: rest for rank, *rest in gather(procs, out, 60, "rank")}
    everything = sorted((f, i) for f, n in enumerate(sizes) for i in range(n))
    for pass_no in range(2):
        rows = results[0][1][pass_no] + results[1][1][pass_no]
        assert sorted(rows) == everything  # (a rank may get no task: Join covers that too)
    if even:
        assert results[0][0] == results[1][0], "even_steps: as many steps on each rank"
    else:
        assert results[0][0] != results[1][0], "the ranks took as many steps: nothing to align"
    for rank in (0, 1):  # pass_end="local"; the job completed after the last pass
        assert results[rank][2][0] == "exhausted" and results[rank][2][2] == "completed"
    assert results[0][3] == results[1][3]
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]
    assert [(p["pass"], p["done"], p["stale"]) for p in audit["passes"]] == [
        (0, len(sizes), 0),
        (1, len(sizes), 0),
    ]
    assert audit["state"] == "completed"


def _launch(url: str, job: str, init: str, state: dict[str, Any], steps: int | None) -> list[Any]:
    """One torchrun-like launch of 2 ranks; their (rank, rewound, rows), by rank."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=restart_rank, args=(r, 2, url, job, init, state, steps, out))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    return sorted(gather(procs, out, 60, "rank"))


def test_two_relaunches_under_torchruns_default_environment_both_rewind(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """A checkpoint with 2 of 8 tasks done; two launches of 2 ranks each, both with
    TORCHELASTIC_RUN_ID=none and TORCHELASTIC_RESTART_COUNT=0 (plain torchrun, no
    --rdzv-id), load the state with the default key. The first takes 2 batches per rank
    (acked) and ends; the second still rewinds (its key is its own: rank 0 made it and
    broadcast it), once for its two ranks, and reads exactly what the checkpoint left."""
    chunks = write_jsonl(tmp_path / "data", 8, 12)
    make_job(client, job_name, chunks)
    with taskq.Trainer(job_name, url=url) as trainer:
        for _ in range(2):
            task = trainer.lease(timeout=2.0)
            assert task is not None
            trainer.ack(task)
        done = {t["id"] for t in client.tasks(job_name, "done")}
    state = checkpoints.state_of(job_name, client.checkpoint(job_name))
    left = sorted((f, i) for f in range(8) if f not in done for i in range(12))
    first = _launch(url, job_name, str(tmp_path / "init-1"), state, steps=2)
    assert [r[1] for r in first].count(True) == 1
    assert client.status(job_name).done >= 1  # the first launch acked work
    second = _launch(url, job_name, str(tmp_path / "init-2"), state, steps=None)
    assert [r[1] for r in second].count(True) == 1, "the second launch did not rewind"
    assert sorted(second[0][2] + second[1][2]) == left
    assert len(client.latest_events(job_name, "rewind_started", 10, 100000)) == 2
    assert client.status(job_name).state == "completed"


def test_load_state_dict_under_torchrun_without_a_process_group_is_refused(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, monkeypatch: Any
) -> None:
    """torchrun's variables alone cannot name a launch: no key given and no process
    group is a clear error, and the job is not rewound."""
    make_job(client, job_name, write_jsonl(tmp_path / "data", 2, 3))
    state = checkpoints.state_of(job_name, client.checkpoint(job_name))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    ds = taskq.torch.TaskDataset(job_name, url=url, reader=jsonl_reader)
    with taskq.torch.DataLoader(ds) as loader:
        with pytest.raises(taskq.InvalidInput, match="init_process_group"):
            loader.load_state_dict(state)
        assert loader.load_state_dict(state, key="attempt-7")
    assert len(client.latest_events(job_name, "rewind_started", 10, 100000)) == 1


def _failing_rank(rank: int, url: str, job: str, init: str, out: Any, weighs: bool = True) -> None:
    """A gloo rank over an ``even_steps`` loader with ``on_error="raise"``: puts (rank,
    the name of what its loop raised, steps) on ``out``. ``weighs``: the loop reads
    ``loader.loss_weight`` each step (as it weighs its loss by it)."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{init}", rank=rank, world_size=2, timeout=timedelta(seconds=30)
    )
    ds = taskq.torch.TaskDataset(job, url=url, reader=jsonl_reader)
    raised, steps = "nothing", 0
    with taskq.torch.DataLoader(
        ds, batch_size=2, pass_end="local", even_steps=True, on_error="raise"
    ) as loader:
        try:
            for _ in loader:
                if weighs:
                    assert loader.loss_weight in (0.0, 1.0)  # loss * loader.loss_weight
                steps += 1
        except taskq.TaskqError as e:
            raised = type(e).__name__
    out.put((rank, raised, steps))
    dist.destroy_process_group()


def test_even_steps_a_rank_whose_loader_raises_stops_the_other_at_the_same_step(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """``even_steps`` with ``on_error="raise"``: the rank that reads a corrupt row raises
    ``CorruptData``; the other raises ``TaskqError`` at the same call instead of waiting
    in the next allreduce for a rank that left (both processes end)."""
    chunks = write_jsonl(tmp_path / "data", 4, 6)
    Path(chunks[2]["path"]).write_text('{"f": 2, "i": 0}\nnot json\n')
    make_job(client, job_name, chunks, passes=1)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    init = str(tmp_path / "dist-init")
    procs = [ctx.Process(target=_failing_rank, args=(r, url, job_name, init, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = {rank: rest for rank, *rest in gather(procs, out, 60, "rank")}
    assert sorted(r[0] for r in results.values()) == ["CorruptData", "TaskqError"], results
    assert results[0][1] == results[1][1], "both stopped at the same step"


def test_even_steps_in_a_loop_that_never_weighs_its_loss_is_refused_on_every_rank(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """A plain DDP loop with ``even_steps=True`` that never reads ``loader.loss_weight``
    (nor ``batch_is_padding``) would train a padding batch (a repeat) again: every rank
    refuses at the call after its first step (``InvalidInput``), at the same step, before
    any padding; no rank waits for another."""
    make_job(client, job_name, write_jsonl(tmp_path / "data", 4, 6), passes=1)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    init = str(tmp_path / "dist-init")
    procs = [
        ctx.Process(target=_failing_rank, args=(r, url, job_name, init, out, False)) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    results = {rank: rest for rank, *rest in gather(procs, out, 60, "rank")}
    assert results == {0: ["InvalidInput", 1], 1: ["InvalidInput", 1]}, results
    assert client.status(job_name).leased == 0


def _unflagged_rank(rank: int, url: str, job: str, init: str, out: Any) -> None:
    """A gloo rank whose loader is made with no flags, iterated in a loop of its own: puts
    (rank, what iter() raised, its text) on ``out``."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{init}", rank=rank, world_size=2, timeout=timedelta(seconds=30)
    )
    ds = taskq.torch.TaskDataset(job, url=url, reader=jsonl_reader)
    raised, text = "nothing", ""
    with taskq.torch.DataLoader(ds, batch_size=2) as loader:
        try:
            for _ in loader:
                pass
        except taskq.TaskqError as e:
            raised, text = type(e).__name__, str(e)
    out.put((rank, raised, text))
    dist.destroy_process_group()


def test_a_loop_of_several_ranks_without_flags_is_refused_at_iter(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """2 gloo ranks, a ``DataLoader(ds, batch_size=2)`` with neither ``even_steps`` nor
    ``pass_end`` and no framework: each rank would take the batches it leases, and under
    DDP the rank with more would wait in backward for ever. Both refuse at ``iter()`` with
    one line naming the flags, before any lease."""
    make_job(client, job_name, write_jsonl(tmp_path / "data", 4, 6), passes=1)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    init = str(tmp_path / "dist-init")
    procs = [
        ctx.Process(target=_unflagged_rank, args=(r, url, job_name, init, out)) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    results = {rank: rest for rank, *rest in gather(procs, out, 60, "rank")}
    for raised, text in results.values():
        assert raised == "InvalidInput", results
        assert "\n" not in text and "even_steps=True" in text and 'pass_end="local"' in text
    st = client.status(job_name)
    assert st.leased == 0 and st.counters.get("leased", 0) == 0
