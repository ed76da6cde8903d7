"""``taskq job append | seal | follow``: feeding a job whose data keeps arriving
(docs/streams.md). Each is the job handle's ``append`` / ``seal``; ``follow`` lists a
prefix every interval (fsspec; a local folder only when its mtime moved) and appends
each file, once complete (settled), that it has not appended before, keeping what it
appended in the job's ``follow`` hash (a watermark ``(mtime, path)`` and the
``path|size|version`` of the files above it: bounded by ``--horizon``, ``_Follower``),
so a restarted follower appends nothing twice: a file half appended when it stopped is
appended again as its source, and the engine skips the chunks its record of the source
(and the chunk ids) says went in, even once trimmed.

Data flow: operator / producer -> cli/streams.py -> taskq.datasets (chunks) ->
taskq.Client's job handle (``append``) -> Redis.
"""

from __future__ import annotations

import datetime
import glob
import hashlib
import json
import logging
import os
import select
import stat
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any, NamedTuple

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


class Listed(NamedTuple):
    """One file of a listing: its path (a URL off the local disk), size, version (the
    etag when the store has one, else the modification time) and modification time
    (seconds since the epoch; the store's clock)."""

    path: str
    size: int
    version: str
    mtime: float

    @property
    def key(self) -> str:
        """The file's key in the follower's record, and its chunk ids' base."""
        return _file_key(self.path, self.size, self.version)

    @property
    def order(self) -> tuple[float, str]:
        """Where it sits against the follower's watermark: (mtime, path)."""
        return (self.mtime, self.path)


def _mtime(info: dict[str, Any]) -> float:
    """A listing entry's modification time in epoch seconds (infinite when the store has
    none: such a file is settled by two listings and stays above the watermark)."""
    for k in ("mtime", "LastModified", "last_modified", "updated", "created"):
        v = info.get(k)
        if isinstance(v, datetime.datetime):
            return v.timestamp()
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        if isinstance(v, str):
            try:
                return datetime.datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return float("inf")


def _listed(fs: Any, path: str, info: dict[str, Any], local: bool) -> Listed:
    version = next(
        (str(info[k]) for k in ("ETag", "etag", "mtime", "LastModified", "created") if info.get(k)),
        "",
    )
    return Listed(
        path if local else fs.unstrip_protocol(path),
        int(info.get("size") or 0),
        version,
        _mtime(info),
    )


def _listing(pattern: str, storage_options: dict[str, Any] | None) -> list[Listed]:
    """The files matching ``pattern`` now, sorted by path."""
    from taskq.data import storage  # fsspec: the data extra, loaded when files are listed

    fs, root = storage.filesystem(pattern, storage_options)
    try:
        found = fs.glob(root, detail=True) if glob.has_magic(root) else {root: fs.info(root)}
    except FileNotFoundError:
        return []
    local = "://" not in pattern
    return [
        _listed(fs, path, info, local)
        for path, info in sorted(found.items())
        if info.get("type") == "file"
    ]


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
    feed: str | None = None,
) -> Any:
    return handle.append(
        chunks, ids=ids, block=not no_wait, timeout=timeout, source=source, feed=feed
    )


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
@click.option(
    "--feed",
    default=None,
    metavar="SOURCE",
    help="NAME is a mixed job and SOURCE its open stream source: the chunks are that "
    "source's next tasks (docs/mixing.md).",
)
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
    feed: str | None,
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
        for f in listed:  # every file read and checked before a write
            if not _utf8(f.path):
                raise taskq.InvalidInput(
                    f"job {name}: {_shown(f.path)}: its name is not UTF-8 (rename it); "
                    "nothing appended"
                )
            got = _file_chunks(f.path, fmt, sizing, storage_options)
            chunks += got
            ids += _chunk_ids(f.key, len(got))
        r = _append(handle, chunks, ids, no_wait, timeout, feed=feed)
        added, skipped = r.tasks, r.skipped
    else:
        counted = [0]  # (what the pages so far added, for a bad line's message)
        for page, page_ids in _stdin_pages(
            name, sys.stdin, id_key, added_so_far=lambda: counted[0]
        ):
            r = _append(handle, page, page_ids, no_wait, timeout, feed=feed)
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
@click.option(
    "--feed",
    default=None,
    metavar="SOURCE",
    help="NAME is a mixed job and SOURCE its open stream source: seal that source's store.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON.")
@click.pass_context
def seal_cmd(ctx: click.Context, name: str, feed: str | None, as_json: bool) -> None:
    """Close stream job NAME: nothing more is appended; the job completes once every
    task appended is done (at once when none was appended). Sealing a sealed stream
    changes nothing and says so (exit 0). With --feed SOURCE, NAME is a mixed job: its
    stream source SOURCE takes no more tasks (it runs out once they are taken)."""
    client = client_of(ctx)
    tasks = client.job(name).seal(feed=feed)
    state = client.job(name).status(summaries=0).state
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


#: A folder's unchanged mtime is trusted once it was listed this long after that mtime: a
#: change made within the file system's timestamp granularity of the mtime it saw would
#: not move it (FAT: 2 s; 1 s on ext4 with small inodes, HFS+, some NFS servers).
_MTIME_GRAIN_S = 2.0
#: A waiting follower says why at most this often per reason (and at least every --every).
_NOTICE_S = 60.0
#: One append attempt waits at most this long for the backlog to fall, so SIGTERM is
#: seen within a second whatever the follower waits for.
_BACKLOG_POLL_S = 0.5
_APPENDED, _ABSENT, _REFUSED = "appended", "absent", "refused"


class _Notices:
    """What a waiting follower says, once per reason and again at most every
    ``repeat_s`` while the reason holds: never a line per listing."""

    def __init__(self, name: str, repeat_s: float) -> None:
        self.name = name
        self.repeat_s = repeat_s
        self.said: dict[str, float] = {}

    def say(self, topic: str, text: str) -> None:
        now = time.monotonic()
        last = self.said.get(topic)
        if last is None or now - last >= self.repeat_s:
            self.said[topic] = now
            click.echo(f"job {self.name}: {text}", err=True)

    def clear(self, topic: str) -> None:
        self.said.pop(topic, None)


class _Stopped(Exception):
    """SIGTERM / SIGINT while the follower waited for the backlog."""


def _append_or_wait(
    handle: Any,
    chunks: list[Any],
    ids: list[str],
    no_wait: bool,
    timeout: float | None,
    stop: threading.Event,
    notices: _Notices,
    path: str,
    source: str | None = None,
) -> Any:
    """``handle.append`` of one file (the engine's record of ``source`` makes a restart
    mid-file exact even after the trim), waiting for the backlog in steps of
    ``_BACKLOG_POLL_S`` (a step's retry sends the pages that went in again: their chunk
    ids skip them) and saying so; ``_Stopped`` when a signal comes while it waits.

    Raises:
        BacklogFull: --no-wait, or --timeout passed. _Stopped.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        step = _BACKLOG_POLL_S if left is None else max(0.0, min(_BACKLOG_POLL_S, left))
        try:
            r = handle.append(
                chunks, ids=ids, block=not no_wait and step > 0, timeout=step, source=source
            )
        except taskq.BacklogFull:
            if no_wait or (deadline is not None and time.monotonic() >= deadline):
                raise
            st = handle.status(summaries=0)
            notices.say(
                "backlog",
                f"waiting for the backlog: {st.backlog} of max_backlog {st.config.get('max_backlog')} "
                f"tasks not done ({path} waits)",
            )
            if stop.is_set():
                raise _Stopped() from None
            continue
        notices.clear("backlog")
        return r


class _Follower:
    """What ``taskq job follow`` knows between listings (docs/streams.md "The follower").

    The record in Redis (the job's ``follow`` hash) is a watermark ``(mtime, path)`` —
    every file at or below it was appended — and the keys of files above it appended;
    the watermark moves over files appended (or refused) once they are older than
    ``horizon``, and the keys it covers, or of files gone from the listing, are dropped:
    the record holds the files of the last ``horizon`` and no more. In memory, the state
    of each file above the watermark: Redis is asked once about a file new to this
    process, never about every file of a listing.

    A file is appended once settled: the same size and version as at the previous
    listing, or last modified ``settle`` seconds ago or more.
    """

    def __init__(
        self, handle: Any, pattern: str, storage_options: Any, settle: float, horizon: float
    ) -> None:
        self.handle = handle
        self.pattern = pattern
        self.storage_options = storage_options
        self.settle = settle
        self.horizon = horizon
        record = handle.follow_record()
        self.watermark: tuple[float, str] = record.watermark or (float("-inf"), "")
        self.recorded: set[str] = set(record.files)  # keys in Redis above the watermark
        self.state: dict[str, str] = {}  # key -> _APPENDED / _ABSENT / _REFUSED
        self.pending: dict[str, str] = {}  # path -> its key at the listing it was seen
        # local folders: each listed again only when its mtime moves (a file added,
        # renamed or removed); in between only the files still settling are looked at
        self.watch = _watched_folders(pattern)
        self.folder_mtimes: dict[str, int] | None = None  # folder -> mtime when last listed
        self.folder_listed: dict[str, float] = {}  # folder -> when it was last listed
        self.folder_files: dict[str, list[Listed]] = {}  # folder -> its files then

    def listing(self) -> tuple[list[Listed], bool]:
        """The files to consider now, and whether that is every file matching (else only
        the files still settling: no watched folder moved).

        An object store or a ``**`` pattern is listed in full each time. A local pattern
        is watched folder by folder: the folders matching its folder part are listed
        (the parents: a wildcard folder costs a listing of the folders, not of their
        files), and only a folder whose mtime moved is listed again; a file changed in
        place does not move its folder, and the files still settling are stat'ed each
        time instead, so an idle follower's cost is the folders and the settling files,
        not the files seen.
        """
        if self.watch is None:
            return _listing(self.pattern, self.storage_options), True
        folder_part, name = self.watch
        folders = glob.glob(folder_part) if glob.has_magic(folder_part) else [folder_part]
        mtimes: dict[str, int] = {}
        stat_time = time.time()
        for folder in folders:
            try:
                st = os.stat(folder)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                mtimes[folder] = st.st_mtime_ns
        before = self.folder_mtimes or {}
        moved = [
            d
            for d, m in mtimes.items()
            if before.get(d) != m
            # listed within the grain of its mtime: a later change could have left it
            or self.folder_listed.get(d, float("-inf")) - m / 1e9 <= _MTIME_GRAIN_S
        ]
        if (
            self.folder_mtimes is not None
            and not moved
            and mtimes.keys() == self.folder_mtimes.keys()
        ):
            return self._restat(), False
        for folder in self.folder_files.keys() - mtimes.keys():
            del self.folder_files[folder]
            del self.folder_listed[folder]
        for folder in moved:
            self.folder_files[folder] = _listing(os.path.join(folder, name), self.storage_options)
            self.folder_listed[folder] = stat_time
        self.folder_mtimes = mtimes
        # a file still settling may have grown in a folder that did not move: as it is now
        now = {f.path: f for f in self._restat()}
        listed = [
            now.get(f.path) if f.path in self.pending else f
            for files in self.folder_files.values()
            for f in files
        ]
        return sorted((f for f in listed if f is not None), key=lambda f: f.path), True

    def _restat(self) -> list[Listed]:
        """The files still settling, as they are now (one stat each)."""
        from taskq.data import storage

        fs, _ = storage.filesystem(self.pattern, self.storage_options)
        out = []
        for path in self.pending:
            try:
                out.append(_listed(fs, path, fs.info(path), True))
            except FileNotFoundError:
                continue
        return out

    def to_append(self, listed: list[Listed], notices: _Notices) -> list[Listed]:
        """The settled files above the watermark not appended yet, in (mtime, path) order;
        one HMGET of the files this process has not seen before."""
        above = sorted((f for f in listed if f.order > self.watermark), key=lambda f: f.order)
        for f in above:
            if f.key not in self.state and not _utf8(f.path):
                # its name cannot be a chunk's path in Redis: said once, passed as refused
                log.warning(
                    "job %s: %s not appended: its name is not UTF-8 (rename it)",
                    self.handle.name,
                    _shown(f.path),
                )
                self.refused(f)
        unknown = [f.key for f in above if f.key not in self.state]
        for key, seen in zip(unknown, self.handle.files_appended(unknown), strict=True):
            self.state[key] = _APPENDED if seen else _ABSENT
        now = time.time()
        out = []
        for f in above:
            if self.state[f.key] != _ABSENT:
                continue
            before = self.pending.get(f.path)
            if before == f.key or f.mtime <= now - self.settle:
                out.append(f)
                continue
            self.pending[f.path] = f.key
            if before is None:
                notices.say(
                    f.path,
                    f"{f.path}: new ({f.size} bytes), appended once unchanged at the next listing",
                )
            else:
                notices.clear(f.path)
                notices.say(
                    f.path,
                    f"{f.path}: still being written ({before.rsplit('|', 2)[1]} -> {f.size} "
                    "bytes): appended once it stops changing",
                )
        return out

    def appended(self, f: Listed, notices: _Notices) -> None:
        self.state[f.key] = _APPENDED
        self.recorded.add(f.key)
        self.pending.pop(f.path, None)
        notices.clear(f.path)

    def refused(self, f: Listed) -> None:
        """A settled file that cannot be read: said once, passed by the watermark (a
        corrected file has a new size or version, so it is a new file)."""
        self.state[f.key] = _REFUSED
        self.pending.pop(f.path, None)

    def advance(self, listed: list[Listed]) -> None:
        """Move the watermark over the files done and older than the horizon, and drop
        the record of what it covers or of files gone (after a full listing only; an
        empty listing drops nothing: a store's hiccup is not every file gone)."""
        listed_paths = {f.path for f in listed}
        self.pending = {p: k for p, k in self.pending.items() if p in listed_paths}
        if not listed:
            return
        horizon = time.time() - self.horizon
        mark = self.watermark
        for f in sorted((f for f in listed if f.order > mark), key=lambda f: f.order):
            if f.mtime > horizon or self.state.get(f.key) not in (_APPENDED, _REFUSED):
                break
            mark = f.order
        by_key = {f.key: f for f in listed}
        gone = [k for k in self.recorded if k not in by_key or by_key[k].order <= mark]
        if mark != self.watermark or gone:
            self.handle.forget_files(None if mark == self.watermark else mark, gone)
            self.watermark = mark
            self.recorded.difference_update(gone)
        # what a listing no longer shows, or the watermark covers (a growing file's sizes)
        self.state = {k: v for k, v in self.state.items() if k in by_key and by_key[k].order > mark}


def _watched_folders(pattern: str) -> tuple[str, str] | None:
    """A local pattern as (its folder part, its file name part), whose folders' mtimes
    tell whether a listing can change; None for an object store or a ``**`` pattern."""
    if "://" in pattern or "**" in pattern:
        return None
    folder, name = os.path.split(os.path.abspath(os.path.expanduser(pattern)))
    return folder, name


def _utf8(text: str) -> bool:
    """Whether ``text`` is Unicode text (a local name whose bytes are not UTF-8 comes
    with lone surrogates)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _shown(path: str) -> str:
    """``path`` as a line can print it: bytes that are not UTF-8 as ``\\xNN``."""
    return path.encode(errors="surrogateescape").decode(errors="backslashreplace")


def _hidden(path: str) -> bool:
    """A name the follower never appends: a dot or underscore first (a file being written
    under a temporary name, Spark's ``_SUCCESS``)."""
    return path.rstrip("/").rsplit("/", 1)[-1].startswith((".", "_"))


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
    "--settle",
    type=DurationType(),
    default="60s",
    show_default=True,
    help="A file last modified this long ago is complete: appended at first sight (a "
    "newer one once unchanged across two listings; 0: every file is complete when it "
    "appears, as when renamed into place or in an object store).",
)
@click.option(
    "--horizon",
    type=DurationType(),
    default="1h",
    show_default=True,
    help="The follower's record keeps the files modified within this long; an older "
    "file appearing later (copied with its old mtime) is not appended.",
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
    settle: float,
    horizon: float,
    seal_after: float | None,
    no_wait: bool,
    timeout: float | None,
) -> None:
    """Append the files matching --files to job NAME as they appear, each once, when it
    is complete (across restarts too: what was appended is kept in Redis, bounded by
    --horizon); names starting with . or _ are skipped (write there, then rename). Runs
    until SIGTERM / SIGINT or --seal-after."""
    if settle > horizon:
        raise click.UsageError("--settle must not be longer than --horizon", ctx)
    client = client_of(ctx)
    handle = client.job(name)
    handle.status(summaries=0)  # no such job: one line, before listing anything
    sizing = {
        "chunk_bytes": chunk_bytes,
        "records_per_chunk": records_per_chunk,
        "row_groups_per_chunk": row_groups_per_chunk,
    }
    follower = _Follower(handle, files, storage_options, settle, horizon)
    notices = _Notices(name, max(every, _NOTICE_S))
    stop = threading.Event()
    with StopOnSignals(stop):
        last_new = time.monotonic()
        while not stop.is_set():
            listed, full = follower.listing()
            listed = [f for f in listed if not _hidden(f.path)]
            if full and not listed:
                notices.say("none", f"waiting: no file matches {files} yet")
            elif listed:
                notices.clear("none")
            for f in follower.to_append(listed, notices):
                if stop.is_set():
                    break
                try:
                    chunks = _file_chunks(f.path, fmt, sizing, storage_options)
                except taskq.InvalidInput as e:
                    log.warning("job %s: %s not appended: %s", name, f.path, e)
                    follower.refused(f)
                    continue
                try:
                    r = _append_or_wait(
                        handle,
                        chunks,
                        _chunk_ids(f.key, len(chunks)),
                        no_wait,
                        timeout,
                        stop,
                        notices,
                        f.path,
                        source=f.key,
                    )
                except _Stopped:
                    break  # not recorded: a restart sends it again, its chunk ids skip what went in
                handle.file_appended(f.key, len(chunks))
                follower.appended(f, notices)
                last_new = time.monotonic()
                click.echo(f"job {name}: {f.path}: {r.tasks} tasks appended", err=True)
            if full and not stop.is_set():
                follower.advance(listed)
            if (
                seal_after is not None
                and not follower.pending
                and time.monotonic() - last_new >= seal_after
                and not stop.is_set()
            ):
                handle.seal()
                click.echo(f"job {name}: sealed (no new file for {seal_after:g}s)", err=True)
                return
            stop.wait(every if seal_after is None else min(every, max(0.0, seal_after)))
