"""The whole data path with nothing written by hand: chunks built by ``taskq.data`` from
real Parquet, JSONL and tar files, read by the default reader inside real DataLoader
worker processes, acked by ``taskq.torch.DataLoader`` as the loop takes the samples."""

from __future__ import annotations

import io
import json
import tarfile
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import taskq
import taskq.torch
from taskq import data

pytestmark = pytest.mark.slow


def _parquet(tmp_path: Path, files: int, rows: int) -> list[int]:
    values = []
    for f in range(files):
        xs = list(range(f * rows, (f + 1) * rows))
        pq.write_table(
            pa.table({"x": xs, "y": [v * 0.5 for v in xs]}),
            tmp_path / f"part-{f}.parquet",
            row_group_size=25,
        )
        values += xs
    return values


def _jsonl(tmp_path: Path, files: int, rows: int) -> list[int]:
    values = []
    for f in range(files):
        xs = list(range(f * rows, (f + 1) * rows))
        (tmp_path / f"part-{f}.jsonl").write_text("".join(json.dumps({"x": v}) + "\n" for v in xs))
        values += xs
    return values


def _tar(tmp_path: Path, shards: int, samples: int) -> list[int]:
    values = []
    for s in range(shards):
        with tarfile.open(tmp_path / f"shard-{s}.tar", "w") as tar:
            for i in range(samples):
                v = s * samples + i
                for ext, payload in (
                    ("json", json.dumps({"x": v}).encode()),
                    ("txt", f"sample {v}".encode()),
                ):
                    info = tarfile.TarInfo(f"s{v:06d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        values += [s * samples + i for i in range(samples)]
    return values


def _x_of_tar(sample: dict) -> dict:
    return {"x": json.loads(sample["json"])["x"]}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "tar"])
def test_every_sample_of_built_chunks_reaches_the_loop_once_per_pass(
    fmt: str, client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    if fmt == "parquet":
        values = _parquet(tmp_path, files=3, rows=100)
        chunks = data.build_chunks(str(tmp_path / "*.parquet"), row_groups_per_chunk=2)
        transform = None
    elif fmt == "jsonl":
        values = _jsonl(tmp_path, files=3, rows=100)
        chunks = data.build_chunks(str(tmp_path / "*.jsonl"), chunk_bytes=1024)
        transform = None
    else:
        values = _tar(tmp_path, shards=3, samples=40)
        chunks = data.build_chunks(str(tmp_path / "*.tar"), records_per_chunk=10)
        transform = _x_of_tar
    assert all(c["format"] == fmt for c in chunks) and len(chunks) > 3
    client.create_job(job_name, chunks, passes=2, worker_ttl=2.0, heartbeat_interval=0.3)
    ds = taskq.torch.TaskDataset(job_name, transform=transform, url=url, seed=7)
    with taskq.torch.DataLoader(ds, batch_size=16, num_workers=2) as loader:
        states = []
        for _ in range(2):
            seen: Counter[int] = Counter()
            for batch in loader:
                seen.update(int(v) for v in batch["x"])
            states.append(loader.state)
            assert seen == Counter(values)  # each sample once in the pass, none missing
    assert states == ["pass_complete", "completed"]
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]
    assert [p["done"] for p in audit["passes"]] == [len(chunks), len(chunks)]
    assert all(not p["stale"] for p in audit["passes"])
