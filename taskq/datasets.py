"""Chunk builders: turn a data set on disk into the chunk descriptors of a job.

Each builder reads and validates its whole input before returning, so a bad input
fails before anything is written to Redis (``client.create_job`` then stages and flips
the job in one go). Chunks are JSON: ``{"path": ..., "offset": ..., "length": ...}``
for files and line ranges, anything JSON (nested at most ``MAX_CHUNK_DEPTH`` deep) for a
manifest. ``format_chunks`` hands files of a known format (lines, JSONL, Parquet, tar) to
``taskq.data``, whose chunks carry a ``format`` field (docs/data.md).

Data flow: files on disk -> datasets.py (-> taskq.data) -> chunks -> client.create_job
-> Redis. The import is one-way: datasets.py uses taskq.data (its format builders and the
line scan of taskq/data/linescan.py), never the other way round.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from . import data, errors
from .data.linescan import Progress, line_ranges

__all__ = [
    "COMPRESSED_SUFFIXES",
    "MAX_CHUNK_DEPTH",
    "Progress",
    "depth",
    "file_chunks",
    "format_chunks",
    "line_chunks",
    "line_ranges",
    "manifest_chunks",
]

#: Suffixes of compressed files: read whole, never by byte range.
COMPRESSED_SUFFIXES = (".gz", ".tgz", ".zst", ".zstd", ".bz2", ".xz")

#: Deepest nesting a manifest chunk may have: far more than any chunk descriptor needs,
#: far less than the recursion limits of the JSON codecs that read it again (Python's
#: json at lease, Lua's cjson).
MAX_CHUNK_DEPTH = 64


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _open(path: str) -> Any:
    try:
        return open(path, "rb")
    except OSError as e:
        raise errors.InvalidInput(f"cannot read {path}: {e.strerror or e}") from e


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError as e:
        raise errors.InvalidInput(f"cannot read {path}: {e.strerror or e}") from e


def manifest_chunks(path: str, progress: Progress | None = None) -> list[Any]:
    """The chunks of a JSON-lines manifest: one JSON value per line, blank lines skipped.

    Args:
        path: the manifest file.
        progress: called with (bytes read, file size) as reading goes.

    Returns:
        The chunks, in file order.

    Raises:
        InvalidInput: the file cannot be read, is empty, or a line is not JSON
            (``bad manifest line N: ...``, N counted from 1).
    """
    total = _size(path)
    chunks: list[Any] = []
    done = 0
    with _open(path) as f:
        for line_no, raw in enumerate(f, start=1):
            done += len(raw)
            if progress and line_no % 10000 == 0:
                progress(done, total)
            if not raw.strip():
                continue
            try:
                chunk = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
            except UnicodeDecodeError as e:
                raise errors.InvalidInput(
                    f"{path}: bad manifest line {line_no}: not UTF-8 ({e.reason})"
                ) from e
            except ValueError as e:
                reason = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
                raise errors.InvalidInput(f"{path}: bad manifest line {line_no}: {reason}") from e
            except RecursionError as e:
                raise errors.InvalidInput(
                    f"{path}: bad manifest line {line_no}: nested deeper than "
                    f"{MAX_CHUNK_DEPTH} levels"
                ) from e
            if chunk is None:
                raise errors.InvalidInput(f"{path}: bad manifest line {line_no}: null chunk")
            if depth(chunk) > MAX_CHUNK_DEPTH:
                raise errors.InvalidInput(
                    f"{path}: bad manifest line {line_no}: nested deeper than "
                    f"{MAX_CHUNK_DEPTH} levels"
                )
            chunks.append(chunk)
    if progress:
        progress(total, total)
    if not chunks:
        raise errors.InvalidInput(f"{path}: empty manifest (no chunks)")
    return chunks


def depth(value: Any) -> int:
    """How deep JSON containers nest in ``value`` (0 for a scalar), without recursion.

    Args:
        value: a decoded JSON value.

    Returns:
        The nesting depth: ``{}`` and ``[]`` are 1, ``[[1]]`` is 2.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level + 1)
            stack.extend((x, level + 1) for x in item if isinstance(x, (dict, list)))
    return deepest


def file_chunks(pattern: str) -> list[dict[str, Any]]:
    """One chunk per regular file matching ``pattern`` (``**`` recurses), sorted by path.

    Returns:
        ``{"path": absolute path, "offset": 0, "length": size in bytes}`` per file.

    Raises:
        InvalidInput: no file matches.
    """
    paths = sorted(
        {os.path.abspath(p) for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)}
    )
    if not paths:
        raise errors.InvalidInput(f"no files match {pattern!r}")
    return [{"path": p, "offset": 0, "length": _size(p)} for p in paths]


def format_chunks(
    pattern: str,
    fmt: str | None = None,
    *,
    chunk_bytes: int | None = None,
    records_per_chunk: int | None = None,
    row_groups_per_chunk: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The chunks of the files matching ``pattern``: by format (``taskq.data``) when one
    is given or the files' extensions tell it, else one whole-file chunk per file
    (``file_chunks``, no format field: read as lines).

    Args:
        pattern: a path, glob or fsspec URL (``s3://bucket/x/*.parquet``).
        fmt: ``lines``, ``jsonl``, ``parquet`` or ``tar``; None guesses per file.
        chunk_bytes: lines/jsonl byte-range size.
        records_per_chunk: lines/jsonl lines per chunk; tar samples per chunk.
        row_groups_per_chunk: parquet row groups per chunk.
        storage_options: passed to fsspec.

    Returns:
        The chunks, files sorted by path.

    Raises:
        InvalidInput: no file matches, a sizing option without a format that takes it,
            a malformed file, the data extra missing (see ``taskq.data.build_chunks``).
    """
    sizing = {
        "chunk_bytes": chunk_bytes,
        "records_per_chunk": records_per_chunk,
        "row_groups_per_chunk": row_groups_per_chunk,
    }
    if fmt is None and "://" not in pattern:
        paths = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
        if all(data.guess_format(p) is None for p in paths):
            given = [k.replace("_", "-") for k, v in sizing.items() if v is not None]
            if paths and given:
                raise errors.InvalidInput(
                    f"--{given[0]} needs a format: give --format "
                    f"(the extensions of {pattern!r} do not tell it)"
                )
            return file_chunks(pattern)
    return data.build_chunks(pattern, fmt, storage_options=storage_options, **sizing)


def line_chunks(
    path: str, records_per_chunk: int, progress: Progress | None = None
) -> list[dict[str, Any]]:
    """Byte ranges of ``path`` holding ``records_per_chunk`` lines each (the last one may
    hold fewer), every range ending at a line end (or at the end of the file).

    Args:
        path: a local text file with one record per line (not compressed).
        records_per_chunk: lines per chunk (>= 1).
        progress: called with (bytes read, file size) as reading goes.

    Returns:
        ``{"path": absolute path, "offset": o, "length": n, "records": r}`` per chunk,
        covering the file exactly once and in order.

    Raises:
        InvalidInput: ``records_per_chunk`` < 1, the file is compressed (its byte ranges
            cannot be read), cannot be read or is empty.
    """
    if not isinstance(records_per_chunk, int) or records_per_chunk < 1:
        raise errors.InvalidInput(f"records per chunk must be >= 1, got {records_per_chunk!r}")
    suffix = next((s for s in COMPRESSED_SUFFIXES if path.lower().endswith(s)), None)
    if suffix:
        raise errors.InvalidInput(
            f"{path}: byte ranges of a compressed file ({suffix}) cannot be read; give it "
            f"whole: --files {path} --format lines|jsonl"
        )
    total = _size(path)
    with _open(path) as f:
        chunks = line_ranges(f, os.path.abspath(path), total, records_per_chunk, progress)
    if not chunks:
        raise errors.InvalidInput(f"{path}: empty file (no lines)")
    return chunks
