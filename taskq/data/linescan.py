"""The line scan: line-aligned byte ranges of an open file, N lines each.

Data flow: a file (local or fsspec) -> ``line_ranges`` -> ``{"path", "offset", "length",
"records"}`` ranges -> the chunk builders of taskq/datasets.py (``line_chunks``, local
files, no extra needed) and taskq/data/lines.py (``--records-per-chunk`` of the lines and
JSON lines formats). Pure Python on bytes: no fsspec, so the builders without the data
extra can use it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from typing import IO, Any

#: Called with (bytes read, total) as a builder reads.
Progress = Callable[[int, int], None]

#: Bytes per read of the scan.
READ_BLOCK = 1 << 20
#: a line of whitespace only (what a JSON lines reader skips: ``bytes.strip``'s set)
_BLANK_LINE = re.compile(rb"^[ \t\r\x0b\x0c]*\n", re.M)


def line_ranges(
    f: IO[bytes],
    path: str,
    total: int,
    records_per_chunk: int,
    progress: Progress | None = None,
    samples: bool = False,
    block_size: int = READ_BLOCK,
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
        block_size: bytes per read (the result is the same whatever it is).

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
        block = f.read(block_size)
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
