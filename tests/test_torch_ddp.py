"""DDP over a taskq job: 2 ranks of real DistributedDataParallel on gloo, 2 passes,
uneven steps per rank kept aligned by torch.distributed.algorithms.Join."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from torch_helpers import ddp_rank, gather, make_job, write_jsonl

import taskq


def test_two_ddp_ranks_two_passes_with_join(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """Neither rank hangs at a pass end (bounded joins), every row is read once per pass
    by exactly one rank, the ranks end with the same weights, and the audit shows every
    task acked once in each pass."""
    sizes = [5, 9, 3, 12, 7, 4, 10, 6]
    chunks = write_jsonl(tmp_path / "data", len(sizes), sizes)
    make_job(client, job_name, chunks, passes=2)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    init = str(tmp_path / "dist-init")
    procs = [ctx.Process(target=ddp_rank, args=(r, 2, url, job_name, init, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = {rank: rest for rank, *rest in gather(procs, out, 60, "rank")}
    everything = sorted((f, i) for f, n in enumerate(sizes) for i in range(n))
    for pass_no in range(2):
        rows = results[0][1][pass_no] + results[1][1][pass_no]
        assert sorted(rows) == everything  # (a rank may get no task: Join covers that too)
    assert results[0][0] != results[1][0], "the ranks took as many steps: nothing to align"
    assert results[0][3] == results[1][3]
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]
    assert [(p["pass"], p["done"], p["stale"]) for p in audit["passes"]] == [
        (0, len(sizes), 0),
        (1, len(sizes), 0),
    ]
    assert audit["state"] == "completed"
