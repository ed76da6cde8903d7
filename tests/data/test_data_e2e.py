"""From files to samples through a real job: chunks built by taskq.data, leased by a
Trainer, read with ``read_task(task.chunks)``; bad data fails its task with the reader's
error text, the task ends dead at max_failures and the pass completes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from data_files import shard_samples, write_parquet, write_shard
from taskq.cli.main import cli

import taskq
from taskq import data
from taskq.errors import DataError


def test_every_parquet_row_exactly_once_through_a_job(
    client: taskq.Client, job_name: str, tmp_path: Path
) -> None:
    for i in range(4):
        write_parquet(tmp_path / f"part-{i}.parquet", rows=250, row_group_size=40, start=i * 250)
    chunks = data.build_chunks(str(tmp_path / "*.parquet"), row_groups_per_chunk=2)
    client.create_job(job_name, chunks, chunks_per_task=3, shuffle=True, seed=5)
    seen: Counter[int] = Counter()
    with taskq.Trainer(job_name, client=client, prefetch=1) as trainer:
        for task in trainer:
            seen.update(row["i"] for row in data.read_task(task.chunks, columns=["i"]))
    assert seen == Counter(range(1000))
    st = client.status(job_name)
    assert st.state == "completed" and st.dead == 0


def test_resuming_a_task_at_start_gives_the_rest_of_it(
    client: taskq.Client, job_name: str, tmp_path: Path
) -> None:
    """A task read part-way, released, then read again from the index reached: the two
    reads together give every sample of the task once."""
    write_shard(tmp_path / "s.tar", shard_samples(20))
    client.create_job(
        job_name, data.build_chunks(str(tmp_path / "s.tar"), records_per_chunk=3), chunks_per_task=7
    )
    with taskq.Trainer(job_name, client=client, heartbeat=False) as trainer:
        task = trainer.lease(timeout=0)
        assert task is not None
        first = []
        for sample in data.read_task(task.chunks):
            first.append(sample["__key__"])
            if len(first) == 8:
                break
        rest = [s["__key__"] for s in data.read_task(task.chunks, start=len(first))]
        trainer.ack(task)
    assert first + rest == [f"s{i:05d}" for i in range(20)]


def corrupt_parquet(tmp_path: Path) -> tuple[list[dict], str]:
    paths = [
        write_parquet(tmp_path / f"p{i}.parquet", rows=30, row_group_size=30, start=i * 30)
        for i in range(4)
    ]
    chunks = data.build_chunks(str(tmp_path / "*.parquet"))
    raw = bytearray(Path(paths[2]).read_bytes())
    footer = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")
    raw[4:footer] = bytes((i * 131 + 7) % 256 for i in range(footer - 4))
    Path(paths[2]).write_bytes(bytes(raw))
    return chunks, f"{paths[2]}: row group 0: "


def truncated_tar(tmp_path: Path) -> tuple[list[dict], str]:
    paths = [write_shard(tmp_path / f"s{i}.tar", shard_samples(4, first=i * 4)) for i in range(4)]
    chunks = data.build_chunks(str(tmp_path / "*.tar"))
    raw = Path(paths[2]).read_bytes()
    Path(paths[2]).write_bytes(raw[: 512 * 5 + 3])  # inside the 3rd member's data
    return chunks, f"{paths[2]}: member "


def unreadable_jsonl(tmp_path: Path) -> tuple[list[dict], str]:
    for i in range(4):
        (tmp_path / f"j{i}.jsonl").write_text(f'{{"i": {i}}}\n')
    chunks = data.build_chunks(str(tmp_path / "*.jsonl"))
    (tmp_path / "j2.jsonl").unlink()
    return chunks, f"{tmp_path / 'j2.jsonl'}: open: FileNotFoundError"


@pytest.mark.parametrize(
    "make",
    [corrupt_parquet, truncated_tar, unreadable_jsonl],
    ids=["corrupt-parquet", "truncated-tar", "unreadable-file"],
)
def test_bad_data_fails_its_task_ends_dead_and_the_pass_completes(
    url: str,
    client: taskq.Client,
    job_name: str,
    tmp_path: Path,
    make: Callable[[Path], tuple[list[dict], str]],
) -> None:
    chunks, text = make(tmp_path)
    client.create_job(job_name, chunks, max_failures=3, worker_ttl=2.0, heartbeat_interval=0.2)
    good, failures = 0, 0
    with taskq.Trainer(job_name, client=client) as trainer:
        for task in trainer:
            try:
                good += len(list(data.read_task(task.chunks)))
            except DataError as e:
                failures += 1
                trainer.fail(task, str(e))
    assert failures == 3 and good > 0
    st = client.status(job_name)
    assert st.state == "completed" and st.dead == 1 and st.done == 3
    assert [t["id"] for t in client.tasks(job_name, "dead")] == [2]
    failed = [f for _, f in client.events(job_name, count=1000) if f.get("type") == "failed"]
    assert len(failed) == 3 and all(f["error"].startswith(text) for f in failed), failed
    shown = CliRunner().invoke(cli, ["--url", url, "events", job_name, "-n", "200"])
    assert shown.exit_code == 0 and text in " ".join(shown.stdout.split())
    assert client.audit(job_name)["ok"]
