"""Parquet by row groups (taskq.data.parquet): chunks from the footer alone, rows or
record batches, columns=, start skipping, and corrupt files as DataError."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_files import write_parquet

from taskq import InvalidInput, data
from taskq.errors import DataError

PARQUET = data.reader("parquet")


def footer_start(path: str) -> int:
    """The byte offset where the Parquet footer (metadata + length + magic) starts."""
    raw = Path(path).read_bytes()
    return len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")


def scramble_data_pages(path: str) -> None:
    """Overwrite every byte between the leading magic and the footer: the footer, and so
    the row-group metadata, stays intact; every data page is garbage."""
    raw = bytearray(Path(path).read_bytes())
    end = footer_start(path)
    raw[4:end] = bytes((i * 131 + 7) % 256 for i in range(end - 4))
    Path(path).write_bytes(bytes(raw))


def test_row_group_chunks_carry_rows_and_cover_every_row_once(tmp_path: Path) -> None:
    a = write_parquet(tmp_path / "a.parquet", rows=100, row_group_size=10)
    b = write_parquet(tmp_path / "b.parquet", rows=25, row_group_size=10, start=100)
    chunks = data.build_chunks(str(tmp_path / "*.parquet"), row_groups_per_chunk=3)
    assert [(c["path"], c["row_groups"], c["rows"]) for c in chunks] == [
        (a, [0, 1, 2], 30),
        (a, [3, 4, 5], 30),
        (a, [6, 7, 8], 30),
        (a, [9], 10),
        (b, [0, 1, 2], 25),
    ]
    assert all(c["format"] == "parquet" for c in chunks)
    rows = list(data.read_task(chunks))
    assert [r["i"] for r in rows] == list(range(125))
    assert rows[7] == {"i": 7, "s": "row 7", "f": 3.5}
    assert data.build_chunks(a) == [
        {"format": "parquet", "path": a, "row_groups": [g], "rows": 10} for g in range(10)
    ]


def test_chunks_are_built_from_the_footer_alone(tmp_path: Path) -> None:
    """Data pages scrambled, footer intact: building still gives every row group with its
    rows (nothing but the footer was read); reading then fails as DataError."""
    path = write_parquet(tmp_path / "p.parquet", rows=60, row_group_size=20)
    before = data.build_chunks(path)
    scramble_data_pages(path)
    assert data.build_chunks(path) == before
    with pytest.raises(DataError) as e:
        list(data.read_task(before))
    assert str(e.value).startswith(f"{path}: row group 0: ")


def test_columns_and_record_batches(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "p.parquet", rows=50, row_group_size=20)
    chunks = data.build_chunks(path, row_groups_per_chunk=2)
    assert list(data.read_task(chunks, columns=["s"]))[:2] == [{"s": "row 0"}, {"s": "row 1"}]
    batches = list(data.read_task(chunks, batch_rows=15, columns=["i", "f"]))
    assert all(isinstance(b, pa.RecordBatch) and b.num_rows <= 15 for b in batches)
    assert batches[0].schema.names == ["i", "f"]
    assert [i for b in batches for i in b.column("i").to_pylist()] == list(range(50))


@pytest.mark.parametrize("start", [0, 1, 19, 20, 21, 39, 40, 45, 49, 50, 70])
def test_start_skips_rows_across_chunks(tmp_path: Path, start: int) -> None:
    path = write_parquet(tmp_path / "p.parquet", rows=50, row_group_size=10)
    chunks = data.build_chunks(path, row_groups_per_chunk=2)
    assert [r["i"] for r in data.read_task(chunks, start=start)] == list(range(start, 50))
    batched = data.read_task(chunks, start=start, batch_rows=7)
    assert [i for b in batched for i in b.column("i").to_pylist()] == list(range(start, 50))


def test_start_skips_whole_row_groups_by_metadata(tmp_path: Path) -> None:
    """Row groups 0-1 scrambled, their rows skipped by start: read without error, as
    their pages are never decoded; a chunk whose rows are all skipped is not opened."""
    path = write_parquet(tmp_path / "p.parquet", rows=40, row_group_size=10)
    meta = pq.ParquetFile(path).metadata
    column = meta.row_group(2).column(0)
    first_kept = min(
        o for o in (column.data_page_offset, column.dictionary_page_offset) if o is not None
    )
    raw = bytearray(Path(path).read_bytes())
    raw[4:first_kept] = bytes((i * 131 + 7) % 256 for i in range(first_kept - 4))
    Path(path).write_bytes(bytes(raw))
    chunk = {"format": "parquet", "path": path, "row_groups": [0, 1, 2, 3]}
    assert [r["i"] for r in PARQUET.read(chunk, start=25)] == list(range(25, 40))
    with pytest.raises(DataError, match="row group 0"):
        list(PARQUET.read(chunk))
    gone = {
        "format": "parquet",
        "path": str(tmp_path / "gone.parquet"),
        "row_groups": [0],
        "rows": 10,
    }
    assert [r["i"] for r in data.read_task([gone, chunk], start=38)] == [
        28,
        29,
        30,
        31,
        32,
        33,
        34,
        35,
        36,
        37,
        38,
        39,
    ]


def test_not_parquet_is_invalid_at_create_and_a_data_error_at_read(tmp_path: Path) -> None:
    path = tmp_path / "junk.parquet"
    path.write_bytes(b"this is not parquet at all" * 10)
    with pytest.raises(InvalidInput, match="junk.parquet: ArrowInvalid"):
        data.build_chunks(str(path))
    with pytest.raises(DataError, match="junk.parquet: footer: ArrowInvalid"):
        list(PARQUET.read({"format": "parquet", "path": str(path), "row_groups": [0]}))


def test_truncated_file_and_bad_row_group_are_data_errors(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "p.parquet", rows=30, row_group_size=10)
    chunks = data.build_chunks(path)
    with pytest.raises(DataError, match="no row group 7"):
        list(PARQUET.read({"format": "parquet", "path": path, "row_groups": [7]}))
    with pytest.raises(DataError, match="row_groups must be a non-empty list"):
        list(PARQUET.read({"format": "parquet", "path": path, "row_groups": "0"}))
    raw = Path(path).read_bytes()
    Path(path).write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match="p.parquet: footer: "):
        list(data.read_task(chunks))
    with pytest.raises(InvalidInput, match="row groups per chunk"):
        PARQUET.chunks([(path, 1)], row_groups_per_chunk=0)


def test_a_file_without_rows_gives_no_chunks(tmp_path: Path) -> None:
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"i": pa.array([], pa.int64())}), str(empty))
    with pytest.raises(InvalidInput, match="no data"):
        data.build_chunks(str(empty))
    full = write_parquet(tmp_path / "full.parquet", rows=3, row_group_size=10)
    assert [c["path"] for c in data.build_chunks(str(tmp_path / "*.parquet"))] == [full]
