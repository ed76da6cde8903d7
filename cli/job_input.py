"""Reading `taskq job create`'s input: the source and sizing options' checks, the chunks
from a manifest, a glob of files or a lines file, and the progress bars of a big input.

Data flow: operator -> cli/job.py (create) -> cli/job_input.py -> taskq.datasets /
taskq.data (chunks) -> cli/job.py -> taskq.Client -> Redis.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from taskq import datasets

from .common import console

#: Inputs at least this large (bytes read, or tasks written) get a progress bar.
BIG_INPUT_BYTES = 8 << 20
BIG_INPUT_TASKS = 5000


def progress_bar() -> Progress:
    """A transient rich progress bar on stderr, for reading or writing a big input."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=console(stderr=True),
        transient=True,
    )


def read_chunks(
    manifest: str | None,
    files: str | None,
    lines: str | None,
    records_per_chunk: int | None,
    show: bool,
    fmt: str | None = None,
    sizing: dict[str, Any] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[Any]:
    """The chunks from exactly one source, read and validated in full.

    Args:
        manifest, files, lines: the sources; exactly one is given (``check_sources``).
        records_per_chunk, fmt, sizing, storage_options: how files are chunked.
        show: a progress bar while reading a big manifest or lines file.

    Returns:
        The chunk descriptors, in order.

    Raises:
        InvalidInput, DataError: an input that cannot be read or chunked (nothing written).
    """
    if files is not None:
        return datasets.format_chunks(
            files,
            fmt,
            records_per_chunk=records_per_chunk,
            storage_options=storage_options,
            **(sizing or {}),
        )
    if lines is not None and fmt is not None:
        from taskq import data

        data.reader(fmt)  # the data extra, before reading
        return data.build_chunks(
            lines, fmt, records_per_chunk=records_per_chunk, storage_options=storage_options
        )
    source = manifest if manifest is not None else lines
    assert source is not None
    big = show and os.path.isfile(source) and os.path.getsize(source) >= BIG_INPUT_BYTES
    with progress_bar() if big else NoProgress() as bar:
        reading = bar.add_task(f"reading {source}", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(reading, completed=done, total=total)

        if manifest is not None:
            return datasets.manifest_chunks(manifest, progress=advance)
        assert records_per_chunk is not None
        return datasets.line_chunks(source, records_per_chunk, progress=advance)


class ByteSizeType(click.ParamType):
    """A size in bytes >= 1: an integer with an optional K, M, G suffix (powers of 1024)."""

    name = "BYTES"
    _UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower().removesuffix("ib").removesuffix("b")
        unit = text[-1:] if text[-1:] in self._UNITS else ""
        try:
            n = int(text[: len(text) - len(unit)]) * self._UNITS[unit]
        except ValueError:
            self.fail(f"{value!r} is not a size (e.g. 1048576, 64M, 1G)", param, ctx)
        if n < 1:
            self.fail(f"{value!r}: a size must be >= 1 byte", param, ctx)
        return n


class JsonObjectType(click.ParamType):
    """A JSON object (``--storage-options '{"anon": true}'``)."""

    name = "JSON"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> dict[str, Any]:
        if isinstance(value, dict):
            return value
        try:
            obj = json.loads(value)
        except ValueError as e:
            self.fail(f"not JSON: {e}", param, ctx)
        if not isinstance(obj, dict):
            self.fail("must be a JSON object", param, ctx)
        return obj


class NoProgress:
    """Stands in for a rich Progress when the input is small or stderr is no terminal."""

    def __enter__(self) -> NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None) -> TaskID:
        return TaskID(0)

    def update(self, task_id: TaskID, **fields: Any) -> None:
        return None


def check_sources(
    ctx: click.Context,
    extra: tuple[str, ...],
    manifest: str | None,
    files: str | None,
    lines: str | None,
    fmt: str | None,
    records_per_chunk: int | None,
    chunk_bytes: int | None,
    row_groups_per_chunk: int | None,
    storage_options: dict[str, Any] | None,
) -> None:
    """Usage errors of `job create`'s source and sizing options, before any reading.

    Raises:
        click.UsageError: not exactly one source, or options that do not go together.
    """
    if extra:
        if files is not None:
            raise click.UsageError(
                f"--files got {len(extra) + 1} paths: the shell expanded an unquoted "
                f"pattern; quote it, e.g. --files 'data/part-*.jsonl'",
                ctx,
            )
        raise click.UsageError(f"unexpected extra arguments: {' '.join(extra)}", ctx)
    sources = [s for s in (manifest, files, lines) if s is not None]
    if len(sources) != 1:
        raise click.UsageError("give exactly one of --manifest, --files, --lines", ctx)
    if manifest is not None:
        given = [
            o
            for o, v in (
                ("--format", fmt),
                ("--records-per-chunk", records_per_chunk),
                ("--chunk-bytes", chunk_bytes),
                ("--row-groups-per-chunk", row_groups_per_chunk),
                ("--storage-options", storage_options),
            )
            if v is not None
        ]
        if given:
            raise click.UsageError(
                f"{given[0]} does not go with --manifest (a manifest lists its chunks as they are)",
                ctx,
            )
    if lines is not None:
        if records_per_chunk is None:
            raise click.UsageError("--lines needs --records-per-chunk N", ctx)
        if fmt not in (None, "lines", "jsonl"):
            raise click.UsageError("--lines takes --format lines or jsonl", ctx)
        if chunk_bytes is not None or row_groups_per_chunk is not None:
            raise click.UsageError("--lines chunks by --records-per-chunk only", ctx)
    if chunk_bytes is not None and records_per_chunk is not None:
        raise click.UsageError("give --chunk-bytes or --records-per-chunk, not both", ctx)
    if chunk_bytes is not None and fmt in ("parquet", "tar"):
        raise click.UsageError(f"--chunk-bytes goes with lines|jsonl, not {fmt}", ctx)
    if row_groups_per_chunk is not None and fmt not in (None, "parquet"):
        raise click.UsageError(f"--row-groups-per-chunk goes with parquet, not {fmt}", ctx)
    if records_per_chunk is not None and fmt == "parquet":
        raise click.UsageError(
            "parquet chunks by --row-groups-per-chunk, not --records-per-chunk", ctx
        )
