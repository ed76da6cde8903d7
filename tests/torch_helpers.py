"""Shared by the taskq.torch tests: real JSONL files and a reader over them."""

from __future__ import annotations

import argparse
import json
import queue
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import taskq


def dump_if_hung(seconds: float = 90.0, exit: bool = True) -> None:
    """In a test's training process: if it is still running after ``seconds``, print
    every thread's stack to stderr and exit 1 (the test then shows where it hung instead
    of its own timeout). ``exit=False``: print them and go on (a process whose test
    allows it longer: the stacks are in the test's output if it then fails)."""
    import faulthandler

    faulthandler.dump_traceback_later(seconds, exit=exit)


#: a rank still running this long prints its stacks (``gather`` waits 60 s for a result)
_RANK_STACKS_S = 50.0


def framework_args() -> argparse.ArgumentParser:
    """The arguments every framework process (tests/*_proc.py run by
    tests/frameworks/test_frameworks.py) takes: ``URL JOB LOG_DIR``, ``--every K``
    (checkpoint every K steps), ``--kill-at S`` (SIGKILL on entering step S) and
    ``--resume CKPT``; a process adds its own after them."""
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("job")
    ap.add_argument("log_dir")
    ap.add_argument("--every", type=int)
    ap.add_argument("--kill-at", type=int)
    ap.add_argument("--resume")
    return ap


def write_jsonl(directory: Path, files: int, lines: int | list[int]) -> list[dict[str, Any]]:
    """``files`` JSONL files of ``{"f": file, "i": line}`` rows; their chunk descriptors."""
    directory.mkdir(parents=True, exist_ok=True)
    chunks = []
    for f in range(files):
        n = lines[f] if isinstance(lines, list) else lines
        path = directory / f"part-{f:04d}.jsonl"
        path.write_text("".join(json.dumps({"f": f, "i": i}) + "\n" for i in range(n)))
        chunks.append({"path": str(path), "n": n})
    return chunks


def jsonl_reader(chunks: list[dict[str, Any]], start: int) -> Iterator[dict[str, int]]:
    """Rows of a task's files, from row ``start`` (module level: picklable for spawn).
    JSONL by default; ``"format": "parquet"`` (pyarrow) or ``"tar"`` (JSONL members)."""
    k = 0
    for chunk in chunks:
        for row in _rows(chunk):
            if k >= start:
                yield row
            k += 1


def _rows(chunk: dict[str, Any]) -> Iterator[dict[str, int]]:
    fmt = chunk.get("format", "jsonl")
    if fmt == "parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(chunk["path"]).iter_batches():
            yield from batch.to_pylist()
    elif fmt == "tar":
        import tarfile

        with tarfile.open(chunk["path"]) as tar:
            for member in tar:
                f = tar.extractfile(member)
                if f is not None:
                    yield from (json.loads(line) for line in f.read().splitlines())
    else:
        with open(chunk["path"]) as f:
            yield from (json.loads(line) for line in f)


def make_job(client: taskq.Client, name: str, chunks: list[dict[str, Any]], **kw: Any) -> None:
    kw.setdefault("worker_ttl", 2.0)
    kw.setdefault("heartbeat_interval", 0.3)
    client.create_job(name, chunks, **kw)


def rows_of(batch: dict[str, Any]) -> list[tuple[int, int]]:
    """The (file, line) pairs of a default-collated batch."""
    return list(zip(batch["f"].tolist(), batch["i"].tolist(), strict=True))


def per_file(rows: list[tuple[int, int]]) -> Counter[int]:
    return Counter(f for f, _ in rows)


def ddp_rank(
    rank: int, world: int, url: str, job: str, init_file: str, out: Any, even: bool = False
) -> None:
    """One DDP rank (gloo): a tiny model over a taskq.torch loader for two passes, steps
    kept aligned by ``Join`` (``even``: by ``even_steps=True``, a padding batch's loss
    x 0); puts (rank, steps per pass, rows per pass, states: after each pass and once all
    ranks are done, weights) on ``out``."""
    import contextlib
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms import Join
    from torch.nn.parallel import DistributedDataParallel

    import taskq.torch

    dump_if_hung(_RANK_STACKS_S, exit=False)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=30),
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = taskq.torch.TaskDataset(job, url=url, reader=jsonl_reader, seed=rank)
    steps, rows, states = [], [], []
    with taskq.torch.DataLoader(
        ds, batch_size=4, num_workers=1, pass_end="local", tasks_ahead=2, even_steps=even
    ) as loader:
        for _ in range(2):
            n, got = 0, []
            with contextlib.nullcontext() if even else Join([model]):
                for batch in loader:
                    x = batch["i"].float().unsqueeze(1)
                    loss = model(x).pow(2).mean()
                    (loss * 0 if loader.batch_is_padding else loss).backward()
                    opt.step()
                    opt.zero_grad()
                    if not loader.batch_is_padding:
                        got += rows_of(batch)
                    n += 1
                    time.sleep(0.05 if rank == 0 else 0.0)  # ranks of different speeds
            steps.append(n)
            rows.append(got)
            states.append(loader.state)
        dist.barrier()  # every rank is past the last pass: the job is completed
        states.append(loader.state)
    # the same weights everywhere: every step was an allreduce of all ranks (or a shadow)
    weight = [p.detach().flatten().tolist() for p in model.parameters()]
    out.put((rank, steps, rows, states, weight))
    dist.destroy_process_group()


def gather(procs: list[Any], out: Any, timeout: float, who: str) -> list[Any]:
    """One result per process from ``out``; fails naming the hung ``who`` (rank,
    trainer) and reaps every process (killing those still alive after 10 s)."""
    results: list[Any] = []
    try:
        for _ in procs:
            results.append(out.get(timeout=timeout))
    except queue.Empty:
        raise AssertionError(f"a {who} hung; got {len(results)} of {len(procs)}") from None
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return results


def restart_rank(
    rank: int,
    world: int,
    url: str,
    job: str,
    init_file: str,
    state: dict[str, Any],
    steps: int | None,
    out: Any,
) -> None:
    """One rank of a relaunch under torchrun's default environment (no ``--rdzv-id``:
    ``TORCHELASTIC_RUN_ID=none``, ``TORCHELASTIC_RESTART_COUNT=0`` on every launch): a
    gloo process group, ``loader.load_state_dict(state)`` with the default key, then
    ``steps`` batches (all of the pass if None), synced; puts (rank, rewound, rows) on
    ``out``."""
    import os
    from datetime import timedelta

    import torch.distributed as dist

    import taskq.torch

    os.environ.update(
        TORCHELASTIC_RUN_ID="none",
        TORCHELASTIC_RESTART_COUNT="0",
        RANK=str(rank),
        WORLD_SIZE=str(world),
    )
    dump_if_hung(_RANK_STACKS_S, exit=False)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=30),
    )
    ds = taskq.torch.TaskDataset(job, url=url, reader=jsonl_reader, shuffle=False)
    rows: list[tuple[int, int]] = []
    # the ranks do not step together (no DDP): said, or iter() refuses (frameworks.py)
    with taskq.torch.DataLoader(
        ds, batch_size=4, num_workers=1, tasks_ahead=2, pass_end="global"
    ) as loader:
        rewound = loader.load_state_dict(state)
        for n, batch in enumerate(loader, 1):
            rows += rows_of(batch)
            if steps is not None and n == steps:
                loader.sync()  # acked and recorded: a rewind that is skipped loses it
                break
    out.put((rank, rewound, rows))
    dist.destroy_process_group()
