"""``taskq job checkpoint``, ``checkpoints`` and ``rewind``: take a checkpoint of a job,
list them, put the job back to one (docs/resume.md). A sharded job's checkpoint is one
id over every shard (docs/sharding.md).

Data flow: operator -> cli/checkpoints.py -> taskq.Client -> the job's handle (jobs.py ->
checkpoints.py, routed to the shards for a sharded job) -> Redis.
"""

from __future__ import annotations

import datetime
from typing import Any

import click
from rich.table import Table

from taskq.admin.checkpoints import DEFAULT_KEEP

from .common import client_of, console, echo_json
from .job import job


def _when(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S"
    )


def _shards(rec: dict[str, Any]) -> str:
    return f", {len(rec['shards'])} shards" if rec.get("shards") else ""


@job.command("checkpoint")
@click.argument("name")
@click.option(
    "--keep",
    type=click.IntRange(1, 1000),
    default=DEFAULT_KEEP,
    show_default=True,
    help="Checkpoints kept (the oldest beyond it go).",
)
@click.option("--id", "ckpt", metavar="ID", help="The checkpoint's id (default: a new one).")
@click.option("--json", "as_json", is_flag=True, help="Print the checkpoint as JSON.")
@click.pass_context
def checkpoint_cmd(
    ctx: click.Context, name: str, keep: int, ckpt: str | None, as_json: bool
) -> None:
    """Record where job NAME stands (pass, tasks done, unfinished tasks' progress) under
    an id that `taskq job rewind` takes. Repeating an id finishes a checkpoint that
    stopped half-way."""
    rec = client_of(ctx).job(name).checkpoint(keep=keep, ckpt=ckpt)
    if as_json:
        echo_json(rec)
        return
    click.echo(
        f"job {name}: checkpoint {rec['id']} (pass {rec['pass']}, {rec['done']} done{_shards(rec)})"
    )


@job.command("checkpoints")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the checkpoints as JSON.")
@click.pass_context
def checkpoints_cmd(ctx: click.Context, name: str, as_json: bool) -> None:
    """The checkpoints of job NAME, oldest first: id, pass, tasks done, unfinished tasks
    (with their progress), and when it was taken (UTC)."""
    rows = client_of(ctx).job(name).checkpoints()
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo(f"job {name}: no checkpoints")
        return
    table = Table()
    for col in ("id", "pass", "done", "unfinished", "job state", "taken (UTC)"):
        table.add_column(col, justify="right" if col in ("pass", "done", "unfinished") else "left")
    for r in rows:
        table.add_row(
            r["id"],
            str(r["pass"]),
            str(r["done"]),
            str(r["unfinished"]),
            r["job_state"],
            _when(r.get("sealed_ms")),
        )
    console().print(table)


@job.command("rewind")
@click.argument("name")
@click.argument("checkpoint")
@click.pass_context
def rewind_cmd(ctx: click.Context, name: str, checkpoint: str) -> None:
    """Put job NAME back to CHECKPOINT: tasks done since return to todo, progress comes
    back, every lease held now is revoked, passes ended since are undone (their summaries
    kept, marked rewound). Safe to repeat; works on a completed job."""
    client = client_of(ctx)
    client.job(name).rewind(checkpoint)
    rec = client.job(name).checkpoints()
    at = next((r for r in rec if r["id"] == checkpoint), None)
    where = f" (pass {at['pass']}, {at['done']} done{_shards(at)})" if at else ""
    click.echo(f"job {name}: rewound to checkpoint {checkpoint}{where}")
