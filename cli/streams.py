"""``taskq job append | seal | follow``: feeding a job whose data keeps arriving
(docs/streams.md). Each is the job handle's ``append`` / ``seal``; ``follow`` lists a
prefix every interval (fsspec) and appends the files it has not appended before, keeping
what it appended in the job's ``follow`` hash (``path|size|version`` -> chunks), so a
restarted follower appends nothing twice: a file half appended when it stopped is
appended again as its source, and the engine skips the chunks its record of the file
(and the chunk ids) says went in.

Data flow: operator / producer -> cli/streams.py -> taskq.datasets (chunks) ->
taskq.Client's job handle (``append``) -> Redis.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import select
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

import click

import taskq
from taskq import datasets
from taskq.admin.jobs import check_chunk_id, encode_chunk
from taskq.ops.stopping import StopOnSignals

from .common import client_of, echo_json
from .job import job
from .job_input import ByteSizeType, JsonObjectType

log = logging.getLogger("taskq.follow")

#: An id longer than this is replaced by its digest (the engine takes 1-1024 bytes).
_ID_MAX = 512
#: stdin: a batch goes out once this long passes without a new line (a slow producer's
#: chunks are not held back waiting for a full batch).
_STDIN_IDLE_S = 0.2
#: stdin: the most chunks one batch holds (each batch is checked whole before its first
#: page is written: what arrives together goes in whole or not at all).
_STDIN_BATCH = 10_000


class DurationType(click.ParamType):
    """Seconds: a number with an optional s, m, h suffix (``30s``, ``5m``, ``1.5h``)."""

    name = "DURATION"
    _UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        text = str(value).strip().lower()
        unit = text[-1:] if text[-1:] in self._UNITS else "s"
        try:
            seconds = float(text.removesuffix(unit) if text[-1:] in self._UNITS else text)
        except ValueError:
            self.fail(f"{value!r} is not a duration (e.g. 30s, 5m, 1h)", param, ctx)
        if not seconds >= 0 or seconds == float("inf"):
            self.fail(f"{value!r}: a duration is a finite number >= 0", param, ctx)
        return seconds * self._UNITS[unit]


def _format_options(command: Any) -> Any:
    """The chunking options of `job create` that apply to --files."""
    options = [
        click.option(
            "--format",
            "fmt",
            type=click.Choice(["lines", "jsonl", "parquet", "tar"]),
            default=None,
            help="The files' format (default: from each file's extension).",
        ),
        click.option("--records-per-chunk", type=click.IntRange(min=1), default=None),
        click.option("--chunk-bytes", type=ByteSizeType(), default=None),
        click.option("--row-groups-per-chunk", type=click.IntRange(min=1), default=None),
        click.option(
            "--storage-options", type=JsonObjectType(), default=None, help="fsspec options."
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _backlog_options(command: Any) -> Any:
    command = click.option(
        "--no-wait",
        is_flag=True,
        help="Refuse at once when the job's max_backlog is reached (default: wait for acks).",
    )(command)
    return click.option(
        "--timeout",
        type=DurationType(),
        default=None,
        help="Wait at most this long in all for the backlog to fall (default: no limit).",
    )(command)


def _listing(pattern: str, storage_options: dict[str, Any] | None) -> list[tuple[str, int, str]]:
    """The files matching ``pattern`` now: (path, size, version), sorted by path; the
    version is the etag when the store has one, else the modification time."""
    from taskq.data import storage  # fsspec: the data extra, loaded when files are listed

    fs, root = storage.filesystem(pattern, storage_options)
    try:
        found = fs.glob(root, detail=True) if glob.has_magic(root) else {root: fs.info(root)}
    except FileNotFoundError:
        return []
    local = "://" not in pattern
    out = []
    for path, info in sorted(found.items()):
        if info.get("type") != "file":
            continue
        version = next(
            (
                str(info[k])
                for k in ("ETag", "etag", "mtime", "LastModified", "created")
                if info.get(k)
            ),
            "",
        )
        out.append(
            (path if local else fs.unstrip_protocol(path), int(info.get("size") or 0), version)
        )
    return out


def _file_key(path: str, size: int, version: str) -> str:
    return f"{path}|{size}|{version}"


def _chunk_ids(key: str, n: int) -> list[str]:
    base = key if len(key) <= _ID_MAX else hashlib.sha1(key.encode()).hexdigest()
    return [f"{base}#{k}" for k in range(n)]


def _file_chunks(path: str, fmt: str | None, sizing: dict[str, Any], options: Any) -> list[Any]:
    return datasets.format_chunks(
        glob.escape(path) if "://" not in path else path,
        fmt,
        storage_options=options,
        **sizing,
    )


def _append(
    handle: Any,
    chunks: list[Any],
    ids: list[str] | None,
    no_wait: bool,
    timeout: Any,
    source: str | None = None,
) -> Any:
    return handle.append(chunks, ids=ids, block=not no_wait, timeout=timeout, source=source)


@job.command("append")
@click.argument("name")
@click.argument("source", required=False, metavar="[-]")
@click.option("--files", default=None, help="A glob of files (quoted; local or fsspec URL).")
@_format_options
@click.option(
    "--id-key",
    default=None,
    help="stdin: the field of each JSON line that is its id (a line whose id was "
    "appended before is skipped).",
)
@_backlog_options
@click.option("--json", "as_json", is_flag=True, help="Print what was appended as JSON.")
@click.pass_context
def append_cmd(
    ctx: click.Context,
    name: str,
    source: str | None,
    files: str | None,
    fmt: str | None,
    records_per_chunk: int | None,
    chunk_bytes: int | None,
    row_groups_per_chunk: int | None,
    storage_options: dict[str, Any] | None,
    id_key: str | None,
    no_wait: bool,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Append chunks to job NAME: the files of --files GLOB (chunked as `job create`
    does; each chunk's id is its file's path, size and version, so appending the same
    files again adds nothing), or `-`: one JSON chunk descriptor per line on stdin,
    appended in batches as they come (the lines that arrive together, up to 10,000,
    checked whole before the batch's first write; a bad line stops it: nothing of its
    batch went in, the message says how many tasks the batches before added)."""
    if (files is None) == (source != "-"):
        raise click.UsageError("give either --files GLOB or - (JSON lines on stdin)", ctx)
    if source not in (None, "-"):
        raise click.UsageError(f"unexpected argument {source!r} (quote a --files pattern)", ctx)
    if files is None and (fmt or records_per_chunk or chunk_bytes or row_groups_per_chunk):
        raise click.UsageError("--format and the sizing options go with --files", ctx)
    if files is not None and id_key is not None:
        raise click.UsageError("--id-key goes with - (stdin)", ctx)
    client = client_of(ctx)
    handle = client.job(name)
    handle.status(summaries=0)  # no such job: one line, before any file is read
    added = skipped = 0
    if files is not None:
        sizing = {
            "chunk_bytes": chunk_bytes,
            "records_per_chunk": records_per_chunk,
            "row_groups_per_chunk": row_groups_per_chunk,
        }
        listed = _listing(files, storage_options)
        if not listed:
            raise taskq.InvalidInput(f"no files match {files!r}")
        chunks: list[Any] = []
        ids: list[str] = []
        for path, size, version in listed:  # every file read and checked before a write
            got = _file_chunks(path, fmt, sizing, storage_options)
            chunks += got
            ids += _chunk_ids(_file_key(path, size, version), len(got))
        r = _append(handle, chunks, ids, no_wait, timeout)
        added, skipped = r.tasks, r.skipped
    else:
        counted = [0]  # (what the pages so far added, for a bad line's message)
        for page, page_ids in _stdin_pages(
            name, sys.stdin, id_key, added_so_far=lambda: counted[0]
        ):
            r = _append(handle, page, page_ids, no_wait, timeout)
            counted[0] += r.tasks
            skipped += r.skipped
        added = counted[0]
    if as_json:
        echo_json({"job": name, "tasks_appended": added, "chunks_skipped": skipped})
    else:
        click.echo(
            f"job {name}: {added} tasks appended, {skipped} chunks skipped (appended before)"
        )


def _stdin_pages(
    name: str, stream: IO[str], id_key: str | None, added_so_far: Any
) -> Iterator[tuple[list[Any], list[str] | None]]:
    """Batches of (chunks, ids) from JSON lines: a batch goes out when full
    (``_STDIN_BATCH``), or when the input has been idle a moment (a slow producer), or at
    its end; each line checked as ``append`` checks a chunk and its id.

    Raises:
        InvalidInput: a line that is not JSON, or without its id, or that append would
            refuse (one line, naming it).
    """
    page: list[Any] = []
    ids: list[str] = []
    lineno = 0
    while True:
        if page and not _readable(stream, _STDIN_IDLE_S):
            yield page, ids if id_key else None
            page, ids = [], []
        line = stream.readline()
        if not line:
            break
        lineno += 1
        if not line.strip():
            continue
        try:
            chunk = json.loads(line)
        except ValueError as e:
            raise taskq.InvalidInput(
                f"stdin line {lineno} is not JSON ({e}); {added_so_far()} tasks appended before it"
            ) from e
        if id_key is not None:
            chunk_id = chunk.get(id_key) if isinstance(chunk, dict) else None
            if not isinstance(chunk_id, (str, int)) or isinstance(chunk_id, bool) or chunk_id == "":
                raise taskq.InvalidInput(
                    f"stdin line {lineno} has no {id_key!r} (a string or integer id); "
                    f"{added_so_far()} tasks appended before it"
                )
            ids.append(str(chunk_id))
        try:
            encode_chunk(name, lineno, chunk)
            if id_key is not None:
                check_chunk_id(name, lineno, ids[-1])
        except taskq.InvalidInput as e:
            raise taskq.InvalidInput(
                f"stdin line {lineno}: {e}; {added_so_far()} tasks appended before it"
            ) from None
        page.append(chunk)
        if len(page) >= _STDIN_BATCH:
            yield page, ids if id_key else None
            page, ids = [], []
    if page:
        yield page, ids if id_key else None


def _readable(stream: IO[str], wait_s: float) -> bool:
    """True when a line may be read without waiting long (or the stream is no pipe)."""
    try:
        ready, _, _ = select.select([stream], [], [], wait_s)
    except (ValueError, OSError, TypeError):
        return True  # not a file descriptor (a test's StringIO): read on
    return bool(ready)


@job.command("seal")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON.")
@click.pass_context
def seal_cmd(ctx: click.Context, name: str, as_json: bool) -> None:
    """Close stream job NAME: nothing more is appended; the job completes once every
    task appended is done (at once when none was appended). Sealing a sealed stream
    changes nothing and says so (exit 0)."""
    client = client_of(ctx)
    tasks = client.job(name).seal()
    state = client.status(name, summaries=0).state
    if as_json:
        echo_json(
            {
                "job": name,
                "stream": "sealed",
                "tasks": int(tasks),
                "state": state,
                "already_sealed": tasks.already_sealed,
            }
        )
    elif tasks.already_sealed:
        click.echo(f"job {name}: already sealed, with {tasks} tasks ({state}); nothing changed")
    else:
        click.echo(f"job {name}: sealed with {tasks} tasks ({state})")


@job.command("follow")
@click.argument("name")
@click.option("--files", required=True, help="A glob of files (quoted; local or fsspec URL).")
@_format_options
@click.option(
    "--every",
    type=DurationType(),
    default="30s",
    show_default=True,
    help="How often to list the files.",
)
@click.option(
    "--seal-after",
    type=DurationType(),
    default=None,
    help="Seal the job and exit once no new file has appeared for this long (0: after "
    "the first listing): the end of a bounded backfill.",
)
@_backlog_options
@click.pass_context
def follow_cmd(
    ctx: click.Context,
    name: str,
    files: str,
    fmt: str | None,
    records_per_chunk: int | None,
    chunk_bytes: int | None,
    row_groups_per_chunk: int | None,
    storage_options: dict[str, Any] | None,
    every: float,
    seal_after: float | None,
    no_wait: bool,
    timeout: float | None,
) -> None:
    """Append the files matching --files to job NAME as they appear, each exactly once
    (across restarts too: what was appended is kept in Redis by path, size and
    version); runs until SIGTERM / SIGINT (it finishes the file it is appending) or
    --seal-after."""
    client = client_of(ctx)
    handle = client.job(name)
    handle.status(summaries=0)  # no such job: one line, before listing anything
    sizing = {
        "chunk_bytes": chunk_bytes,
        "records_per_chunk": records_per_chunk,
        "row_groups_per_chunk": row_groups_per_chunk,
    }
    stop = threading.Event()
    with StopOnSignals(stop):
        last_new = time.monotonic()
        while not stop.is_set():
            listed = _listing(files, storage_options)
            keys = [_file_key(*f) for f in listed]
            known = handle.files_appended(keys)
            for (path, _size, _version), key, seen in zip(listed, keys, known, strict=True):
                if seen or stop.is_set():
                    continue
                try:
                    chunks = _file_chunks(path, fmt, sizing, storage_options)
                except taskq.InvalidInput as e:  # a file still being written: the next listing
                    log.warning("job %s: %s not appended yet: %s", name, path, e)
                    continue
                # the file is the source: the engine records how far it went in, so a
                # restart mid-file skips what went in even once it was trimmed
                r = _append(
                    handle, chunks, _chunk_ids(key, len(chunks)), no_wait, timeout, source=key
                )
                handle.file_appended(key, len(chunks))
                last_new = time.monotonic()
                click.echo(f"job {name}: {path}: {r.tasks} tasks appended", err=True)
            if seal_after is not None and time.monotonic() - last_new >= seal_after:
                handle.seal()
                click.echo(f"job {name}: sealed (no new file for {seal_after:g}s)", err=True)
                return
            stop.wait(every if seal_after is None else min(every, max(0.0, seal_after)))
