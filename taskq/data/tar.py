"""Tar shards in the WebDataset layout: chunk builder (tar headers) and reader (tarfile).

Data flow: shards -> ``TarReader.chunks`` (headers only: member offsets, keys) -> a
chunk per shard or per ``records_per_chunk`` samples -> ... -> ``TarReader.read`` ->
``{"__key__": key, "<ext>": bytes, ...}`` per sample.

Members are grouped into samples as WebDataset does: the key is the member's path up to
the first dot of its file name, the extension (lower-cased) is the rest; consecutive
members with the same key make one sample; members without an extension and non-files
are skipped. A member range starts at the header offset of a sample's first member, so
a chunk holds whole samples. Compressed shards (.tar.gz, .tgz, ...) are streamed whole.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Generator, Iterator
from typing import IO, Any

from .. import errors
from . import compression_of
from .storage import Reader, building, chunk_count, chunk_int, chunk_range, reading

# WebDataset's base_plus_ext: key = path up to the first dot of the file name.
_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")

_BLOCK = tarfile.BLOCKSIZE

# End-of-archive zeros are two blocks, padded to a record (tarfile's RECORDSIZE, 10 KiB,
# or larger blocking factors of other tools): anything longer after the last member is
# not padding.
_TAIL_MAX = 64 << 10


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, ext)`` of a member name, or None when it has no extension.

    Args:
        name: the member's path in the tar.

    Returns:
        The sample key and the lower-cased extension (``a/b.seg.JPG`` -> ``a/b``,
        ``seg.jpg``).
    """
    m = _KEY_EXT.match(name)
    return (m.group(1), m.group(2).lower()) if m else None


def _members(tf: tarfile.TarFile, end: int | None) -> Iterator[tuple[tarfile.TarInfo, str, str]]:
    """The sample members of an open tar, ``(member, key, ext)``, up to header ``end``."""
    for member in tf:
        if end is not None and member.offset >= end:
            break
        if not member.isfile():
            continue
        parts = split_name(member.name)
        if parts:
            yield member, parts[0], parts[1]


def _open_tar(f: IO[bytes], streamed: bool) -> tarfile.TarFile:
    # "r:" reads headers where the file stands and seeks over the data; "r|" streams
    return tarfile.open(fileobj=f, mode="r|" if streamed else "r:")


class TarReader(Reader):
    """``tar``: WebDataset samples, by shard or by member range."""

    format = "tar"
    sizing = frozenset({"records_per_chunk"})

    def chunks(
        self,
        files: list[tuple[str, int]],
        storage_options: dict[str, Any] | None = None,
        records_per_chunk: int | None = None,
        **sizing: Any,
    ) -> list[dict[str, Any]]:
        """One chunk per shard, or per ``records_per_chunk`` samples of a shard, from
        its headers; a compressed shard is one chunk without counts.

        Args:
            files: ``(path, size)`` pairs.
            storage_options: passed to fsspec.
            records_per_chunk: samples per chunk (>= 1); None: one chunk per shard.

        Returns:
            ``{"format": "tar", "path", "offset", "length", "members", "samples"}`` per
            chunk (offset/length: header offset of the first member, bytes through the
            last member's data); ``{"format", "path", "compression", "bytes"}`` per
            compressed shard.

        Raises:
            InvalidInput: a bad size, a file that is not a tar, a shard whose last
                member runs past its end, a duplicate extension in one sample.
        """
        per = records_per_chunk
        if per is not None and (not isinstance(per, int) or per < 1):
            raise errors.InvalidInput(f"records per chunk must be >= 1, got {per!r}")
        out: list[dict[str, Any]] = []
        for path, size in files:
            compression = compression_of(path)
            if compression:
                if per is not None:
                    raise errors.InvalidInput(
                        f"{path}: a compressed shard cannot be read by member range; give it whole"
                    )
                out.append(self.whole_file(path, compression, size))
                continue
            samples = self._scan(path, size, storage_options)
            step = per or max(len(samples), 1)
            for i in range(0, len(samples), step):
                group = samples[i : i + step]
                first, last = group[0][0], group[-1][1]
                out.append(
                    {
                        "format": self.format,
                        "path": path,
                        "offset": first,
                        "length": last - first,
                        "members": sum(s[2] for s in group),
                        "samples": len(group),
                    }
                )
        return out

    def _scan(
        self, path: str, size: int, storage_options: dict[str, Any] | None
    ) -> list[tuple[int, int, int]]:
        """``(first header offset, end of data, members)`` per sample, from headers."""
        samples: list[tuple[int, int, int]] = []
        key = None
        exts: set[str] = set()
        with building(path, storage_options) as f, _open_tar(f, False) as tf:
            for member, k, ext in _members(tf, None):
                data_end = member.offset_data + -(-member.size // _BLOCK) * _BLOCK
                if member.offset_data + member.size > size:
                    raise errors.InvalidInput(
                        f"{path}: member {member.name} at byte "
                        f"{member.offset}: truncated (the file ends "
                        f"at byte {size})"
                    )
                if k != key:
                    samples.append((member.offset, data_end, 1))
                    key, exts = k, {ext}
                    continue
                if ext in exts:
                    raise errors.InvalidInput(
                        f"{path}: member {member.name}: duplicate extension {ext!r} in sample {k!r}"
                    )
                exts.add(ext)
                first, _, n = samples[-1]
                samples[-1] = (first, data_end, n + 1)
            # tarfile stops quietly at a bad or cut header past the first: what follows
            # the last member must be the end-of-archive zeros (a record at most)
            tail_at = tf.offset
            f.seek(tail_at)
            tail = f.read(min(size - tail_at, _TAIL_MAX + 1))
            if len(tail) > _TAIL_MAX or tail.strip(b"\0"):
                raise errors.InvalidInput(f"{path}: bad or truncated tar header at byte {tail_at}")
        return samples

    def read(
        self,
        chunk: dict[str, Any],
        start: int = 0,
        storage_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> Generator[Any, None, int]:
        """The samples of the chunk's members from sample ``start``; members of skipped
        samples are passed over by their headers, their data not read.

        Args:
            chunk: path, and offset/length (absent: the whole shard).
            start: samples to skip.
            storage_options: passed to fsspec.

        Returns:
            A generator of samples; returns the number of samples the chunk holds.

        Raises:
            DataError: not a tar, a truncated member, a duplicate extension, fewer
                samples than the chunk's ``samples``.
        """
        path, compression, offset, length = chunk_range(chunk, "member")
        expected = chunk_int(chunk, "samples")
        end = None if length is None else offset + length
        index = -1
        sample: dict[str, Any] = {}
        where = f"header at byte {offset}"
        with reading(path, storage_options, compression, where) as (f, spot):
            if offset:
                f.seek(offset)
            with _open_tar(f, bool(compression)) as tf:
                for member, key, ext in _members(tf, end):
                    spot.where = f"member {member.name} at byte {member.offset}"
                    if key != sample.get("__key__"):
                        if sample and index >= start:
                            yield sample
                        index += 1
                        sample = {"__key__": key}
                    elif ext in sample:
                        raise errors.DataError(
                            path, spot.where, f"duplicate extension {ext!r} in sample {key!r}"
                        )
                    if index >= start:
                        handle = tf.extractfile(member)
                        assert handle is not None  # a regular file always has one
                        sample[ext] = handle.read()
                    else:
                        sample[ext] = b""  # skipped: data not read
                spot.where = "end of chunk"
        if sample and index >= start:
            yield sample
        count = index + 1
        if expected is not None and count != expected:
            raise errors.DataError(
                path,
                f"bytes {offset}+{length}",
                f"{count} samples, the chunk says {expected} (truncated or corrupt tar?)",
            )
        return count

    def size(self, chunk: dict[str, Any]) -> int | None:
        """The chunk's ``samples`` (from the headers at create)."""
        return chunk_count(chunk, "samples")


READERS: dict[str, Reader] = {"tar": TarReader()}
