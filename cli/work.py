"""``taskq work JOB -- CMD ARGS...``: run a command once per task (placeholder, filled in next)."""

from __future__ import annotations

import click


@click.command("work", context_settings={"ignore_unknown_options": True})
@click.argument("job")
@click.option("--prefetch", type=int, default=0, show_default=True,
              help="Reserved tasks kept ahead of the current one.")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def work(job: str, prefetch: int, cmd: tuple[str, ...]) -> None:
    """Run CMD once per task of JOB (task JSON on stdin)."""
    raise click.ClickException("not implemented yet")
