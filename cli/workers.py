"""``taskq workers ...``: list the workers of a job and ask them to drain.

Data flow: operator -> cli/workers.py -> taskq.Client -> Redis.
"""

from __future__ import annotations

import click
from rich.table import Table

import taskq

from .common import age, client_of, echo_json, show


@click.group("workers")
def workers() -> None:
    """Inspect and drain the workers (trainers) of a job."""


@workers.command("list")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the workers as JSON.")
@click.pass_context
def list_cmd(ctx: click.Context, name: str, as_json: bool) -> None:
    """Workers of NAME: id, host, pid, joined, last heartbeat age, leases held."""
    client = client_of(ctx)
    rows = client.job(name).workers()
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo(f"job {name}: no workers")
        return
    now_ms = client.job(name).status(summaries=0).now_ms
    table = Table()
    for col in ("id", "host", "pid", "joined", "heartbeat", "leases", "state"):
        table.add_column(col, justify="right" if col in ("pid", "leases") else "left")
    for w in rows:
        joined = age(max(0, now_ms - int(w["joined_ms"])) / 1000.0) + " ago"
        state = "draining" if w["draining"] else "alive" if w["alive"] else "lost"
        table.add_row(
            w["id"],
            w["host"],
            str(w["pid"]),
            joined,
            age(w["last_heartbeat_age_s"]) + " ago",
            str(w["leases"]),
            state,
        )
    show(table)


@workers.command("drain")
@click.argument("name")
@click.argument("worker_ids", metavar="[WORKER]...", nargs=-1)
@click.option("--all", "drain_all", is_flag=True, help="Drain every registered worker.")
@click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON.")
@click.pass_context
def drain(
    ctx: click.Context, name: str, worker_ids: tuple[str, ...], drain_all: bool, as_json: bool
) -> None:
    """Ask workers of NAME to leave: they lease nothing more and leave once done with
    what they work on (a trainer, its current task; a taskq.torch loader, every task its
    readers began or have queued), giving back read-ahead not begun."""
    client = client_of(ctx)
    if drain_all == bool(worker_ids):
        raise click.UsageError("name WORKER ids or give --all (not both)", ctx)
    targets = [w["id"] for w in client.job(name).workers()] if drain_all else list(worker_ids)
    for worker_id in targets:
        try:
            client.job(name).drain(worker_id)
        except taskq.InvalidInput as e:
            raise taskq.InvalidInput(f"job {name}: no worker {worker_id!r}") from e
        if not as_json:
            click.echo(f"job {name}: worker {worker_id} draining")
    if as_json:
        echo_json({"job": name, "draining": targets})
    elif not targets:
        click.echo(f"job {name}: no workers to drain")
