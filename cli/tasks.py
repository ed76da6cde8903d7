"""``taskq tasks ...``: list and show tasks of the current pass, retry dead ones, revoke a
lease.

Data flow: operator -> cli/tasks.py -> taskq.Client -> Redis.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import click
from rich.table import Table

import taskq

from .common import age, client_of, echo_json, show
from .events import one_line

#: Characters of a task's chunks shown in a table cell (``tasks show`` / --json: all).
CHUNKS_CELL = 60


def _chunks_text(chunks: Any, width: int = CHUNKS_CELL) -> str:
    text = json.dumps(chunks, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 3] + "..."


@click.group("tasks")
def tasks() -> None:
    """Inspect and act on the tasks of a job."""


@tasks.command("list")
@click.argument("name")
@click.option(
    "--state",
    type=click.Choice(["todo", "leased", "done", "dead"]),
    default="leased",
    show_default=True,
    help="Which tasks to list.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=100000),
    default=100,
    show_default=True,
    help="At most this many rows.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the tasks as JSON.")
@click.pass_context
def list_cmd(ctx: click.Context, name: str, state: str, limit: int, as_json: bool) -> None:
    """Tasks of NAME's current pass in one state (leased: worker, token, age; dead: last
    error and chunks).

    attempts counts the leases that count toward max_attempts, the current one
    included; a revoked lease is not counted.
    """
    client = client_of(ctx)
    rows = client.job(name).tasks(state=state, limit=limit, details=state == "dead")
    status = client.job(name).status(summaries=0)
    for row in rows:
        if "since_ms" in row:
            row["age_s"] = round(max(0, status.now_ms - row["since_ms"]) / 1000.0, 3)
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo(f"job {name}: no {state} tasks")
        return
    maxf, maxa = status.config.get("max_failures"), status.config.get("max_attempts")
    table = Table()
    cols = ["id", f"failures (max {maxf})", f"attempts (max {maxa})"]
    if state == "leased":
        cols += ["worker", "token", "started", "age"]
    if state == "dead":
        cols += ["last error", "chunks"]
    for col in cols:
        table.add_column(
            col, justify="left" if col in ("worker", "last error", "chunks") else "right"
        )
    for r in rows:
        # a leased task's lease record numbers the current attempt (counter + 1)
        attempts = r.get("attempt", r["attempts"]) if state == "leased" else r["attempts"]
        cells = [str(r["id"]), str(r["failures"]), str(attempts)]
        if state == "leased":
            cells += [
                r.get("worker", "-"),
                str(r.get("token", "-")),
                "yes" if r.get("started") else "reserved",
                age(r.get("age_s")),
            ]
        if state == "dead":
            error = r.get("last_error")
            cells += [
                one_line(error) if error else "- (not in the recent events)",
                _chunks_text(r.get("chunks")),
            ]
        table.add_row(*cells)
    show(table)
    if len(rows) == limit:
        click.echo(f"(first {limit}; use --limit for more)", err=True)


@tasks.command("show")
@click.argument("name")
@click.argument("task_id", metavar="ID", type=click.IntRange(min=0))
@click.option(
    "--history",
    type=click.IntRange(min=0, max=1000),
    default=10,
    show_default=True,
    help="How many of the task's latest events to show.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the task as JSON.")
@click.pass_context
def show_cmd(ctx: click.Context, name: str, task_id: int, history: int, as_json: bool) -> None:
    """One task of NAME: state, chunks, holder, failures, attempts, last error and its
    latest events (from the job's recent events, which are trimmed)."""
    t = client_of(ctx).job(name).task(task_id, history=history)
    if as_json:
        echo_json(t)
        return
    out = []
    out.append(f"task {t['id']} of job {name}: {t['state']} (pass {t['pass']})")
    lease = t["lease"]
    if lease:
        out.append(
            f"holder: {lease['worker']} (token {lease['token']}, "
            f"{'started' if lease['started'] else 'reserved'}, attempt "
            f"{lease['attempt']})"
        )
    else:
        last = t["last_lease"]
        out.append("holder: -" + (f" (last: {last['worker']}, {last['ended']})" if last else ""))
    out.append(
        f"failures: {t['failures']} of {t['max_failures']}; attempts: {t['attempts']} "
        f"of {t['max_attempts']}{'; leased alone until it passes (solo)' if t['solo'] else ''}"
    )
    error = t["last_error"]
    if error:
        lines = error.splitlines()
        out.append(f"last error: {lines[0]}")
        out.extend(f"  {line}" for line in lines[1:])
    else:
        out.append("last error: -")
    chunks = t["chunks"] or []
    out.append(f"chunks ({len(chunks)}):")
    out.extend(f"  {json.dumps(c, separators=(',', ':'))}" for c in chunks)
    if history:
        out.append(f"history (latest {len(t['history'])} of the recent events):")
        for e in t["history"]:
            when = datetime.datetime.fromtimestamp(e["ms"] / 1000.0).strftime("%H:%M:%S.%f")[:-3]
            rest = " ".join(
                f"{k}={one_line(str(v))}"
                for k, v in e.items()
                if k not in ("id", "ms", "type", "tasks", "tokens", "count")
            )
            out.append(f"  {when} {e.get('type', '?'):<10} {rest}")
    click.echo("\n".join(out))


@tasks.command("retry")
@click.argument("name")
@click.option(
    "--id",
    "ids",
    type=click.IntRange(min=0),
    multiple=True,
    metavar="ID",
    help="A dead task to retry (repeat; default: every dead task).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON.")
@click.pass_context
def retry(ctx: click.Context, name: str, ids: tuple[int, ...], as_json: bool) -> None:
    """Put dead tasks of NAME back at the front of the current pass.

    A task named with --id that does not exist or is not dead is an error (exit 1,
    nothing retried).
    """
    count = client_of(ctx).job(name).retry(list(ids) or None)
    if as_json:
        echo_json({"job": name, "retried": count, "ids": sorted(set(ids)) or None})
    elif count == 0:
        click.echo(f"job {name}: no dead tasks; nothing retried")
    else:
        click.echo(f"job {name}: {count} task(s) retried")


@tasks.command("revoke")
@click.argument("name")
@click.argument("task_id", metavar="ID", type=click.IntRange(min=0))
@click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON.")
@click.pass_context
def revoke(ctx: click.Context, name: str, task_id: int, as_json: bool) -> None:
    """Send task ID's lease back to the front (no failure counted).

    Exit 1 if the task does not exist or is not leased.
    """
    client = client_of(ctx)
    if not client.job(name).revoke(task_id):
        state = client.job(name).task(task_id, history=0)["state"]
        raise taskq.InvalidInput(
            f"job {name}: task {task_id} is {state}, not leased; nothing to revoke"
        )
    if as_json:
        echo_json({"job": name, "revoked": task_id})
    else:
        click.echo(f"job {name}: task {task_id} revoked")
