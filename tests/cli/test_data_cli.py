"""``taskq job create --format ...`` through the installed entry point and CliRunner,
against the suite's real redis-server: formats, sizing options, and bad input as one
line with no job written."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from data_files import RangeServer, shard_samples, write_parquet, write_shard
from support import ENTRY_POINT, assert_no_job, one_error_line
from taskq.cli.main import cli

import taskq
from taskq import data


def taskq_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ENTRY_POINT, "--url", url, *args], capture_output=True, text=True, timeout=120
    )


def run(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--url", url, *args])


def all_chunks(client: taskq.Client, name: str) -> list[dict]:
    raw = client.redis.hgetall(client.keys(name).chunks)
    return [c for _, t in sorted((int(k), json.loads(v)) for k, v in raw.items()) for c in t]


def refusal(
    client: taskq.Client,
    name: str,
    out: subprocess.CompletedProcess[str] | Result,
    codes: tuple[int, ...],
) -> str:
    """The one error line of a refused ``job create`` of ``name``: it exited with one of
    ``codes`` and wrote no job."""
    code = out.returncode if isinstance(out, subprocess.CompletedProcess) else out.exit_code
    assert code in codes, (code, out.stdout, out.stderr)
    assert_no_job(client, name)
    return one_error_line(out.stderr)


def test_parquet_files_by_row_groups_through_the_entry_point(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path
) -> None:
    write_parquet(tmp_path / "a.parquet", rows=100, row_group_size=10)
    write_parquet(tmp_path / "b.parquet", rows=30, row_group_size=10, start=100)
    out = taskq_cli(
        url,
        "job",
        "create",
        job_name,
        "--files",
        str(tmp_path / "*.parquet"),
        "--row-groups-per-chunk",
        "4",
        "--chunks-per-task",
        "2",
    )
    assert out.returncode == 0, out.stderr
    assert f"job {job_name}: 2 tasks from 4 chunks" in out.stdout
    chunks = all_chunks(client, job_name)
    assert [(c["format"], c["rows"]) for c in chunks] == [
        ("parquet", 40),
        ("parquet", 40),
        ("parquet", 20),
        ("parquet", 30),
    ]
    assert [r["i"] for r in data.read_task(chunks)] == list(range(130))


def test_jsonl_guessed_from_the_extension_with_chunk_bytes(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path
) -> None:
    (tmp_path / "part-0.jsonl").write_text("".join(f'{{"i": {i}}}\n' for i in range(300)))
    (tmp_path / "part-1.jsonl.gz").write_bytes(gzip.compress(b'{"i": 300}\n'))
    out = taskq_cli(
        url, "job", "create", job_name, "--files", str(tmp_path / "part-*"), "--chunk-bytes", "1K"
    )
    assert out.returncode == 0, out.stderr
    chunks = all_chunks(client, job_name)
    assert {c["format"] for c in chunks} == {"jsonl"}
    size = (tmp_path / "part-0.jsonl").stat().st_size
    assert [c.get("length") for c in chunks[:-1]] == [1024] * 3 + [size - 3072]
    assert chunks[-1]["compression"] == "gzip"
    assert [v["i"] for v in data.read_task(chunks)] == list(range(301))


def test_lines_format_tar_shards_and_lines_with_a_format(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path
) -> None:
    (tmp_path / "t.txt").write_text("a\r\nb\nc")
    r = run(url, "job", "create", job_name, "--files", str(tmp_path / "*.txt"), "--format", "lines")
    assert r.exit_code == 0, r.output
    assert list(data.read_task(all_chunks(client, job_name))) == ["a", "b", "c"]

    samples = shard_samples(7)
    write_shard(tmp_path / "s.tar", samples)
    r = run(
        url,
        "job",
        "create",
        job_name,
        "--replace",
        "--files",
        str(tmp_path / "s.tar"),
        "--records-per-chunk",
        "3",
    )
    assert r.exit_code == 0, r.output
    chunks = all_chunks(client, job_name)
    assert [c["samples"] for c in chunks] == [3, 3, 1]
    assert list(data.read_task(chunks)) == samples

    (tmp_path / "v.jsonl").write_text("1\n2\n3\n")
    r = run(
        url,
        "job",
        "create",
        job_name,
        "--replace",
        "--lines",
        str(tmp_path / "v.jsonl"),
        "--records-per-chunk",
        "2",
        "--format",
        "jsonl",
    )
    assert r.exit_code == 0, r.output
    chunks = all_chunks(client, job_name)
    assert [(c["format"], c["records"]) for c in chunks] == [("jsonl", 2), ("jsonl", 1)]
    assert list(data.read_task(chunks)) == [1, 2, 3]


def test_files_of_no_known_format_stay_whole_file_chunks(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path
) -> None:
    (tmp_path / "a.bin").write_bytes(b"xyz")
    assert run(url, "job", "create", job_name, "--files", str(tmp_path / "*.bin")).exit_code == 0
    assert all_chunks(client, job_name) == [
        {"path": str(tmp_path / "a.bin"), "offset": 0, "length": 3}
    ]


def test_compressed_lines_are_refused_with_one_line(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path
) -> None:
    path = tmp_path / "data.txt.gz"
    path.write_bytes(gzip.compress(b"a\nb\n"))
    out = taskq_cli(
        url, "job", "create", job_name, "--lines", str(path), "--records-per-chunk", "1"
    )
    assert "byte ranges of a compressed file" in refusal(client, job_name, out, (1,))


def test_an_unquoted_glob_says_to_quote_it(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path
) -> None:
    for i in range(3):
        (tmp_path / f"part-{i}.jsonl").write_text("1\n")
    paths = sorted(str(p) for p in tmp_path.glob("part-*.jsonl"))  # as the shell expands
    out = taskq_cli(url, "job", "create", job_name, "--files", *paths)
    line = refusal(client, job_name, out, (2,))
    assert "--files got 3 paths" in line and "quote it" in line


@pytest.mark.parametrize("depth", [990, 5000])
def test_a_deeply_nested_manifest_is_refused_at_create(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path, depth: int
) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_text('{"ok": 1}\n' + "[" * depth + "]" * depth + "\n")
    out = taskq_cli(url, "job", "create", job_name, "--manifest", str(path))
    line = refusal(client, job_name, out, (1,))
    assert "bad manifest line 2: nested deeper than 64 levels" in line


def test_corrupt_or_truncated_files_fail_create_with_one_line(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path
) -> None:
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really" * 20)
    r = run(url, "job", "create", job_name, "--files", str(tmp_path / "bad.parquet"))
    assert "bad.parquet: ArrowInvalid" in refusal(client, job_name, r, (1,))
    shard = Path(write_shard(tmp_path / "s.tar", shard_samples(3)))
    shard.write_bytes(shard.read_bytes()[:1500])
    r = run(url, "job", "create", job_name, "--files", str(shard))
    line = refusal(client, job_name, r, (1,))
    assert "s.tar: bad or truncated tar header at byte 1024" in line


@pytest.mark.parametrize(
    "args, message",
    [
        (["--manifest", "{m}", "--format", "jsonl"], "--format does not go with --manifest"),
        (
            ["--files", "{d}/*.jsonl", "--format", "parquet", "--chunk-bytes", "1M"],
            "--chunk-bytes goes with lines|jsonl",
        ),
        (
            ["--files", "{d}/*.jsonl", "--format", "jsonl", "--row-groups-per-chunk", "2"],
            "--row-groups-per-chunk goes with parquet",
        ),
        (["--files", "{d}/*.jsonl", "--chunk-bytes", "1M", "--records-per-chunk", "3"], "not both"),
        (
            ["--files", "{d}/*.parquet", "--format", "parquet", "--records-per-chunk", "3"],
            "--row-groups-per-chunk",
        ),
        (["--files", "{d}/*.jsonl", "--chunk-bytes", "lots"], "is not a size"),
        (["--files", "{d}/*.jsonl", "--storage-options", "[1]"], "must be a JSON object"),
        (
            ["--lines", "{d}/a.jsonl", "--records-per-chunk", "2", "--format", "tar"],
            "--lines takes --format lines or jsonl",
        ),
        (["--files", "{d}/*.jsonl", "--format", "csv"], "'csv' is not one of"),
    ],
    ids=lambda a: a if isinstance(a, str) else " ".join(a[-2:]),
)
def test_bad_option_combinations_are_usage_errors(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "a.jsonl").write_text("1\n")
    (tmp_path / "m.jsonl").write_text('{"x": 1}\n')
    args = [a.format(d=tmp_path, m=tmp_path / "m.jsonl") for a in args]
    r = run(url, "job", "create", job_name, *args)
    assert message in refusal(client, job_name, r, (2,))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--files", "{d}/*.bin", "--chunk-bytes", "10"], "--chunk-bytes needs a format"),
        (["--files", "{d}/*.parquet", "--row-groups-per-chunk", "0"], "0 is not in the range"),
        (["--files", "{d}/nothing-*.parquet"], "no files match"),
        (["--files", "{d}/*.parquet", "--chunk-bytes", "1K"], "chunk-bytes does not apply"),
        (["--files", "{d}/*", "--format", "parquet"], "ArrowInvalid"),
    ],
)
def test_bad_inputs_are_one_line_and_no_job(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "a.bin").write_bytes(b"123")
    write_parquet(tmp_path / "p.parquet", rows=5, row_group_size=5)
    args = [a.format(d=tmp_path) for a in args]
    r = run(url, "job", "create", job_name, *args)
    assert message in refusal(client, job_name, r, (1, 2))


def test_remote_files_over_http_with_storage_options(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path
) -> None:
    write_parquet(tmp_path / "r.parquet", rows=40, row_group_size=10)
    server = RangeServer(tmp_path)
    try:
        out = taskq_cli(
            url,
            "job",
            "create",
            job_name,
            "--files",
            f"{server.url}/r.parquet",
            "--row-groups-per-chunk",
            "3",
            "--storage-options",
            '{"headers": {"X-Test": "from-cli"}}',
        )
        assert out.returncode == 0, out.stderr
        assert server.marks and set(server.marks) == {"from-cli"}
        chunks = all_chunks(client, job_name)
        assert [(c["path"], c["rows"]) for c in chunks] == [
            (f"{server.url}/r.parquet", 30),
            (f"{server.url}/r.parquet", 10),
        ]
        assert [r["i"] for r in data.read_task(chunks)] == list(range(40))
    finally:
        server.close()
