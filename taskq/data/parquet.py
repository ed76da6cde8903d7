"""Parquet by row groups: chunk builder (footer metadata only) and reader (pyarrow).

Data flow: files -> ``ParquetReader.chunks`` (each file's footer) -> chunks of
``row_groups_per_chunk`` row groups -> ... -> ``ParquetReader.read`` -> one dict per row,
or pyarrow RecordBatches with ``batch_rows=N``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pyarrow.parquet as pq

from .. import errors
from .storage import Reader, building, chunk_count, chunk_int, chunk_path, reading

#: Rows per batch pyarrow decodes at a time when rows are yielded one by one.
ROW_BATCH = 8192


class ParquetReader(Reader):
    """``parquet``: one dict per row (or RecordBatches), by row groups."""

    format = "parquet"
    sizing = frozenset({"row_groups_per_chunk"})

    def chunks(
        self,
        files: list[tuple[str, int]],
        storage_options: dict[str, Any] | None = None,
        row_groups_per_chunk: int | None = None,
        **sizing: Any,
    ) -> list[dict[str, Any]]:
        """``row_groups_per_chunk`` row groups per chunk (default 1), from each footer.

        Args:
            files: ``(path, size)`` pairs.
            storage_options: passed to fsspec.
            row_groups_per_chunk: row groups per chunk (>= 1).

        Returns:
            ``{"format": "parquet", "path", "row_groups": [i, ...], "rows": n}`` per
            chunk; a file without rows gives none.

        Raises:
            InvalidInput: a bad size, a file that is not Parquet or cannot be read.
        """
        per = 1 if row_groups_per_chunk is None else row_groups_per_chunk
        if not isinstance(per, int) or per < 1:
            raise errors.InvalidInput(f"row groups per chunk must be >= 1, got {per!r}")
        out: list[dict[str, Any]] = []
        for path, _size in files:
            with building(path, storage_options) as f:
                meta = pq.ParquetFile(f).metadata
                rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            for first in range(0, len(rows), per):
                groups = list(range(first, min(first + per, len(rows))))
                n = sum(rows[g] for g in groups)
                if n:
                    out.append(
                        {"format": self.format, "path": path, "row_groups": groups, "rows": n}
                    )
        return out

    def read(
        self,
        chunk: dict[str, Any],
        start: int = 0,
        storage_options: dict[str, Any] | None = None,
        columns: list[str] | None = None,
        batch_rows: int | None = None,
        **options: Any,
    ) -> Generator[Any, None, int]:
        """The rows of the chunk's row groups from row ``start``; whole row groups
        before it are skipped by their metadata, without reading them.

        Args:
            chunk: path and ``row_groups`` (absent: every row group of the file).
            start: rows to skip (rows, also with ``batch_rows``).
            storage_options: passed to fsspec.
            columns: the columns to read (default all).
            batch_rows: yield RecordBatches of up to this many rows instead of dicts.

        Returns:
            A generator of samples; returns the number of rows the chunk holds.

        Raises:
            DataError: not Parquet, a corrupt page, a missing column or row group.
        """
        path = chunk_path(chunk)
        if batch_rows is not None and (not isinstance(batch_rows, int) or batch_rows < 1):
            raise errors.InvalidInput(f"batch_rows must be >= 1, got {batch_rows!r}")
        groups = chunk.get("row_groups")
        if groups is not None and (not isinstance(groups, list) or not groups):
            raise errors.DataError(path, "chunk", "row_groups must be a non-empty list")
        chunk_int(chunk, "rows")
        with reading(path, storage_options) as (f, spot):
            spot.where = "footer"
            pf = pq.ParquetFile(f)
            meta = pf.metadata
            if groups is None:
                groups = list(range(meta.num_row_groups))
            for g in groups:
                if (
                    isinstance(g, bool)
                    or not isinstance(g, int)
                    or not 0 <= g < meta.num_row_groups
                ):
                    raise errors.DataError(
                        path, "chunk", f"no row group {g!r} (the file has {meta.num_row_groups})"
                    )
            sizes = [meta.row_group(g).num_rows for g in groups]
            total = sum(sizes)
            skip, first = start, 0
            while first < len(groups) and skip >= sizes[first]:
                skip -= sizes[first]
                first += 1
            if first == len(groups):
                return total
            at = first
            spot.where = f"row group {groups[at]}"
            done_in_group = 0
            for batch in pf.iter_batches(
                batch_size=batch_rows or ROW_BATCH, row_groups=groups[first:], columns=columns
            ):
                # the row group being decoded, for the error text
                done_in_group += batch.num_rows
                while at < len(groups) - 1 and done_in_group > sizes[at]:
                    done_in_group -= sizes[at]
                    at += 1
                    spot.where = f"row group {groups[at]}"
                if skip:
                    if skip >= batch.num_rows:
                        skip -= batch.num_rows
                        continue
                    batch = batch.slice(skip)
                    skip = 0
                if batch_rows:
                    yield batch
                else:
                    yield from batch.to_pylist()
        return total

    def size(self, chunk: dict[str, Any]) -> int | None:
        """The chunk's ``rows`` (from the footer at create)."""
        return chunk_count(chunk, "rows")


READERS: dict[str, Reader] = {"parquet": ParquetReader()}
