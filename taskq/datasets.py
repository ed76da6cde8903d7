"""Chunk builders: turn a data set on disk into the chunk descriptors of a job.

Each builder reads and validates its whole input before returning, so a bad input
fails before anything is written to Redis (``client.create_job`` then stages and flips
the job in one go). Chunks are JSON: ``{"path": ..., "offset": ..., "length": ...}``
for files and line ranges, anything JSON (nested at most ``MAX_CHUNK_DEPTH`` deep) for a
manifest. ``format_chunks`` hands files of a known format (lines, JSONL, Parquet, tar) to
``taskq.data``, whose chunks carry a ``format`` field (docs/data.md).

Data flow: files on disk -> datasets.py (-> taskq.data) -> chunks -> client.create_job
-> Redis.
"""

from __future__ import annotations

import bisect
import glob
import json
import os
import re
from collections.abc import Callable
from typing import IO, Any

from . import errors

Progress = Callable[[int, int], None]

_READ_BLOCK = 1 << 20
#: a line of whitespace only (what a JSON lines reader skips: ``bytes.strip``'s set)
_BLANK_LINE = re.compile(rb"^[ \t\r\x0b\x0c]*\n", re.M)

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
    from . import data

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


def line_ranges(
    f: IO[bytes],
    path: str,
    total: int,
    records_per_chunk: int,
    progress: Progress | None = None,
    samples: bool = False,
) -> list[dict[str, Any]]:
    """The line-aligned ranges of an open file, ``records_per_chunk`` lines each.

    Args:
        f: the file, at its start (any binary file object: local or fsspec).
        path: the path the chunks name.
        total: the file's size (for ``progress``).
        records_per_chunk: lines per chunk (>= 1).
        progress: called with (bytes read, total) as reading goes.
        samples: also count each range's lines that are not blank (JSON lines: its
            samples, what lets the engine split a task of it, docs/design.md).

    Returns:
        ``{"path", "offset", "length", "records"[, "samples"]}`` per range, in order
        (none for an empty file).
    """
    chunks: list[dict[str, Any]] = []
    start = 0  # offset of the current chunk's first byte
    records = 0  # complete lines in the current chunk so far
    blanks = 0  # blank lines among them (with ``samples``)
    pos = 0  # file offset of the block being scanned
    last = b"\n"  # the file's last byte so far
    # with ``samples``: whether the line the block begins in is blank so far (what came
    # of it before the block is whitespace only)
    open_blank = True

    def chunk(length: int, n: int, nblank: int) -> dict[str, Any]:
        c: dict[str, Any] = {"path": path, "offset": start, "length": length, "records": n}
        if samples:
            c["samples"] = n - nblank
        return c

    while True:
        block = f.read(_READ_BLOCK)
        if not block:
            break
        last = block[-1:]
        # ends (in block) of the blank lines: a match at 0 continues the line before it
        ends = []
        if samples:
            ends = [m.end() for m in _BLANK_LINE.finditer(block) if m.start() or open_blank]
            nl = block.rfind(b"\n")
            if nl >= 0:
                open_blank = not block[nl + 1 :].strip()
            else:
                open_blank = open_blank and not block.strip()
        k = 0  # blank line ends in ends[:k] are counted already
        i = 0
        left = block.count(b"\n")  # line ends in block[i:]
        while True:
            need = records_per_chunk - records
            if left < need:  # the chunk cannot end in this block: count, move on
                records += left
                blanks += len(ends) - k
                break
            for _ in range(need):
                i = block.index(b"\n", i) + 1
            left -= need
            end = pos + i
            j = bisect.bisect_right(ends, i, k)
            chunks.append(chunk(end - start, records_per_chunk, blanks + j - k))
            k, start, records, blanks = j, end, 0, 0
        pos += len(block)
        if progress:
            progress(pos, total)
    if pos > start:  # a last line without a newline, or a short last chunk
        partial = last != b"\n"
        chunks.append(chunk(pos - start, records + partial, blanks + (partial and open_blank)))
    return chunks
