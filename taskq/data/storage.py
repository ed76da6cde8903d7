"""Files through fsspec, data errors in one place, and the Reader base of every format.

Data flow: a chunk's path -> ``open_file`` (fsspec: local, s3://, gs://, http(s)://, ...;
remote files are read by range) -> a format module's reader. Builders list files with
``expand``. A reader opens with ``reading`` (any library error becomes ``DataError``),
a builder with ``building`` (the same error is ``InvalidInput``: bad input at create).
"""

from __future__ import annotations

import contextlib
import glob
import io
from collections.abc import Generator, Iterator
from typing import IO, Any, cast

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractBufferedFile

from .. import errors
from . import compression_of

# Errors that mean a bug in the calling code, not bad data: never turned into DataError.
_PROGRAMMING = (TypeError, AttributeError, NameError, AssertionError, NotImplementedError)

#: Buffer over remote files: line scanning and tar headers read this much per request.
REMOTE_BUFFER = 1 << 20


def filesystem(path: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    """The fsspec filesystem of ``path`` and the path as that filesystem names it."""
    fs, fs_path = fsspec.core.url_to_fs(path, **(storage_options or {}))
    return fs, fs_path


def expand(pattern: str, storage_options: dict[str, Any] | None = None) -> list[tuple[str, int]]:
    """The regular files matching ``pattern``, sorted, with their sizes in bytes.

    Args:
        pattern: a path, glob (``**`` recurses) or URL; a URL keeps its protocol in the
            returned paths, a local path becomes absolute.
        storage_options: passed to fsspec.

    Returns:
        ``(path, size)`` per file, sorted by path.

    Raises:
        InvalidInput: nothing matches, the pattern names a directory, or listing fails.
    """
    try:
        fs, root = filesystem(pattern, storage_options)
        if glob.has_magic(root):
            found = fs.glob(root, detail=True)
        else:
            found = {root: fs.info(root)}
    except FileNotFoundError:
        found = {}
    except Exception as e:
        if isinstance(e, _PROGRAMMING):
            raise
        raise errors.InvalidInput(f"cannot list {pattern}: {describe(e)}") from e
    files = sorted((p, info) for p, info in found.items() if info.get("type") == "file")
    if not files:
        if found and not glob.has_magic(root):
            raise errors.InvalidInput(
                f"{pattern} is a directory: give a glob, e.g. '{pattern.rstrip('/')}/*.parquet'"
            )
        raise errors.InvalidInput(f"no files match {pattern!r}")
    local = isinstance(fs, LocalFileSystem)
    return [
        (p if local else fs.unstrip_protocol(p), int(info.get("size") or 0)) for p, info in files
    ]


def describe(e: BaseException) -> str:
    """The library's own error text, with its type (``ArrowInvalid: ...``)."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class Spot:
    """Where a reader is in a file, for the error it may raise."""

    def __init__(self, path: str, where: str = "open") -> None:
        self.path = path
        self.where = where


@contextlib.contextmanager
def guarded(spot: Spot) -> Iterator[Spot]:
    """Turn any library error raised inside into ``DataError(path, where, text)``.

    taskq's own errors and programming errors (TypeError, ...) pass through.
    """
    try:
        yield spot
    except errors.TaskqError:
        raise
    except _PROGRAMMING:
        raise
    except Exception as e:
        raise errors.DataError(spot.path, spot.where, describe(e)) from e


@contextlib.contextmanager
def open_file(
    path: str, storage_options: dict[str, Any] | None = None, compression: str | None = None
) -> Iterator[IO[bytes]]:
    """A binary file object for ``path`` (decompressed when ``compression`` is given).

    Remote files are read by range through fsspec's block cache, behind a 1 MiB buffer
    so that line scanning does not fetch per line. Errors pass out unchanged: callers
    open inside ``guarded``.
    """
    fs, fs_path = filesystem(path, storage_options)
    with fs.open(fs_path, "rb", compression=compression) as f:
        # fsspec's remote files read a whole block per readline, and zstandard's stream
        # reader has no readline: a buffer in front fixes both
        if isinstance(f, AbstractBufferedFile) or compression == "zstd":
            yield cast(IO[bytes], io.BufferedReader(f, REMOTE_BUFFER))
        else:
            yield f


@contextlib.contextmanager
def reading(
    path: str,
    storage_options: dict[str, Any] | None = None,
    compression: str | None = None,
    where: str = "open",
) -> Iterator[tuple[IO[bytes], Spot]]:
    """For readers: ``open_file`` inside ``guarded``, the one way a reader opens a file.

    Any library error raised while opening or inside the ``with`` becomes
    ``DataError(path, spot.where, text)``; the reader moves ``spot.where`` along as it
    reads, so the error says where in the file it stopped.

    Args:
        path: the file (a local path or an fsspec URL).
        storage_options: passed to fsspec.
        compression: decompress with this fsspec codec (``gzip``, ``zstd`` ...).
        where: the spot's first place (``open`` unless the reader knows better).

    Returns:
        A context manager giving ``(file, spot)``.

    Raises:
        DataError: the file cannot be opened, or reading it failed.
    """
    spot = Spot(path, where)
    with guarded(spot), open_file(path, storage_options, compression) as f:
        yield f, spot


@contextlib.contextmanager
def building(path: str, storage_options: dict[str, Any] | None = None) -> Iterator[IO[bytes]]:
    """For builders: ``reading``, where a file that cannot be read or parsed is bad input.

    Args:
        path: the file (a local path or an fsspec URL).
        storage_options: passed to fsspec.

    Returns:
        A context manager giving the open file.

    Raises:
        InvalidInput: the file cannot be opened, or reading it failed.
    """
    try:
        with reading(path, storage_options, where="") as (f, _):
            yield f
    except errors.DataError as e:
        raise errors.InvalidInput(str(e)) from e


def chunk_path(chunk: dict[str, Any]) -> str:
    """The chunk's path, or DataError when it has none."""
    path = chunk.get("path")
    if not isinstance(path, str) or not path:
        raise errors.DataError(repr(chunk)[:80], "chunk", "no path")
    return path


def chunk_int(chunk: dict[str, Any], field: str, default: int | None = None) -> int | None:
    """An integer field of the chunk (>= 0), ``default`` when absent; DataError if bad."""
    value = chunk.get(field, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise errors.DataError(
            str(chunk.get("path")), "chunk", f"{field} must be an integer >= 0, got {value!r}"
        )
    return value


def chunk_compression(chunk: dict[str, Any], path: str) -> str | None:
    """The chunk's ``compression`` field, else what the path's suffix says."""
    value = chunk.get("compression", compression_of(path))
    return str(value) if value else None


def chunk_range(chunk: dict[str, Any], unit: str) -> tuple[str, str | None, int, int | None]:
    """The ``path``, ``compression``, ``offset`` and ``length`` of a ranged chunk.

    Args:
        chunk: a chunk with a path and, optionally, ``offset`` (default 0), ``length``
            (default: to the end) and ``compression``.
        unit: what the range counts in the error (``byte``, ``member``).

    Returns:
        ``(path, compression, offset, length)``.

    Raises:
        DataError: no path, a bad offset or length, or a range of a compressed file (a
            compressed stream cannot be entered half-way; its chunk is the whole file).
    """
    path = chunk_path(chunk)
    compression = chunk_compression(chunk, path)
    offset = chunk_int(chunk, "offset", 0) or 0
    length = chunk_int(chunk, "length")
    if compression and offset:
        raise errors.DataError(
            path,
            f"byte {offset}",
            f"a {unit} range of a compressed file cannot be read (whole-file chunks only)",
        )
    return path, compression, offset, length


def chunk_count(chunk: dict[str, Any], field: str) -> int | None:
    """A count the builder wrote into the chunk (``rows``, ``samples``), None if absent or
    not an integer >= 0 (``Reader.size`` is a hint: reading then counts)."""
    value = chunk.get(field)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class Reader:
    """One format: builds chunks from files (metadata only) and reads chunks as samples.

    Subclasses set ``format``, ``sizing`` (the builder options they take) and implement
    ``chunks`` and ``read``.
    """

    format = ""
    sizing: frozenset[str] = frozenset()

    def chunks(
        self,
        files: list[tuple[str, int]],
        storage_options: dict[str, Any] | None = None,
        **sizing: Any,
    ) -> list[dict[str, Any]]:
        """The chunks of ``files`` (``(path, size)`` pairs, in order).

        Args:
            files: the files, as ``expand`` lists them.
            storage_options: passed to fsspec.
            **sizing: the format's builder options (``sizing``).

        Returns:
            JSON-able chunk dicts with a ``format`` field.

        Raises:
            InvalidInput: a file cannot be read or is malformed, or bad sizing.
        """
        raise NotImplementedError

    def read(
        self, chunk: dict[str, Any], start: int = 0, **options: Any
    ) -> Generator[Any, None, int]:
        """The chunk's samples from index ``start`` (0-based within the chunk).

        Args:
            chunk: a chunk of this format.
            start: samples to skip first.
            **options: read options (see ``taskq.data``); others' options are ignored.

        Returns:
            A generator of samples; its return value is the number of samples the chunk
            holds (skipped ones included).

        Raises:
            DataError: the data cannot be read or decoded.
        """
        raise NotImplementedError

    def size(self, chunk: dict[str, Any]) -> int | None:
        """The number of samples in ``chunk`` if the chunk says so, else None."""
        return None

    def count(self, chunk: dict[str, Any], **options: Any) -> int | None:
        """Count the samples of a chunk from its data, when that is cheap (a byte range
        of a local file: scanned, not decoded), and write the count into a chunk that
        does not say its size, so ``size`` says it from then on (a size it says is
        checked against the count: ``taskq.data.count_task``); None when it cannot be
        counted here.

        Raises:
            DataError: the data cannot be read.
        """
        return None

    def whole_file(self, path: str, compression: str, size: int) -> dict[str, Any]:
        """The chunk of a compressed file: read whole, as one stream (no counts: the
        builder reads no compressed data)."""
        return {"format": self.format, "path": path, "compression": compression, "bytes": size}
