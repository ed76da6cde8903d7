"""``taskq reaper``: run the loop that re-dispatches expired leases and lost workers' work.

Data flow: cli/reaper.py -> taskq.ops.reaper.Reaper -> Lua (reap) -> Redis.
"""

from __future__ import annotations

import click

import taskq

from .common import client_of, setup_logging


@click.command("reaper")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.01),
    default=0.5,
    show_default=True,
    help="Seconds between sweeps.",
)
@click.option(
    "--job",
    "jobs",
    multiple=True,
    metavar="NAME",
    help="Reap only this job (repeat); default: every job.",
)
@click.option(
    "--give-up-after",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Exit 1 after Redis was unreachable this long (default: keep retrying).",
)
@click.pass_context
def reaper(
    ctx: click.Context, interval: float, jobs: tuple[str, ...], give_up_after: float | None
) -> None:
    """Re-dispatch expired leases within seconds (several reapers may run; runs until
    SIGTERM / Ctrl-C)."""
    from taskq.ops.reaper import Reaper

    setup_logging()
    client = client_of(ctx)
    code = Reaper(
        client, jobs=list(jobs) or None, interval=interval, give_up_after=give_up_after
    ).run()
    if code:
        raise taskq.ConnectionLost(
            f"reaper gave up: Redis at {client.url} unreachable for {give_up_after:g} s"
        )
