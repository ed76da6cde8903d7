"""``taskq job checkpoints`` and ``taskq job rewind``: list a job's checkpoints, put the
job back to one (docs/resume.md).

Data flow: operator -> cli/checkpoints.py -> taskq.Client (checkpoints.py) -> Redis.
"""

from __future__ import annotations

import datetime

import click
from rich.table import Table

from .common import client_of, console, echo_json
from .job import job


def _when(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S")


@job.command("checkpoints")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the checkpoints as JSON.")
@click.pass_context
def checkpoints_cmd(ctx: click.Context, name: str, as_json: bool) -> None:
    """The checkpoints of job NAME, oldest first: id, pass, tasks done, unfinished tasks
    (with their progress), and when it was taken (UTC)."""
    rows = client_of(ctx).checkpoints(name)
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo(f"job {name}: no checkpoints")
        return
    table = Table()
    for col in ("id", "pass", "done", "unfinished", "job state", "taken (UTC)"):
        table.add_column(col, justify="right" if col in ("pass", "done", "unfinished")
                         else "left")
    for r in rows:
        table.add_row(r["id"], str(r["pass"]), str(r["done"]), str(r["unfinished"]),
                      r["job_state"], _when(r.get("sealed_ms")))
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
    client.rewind(name, checkpoint)
    rec = client.checkpoints(name)
    at = next((r for r in rec if r["id"] == checkpoint), None)
    where = f" (pass {at['pass']}, {at['done']} done)" if at else ""
    click.echo(f"job {name}: rewound to checkpoint {checkpoint}{where}")
