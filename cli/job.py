"""``taskq job ...``: the ``job`` group, and the commands that write: create, delete,
cancel, pause, resume (each the job handle's verb: a plain or a sharded job alike). The read-only views
(status, list, audit) are cli/job_view.py's, checkpoints cli/checkpoints.py's; create's
input is read by cli/job_input.py.

Data flow: operator -> cli/job.py -> cli/job_input.py (chunks) -> taskq.Client -> Redis.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any, get_type_hints

import click

import taskq
from taskq.admin.shardset import ShardedStatus
from taskq.mix import MIX_BY, ON_EXHAUSTED
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

#: Settings whose option reads its value its own way (the others: by type and bounds).
OPTION_TYPES: dict[str, click.ParamType] = {
    "passes": PassesType(),
    "task_timeout": TaskTimeoutType(),
    "mix": MixType(),
    "on_exhausted": click.Choice(ON_EXHAUSTED),
    "mix_by": click.Choice(MIX_BY),
}
#: A flag's "off" form when it is not --no-NAME.
OFF_FLAGS = {"auto_advance": "--manual-advance"}


def setting_options(command: Callable[..., None]) -> Callable[..., None]:
    """``taskq job create``'s settings: one option per ``JobConfig`` field (in its order),
    named as the field (``chunks_per_task``: ``--chunks-per-task``), with its default,
    its help and, for a number, a range from its bounds (``models.setting``); a bool is a
    ``--x/--no-x`` flag. ``config.validate_config`` checks the values all the same."""
    kinds = get_type_hints(JobConfig)
    for f in reversed(dataclasses.fields(JobConfig)):
        flag = "--" + f.name.replace("_", "-")
        kind = kinds[f.name]
        lo, above = f.metadata.get("min"), f.metadata.get("above")
        option_type: Any = OPTION_TYPES.get(f.name)
        if kind is bool:
            flag += "/" + OFF_FLAGS.get(f.name, "--no-" + flag[2:])
        elif option_type is None and kind is float:
            floor = lo if above is None else above
            option_type = click.FloatRange(min=floor, min_open=above is not None)
        elif option_type is None:  # an integer, or None
            option_type = int if lo is None else click.IntRange(min=lo)
        help_text = re.sub(
            r"``(\w+)``", lambda m: "--" + m[1].replace("_", "-"), f.metadata["help"]
        )
        command = click.option(
            flag, f.name, type=option_type, default=f.default, show_default=True, help=help_text
        )(command)
    return command


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
@setting_options
@click.option(
    "--replace", is_flag=True, help="Replace an existing job of that name (a new incarnation)."
)
@click.option(
    "--exist-ok",
    is_flag=True,
    help="If a job of that name exists, leave it as it is and exit 0 (for set-up "
    "steps that may run again).",
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
