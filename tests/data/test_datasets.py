"""Chunk builders (taskq/datasets.py): manifests, file globs, line ranges."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from taskq import InvalidInput, datasets


def write(path: Path, data: str | bytes) -> str:
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    return str(path)


def test_manifest_reads_one_chunk_per_line_skipping_blank_lines(tmp_path: Path) -> None:
    p = write(tmp_path / "m.jsonl", '{"path": "a"}\n\n  \n["x", 1]\n"plain"\n')
    assert datasets.manifest_chunks(p) == [{"path": "a"}, ["x", 1], "plain"]


@pytest.mark.parametrize(
    "bad_line, expected_no",
    [
        ('{"a": 1', 3),
        ("NaN", 3),
        ("null", 3),
        ("not json", 3),
        ('{"a": Infinity}', 3),
    ],
)
def test_manifest_bad_line_names_its_number(
    tmp_path: Path, bad_line: str, expected_no: int
) -> None:
    p = write(tmp_path / "m.jsonl", '{"a": 1}\n\n' + bad_line + '\n{"a": 2}\n')
    with pytest.raises(InvalidInput, match=f"bad manifest line {expected_no}\\b"):
        datasets.manifest_chunks(p)


def test_manifest_not_utf8_is_a_bad_line(tmp_path: Path) -> None:
    p = write(tmp_path / "m.jsonl", b'{"a": 1}\n"\xff\xfe"\n')
    with pytest.raises(InvalidInput, match="bad manifest line 2: not UTF-8"):
        datasets.manifest_chunks(p)


def test_manifest_empty_or_missing_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="empty manifest"):
        datasets.manifest_chunks(write(tmp_path / "e.jsonl", "\n\n"))
    with pytest.raises(InvalidInput, match="cannot read"):
        datasets.manifest_chunks(str(tmp_path / "missing.jsonl"))


def test_files_are_sorted_regular_files_with_sizes(tmp_path: Path) -> None:
    for name, size in (("b.bin", 3), ("a.bin", 5), ("c.txt", 1)):
        write(tmp_path / name, b"x" * size)
    (tmp_path / "d.bin").mkdir()
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "e.bin", b"yy")
    chunks = datasets.file_chunks(str(tmp_path / "*.bin"))
    assert [(os.path.basename(c["path"]), c["offset"], c["length"]) for c in chunks] == [
        ("a.bin", 0, 5),
        ("b.bin", 0, 3),
    ]
    assert all(os.path.isabs(c["path"]) for c in chunks)
    deep = datasets.file_chunks(str(tmp_path / "**" / "*.bin"))
    assert [os.path.relpath(c["path"], tmp_path) for c in deep] == [
        "a.bin",
        "b.bin",
        os.path.join("sub", "e.bin"),
    ]


def test_files_no_match_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no files match"):
        datasets.file_chunks(str(tmp_path / "*.parquet"))


def _check_ranges(path: str, chunks: list[dict], per_chunk: int) -> None:
    data = Path(path).read_bytes()
    pieces = [data[c["offset"] : c["offset"] + c["length"]] for c in chunks]
    assert b"".join(pieces) == data  # covers the file exactly once, in order
    assert chunks[0]["offset"] == 0
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        assert nxt["offset"] == prev["offset"] + prev["length"]
    for piece, c in zip(pieces[:-1], chunks[:-1], strict=True):
        assert piece.endswith(b"\n") and piece.count(b"\n") == per_chunk == c["records"]
    last = pieces[-1]
    assert chunks[-1]["records"] == len(last.splitlines()) <= per_chunk


@pytest.mark.parametrize("per_chunk", [1, 3, 7, 1000])
def test_line_ranges_end_at_line_ends_and_cover_the_file(tmp_path: Path, per_chunk: int) -> None:
    p = write(tmp_path / "l.txt", "".join(f"record {i} {'x' * (i % 13)}\n" for i in range(50)))
    chunks = datasets.line_chunks(p, per_chunk)
    assert len(chunks) == -(-50 // per_chunk)
    _check_ranges(p, chunks, per_chunk)


def test_line_ranges_last_line_without_newline_is_a_record(tmp_path: Path) -> None:
    p = write(tmp_path / "l.txt", "a\nb\nc\nd\ne")
    chunks = datasets.line_chunks(p, 2)
    assert [(c["offset"], c["length"], c["records"]) for c in chunks] == [
        (0, 4, 2),
        (4, 4, 2),
        (8, 1, 1),
    ]
    _check_ranges(p, chunks, 2)


def test_line_ranges_across_read_blocks(tmp_path: Path) -> None:
    line = "y" * 99 + "\n"
    p = write(tmp_path / "big.txt", line * 30011)  # ~3 MB: several 1 MiB read blocks
    seen: list[tuple[int, int]] = []
    chunks = datasets.line_chunks(p, 1000, progress=lambda d, t: seen.append((d, t)))
    assert len(chunks) == 31
    _check_ranges(p, chunks, 1000)
    assert seen[-1] == (os.path.getsize(p), os.path.getsize(p))


def test_line_ranges_reject_bad_input(tmp_path: Path) -> None:
    p = write(tmp_path / "l.txt", "a\n")
    with pytest.raises(InvalidInput, match="records per chunk"):
        datasets.line_chunks(p, 0)
    with pytest.raises(InvalidInput, match="empty file"):
        datasets.line_chunks(write(tmp_path / "e.txt", ""), 5)
    with pytest.raises(InvalidInput, match="cannot read"):
        datasets.line_chunks(str(tmp_path / "missing.txt"), 5)


@pytest.mark.parametrize("nesting", [65, 990, 5000])
def test_manifest_nested_too_deep_is_a_bad_line(tmp_path: Path, nesting: int) -> None:
    """Refused at create, before any codec further on (lease, Lua) meets it."""
    p = write(tmp_path / "m.jsonl", '{"a": 1}\n' + '{"k": ' * nesting + "1" + "}" * nesting + "\n")
    with pytest.raises(InvalidInput, match="bad manifest line 2: nested deeper than 64"):
        datasets.manifest_chunks(p)


def test_manifest_nesting_up_to_the_cap_is_accepted(tmp_path: Path) -> None:
    deep = "[" * datasets.MAX_CHUNK_DEPTH + "]" * datasets.MAX_CHUNK_DEPTH
    assert datasets.manifest_chunks(write(tmp_path / "m.jsonl", deep + "\n"))
    assert [datasets.depth(v) for v in (1, [], {}, [[1]], {"a": [{"b": {}}]}, [1, [2, [3]]])] == [
        0,
        1,
        1,
        2,
        4,
        3,
    ]


@pytest.mark.parametrize("name", ["data.txt.gz", "x.jsonl.zst", "y.bz2", "z.xz"])
def test_line_ranges_of_compressed_files_are_refused(tmp_path: Path, name: str) -> None:
    p = write(tmp_path / name, b"\x1f\x8b not read")
    with pytest.raises(InvalidInput, match="byte ranges of a compressed file"):
        datasets.line_chunks(p, 10)


def test_format_chunks_by_extension_or_whole_files(tmp_path: Path) -> None:
    write(tmp_path / "a.bin", b"12345")
    assert datasets.format_chunks(str(tmp_path / "*.bin")) == [
        {"path": str(tmp_path / "a.bin"), "offset": 0, "length": 5}
    ]
    with pytest.raises(InvalidInput, match="--chunk-bytes needs a format"):
        datasets.format_chunks(str(tmp_path / "*.bin"), chunk_bytes=2)
    assert datasets.format_chunks(str(tmp_path / "*.bin"), "lines", chunk_bytes=2) == [
        {"format": "lines", "path": str(tmp_path / "a.bin"), "offset": o, "length": n}
        for o, n in ((0, 2), (2, 2), (4, 1))
    ]
    write(tmp_path / "b.jsonl", b"1\n")
    assert datasets.format_chunks(str(tmp_path / "*.jsonl"))[0]["format"] == "jsonl"
    with pytest.raises(InvalidInput, match="a.bin: cannot tell the format"):
        datasets.format_chunks(str(tmp_path / "*"))
