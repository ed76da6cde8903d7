"""Remote paths through fsspec: the memory filesystem (``memory://``) and a local HTTP
server that serves byte ranges, read through fsspec's http filesystem."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from data_files import RangeServer, range_server, shard_samples, write_parquet, write_shard

from taskq import InvalidInput, data
from taskq.errors import DataError


@pytest.fixture
def memdir() -> Iterator[str]:
    """A fresh directory on fsspec's (process-wide) memory filesystem, removed after."""
    root = f"memory:///taskq-test-{uuid.uuid4().hex}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.fixture
def http(tmp_path: Path) -> Iterator[RangeServer]:
    yield from range_server(tmp_path)


def put(url: str, payload: bytes) -> None:
    with fsspec.open(url, "wb") as f:
        f.write(payload)


def test_memory_filesystem_every_format(memdir: str, tmp_path: Path) -> None:
    put(f"{memdir}/a.jsonl", b"".join(b'{"i": %d}\r\n' % i for i in range(40)))
    put(
        f"{memdir}/b.parquet",
        Path(write_parquet(tmp_path / "b.parquet", rows=30, row_group_size=8)).read_bytes(),
    )
    samples = shard_samples(5)
    put(f"{memdir}/c.tar", Path(write_shard(tmp_path / "c.tar", samples)).read_bytes())
    put(f"{memdir}/sub/d.txt", b"not matched by the glob\n")
    chunks = data.build_chunks(f"{memdir}/*.*", chunk_bytes=64, row_groups_per_chunk=2)
    assert {c["path"] for c in chunks} == {
        f"{memdir}/a.jsonl",
        f"{memdir}/b.parquet",
        f"{memdir}/c.tar",
    }
    assert [c["format"] for c in chunks] == ["jsonl"] * 7 + ["parquet"] * 2 + ["tar"]
    got = list(data.read_task(chunks))
    assert got[:40] == [{"i": i} for i in range(40)]
    assert [r["i"] for r in got[40:70]] == list(range(30))
    assert got[70:] == samples
    assert list(data.read_task(chunks, start=68)) == got[68:]


def test_memory_filesystem_recursive_glob_and_missing_files(memdir: str) -> None:
    put(f"{memdir}/x/1.jsonl", b"1\n")
    put(f"{memdir}/y/z/2.jsonl", b"2\n")
    chunks = data.build_chunks(f"{memdir}/**/*.jsonl")
    assert [c["path"] for c in chunks] == [f"{memdir}/x/1.jsonl", f"{memdir}/y/z/2.jsonl"]
    assert list(data.read_task(chunks)) == [1, 2]
    with pytest.raises(InvalidInput, match="no files match"):
        data.build_chunks(f"{memdir}/nothing/*.jsonl")
    with pytest.raises(InvalidInput, match="is a directory"):
        data.build_chunks(f"{memdir}/x")
    fsspec.filesystem("memory").rm(f"{memdir}/x/1.jsonl")
    with pytest.raises(DataError, match="1.jsonl: open: FileNotFoundError"):
        list(data.read_task(chunks))


def test_http_jsonl_byte_ranges_are_read_by_range(http: RangeServer, tmp_path: Path) -> None:
    lines = [json.dumps({"i": i, "pad": "x" * (i % 50)}) for i in range(3000)]
    (tmp_path / "big.jsonl").write_text("\n".join(lines))  # last line without newline
    url = f"{http.url}/big.jsonl"
    chunks = data.build_chunks(url, chunk_bytes=20000)
    assert len(chunks) > 5 and all(c["path"] == url for c in chunks)
    assert [v["i"] for v in data.read_task(chunks)] == list(range(3000))
    http.requests.clear()
    third = chunks[3]
    assert [v["i"] for v in data.reader_for(third).read(third)]  # some lines
    starts = [int(r.split("=")[1].split("-")[0]) for r in http.ranges("big.jsonl") if r]
    assert starts and min(starts) == third["offset"] - 1  # ranged, not from byte 0


def test_http_parquet_footer_only_at_create_and_ranged_reads(
    http: RangeServer, tmp_path: Path
) -> None:
    path = write_parquet(tmp_path / "p.parquet", rows=50000, row_group_size=10000)
    raw = Path(path).read_bytes()
    footer = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")
    url = f"{http.url}/p.parquet"
    http.requests.clear()
    chunks = data.build_chunks(url, row_groups_per_chunk=2)
    assert [c["rows"] for c in chunks] == [20000, 20000, 10000]
    gets = http.ranges("p.parquet")
    # pyarrow fetches the file's tail (64 KiB at most, or the footer if larger): no page
    tail = min(footer, len(raw) - (64 << 10))
    assert tail > 500_000  # the data pages lie before it
    assert gets and all(
        r is not None and int(r.split("=")[1].split("-")[0]) >= tail for r in gets
    ), gets
    assert [r["i"] for r in data.read_task(chunks[2:], columns=["i"])] == list(range(40000, 50000))


def test_http_tar_member_range_and_storage_options(http: RangeServer, tmp_path: Path) -> None:
    samples = shard_samples(12)
    write_shard(tmp_path / "s.tar", samples)
    url = f"{http.url}/s.tar"
    options = {"headers": {"X-Test": "taskq"}}
    chunks = data.build_chunks(url, records_per_chunk=4, storage_options=options)
    http.requests.clear()
    http.marks.clear()
    assert list(data.read_task(chunks[1:2], storage_options=options)) == samples[4:8]
    starts = [int(r.split("=")[1].split("-")[0]) for r in http.ranges("s.tar") if r]
    assert starts and min(starts) == chunks[1]["offset"]
    assert http.marks and set(http.marks) == {"taskq"}


def test_http_missing_file(http: RangeServer) -> None:
    with pytest.raises(InvalidInput, match="no files match"):
        data.build_chunks(f"{http.url}/nope.jsonl")
    with pytest.raises(DataError, match="nope.jsonl: open: FileNotFoundError"):
        list(
            data.read_task(
                [{"format": "jsonl", "path": f"{http.url}/nope.jsonl", "offset": 0, "length": 10}]
            )
        )


def test_import_taskq_needs_no_data_extra_and_a_missing_extra_says_so() -> None:
    """``import taskq`` (and taskq.data, the CLI) imports neither pyarrow nor fsspec; with
    pyarrow unimportable, a parquet reader is InvalidInput naming the extra."""
    script = r"""
import sys
import taskq, taskq.data, taskq.datasets, taskq.cli.main
assert not {"pyarrow", "fsspec"} & set(sys.modules), sorted(sys.modules)
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ImportError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
try:
    taskq.data.reader_for({"format": "parquet", "path": "x.parquet"})
except taskq.InvalidInput as e:
    print(e)
"""
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert out.returncode == 0, out.stderr
    assert "format parquet needs the data extra: pip install 'taskq-ml[data]'" in out.stdout
