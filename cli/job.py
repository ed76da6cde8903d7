"""``taskq job ...``: the ``job`` group, and the commands that write: create, delete,
cancel, pause, resume (each the job handle's verb: a plain or a sharded job alike). The read-only views
(status, list, audit) are cli/job_view.py's, checkpoints cli/checkpoints.py's; create's
input is read by cli/job_input.py.

Data flow: operator -> cli/job.py -> cli/job_input.py (chunks) -> taskq.Client -> Redis.
"""

from __future__ import annotations

from typing import Any

import click

import taskq
from taskq.admin.shardset import ShardedStatus
from taskq.mix import ON_EXHAUSTED
from taskq.models import JobConfig

from .common import MixType, PassesType, TaskTimeoutType, client_of, echo_json, interactive
from .job_input import (
    BIG_INPUT_TASKS,
    ByteSizeType,
    JsonObjectType,
    NoProgress,
    check_sources,
    progress_bar,
    read_chunks,
)

#: The defaults of ``taskq job create``'s settings: ``JobConfig``'s (one option per field,
#: named as the field: tests/cli/test_cli.py checks both ways).
DEFAULT = JobConfig()
#: ``taskq job create``'s options that are not settings of the job: its input and the call.
CREATE_CALL = {"name", "extra", "manifest", "files", "lines", "fmt", "records_per_chunk"}
CREATE_CALL |= {"chunk_bytes", "row_groups_per_chunk", "storage_options", "replace"}
CREATE_CALL |= {"exist_ok", "as_json"}


@click.group("job")
def job() -> None:
    """Create, inspect and remove jobs (one named dispatch of one data set)."""


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
    default=DEFAULT.chunks_per_task,
    show_default=True,
    help="Chunks per task (the unit a trainer leases).",
)
@click.option(
    "--passes",
    type=PassesType(),
    default=str(DEFAULT.passes),
    show_default=True,
    help="Number of passes; 0 or inf runs until cancelled.",
)
@click.option(
    "--worker-ttl",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT.worker_ttl,
    show_default=True,
    help="Seconds of silence after which a worker is lost.",
)
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT.heartbeat_interval,
    show_default=True,
    help="Seconds between a trainer's heartbeats (< --worker-ttl).",
)
@click.option(
    "--task-timeout",
    type=TaskTimeoutType(),
    default=DEFAULT.task_timeout,
    show_default=True,
    help="Cap on one lease's run time: auto (10x p99 once known), none, or seconds.",
)
@click.option(
    "--max-failures",
    type=click.IntRange(min=1),
    default=DEFAULT.max_failures,
    show_default=True,
    help="Failures (fail, timeout) before a task is dead.",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=DEFAULT.max_attempts,
    show_default=True,
    help="Started leases ending without an ack before a task is dead.",
)
@click.option(
    "--shuffle/--no-shuffle",
    default=DEFAULT.shuffle,
    show_default=True,
    help="A seeded new task order every pass.",
)
@click.option("--seed", type=int, default=DEFAULT.seed, show_default=True, help="The shuffle seed.")
@click.option(
    "--shuffle-samples",
    is_flag=True,
    help="The samples inside each task in a permutation fixed by the seed, the pass and "
    "the task, the same for every reader (default: the chunks' order).",
)
@click.option(
    "--auto-advance/--manual-advance",
    default=DEFAULT.auto_advance,
    show_default=True,
    help="Start the next pass by itself, or wait for `taskq pass next` between passes.",
)
@click.option(
    "--manual-clock",
    is_flag=True,
    default=DEFAULT.manual_clock,
    help="Tests only: the job's clock moves by advance_clock.",
)
@click.option(
    "--backup-leases",
    is_flag=True,
    default=DEFAULT.backup_leases,
    help="At a pass's tail an idle trainer may take a backup lease of a task running "
    "longer than --backup-factor x the median (its work done twice; docs/trainers.md).",
)
@click.option(
    "--backup-factor",
    type=click.FloatRange(min=1, min_open=True),
    default=DEFAULT.backup_factor,
    show_default=True,
    help="That factor, with --backup-leases.",
)
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
    default=DEFAULT.shards,
    show_default=True,
    help="Spread the job over S shards on different cluster masters, one pass "
    "for all (docs/sharding.md).",
)
@click.option(
    "--split-tails/--no-split-tails",
    default=DEFAULT.split_tails,
    show_default=True,
    help="At a pass's tail an idle trainer takes the unread end of a task running long.",
)
@click.option(
    "--stream",
    is_flag=True,
    help="A job whose data keeps arriving (`taskq job append` / `follow`; no source "
    "needed): its pass stays open until `taskq job seal` (docs/streams.md).",
)
@click.option(
    "--max-backlog",
    type=click.IntRange(min=1),
    default=DEFAULT.max_backlog,
    help="An append that would leave more tasks than this not done waits or is refused.",
)
@click.option(
    "--mix",
    type=MixType(),
    default=DEFAULT.mix,
    help="A mixed job drawing the tasks of these jobs by weight, e.g. web=0.5,code=0.5 "
    "(no source of its own; docs/mixing.md).",
)
@click.option(
    "--on-exhausted",
    type=click.Choice(ON_EXHAUSTED),
    default=DEFAULT.on_exhausted,
    show_default=True,
    help="A mixed job's source run out in a pass: the others' weights renormalise.",
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
    replace: bool,
    exist_ok: bool,
    as_json: bool,
    **settings: Any,
) -> None:
    """Create job NAME from exactly one of --manifest, --files, --lines (a --stream job:
    at most one; its tasks are appended later), or a mixed job from --mix (none).

    --files 'GLOB' (quoted; local paths or fsspec URLs) chunks each file by its format:
    lines/jsonl by byte range, parquet by row groups, tar by shard or samples. Everything
    is read and validated before anything is written; the job appears all at once or not
    at all. See docs/data.md.
    """
    cfg = JobConfig.of(**settings)  # every option that is not CREATE_CALL's is a setting
    no_input = manifest is None and files is None and lines is None
    empty_stream = cfg.stream and no_input
    if cfg.mix is not None and not (no_input and not extra):
        raise click.UsageError("--mix takes its tasks from its sources: no other input", ctx)
    sizing_given = [
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
    if (empty_stream or cfg.mix is not None) and not extra:
        if sizing_given:
            raise click.UsageError(f"{sizing_given[0]} needs a source (--files or --lines)", ctx)
    else:
        check_sources(
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
    chunks = (
        []
        if empty_stream or cfg.mix is not None
        else read_chunks(
            manifest, files, lines, records_per_chunk, show, fmt, sizing, storage_options
        )
    )
    ntasks = -(-len(chunks) // cfg.chunks_per_task)
    try:
        with progress_bar() if show and ntasks >= BIG_INPUT_TASKS else NoProgress() as bar:
            writing = bar.add_task(f"writing {ntasks} tasks", total=ntasks)
            status = client.create_job(
                name,
                chunks,
                cfg,
                replace=replace,
                progress=lambda done, total: bar.update(writing, completed=done, total=total),
            )
    except taskq.JobExists:
        if not exist_ok:
            raise
        if as_json:
            echo_json(client.job(name).status().as_dict())
        else:
            click.echo(f"job {name} exists: left as it is (--exist-ok)")
        return
    if as_json:
        echo_json(status.as_dict())
        return
    click.echo(
        f"job {name}: {status.tasks} tasks from "
        f"{f'{len(chunks)} chunks' if cfg.mix is None else ', '.join(cfg.mix)}, "
        f"{'until cancelled' if cfg.passes is None else f'{cfg.passes} pass(es)'}"
        f"{', a stream (append, then `taskq job seal`)' if cfg.stream else ''}"
        f"{' (replaced)' if replace else ''}"
    )


@job.command("delete")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON.")
@click.pass_context
def delete(ctx: click.Context, name: str, yes: bool, as_json: bool) -> None:
    """Delete job NAME and every key of it; its trainers stop (job not found)."""
    client = client_of(ctx)
    status = client.job(name).status(summaries=0)  # unknown job: fail before asking
    if not yes:
        shards = status.shards if isinstance(status, ShardedStatus) else []
        where = f" in {len(shards)} shards" if shards else ""
        click.confirm(
            f"delete job {name} ({status.state}, {status.tasks} tasks{where}, "
            f"{status.workers} workers)?",
            abort=True,
            err=True,
        )
    client.job(name).delete()
    if as_json:
        echo_json(
            {"job": name, "deleted": True, "state_before": status.state, "tasks": status.tasks}
        )
    else:
        click.echo(f"job {name}: deleted")


def _lifecycle_command(verb: str, summary: str, said: str) -> click.Command:
    """``taskq job cancel|pause|resume NAME [--json]``: one shape, the job handle's verb
    (a sharded job: every shard, as one)."""

    @job.command(verb, help=summary)
    @click.argument("name")
    @click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON.")
    @click.pass_context
    def command(ctx: click.Context, name: str, as_json: bool) -> None:
        handle = client_of(ctx).job(name)
        before = handle.status(summaries=0)
        getattr(handle, verb)()
        out: dict[str, Any] = {
            "job": name,
            "state": "cancelled" if verb == "cancel" else handle.status(summaries=0).state,
            "state_before": before.state,
            "pass": before.pass_no,
        }
        if verb == "cancel":
            out["leases_revoked"] = before.leased
        shards = before.shards if isinstance(before, ShardedStatus) else []
        if shards:
            out["shards"] = len(shards)
        if as_json:
            echo_json(out)
        else:
            every = f" (all {len(shards)} shards)" if shards else ""
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
