"""Chunk builders: turn a data set on disk into the chunk descriptors of a job.

Each builder reads and validates its whole input before returning, so a bad input
fails before anything is written to Redis (``client.create_job`` then stages and flips
the job in one go). Chunks are JSON: ``{"path": ..., "offset": ..., "length": ...}``
for files and line ranges, anything JSON for a manifest.

Data flow: files on disk -> datasets.py -> chunks -> client.create_job -> Redis.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable
from typing import Any

from . import errors

Progress = Callable[[int, int], None]

_READ_BLOCK = 1 << 20


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
            if chunk is None:
                raise errors.InvalidInput(f"{path}: bad manifest line {line_no}: null chunk")
            chunks.append(chunk)
    if progress:
        progress(total, total)
    if not chunks:
        raise errors.InvalidInput(f"{path}: empty manifest (no chunks)")
    return chunks


def file_chunks(pattern: str) -> list[dict[str, Any]]:
    """One chunk per regular file matching ``pattern`` (``**`` recurses), sorted by path.

    Returns:
        ``{"path": absolute path, "offset": 0, "length": size in bytes}`` per file.

    Raises:
        InvalidInput: no file matches.
    """
    paths = sorted({os.path.abspath(p) for p in glob.glob(pattern, recursive=True)
                    if os.path.isfile(p)})
    if not paths:
        raise errors.InvalidInput(f"no files match {pattern!r}")
    return [{"path": p, "offset": 0, "length": _size(p)} for p in paths]


def line_chunks(
    path: str, records_per_chunk: int, progress: Progress | None = None
) -> list[dict[str, Any]]:
    """Byte ranges of ``path`` holding ``records_per_chunk`` lines each (the last one may
    hold fewer), every range ending at a line end (or at the end of the file).

    Args:
        path: a text file with one record per line.
        records_per_chunk: lines per chunk (>= 1).
        progress: called with (bytes read, file size) as reading goes.

    Returns:
        ``{"path": absolute path, "offset": o, "length": n, "records": r}`` per chunk,
        covering the file exactly once and in order.

    Raises:
        InvalidInput: ``records_per_chunk`` < 1, the file cannot be read or is empty.
    """
    if not isinstance(records_per_chunk, int) or records_per_chunk < 1:
        raise errors.InvalidInput(f"records per chunk must be >= 1, got {records_per_chunk!r}")
    total = _size(path)
    abspath = os.path.abspath(path)
    chunks: list[dict[str, Any]] = []
    start = 0  # offset of the current chunk's first byte
    records = 0  # complete lines in the current chunk so far
    pos = 0  # file offset of the block being scanned
    with _open(path) as f:
        while True:
            block = f.read(_READ_BLOCK)
            if not block:
                break
            i = 0
            left = block.count(b"\n")  # line ends in block[i:]
            while True:
                need = records_per_chunk - records
                if left < need:  # the chunk cannot end in this block: count, move on
                    records += left
                    break
                for _ in range(need):
                    i = block.index(b"\n", i) + 1
                left -= need
                end = pos + i
                chunks.append({"path": abspath, "offset": start, "length": end - start,
                               "records": records_per_chunk})
                start, records = end, 0
            pos += len(block)
            if progress:
                progress(pos, total)
    if pos > start:  # a last line without a newline, or a short last chunk
        chunks.append({"path": abspath, "offset": start, "length": pos - start,
                       "records": records + 1 if not _ends_with_newline(path, pos) else records})
    if not chunks:
        raise errors.InvalidInput(f"{path}: empty file (no lines)")
    return chunks


def _ends_with_newline(path: str, size: int) -> bool:
    with _open(path) as f:
        f.seek(size - 1)
        return bool(f.read(1) == b"\n")
