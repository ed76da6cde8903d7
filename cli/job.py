"""``taskq job ...``: create, inspect, list, audit, cancel, pause, resume and delete jobs
(a sharded job as one: cli/shards.py).

Data flow: operator -> cli/job.py -> taskq.datasets (chunks) -> taskq.Client -> Redis.
"""

from __future__ import annotations

import datetime
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
from rich.table import Table

import taskq
from taskq import datasets, sharded
from taskq.models import JobStatus

from . import shards as shards_cli
from .common import (
    PassesType,
    TaskTimeoutType,
    age,
    client_of,
    console,
    echo_json,
    interactive,
    pass_label,
    show,
)

#: Inputs at least this large (bytes read, or tasks written) get a progress bar.
BIG_INPUT_BYTES = 8 << 20
BIG_INPUT_TASKS = 5000


@click.group("job")
def job() -> None:
    """Create, inspect and remove jobs (one named dispatch of one data set)."""


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=console(stderr=True),
        transient=True,
    )


def _read_chunks(
    manifest: str | None,
    files: str | None,
    lines: str | None,
    records_per_chunk: int | None,
    show: bool,
    fmt: str | None = None,
    sizing: dict[str, Any] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[Any]:
    """The chunks from exactly one source, read and validated in full."""
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
    with _progress() if big else _NoProgress() as bar:
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


class _NoProgress:
    """Stands in for a rich Progress when the input is small or stderr is no terminal."""

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None) -> TaskID:
        return TaskID(0)

    def update(self, task_id: TaskID, **fields: Any) -> None:
        return None


@job.command("create")
@click.argument("name")
@click.argument("extra", nargs=-1, metavar="")
@click.option(
    "--manifest",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="JSON-lines file: one chunk (any JSON) per line.",
)
@click.option(
    "--files",
    metavar="GLOB",
    help="Files (quote it; ** recurses; local or s3://, gs://, http(s)://) "
    "chunked by --format; one chunk per file when no format applies.",
)
@click.option(
    "--lines",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Byte ranges of FILE aligned to line ends (with --records-per-chunk).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["lines", "jsonl", "parquet", "tar"]),
    help="How to chunk and read the files (default for --files: from each "
    "file's extension; none of them: one whole-file chunk per file).",
)
@click.option(
    "--records-per-chunk",
    type=click.IntRange(min=1),
    metavar="N",
    help="Lines per chunk for --lines and --files lines|jsonl (scans for "
    "newlines); samples per chunk for tar shards (default a shard).",
)
@click.option(
    "--chunk-bytes",
    type=ByteSizeType(),
    metavar="BYTES",
    help="Byte-range size for --files lines|jsonl (e.g. 16M; by file size "
    "alone, no scan) [default: 64M].",
)
@click.option(
    "--row-groups-per-chunk",
    type=click.IntRange(min=1),
    metavar="N",
    help="Parquet row groups per chunk [default: 1].",
)
@click.option(
    "--storage-options",
    type=JsonObjectType(),
    metavar="JSON",
    help="fsspec options for remote --files URLs (s3://, gs://, http(s)://), as a JSON object.",
)
@click.option(
    "--chunks-per-task",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Chunks per task (the unit a trainer leases).",
)
@click.option(
    "--passes",
    type=PassesType(),
    default="1",
    show_default=True,
    help="Number of passes; 0 or inf runs until cancelled.",
)
@click.option(
    "--worker-ttl",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds of silence after which a worker is lost.",
)
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Seconds between a trainer's heartbeats (< --worker-ttl).",
)
@click.option(
    "--task-timeout",
    type=TaskTimeoutType(),
    default="auto",
    show_default=True,
    help="Cap on one lease's run time: auto (10x p99 once known), none, or seconds.",
)
@click.option(
    "--max-failures",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Failures (fail, timeout) before a task is dead.",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Started leases ending without an ack before a task is dead.",
)
@click.option(
    "--shuffle/--no-shuffle",
    default=False,
    show_default=True,
    help="A seeded new task order every pass.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="The shuffle seed.")
@click.option("--manual-advance", is_flag=True, help="Wait for `taskq pass next` between passes.")
@click.option(
    "--replace", is_flag=True, help="Replace an existing job of that name (a new incarnation)."
)
@click.option(
    "--exist-ok",
    is_flag=True,
    help="If a job of that name exists, leave it as it is and exit 0 (for set-up "
    "steps that may run again).",
)
@click.option(
    "--shards",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Spread the job over S shards on different cluster masters, one pass "
    "for all (docs/sharding.md).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the new job's status as JSON.")
@click.pass_context
def create(
    ctx: click.Context,
    name: str,
    extra: tuple[str, ...],
    manifest: str | None,
    files: str | None,
    lines: str | None,
    fmt: str | None,
    records_per_chunk: int | None,
    chunk_bytes: int | None,
    row_groups_per_chunk: int | None,
    storage_options: dict[str, Any] | None,
    chunks_per_task: int,
    passes: int | None,
    worker_ttl: float,
    heartbeat_interval: float,
    task_timeout: float | str | None,
    max_failures: int,
    max_attempts: int,
    shuffle: bool,
    seed: int,
    manual_advance: bool,
    replace: bool,
    exist_ok: bool,
    shards: int,
    as_json: bool,
) -> None:
    """Create job NAME from exactly one of --manifest, --files, --lines.

    --files 'GLOB' (quoted; local paths or fsspec URLs) chunks each file by its format:
    lines/jsonl by byte range, parquet by row groups, tar by shard or samples. Everything
    is read and validated before anything is written; the job appears all at once or not
    at all. See docs/data.md.
    """
    _check_sources(
        ctx,
        extra,
        manifest,
        files,
        lines,
        fmt,
        records_per_chunk,
        chunk_bytes,
        row_groups_per_chunk,
        storage_options,
    )
    if replace and exist_ok:
        raise click.UsageError("--replace and --exist-ok exclude each other", ctx)
    client = client_of(ctx)
    client.keys(name)  # a bad name fails before any file is read
    show = interactive(stderr=True)
    sizing = {"chunk_bytes": chunk_bytes, "row_groups_per_chunk": row_groups_per_chunk}
    chunks = _read_chunks(
        manifest, files, lines, records_per_chunk, show, fmt, sizing, storage_options
    )
    ntasks = -(-len(chunks) // chunks_per_task)
    try:
        with _progress() if show and ntasks >= BIG_INPUT_TASKS else _NoProgress() as bar:
            writing = bar.add_task(f"writing {ntasks} tasks", total=ntasks)
            status = client.create_job(
                name,
                chunks,
                chunks_per_task=chunks_per_task,
                passes=passes,
                worker_ttl=worker_ttl,
                heartbeat_interval=heartbeat_interval,
                task_timeout=task_timeout,
                max_failures=max_failures,
                max_attempts=max_attempts,
                shuffle=shuffle,
                seed=seed,
                auto_advance=not manual_advance,
                replace=replace,
                progress=lambda done, total: bar.update(writing, completed=done, total=total),
                shards=shards,
            )
    except taskq.JobExists:
        if not exist_ok:
            raise
        if as_json:
            if not shards_cli.handle(ctx, "status", name, True):
                echo_json(client.status(name).as_dict())
        else:
            click.echo(f"job {name} exists: left as it is (--exist-ok)")
        return
    if as_json:
        echo_json(status.as_dict())
        return
    click.echo(
        f"job {name}: {status.tasks} tasks from {len(chunks)} chunks, "
        f"{'until cancelled' if passes is None else f'{passes} pass(es)'}"
        f"{' (replaced)' if replace else ''}"
    )


def _check_sources(
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
    """Usage errors of `job create`'s source and sizing options, before any reading."""
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


def _when(ms: int) -> str:
    if not ms:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000.0).strftime("%Y-%m-%d %H:%M:%S")


def status_table(status: JobStatus) -> Table:
    """The human view of one status snapshot (used by `job status`)."""
    d = status.as_dict()
    cfg = status.config
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    state = status.state + (f" ({status.reason})" if status.reason else "")
    table.add_row("job", f"{status.job}  (incarnation {status.incarnation})")
    table.add_row("state", state)
    attempt = f", attempt {status.pass_attempt + 1}" if status.pass_attempt else ""
    table.add_row("pass", pass_label(status.pass_no, status.passes) + attempt)
    table.add_row(
        "tasks",
        f"{status.tasks} ({cfg.get('chunks')} chunks, {cfg.get('chunks_per_task')} per task)",
    )
    table.add_row(
        "todo / leased / done / dead",
        f"{status.todo} / {status.leased} (reserved {status.reserved}) / "
        f"{status.done} / {status.dead}",
    )
    table.add_row("workers", str(status.workers))
    table.add_row("throughput", f"{d['throughput_per_s']:.2f} tasks/s (this pass)")
    table.add_row("eta (this pass)", age(d["eta_s"]))
    table.add_row("oldest lease", age(status.oldest_lease_age_s))
    tt = cfg.get("task_timeout")
    if tt == "auto":
        auto = cfg.get("auto_task_timeout_s")
        tt = f"auto ({age(auto) if auto else 'not yet known'})"
    table.add_row(
        "config",
        f"worker_ttl {cfg.get('worker_ttl')}s, heartbeat "
        f"{cfg.get('heartbeat_interval')}s, task_timeout {tt}, "
        f"max_failures {cfg.get('max_failures')}, max_attempts "
        f"{cfg.get('max_attempts')}, shuffle {cfg.get('shuffle')}, "
        f"auto_advance {cfg.get('auto_advance')}",
    )
    c = status.counters
    table.add_row("counters", ", ".join(f"{k} {v}" for k, v in c.items() if not k.endswith("_ms")))
    table.add_row("created", _when(status.created_ms))
    return table


def summaries_table(summaries: list[dict[str, Any]], first_lease_ms: int | None) -> Table:
    """Per-pass summaries (pass, round, how it ended, done, dead, ...).

    ``took`` runs from a pass's start to its end; pass 0 starts at its first lease
    (``first_lease_ms``), not at the job's creation, so waiting for trainers is not
    counted (marked ``*`` when the first lease is no longer in the events).
    """
    table = Table(title="passes (docs/operations.md: reading the tables)", title_justify="left")
    for col in (
        "pass",
        "round",
        "ended",
        "done",
        "dead",
        "skipped",
        "stale",
        "expired",
        "max lateness",
        "took",
    ):
        table.add_column(col, justify="right" if col not in ("ended",) else "left")
    for s in summaries:
        took, mark = None, ""
        started, ended = s.get("started_ms"), s.get("ended_ms")
        if s.get("pass") == 0 and s.get("round") == 1 and started:
            if first_lease_ms:
                started = max(started, first_lease_ms)
            else:
                mark = "*"
        if ended and started:
            took = (ended - started) / 1000.0
        table.add_row(
            str(s.get("pass")),
            str(s.get("round")),
            str(s.get("state")),
            str(s.get("done")),
            str(s.get("dead")),
            str(s.get("skipped")),
            str(s.get("stale")),
            str(s.get("expired")),
            age((s.get("max_lateness_ms") or 0) / 1000.0),
            age(took) + mark if took is not None else "-",
        )
    return table


@job.command("status")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option(
    "--summaries",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Per-pass summaries to show (the latest).",
)
@click.pass_context
def status_cmd(ctx: click.Context, name: str, as_json: bool, summaries: int) -> None:
    """State, pass k of n, todo/leased/done/dead, workers, throughput, ETA, passes (a
    sharded job: the sums and a breakdown by shard)."""
    if shards_cli.handle(ctx, "status", name, as_json):
        return
    client = client_of(ctx)
    status = client.status(name, summaries=summaries)
    if as_json:
        data = status.as_dict()
        data["histograms"] = status.histograms
        data["lease_ages"] = status.lease_ages
        echo_json(data)
        return
    if status.summaries:
        show(status_table(status), summaries_table(status.summaries, client.first_lease_ms(name)))
    else:
        show(status_table(status))


@job.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
@click.option(
    "--repair",
    is_flag=True,
    help="First rebuild the job index from the jobs' keys (after an interrupted create or delete).",
)
@click.pass_context
def list_cmd(ctx: click.Context, as_json: bool, repair: bool) -> None:
    """The jobs in this Redis (under the key prefix)."""
    client = client_of(ctx)
    if repair:
        added, removed = client.repair_index()
        if not as_json:
            click.echo(
                f"index repaired: {len(added)} added {added}, {len(removed)} removed {removed}",
                err=True,
            )
    rows: list[dict[str, Any]] = []
    for name in client.list_jobs():
        try:
            s = client.status(name, summaries=0)
        except (taskq.JobNotFound, taskq.CorruptData) as e:
            # one broken entry must not hide the others
            state = "missing" if isinstance(e, taskq.JobNotFound) else "unreadable"
            rows.append(
                {
                    "job": name,
                    "state": state,
                    "error": str(e),
                    "pass": None,
                    "passes": None,
                    "tasks": None,
                    "done": None,
                    "dead": None,
                    "workers": None,
                }
            )
            continue
        rows.append(
            {
                "job": name,
                "state": s.state,
                "pass": s.pass_no,
                "passes": s.passes,
                "tasks": s.tasks,
                "done": s.done,
                "dead": s.dead,
                "workers": s.workers,
            }
        )
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("no jobs")
        return
    table = Table()
    for col in ("job", "state", "pass", "done", "dead", "workers"):
        table.add_column(col, justify="left" if col in ("job", "state") else "right")
    for r in rows:
        if r["state"] == "missing":
            table.add_row(r["job"], "missing (taskq job list --repair)", "-", "-", "-", "-")
            continue
        if r["state"] == "unreadable":
            table.add_row(r["job"], f"unreadable: {r['error']}", "-", "-", "-", "-")
            continue
        table.add_row(
            r["job"],
            r["state"],
            pass_label(r["pass"], r["passes"]),
            f"{r['done']}/{r['tasks']}",
            str(r["dead"]),
            str(r["workers"]),
        )
    show(table)


@job.command("delete")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON.")
@click.pass_context
def delete(ctx: click.Context, name: str, yes: bool, as_json: bool) -> None:
    """Delete job NAME and every key of it; its trainers stop (job not found)."""
    if shards_cli.handle(ctx, "delete", name, as_json, yes=yes):
        return
    client = client_of(ctx)
    status = client.status(name, summaries=0)  # unknown job: fail before asking
    if not yes:
        click.confirm(
            f"delete job {name} ({status.state}, {status.tasks} tasks, {status.workers} workers)?",
            abort=True,
            err=True,
        )
    client.delete_job(name)
    if as_json:
        echo_json(
            {"job": name, "deleted": True, "state_before": status.state, "tasks": status.tasks}
        )
    else:
        click.echo(f"job {name}: deleted")


def _lifecycle_command(verb: str, summary: str, said: str) -> click.Command:
    """``taskq job cancel|pause|resume NAME [--json]``: one shape, ``Client.<verb>_job``
    (a sharded job: every shard, as one)."""

    @job.command(verb, help=summary)
    @click.argument("name")
    @click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON.")
    @click.pass_context
    def command(ctx: click.Context, name: str, as_json: bool) -> None:
        client = client_of(ctx)
        sset = sharded.load(client, name)
        read = (lambda: sharded.status(client, name)) if sset else (lambda: client.status(name, 0))
        before = read()
        getattr(client, f"{verb}_job")(name)
        out: dict[str, Any] = {
            "job": name,
            "state": "cancelled" if verb == "cancel" else read().state,
            "state_before": before.state,
            "pass": before.pass_no,
        }
        if verb == "cancel":
            out["leases_revoked"] = before.leased
        if sset is not None:
            out["shards"] = len(sset.shards)
        if as_json:
            echo_json(out)
        else:
            every = f" (all {len(sset.shards)} shards)" if sset is not None else ""
            click.echo(f"job {name}: {said.format(name=name)}{every}")

    return command


cancel = _lifecycle_command(
    "cancel", "Cancel job NAME: every lease is revoked and the trainers' loops end.", "cancelled"
)
pause = _lifecycle_command(
    "pause",
    "Pause NAME: trainers get no new leases (they wait) and keep what they hold.",
    "paused (resume with `taskq job resume {name}`)",
)
resume = _lifecycle_command(
    "resume", "Resume NAME after a pause: waiting trainers lease again at once.", "resumed"
)


@job.command("audit")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the audit as JSON.")
@click.pass_context
def audit(ctx: click.Context, name: str, as_json: bool) -> None:
    """Per pass: done, dead, skipped, stale writes rejected, resets, longest re-dispatch
    delay; and whether the counters agree with the sets they count (exit 1 if not). A
    sharded job: every shard, and whether the shards agree on every pass."""
    if shards_cli.handle(ctx, "audit", name, as_json):
        return
    report = client_of(ctx).audit(name)
    if as_json:
        echo_json(report)
    else:
        show(summaries_table(report["passes"], report.get("first_lease_ms")))
        cur = report["current"]
        click.echo(
            f"current: pass {cur['pass']} ({report['state']}): done {cur['done']}, "
            f"leased {cur['leased']}, todo {cur['todo']}, dead {cur['dead']}"
        )
        for check, ok in report["checks"].items():
            click.echo(f"{'ok  ' if ok else 'FAIL'} {check}")
    if not report["ok"]:
        failed = [k for k, ok in report["checks"].items() if not ok]
        raise taskq.TaskqError(f"job {name}: audit failed: {', '.join(failed)}")
