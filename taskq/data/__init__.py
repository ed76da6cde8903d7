"""Readers and chunk builders for data files: lines, JSONL, Parquet and tar shards.

Data flow: files (local, s3://, gs://, http(s)://, any fsspec URL) -> a format's builder
-> chunks -> ``client.create_job`` -> Redis; then a trainer leases a task ->
``read_task(task.chunks)`` -> the format's reader -> samples -> the training loop.

One module per format (``lines``, ``parquet``, ``tar``), each with one class that both
builds chunks (``Reader.chunks``) and reads them (``Reader.read``). Every chunk names its
``format`` so the reader is picked from the chunk alone. Format modules import pyarrow
and fsspec (the ``data`` extra); this package imports them only when a format is used,
so ``import taskq`` and ``import taskq.data`` need neither.

The contract (docs/data.md says the same, with the chunk fields):

``read_task(task)`` / ``read_task(chunks, start=0, end=None, order=None, **options)``
    The samples of a task from sample index ``start`` (0-based over the whole task) up to
    ``end`` (an index, or a callable asked before each sample: ``task.current_end`` for a
    task whose end a split moves), in the task's sample order: the chunks' order, or the
    permutation ``order`` names (``sample_order``; a job created with
    ``shuffle_samples=True``). ``read_task(task)`` reads a leased task's range in its
    order (``task.chunks``, ``task.start``, ``task.current_end``, ``task.order``), as does
    ``end=task.current_end``. In the chunks' order, chunks whose size is in the chunk
    (parquet ``rows``, tar ``samples``, lines ``records``) are skipped without opening
    them; otherwise the reader skips cheaply: Parquet by row-group metadata, tar by
    headers, lines by scanning. A chunk read to its end that holds other than the samples
    it declares is a DataError, never a boundary.

``sample_order(order, size)``
    The permutation a task's sample positions map to (``order_key``'s key): the one
    function every reader of the project applies (``read_task``, taskq.torch).

``reader_for(chunk) -> Reader``
    The reader of ``chunk["format"]``; a chunk without ``format`` that has
    path/offset/length (``--lines`` / ``--files`` chunks) is read as ``lines``.
    ``Reader.read(chunk, start=0, **options)`` yields the chunk's samples from ``start``;
    its return value (``yield from``) is the number of samples the chunk holds.
    ``Reader.size(chunk)`` is that number when the chunk carries it (parquet ``rows``,
    tar ``samples``, lines ``records``), else None. The Reader class is
    ``taskq.data.storage.Reader`` (importing it needs fsspec).

Samples:
    ``lines`` -> str (the line without its ``\\n`` / ``\\r\\n``); ``jsonl`` -> the decoded
    JSON value (blank lines are skipped); ``parquet`` -> one dict per row (``columns=``
    picks columns; ``batch_rows=N`` yields pyarrow RecordBatches of up to N rows instead,
    and ``start`` still counts rows); ``tar`` -> a WebDataset-style dict
    ``{"__key__": key, "<ext>": bytes, ...}``.

Options (``read_task`` / ``Reader.read``): ``storage_options`` (dict for fsspec, all
formats), ``columns`` and ``batch_rows`` (parquet). An unknown option is InvalidInput.

Errors:
    Any failure to read or decode data raises ``taskq.errors.DataError`` (path, where,
    and the underlying library's error text), never a bare OSError / ArrowInvalid /
    TarError; a trainer fails the task with ``str(e)``. A missing extra raises
    ``InvalidInput("... needs the data extra: pip install 'taskq-ml[data]'")``.

Builders (``build_chunks`` and ``Reader.chunks``) read metadata only (file sizes, Parquet
footers, tar headers; newline scanning only when records per chunk are asked for) and
return JSON-able dicts with a ``format`` field.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .. import errors
from ..models import Task

if TYPE_CHECKING:
    from .storage import Reader

__all__ = [
    "FORMATS",
    "build_chunks",
    "compression_of",
    "guess_format",
    "order_key",
    "read_task",
    "reader",
    "reader_for",
    "sample_order",
]

#: Chunk formats and the module that reads each.
FORMATS = {"lines": "lines", "jsonl": "lines", "parquet": "parquet", "tar": "tar"}

#: Read options, by the formats that use them (others ignore them).
OPTIONS = frozenset({"storage_options", "columns", "batch_rows"})

#: Compression suffixes (whole-file chunks only) and the name fsspec knows them by.
COMPRESSIONS = {
    ".gz": "gzip",
    ".tgz": "gzip",
    ".zst": "zstd",
    ".zstd": "zstd",
    ".bz2": "bz2",
    ".xz": "xz",
}

_EXTENSIONS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".tar": "tar",
    ".tgz": "tar",
}


def compression_of(path: str) -> str | None:
    """The compression a path's suffix names (``gzip``, ``zstd``, ...), or None.

    Args:
        path: a file path or URL.

    Returns:
        The fsspec compression name, or None for an uncompressed suffix.
    """
    for suffix, name in COMPRESSIONS.items():
        if path.lower().endswith(suffix):
            return name
    return None


def guess_format(path: str) -> str | None:
    """The format a path's extension names, ignoring a compression suffix.

    Args:
        path: a file path, URL or glob (``data/*.parquet``).

    Returns:
        ``jsonl`` (.jsonl, .ndjson), ``parquet`` (.parquet, .pq), ``tar`` (.tar, .tgz), or
        None (``lines`` is never guessed: give ``--format lines``).
    """
    name = path.lower().rsplit("/", 1)[-1]
    if name.endswith(".tgz"):
        return "tar"
    for suffix in COMPRESSIONS:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    for ext, fmt in _EXTENSIONS.items():
        if name.endswith(ext):
            return fmt
    return None


def _module(fmt: str) -> Any:
    """The format module, imported now; a missing extra becomes InvalidInput."""
    try:
        return importlib.import_module(f".{FORMATS[fmt]}", __name__)
    except ImportError as e:
        raise errors.InvalidInput(
            f"format {fmt} needs the data extra: pip install 'taskq-ml[data]' ({e})"
        ) from e


def reader(fmt: str) -> Reader:
    """The reader (and builder) of format ``fmt``.

    Args:
        fmt: one of ``lines``, ``jsonl``, ``parquet``, ``tar``.

    Returns:
        The format's Reader.

    Raises:
        InvalidInput: an unknown format, or the data extra is not installed.
    """
    if fmt not in FORMATS:
        raise errors.InvalidInput(f"unknown format {fmt!r} (one of {', '.join(sorted(FORMATS))})")
    return _module(fmt).READERS[fmt]  # type: ignore[no-any-return]


def reader_for(chunk: Any) -> Reader:
    """The reader of a chunk, by its ``format`` field.

    Args:
        chunk: a chunk dict; without ``format``, one with path/offset/length is ``lines``.

    Returns:
        The Reader whose ``read(chunk, start=0, **options)`` yields the chunk's samples.

    Raises:
        DataError: the chunk is not a dict, names an unknown format, or has no format
            and no path/offset/length.
        InvalidInput: the data extra is not installed.
    """
    if not isinstance(chunk, dict):
        raise errors.DataError(repr(chunk)[:80], "chunk", "not an object")
    fmt = chunk.get("format")
    if fmt is None:
        if not all(k in chunk for k in ("path", "offset", "length")):
            raise errors.DataError(
                str(chunk.get("path", repr(chunk)[:80])),
                "chunk",
                "no format and no path/offset/length",
            )
        fmt = "lines"
    if fmt not in FORMATS:
        raise errors.DataError(str(chunk.get("path", "?")), "chunk", f"unknown format {fmt!r}")
    return reader(fmt)


def check_options(options: dict[str, Any]) -> None:
    """Refuse read options no format knows (a typo would otherwise be ignored).

    Raises:
        InvalidInput: an unknown option.
    """
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise errors.InvalidInput(
            f"unknown read option(s) {', '.join(unknown)} (known: {', '.join(sorted(OPTIONS))})"
        )


def order_key(job: str, seed: int, pass_no: int, task_id: int) -> str:
    """The key of a task's sample permutation in a job whose samples are shuffled: fixed
    by the job (an engine job's name: a sharded job's shard), its seed, the pass and the
    task, so every reader of the job reads a task in one order (``Task.order``)."""
    return f"{job}:{seed}:{pass_no}:{task_id}"


def sample_order(order: str | None, size: int) -> list[int]:
    """The task's sample positions mapped to its samples in the chunks' order: position
    ``k`` is sample ``sample_order(order, size)[k]``. What every reader applies (a piece
    ``[start, end)`` of a task means the same samples to all).

    Args:
        order: the task's ``order`` (``order_key``); None: the chunks' order.
        size: the task's samples.

    Returns:
        A permutation of ``range(size)``.
    """
    positions = list(range(size))
    if order is not None:
        random.Random(order).shuffle(positions)
    return positions


def read_task(
    chunks: Iterable[Any] | Task,
    start: int | None = None,
    end: int | Callable[[], int | None] | None = None,
    order: str | None = None,
    **options: Any,
) -> Iterator[Any]:
    """The samples of a task from position ``start`` up to (not including) ``end``, in
    the task's sample order.

    Args:
        chunks: the task's chunks (``task.chunks``), or a leased ``Task``: its chunks,
            ``start``, ``current_end`` and ``order`` (what a loop that reads ranges
            passes: ``Trainer(ranges=True)``).
        start: 0-based position over the whole task of the first sample to yield (None:
            the task's ``start``, else 0).
        end: where to stop: None (the task's end), a position, or a callable asked before
            each sample (``task.current_end``: a split task's end moves while it is
            read, docs/design.md "Tail splitting"; its task's order is applied); a
            batch (``batch_rows``) is cut there.
        order: the task's sample order (``task.order``, ``order_key``): None, the chunks'
            order; else the task is read whole into memory and its samples given in the
            permutation ``sample_order`` makes.
        **options: ``storage_options`` (fsspec), ``columns`` and ``batch_rows`` (parquet).

    Returns:
        An iterator of samples (see the module docstring for each format's samples).

    Raises:
        DataError: a chunk's data cannot be read or decoded, or a chunk read to its end
            holds other than the samples it declares.
        InvalidInput: ``start`` < 0, ``end`` neither None, an integer >= 0 nor a
            callable, an unknown option, ``batch_rows`` with an ``order``, or the data
            extra is missing.
    """
    if isinstance(chunks, Task):
        task = chunks
        chunks = task.chunks
        start = task.start if start is None else start
        end = task.current_end if end is None else end
        order = task.order if order is None else order
    elif order is None and isinstance(getattr(end, "__self__", None), Task):
        order = end.__self__.order  # type: ignore[union-attr]
    start = 0 if start is None else start
    if not isinstance(start, int) or start < 0:
        raise errors.InvalidInput(f"start must be an integer >= 0, got {start!r}")
    if (
        end is not None
        and not callable(end)
        and (not isinstance(end, int) or isinstance(end, bool) or end < 0)
    ):
        raise errors.InvalidInput(f"end must be None, an integer >= 0 or a callable, got {end!r}")
    check_options(options)
    if order is not None and options.get("batch_rows"):
        raise errors.InvalidInput("batch_rows reads in the chunks' order: not with an order")
    chunks = list(chunks)
    if callable(end):  # a loop that follows a split's end: its size makes it splittable
        count_task(chunks, **{k: v for k, v in options.items() if k == "storage_options"})
    if order is None:
        samples = _samples(chunks, start, options)
    else:
        items = list(_samples(chunks, 0, options))
        positions = sample_order(order, len(items))
        samples = (items[positions[k]] for k in range(start, len(items)))
    if end is None:
        return samples
    return _until(samples, start, end)


def _until(samples: Iterator[Any], at: int, end: int | Callable[[], int | None]) -> Iterator[Any]:
    """``samples`` (the first one is sample ``at``) up to ``end``, asked before each."""
    limit = end if callable(end) else (lambda: end)
    try:
        for item in samples:
            stop = limit()
            if stop is not None and at >= stop:
                return
            rows = getattr(item, "num_rows", None) if hasattr(item, "slice") else None
            if isinstance(rows, int):  # a RecordBatch (batch_rows): cut at the end
                if stop is not None and at + rows > stop:
                    yield item.slice(0, stop - at)
                    return
                at += rows
            else:
                at += 1
            yield item
    finally:
        close = getattr(samples, "close", None)
        if close is not None:
            close()


def task_size(chunks: Any) -> int | None:
    """The number of samples of a task when every chunk says its own (a ``format`` whose
    reader knows the chunk's size: parquet ``rows``, tar ``samples``, ...), else None.
    Never raises: a chunk that is not one of ours has no known size.

    Args:
        chunks: the task's chunks (``Task.chunks``).

    Returns:
        The task's samples, or None.
    """
    if not isinstance(chunks, list) or not chunks:
        return None
    total = 0
    for chunk in chunks:
        if not isinstance(chunk, dict) or chunk.get("format") not in FORMATS:
            return None
        try:
            size = reader_for(chunk).size(chunk)
        except (errors.TaskqError, ValueError, TypeError):
            return None
        if not isinstance(size, int) or isinstance(size, bool):
            return None
        total += size
    return total


def count_task(chunks: Any, **options: Any) -> int | None:
    """``task_size``, measured where the reader can count a chunk cheaply (a JSONL or
    lines byte range of a local file: scanned once, not decoded; the count is written into
    the chunk, so ``task_size`` says it from then on). A size a chunk declares is checked
    against the data there: the size a split is made from is the data's. What makes a
    task of the default ``--chunk-bytes`` ranges splittable at a pass's tail (called
    before a reader's first report of a task's size: ``read_task`` with a moving end,
    taskq.torch's loader).

    Args:
        chunks: the task's chunks (``Task.chunks``).
        **options: ``storage_options`` (fsspec).

    Returns:
        The task's samples, or None (a chunk of unknown size that is not counted here).

    Raises:
        DataError: a chunk's data cannot be read, or holds other than the samples it
            declares.
    """
    if not isinstance(chunks, list) or not chunks:
        return task_size(chunks)
    for chunk in chunks:
        if not isinstance(chunk, dict) or chunk.get("format") not in FORMATS:
            return None
        rdr = reader_for(chunk)
        declared = rdr.size(chunk)
        if declared is not None and chunk.get(_CHECKED) == declared:
            continue
        counted = rdr.count(chunk, **options)
        if counted is None:
            if declared is None:
                return None
            continue  # not countable here (remote): a whole read checks it (_samples)
        if declared is not None and counted != declared:
            raise _size_error(chunk, counted, declared)
        chunk[_CHECKED] = counted
    return task_size(chunks)


#: a chunk's size as ``count_task`` checked it against its data (in this process only:
#: the key is written into the task's chunks as leased, never sent)
_CHECKED = "_taskq_counted"


def _samples(chunks: list[Any], start: int, options: dict[str, Any]) -> Iterator[Any]:
    for chunk in chunks:
        rdr = reader_for(chunk)
        size = rdr.size(chunk)
        if size is not None and start >= size:
            start -= size
            continue
        held = yield from rdr.read(chunk, start=start, **options)
        if size is not None and held != size:  # a declared size is checked, never trusted
            raise _size_error(chunk, held, size)
        start = max(0, start - held)


def _size_error(chunk: dict[str, Any], held: int, size: int) -> errors.DataError:
    return errors.DataError(
        str(chunk.get("path", "?")),
        "chunk",
        f"holds {held} samples, its descriptor says {size}",
    )


def build_chunks(
    pattern: str,
    fmt: str | None = None,
    *,
    chunk_bytes: int | None = None,
    records_per_chunk: int | None = None,
    row_groups_per_chunk: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The chunks of every file matching ``pattern`` (sorted by path), by format.

    Args:
        pattern: a path, glob or URL (``data/*.jsonl``, ``s3://bucket/x/**/*.parquet``).
        fmt: the format of every file; None guesses it per file from its extension.
        chunk_bytes: lines/jsonl: byte-range size (default ``lines.DEFAULT_CHUNK_BYTES``).
        records_per_chunk: lines/jsonl: lines per chunk (scans for newlines); tar:
            samples per chunk (default one chunk per shard).
        row_groups_per_chunk: parquet: row groups per chunk (default 1).
        storage_options: passed to fsspec (credentials, endpoint, ...).

    Returns:
        JSON-able chunk dicts, each with a ``format`` field.

    Raises:
        InvalidInput: no file matches, a file's format cannot be told, a sizing option
            does not fit the format, a file is unreadable or malformed (bad footer,
            truncated tar), or the data extra is missing.
    """
    from . import storage  # noqa: PLC0415 -- fsspec only when files are built

    if fmt is not None:
        reader(fmt)  # unknown format / missing extra before any file is listed
    try:
        files = storage.expand(pattern, storage_options)
    except ImportError as e:  # pragma: no cover - the extra is missing
        raise errors.InvalidInput(
            f"{pattern} needs the data extra: pip install 'taskq-ml[data]' ({e})"
        ) from e
    by_format: dict[str, list[tuple[str, int]]] = {}
    for path, size in files:
        f = fmt or guess_format(path)
        if f is None:
            raise errors.InvalidInput(
                f"{path}: cannot tell the format from the extension "
                f"(give --format {'|'.join(FORMATS)})"
            )
        by_format.setdefault(f, []).append((path, size))
    sizing = {
        "chunk_bytes": chunk_bytes,
        "records_per_chunk": records_per_chunk,
        "row_groups_per_chunk": row_groups_per_chunk,
    }
    for name, value in sizing.items():
        if value is not None and not any(name in reader(f).sizing for f in by_format):
            raise errors.InvalidInput(
                f"{name.replace('_', '-')} does not apply to {'/'.join(sorted(by_format))} files"
            )
    per_path: dict[str, list[dict[str, Any]]] = {}
    for f, group in by_format.items():
        rdr = reader(f)
        opts = {k: v for k, v in sizing.items() if k in rdr.sizing and v is not None}
        for chunk in rdr.chunks(group, storage_options=storage_options, **opts):
            per_path.setdefault(chunk["path"], []).append(chunk)
    chunks = [c for path, _ in files for c in per_path.get(path, [])]
    if not chunks:
        raise errors.InvalidInput(f"{pattern}: no data (every matching file is empty)")
    return chunks
