"""Text lines and JSON lines by byte range: chunk builder and reader.

Data flow: files -> ``LinesReader.chunks`` (file sizes; newline scanning only for
records per chunk) -> chunks -> ... -> ``LinesReader.read`` -> str / JSON values.

A range ``[offset, offset + length)`` owns the lines that begin inside it: it starts at
its offset when that is 0 or follows a newline, else just after the first newline at or
after its offset, and runs through the line that crosses its end. Ranges that tile a
file therefore read every line exactly once, whatever their sizes: a range may own no
line (empty, or inside one long line). Lines end at ``\\n``; a ``\\r`` before it is
dropped; a last line without a newline is a line. Compressed files (.gz, .zst, .bz2,
.xz) cannot be read by range: they are whole-file chunks, and a byte range of one is
refused (InvalidInput at create, DataError at read).
"""

from __future__ import annotations

import json
from collections.abc import Generator
from typing import Any

from .. import errors
from . import compression_of
from .linescan import line_ranges
from .storage import Reader, building, chunk_count, chunk_range, reading

#: Byte-range size when neither --chunk-bytes nor --records-per-chunk is given: large
#: enough that one ranged read per task amortises a remote open, small enough that a
#: task of one chunk is minutes, not hours, of JSONL.
DEFAULT_CHUNK_BYTES = 64 << 20


def refuse_compressed_ranges(path: str) -> None:
    """InvalidInput when ``path`` is compressed: its byte ranges cannot be read.

    Raises:
        InvalidInput: the path has a compression suffix.
    """
    if compression_of(path):
        raise errors.InvalidInput(
            f"{path}: byte ranges of a compressed file cannot be read; give it whole "
            f"(--files with --format lines|jsonl and no --records-per-chunk)"
        )


class LinesReader(Reader):
    """``lines``: one str sample per line, without its ``\\n`` / ``\\r\\n``."""

    format = "lines"
    sizing = frozenset({"chunk_bytes", "records_per_chunk"})
    #: ranges scanned for lines (``records_per_chunk``) also count their samples (the
    #: lines that are not blank), when those are not the lines themselves
    counts_samples = False

    def chunks(
        self,
        files: list[tuple[str, int]],
        storage_options: dict[str, Any] | None = None,
        chunk_bytes: int | None = None,
        records_per_chunk: int | None = None,
        **sizing: Any,
    ) -> list[dict[str, Any]]:
        """Byte ranges of each file: ``chunk_bytes`` each (by size alone, the default
        64 MiB), or ``records_per_chunk`` lines each (scanning for newlines); one
        whole-file chunk per compressed file.

        Args:
            files: ``(path, size)`` pairs.
            storage_options: passed to fsspec.
            chunk_bytes: bytes per range (>= 1).
            records_per_chunk: lines per range (>= 1); chunks then carry ``records``
                (and, for jsonl, ``samples``: the lines that are not blank, which
                makes their tasks splittable at a pass's tail).

        Returns:
            ``{"format", "path", "offset", "length"[, "records"[, "samples"]]}`` per range, or
            ``{"format", "path", "compression", "bytes"}`` per compressed file.

        Raises:
            InvalidInput: both or bad sizes, records per chunk on a compressed file,
                an unreadable file.
        """
        if chunk_bytes is not None and records_per_chunk is not None:
            raise errors.InvalidInput("give chunk bytes or records per chunk, not both")
        for name, value in (("chunk bytes", chunk_bytes), ("records per chunk", records_per_chunk)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise errors.InvalidInput(f"{name} must be >= 1, got {value!r}")
        step = chunk_bytes or DEFAULT_CHUNK_BYTES
        out: list[dict[str, Any]] = []
        for path, size in files:
            compression = compression_of(path)
            if compression:
                if records_per_chunk is not None:
                    refuse_compressed_ranges(path)
                out.append(self.whole_file(path, compression, size))
            elif records_per_chunk is not None:
                if size == 0:
                    continue
                with building(path, storage_options) as f:
                    ranges = line_ranges(
                        f, path, size, records_per_chunk, samples=self.counts_samples
                    )
                out += [{"format": self.format, **r} for r in ranges]
            else:
                out += [
                    {
                        "format": self.format,
                        "path": path,
                        "offset": o,
                        "length": min(step, size - o),
                    }
                    for o in range(0, size, step)
                ]
        return out

    def read(
        self,
        chunk: dict[str, Any],
        start: int = 0,
        storage_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> Generator[Any, None, int]:
        """The lines the chunk's range owns (see the module docstring), from ``start``.

        Args:
            chunk: path, offset, length; or path and compression (whole file).
            start: samples to skip (scanned, not decoded).
            storage_options: passed to fsspec.

        Returns:
            A generator of samples; returns the number of samples the range holds.

        Raises:
            DataError: unreadable file, bad UTF-8 / JSON, a byte range of a compressed
                file.
        """
        path, compression, offset, length = chunk_range(chunk, "byte")
        end = None if compression or length is None else offset + length
        count = 0
        with reading(path, storage_options, compression) as (f, spot):
            pos = offset
            if offset > 0:
                spot.where = f"byte {offset - 1}"
                f.seek(offset - 1)
                pos = offset - 1 + len(f.readline())
            while end is None or pos < end:
                spot.where = f"line at byte {pos}" + (" (decompressed)" if compression else "")
                line = f.readline()
                if not line:
                    break
                pos += len(line)
                if self.skips(line):
                    continue
                if count >= start:
                    yield self.decode(line)
                count += 1
        return count

    def skips(self, line: bytes) -> bool:
        """Whether a line is no sample (never, for plain lines)."""
        return False

    def decode(self, line: bytes) -> Any:
        """One sample from one raw line (its newline still on)."""
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        return line.decode("utf-8")

    def size(self, chunk: dict[str, Any]) -> int | None:
        """The ``records`` of a chunk built with records per chunk, else None."""
        return chunk_count(chunk, self.count_field)

    #: the chunk's field that says its samples (``size``; written by ``count``)
    count_field = "records"

    def count(self, chunk: dict[str, Any], **options: Any) -> int | None:
        """The samples of an uncompressed byte range of a local file, scanned for its lines
        (not decoded) and written into the chunk when it does not say them (a size it
        says is the caller's to check against this count: ``taskq.data.count_task``);
        None for a remote or compressed file (a second read of the range would cost a
        ranged GET: give ``--records-per-chunk``)."""
        path = str(chunk.get("path", ""))
        if chunk.get("compression") or ("://" in path and not path.startswith("file://")):
            return None
        scan = self.read(chunk, 1 << 62, options.get("storage_options"))
        try:
            while True:
                next(scan)
        except StopIteration as stop:
            counted = int(stop.value)
        if self.size(chunk) is None:
            chunk[self.count_field] = counted
        return counted


class JsonlReader(LinesReader):
    """``jsonl``: one decoded JSON value per line; blank lines are skipped."""

    format = "jsonl"
    counts_samples = True

    def skips(self, line: bytes) -> bool:
        return not line.strip()

    def decode(self, line: bytes) -> Any:
        return json.loads(line)

    # ``records`` counts lines, blank ones too: not a sample count for jsonl; a chunk may
    # say its ``samples`` (its non-blank lines), which a split needs
    count_field = "samples"


READERS: dict[str, Reader] = {"lines": LinesReader(), "jsonl": JsonlReader()}
