"""``taskq tasks ...``: list tasks of the current pass, retry dead ones, revoke a lease.

Data flow: operator -> cli/tasks.py -> taskq.Client -> Redis.
"""

from __future__ import annotations

import click
from rich.table import Table

from .common import age, client_of, console, echo_json


@click.group("tasks")
def tasks() -> None:
    """Inspect and act on the tasks of a job."""


@tasks.command("list")
@click.argument("name")
@click.option("--state", type=click.Choice(["todo", "leased", "done", "dead"]),
              default="leased", show_default=True, help="Which tasks to list.")
@click.option("--limit", type=click.IntRange(min=1, max=100000), default=100,
              show_default=True, help="At most this many rows.")
@click.option("--json", "as_json", is_flag=True, help="Print the tasks as JSON.")
@click.pass_context
def list_cmd(ctx: click.Context, name: str, state: str, limit: int, as_json: bool) -> None:
    """Tasks of NAME's current pass in one state (leased: worker, token, age, attempt)."""
    client = client_of(ctx)
    rows = client.tasks(name, state=state, limit=limit)
    now_ms = client.status(name, summaries=0).now_ms if state == "leased" else 0
    for row in rows:
        if "since_ms" in row:
            row["age_s"] = round(max(0, now_ms - row["since_ms"]) / 1000.0, 3)
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo(f"job {name}: no {state} tasks")
        return
    table = Table()
    cols = ["id", "failures", "attempts"]
    if state == "leased":
        cols += ["worker", "token", "started", "age", "attempt"]
    for col in cols:
        table.add_column(col, justify="left" if col == "worker" else "right")
    for r in rows:
        cells = [str(r["id"]), str(r["failures"]), str(r["attempts"])]
        if state == "leased":
            cells += [r.get("worker", "-"), str(r.get("token", "-")),
                      "yes" if r.get("started") else "reserved",
                      age(r.get("age_s")), str(r.get("attempt", "-"))]
        table.add_row(*cells)
    console().print(table)
    if len(rows) == limit:
        click.echo(f"(first {limit}; use --limit for more)", err=True)


@tasks.command("retry")
@click.argument("name")
@click.option("--id", "ids", type=click.IntRange(min=0), multiple=True, metavar="ID",
              help="A dead task to retry (repeat; default: every dead task).")
@click.pass_context
def retry(ctx: click.Context, name: str, ids: tuple[int, ...]) -> None:
    """Put dead tasks of NAME back at the front of the current pass."""
    count = client_of(ctx).retry(name, list(ids) or None)
    click.echo(f"job {name}: {count} task(s) retried")


@tasks.command("revoke")
@click.argument("name")
@click.argument("task_id", metavar="ID", type=click.IntRange(min=0))
@click.pass_context
def revoke(ctx: click.Context, name: str, task_id: int) -> None:
    """Send task ID's lease back to the front (no failure counted)."""
    if client_of(ctx).revoke(name, task_id):
        click.echo(f"job {name}: task {task_id} revoked")
    else:
        click.echo(f"job {name}: task {task_id} is not leased; nothing to revoke")
