"""``taskq pass ...``: advance, reset and watch the passes of a job.

(The module is ``passes`` because ``pass`` is a Python keyword.)

Data flow: operator -> cli/passes.py -> taskq.Client -> Redis.
"""

from __future__ import annotations

import datetime
import signal
import time
from types import FrameType
from typing import Any

import click
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import taskq
from taskq.models import JobStatus

from .common import age, client_of, console, echo_json, interactive, pass_label

FINAL_STATES = ("completed", "cancelled")


@click.group("pass")
def pass_group() -> None:
    """Advance, reset and watch passes (a pass is one sweep over all live tasks)."""


@pass_group.command("next")
@click.argument("name")
@click.option(
    "--force", is_flag=True, help="Skip what is left of an incomplete pass (recorded as skipped)."
)
@click.option(
    "--expect",
    "expected",
    type=click.IntRange(min=0),
    metavar="PASS",
    help="Only advance if PASS is still the current pass (compare-and-set).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON.")
@click.pass_context
def next_cmd(
    ctx: click.Context, name: str, force: bool, expected: int | None, as_json: bool
) -> None:
    """Start the next pass of NAME (manual advance).

    Refuses while the current pass has work left unless --force.
    """
    client = client_of(ctx)
    before = client.job(name).status(summaries=0)
    new_pass = client.job(name).next(expected_pass=expected, force=force)
    status = client.job(name).status(summaries=0)
    if as_json:
        echo_json(
            {
                "job": name,
                "from_pass": before.pass_no,
                "pass": status.pass_no,
                "state": status.state,
                "skipped": before.todo + before.leased
                if force and before.state == "running"
                else 0,
            }
        )
    elif status.state == "completed":
        click.echo(f"job {name}: completed (last pass {status.pass_no})")
    else:
        click.echo(f"job {name}: pass {pass_label(new_pass, status.passes)} started")


@pass_group.command("reset")
@click.argument("name")
@click.option(
    "--expect",
    "expected",
    type=click.IntRange(min=0),
    metavar="PASS",
    help="Only reset if PASS is still the current pass.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON.")
@click.pass_context
def reset(ctx: click.Context, name: str, expected: int | None, as_json: bool) -> None:
    """Restart the current pass of NAME (a new attempt; leases out become stale)."""
    client = client_of(ctx)
    pass_no = client.job(name).reset(expected_pass=expected)
    if as_json:
        status = client.job(name).status(summaries=0)
        echo_json({"job": name, "pass": pass_no, "attempt": status.pass_attempt + 1})
    else:
        click.echo(f"job {name}: pass {pass_no} restarted")


def _workers_table(client: taskq.Client, name: str, limit: int = 10) -> Table:
    table = Table(box=None, pad_edge=False)
    for col in ("worker", "leases", "heartbeat", "state"):
        table.add_column(col)
    rows = client.job(name).workers()
    for w in rows[:limit]:
        state = "draining" if w["draining"] else "alive" if w["alive"] else "lost"
        table.add_row(w["id"], str(w["leases"]), age(w["last_heartbeat_age_s"]) + " ago", state)
    if len(rows) > limit:
        table.add_row(f"... {len(rows) - limit} more", "", "", "")
    return table


class _Stop(Exception):
    """SIGTERM while watching: leave like Ctrl-C, with the signal's exit code."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signum)


def _plain(name: str, s: JobStatus) -> str:
    d = s.as_dict()
    when = datetime.datetime.now().strftime("%H:%M:%S")
    return (
        f"{when} job {name} pass {pass_label(s.pass_no, s.passes)}: {s.state}"
        f"{' (' + s.reason + ')' if s.reason else ''} todo {s.todo} leased {s.leased} "
        f"done {s.done} dead {s.dead} workers {s.workers} "
        f"{d['throughput_per_s']:.1f} tasks/s eta {age(d['eta_s'])}"
    )


@pass_group.command("watch")
@click.argument("name")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=0.5,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.pass_context
def watch(ctx: click.Context, name: str, interval: float) -> None:
    """Live progress of the current pass of NAME and its workers, until the job is
    completed or cancelled (or Ctrl-C: exit 130; SIGTERM: 143).

    Off a terminal (a file, a pipe, kubectl logs) it prints one plain line per change
    instead of a live display.
    """
    client = client_of(ctx)
    status: JobStatus = client.job(name).status(summaries=0)
    old = signal.signal(signal.SIGTERM, _on_term)
    try:
        if interactive(stderr=False):
            status = _watch_live(client, name, interval, status)
        else:
            status = _watch_plain(client, name, interval, status)
    except KeyboardInterrupt:
        click.echo(f"job {name}: stopped watching (Ctrl-C)", err=True)
        ctx.exit(130)
    except _Stop as e:
        click.echo(f"job {name}: stopped watching (signal {e.signum})", err=True)
        ctx.exit(128 + e.signum)
    finally:
        signal.signal(signal.SIGTERM, old)
    click.echo(f"job {name}: {status.state} (pass {status.pass_no})")


def _watch_plain(client: taskq.Client, name: str, interval: float, status: JobStatus) -> JobStatus:
    last: tuple[Any, ...] | None = None
    while True:
        key = (
            status.state,
            status.reason,
            status.pass_no,
            status.todo,
            status.leased,
            status.done,
            status.dead,
            status.workers,
        )
        if key != last:
            click.echo(_plain(name, status))
            last = key
        if status.state in FINAL_STATES:
            return status
        time.sleep(interval)
        status = client.job(name).status(summaries=0)


def _watch_live(client: taskq.Client, name: str, interval: float, status: JobStatus) -> JobStatus:
    out = console()
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=out,
    )
    info = ""
    current = bar.add_task("", total=status.tasks)

    def refresh() -> JobStatus:
        nonlocal info
        s = client.job(name).status(summaries=0)
        d = s.as_dict()
        bar.update(
            current,
            completed=s.done,
            total=max(1, s.tasks - s.dead),
            description=f"{name} pass {pass_label(s.pass_no, s.passes)}",
        )
        info = (
            f"{s.state}{' (' + s.reason + ')' if s.reason else ''}  todo {s.todo}  "
            f"leased {s.leased}  done {s.done}  dead {s.dead}  workers {s.workers}  "
            f"{d['throughput_per_s']:.1f} tasks/s  eta {age(d['eta_s'])}"
        )
        return s

    def view() -> Table:
        grid = Table.grid()
        grid.add_row(bar)
        grid.add_row(info)
        grid.add_row(_workers_table(client, name))
        return grid

    with Live(view(), console=out, refresh_per_second=4, transient=False) as live:
        while True:
            status = refresh()
            live.update(view())
            if status.state in FINAL_STATES:
                return status
            time.sleep(interval)
