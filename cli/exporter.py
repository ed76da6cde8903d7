"""``taskq exporter``: serve Prometheus metrics of every job (reads only).

Data flow: Prometheus -> cli/exporter.py -> taskq.ops.exporter -> taskq.admin.stats -> Redis.
"""

from __future__ import annotations

import click

from .common import client_of, setup_logging


@click.command("exporter")
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=9478,
    show_default=True,
    help="HTTP port of /metrics.",
)
@click.option("--addr", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option(
    "--job",
    "jobs",
    multiple=True,
    metavar="NAME",
    help="Export only this job (repeat); default: every job.",
)
@click.pass_context
def exporter(ctx: click.Context, port: int, addr: str, jobs: tuple[str, ...]) -> None:
    """Serve /metrics for Prometheus until SIGTERM / Ctrl-C."""
    from taskq.ops.exporter import serve

    setup_logging()
    try:
        serve(client_of(ctx), port=port, addr=addr, jobs=list(jobs) or None)
    except OSError as e:
        raise click.ClickException(f"cannot listen on {addr}:{port}: {e.strerror or e}") from e
