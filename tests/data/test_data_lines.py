"""Lines and JSONL by byte range (taskq.data.lines): every line read exactly once over
any tiling of a file into ranges, compressed files whole, and bad data as DataError."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import tempfile
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from taskq import InvalidInput, data, datasets
from taskq.data.linescan import line_ranges
from taskq.errors import DataError, TaskqError

LINES = data.reader("lines")
JSONL = data.reader("jsonl")


def expected_lines(content: bytes) -> list[str]:
    """The lines of ``content`` as the reader must give them: split at \\n, a \\r before
    it dropped, a last line without a newline kept."""
    parts = content.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    return [(p[:-1] if p.endswith(b"\r") else p).decode() for p in parts]


def read_ranges(
    path: str, bounds: list[int], reader: data.storage.Reader = LINES, fmt: str = "lines"
) -> list[object]:
    out: list[object] = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        out += list(reader.read({"format": fmt, "path": path, "offset": lo, "length": hi - lo}))
    return out


line_text = st.text(
    alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=12
)


@st.composite
def files_and_tilings(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    lines = draw(st.lists(line_text, max_size=25))
    ends = draw(
        st.lists(st.sampled_from([b"\n", b"\r\n"]), min_size=len(lines), max_size=len(lines))
    )
    content = b"".join(t.encode() + e for t, e in zip(lines, ends, strict=True))
    if lines and draw(st.booleans()):
        content = content[: -len(ends[-1])]  # a last line without a newline
    sizes = draw(st.lists(st.integers(min_value=0, max_value=max(len(content), 1)), max_size=40))
    bounds, pos = [0], 0
    for size in sizes:  # zero sizes make empty ranges
        pos = min(pos + size, len(content))
        bounds.append(pos)
    if bounds[-1] != len(content):
        bounds.append(len(content))
    return content, bounds


@settings(max_examples=300, deadline=None)
@given(files_and_tilings())
def test_every_line_is_read_exactly_once_over_any_tiling(case: tuple[bytes, list[int]]) -> None:
    """Random line lengths, LF and CRLF, empty lines, a last line with or without a
    newline, random range sizes (empty ones, ones smaller than a line)."""
    content, bounds = case
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "f.txt")
        Path(path).write_bytes(content)
        assert read_ranges(path, bounds) == expected_lines(content)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(),
            st.text(max_size=8),
            st.none(),
            st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
        ),
        max_size=20,
    ),
    st.integers(min_value=1, max_value=64),
    st.booleans(),
)
def test_jsonl_ranges_give_every_value_once_and_skip_blank_lines(
    values: list[object], chunk_bytes: int, crlf: bool
) -> None:
    end = "\r\n" if crlf else "\n"
    text = "".join(
        json.dumps(v) + end + ("  " + end if i % 4 == 1 else "") for i, v in enumerate(values)
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "v.jsonl")
        Path(path).write_text(text, newline="")
        chunks = data.build_chunks(path, chunk_bytes=chunk_bytes) if values else []
        assert all(c["format"] == "jsonl" and c["length"] <= chunk_bytes for c in chunks)
        assert list(data.read_task(chunks)) == values


def test_ranges_smaller_than_a_line_and_empty_ranges(tmp_path: Path) -> None:
    path = tmp_path / "l.txt"
    path.write_bytes(b"alpha\r\nbeta\n\ngamma")
    size = path.stat().st_size
    chunks = LINES.chunks([(str(path), size)], chunk_bytes=1)
    assert len(chunks) == size and all(c["length"] == 1 for c in chunks)
    per_chunk = [list(LINES.read(c)) for c in chunks]
    assert [x for xs in per_chunk for x in xs] == ["alpha", "beta", "", "gamma"]
    assert sum(1 for xs in per_chunk if xs) == 4  # each line owned by the range it starts in
    assert list(LINES.read({"path": str(path), "offset": 3, "length": 0})) == []
    assert list(LINES.read({"path": str(path), "offset": size, "length": 5})) == []


def test_default_chunk_bytes_and_sizes_from_the_file_size_alone(tmp_path: Path) -> None:
    small = tmp_path / "a.jsonl"
    small.write_text('{"a": 1}\n')
    (tmp_path / "empty.jsonl").write_bytes(b"")
    chunks = data.build_chunks(str(tmp_path / "*.jsonl"))
    assert chunks == [{"format": "jsonl", "path": str(small), "offset": 0, "length": 9}]
    big = data.lines.DEFAULT_CHUNK_BYTES
    ranged = LINES.chunks([("/never/opened.txt", 2 * big + 5)])  # sizes only: no open
    assert [(c["offset"], c["length"]) for c in ranged] == [(0, big), (big, big), (2 * big, 5)]


def test_records_per_chunk_scans_and_chunks_carry_records(tmp_path: Path) -> None:
    path = tmp_path / "r.txt"
    path.write_text("".join(f"line {i}\n" for i in range(10)) + "tail")
    chunks = data.build_chunks(str(path), "lines", records_per_chunk=4)
    assert [c["records"] for c in chunks] == [4, 4, 3]
    assert list(data.read_task(chunks)) == [f"line {i}" for i in range(10)] + ["tail"]


json_or_blank = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6).map(lambda v: json.dumps({"v": v}).encode()),
    st.sampled_from([b"", b" ", b"\t", b"  \r", b"\x0b \x0c"]),  # blank: no sample
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(json_or_blank, max_size=40),
    st.sampled_from([b"", b"\n", b"  "]),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=1, max_value=24),
)
def test_jsonl_ranges_by_records_say_their_samples(
    lines: list[bytes], end: bytes, per_chunk: int, block: int
) -> None:
    """JSON lines built with records per chunk: each range says its ``samples`` (its
    lines that are not blank, what its reader yields), counted in the same scan as its
    records, whatever the read block size (blank lines across block ends); the task's
    size is their sum (``task_size``: what lets the engine split it)."""
    content = b"\n".join(lines) + end
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "x.jsonl")
        Path(path).write_bytes(content)
        with open(path, "rb") as f:
            ranges = line_ranges(f, path, len(content), per_chunk, samples=True, block_size=block)
        # what JSONL.chunks builds of them (it reads by READ_BLOCK)
        chunks = [{"format": JSONL.format, **r} for r in ranges]
        assert chunks == JSONL.chunks([(path, len(content))], records_per_chunk=per_chunk)
        for c in chunks:
            assert c["samples"] == len(list(JSONL.read(c))), c
        values = [json.loads(x) for x in content.split(b"\n") if x.strip()]
        assert list(data.read_task(chunks)) == values
        assert data.task_size(chunks) == (len(values) if chunks else None)


def test_start_skips_whole_chunks_by_records_without_opening_them(tmp_path: Path) -> None:
    path = tmp_path / "r.txt"
    path.write_text("".join(f"{i}\n" for i in range(9)))
    chunks = datasets.line_chunks(str(path), 3)  # no format field: read as lines
    gone = {"path": str(tmp_path / "deleted.txt"), "offset": 0, "length": 6, "records": 3}
    assert list(data.read_task([gone, *chunks], start=5)) == [str(i) for i in range(2, 9)]
    for start in range(0, 11):
        assert list(data.read_task(chunks, start=start)) == [str(i) for i in range(start, 9)]
    with pytest.raises(DataError, match="deleted.txt"):
        list(data.read_task([gone, *chunks], start=2))


def test_legacy_whole_file_chunks_are_read_as_lines(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"one\ntwo\n")
    chunks = datasets.format_chunks(str(tmp_path / "*.bin"))
    assert "format" not in chunks[0]
    assert list(data.read_task(chunks)) == ["one", "two"]


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_compressed_files_are_whole_file_chunks(tmp_path: Path, suffix: str) -> None:
    text = "".join(json.dumps({"i": i}) + "\n" for i in range(1000)).encode()
    path = tmp_path / f"d.jsonl{suffix}"
    packed = gzip.compress(text) if suffix == ".gz" else zstandard.ZstdCompressor().compress(text)
    path.write_bytes(packed)
    chunks = data.build_chunks(str(path), chunk_bytes=100)
    assert chunks == [
        {
            "format": "jsonl",
            "path": str(path),
            "compression": "gzip" if suffix == ".gz" else "zstd",
            "bytes": len(packed),
        }
    ]
    assert [v["i"] for v in data.read_task(chunks)] == list(range(1000))
    assert [v["i"] for v in data.read_task(chunks, start=990)] == list(range(990, 1000))


def test_byte_ranges_of_compressed_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "data.txt.gz"
    path.write_bytes(gzip.compress(b"a\nb\n"))
    with pytest.raises(InvalidInput, match="byte ranges of a compressed file"):
        datasets.line_chunks(str(path), 1)
    with pytest.raises(InvalidInput, match="byte ranges of a compressed file"):
        data.build_chunks(str(path), "lines", records_per_chunk=1)
    with pytest.raises(DataError, match="byte range of a compressed file"):
        list(LINES.read({"path": str(path), "offset": 2, "length": 2}))
    # a whole-file chunk without a compression field: the suffix says it
    assert list(LINES.read({"path": str(path), "offset": 0, "length": 24})) == ["a", "b"]


def test_bad_json_line_is_a_data_error_naming_path_and_byte(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(DataError) as e:
        list(data.read_task(data.build_chunks(str(path))))
    assert str(e.value).startswith(f"{path}: line at byte 9: JSONDecodeError: Expecting value")
    assert isinstance(e.value, TaskqError) and e.value.path == str(path)
    again = pickle.loads(pickle.dumps(e.value))  # DataLoader workers pickle it
    assert (str(again), again.path, again.where) == (str(e.value), str(path), "line at byte 9")
    assert str(DataError(str(e.value))) == str(e.value)  # rebuilt from its message alone


def test_bad_utf8_missing_file_and_truncated_gzip_are_data_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(DataError, match="line at byte 3: UnicodeDecodeError"):
        list(LINES.read({"format": "lines", "path": str(bad), "offset": 0, "length": 6}))
    with pytest.raises(DataError, match="missing.txt: open: FileNotFoundError"):
        list(LINES.read({"format": "lines", "path": str(tmp_path / "missing.txt")}))
    cut = tmp_path / "cut.jsonl.gz"
    packed = gzip.compress(
        b"".join(b'{"a": "%s"}\n' % os.urandom(8).hex().encode() for _ in range(5000))
    )
    cut.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(DataError, match="cut.jsonl.gz: line at byte .*(EOFError|BadGzipFile)"):
        list(data.read_task(data.build_chunks(str(cut))))


def test_bad_chunks_options_and_start(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown format 'csv'"):
        data.reader_for({"format": "csv", "path": "x"})
    with pytest.raises(DataError, match="no format and no path/offset/length"):
        data.reader_for({"path": "x"})
    with pytest.raises(DataError, match="offset must be an integer"):
        list(LINES.read({"path": "x", "offset": -1, "length": 3}))
    with pytest.raises(InvalidInput, match="unknown read option"):
        data.read_task([], colums=["a"])
    with pytest.raises(InvalidInput, match="start must be"):
        data.read_task([], start=-1)
    with pytest.raises(InvalidInput, match="cannot tell the format"):
        (tmp_path / "a.csv").write_text("x\n")
        data.build_chunks(str(tmp_path / "a.csv"))
    with pytest.raises(InvalidInput, match="no files match"):
        data.build_chunks(str(tmp_path / "*.jsonl"))
