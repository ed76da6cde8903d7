"""The ``taskq`` click group: global options, the lazy client, and error reporting.

Every expected failure (a ``taskq.TaskqError``, a usage error) is turned into one line
``taskq: error: ...`` on stderr here, once for all commands: exit 1, or 2 for usage.

Data flow: operator -> cli/main.py -> cli/<noun>.py -> taskq.Client -> Redis.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click
import redis

import taskq

from . import checkpoints as _checkpoints  # noqa: F401  (adds job checkpoints / rewind)
from . import demo as demo_module
from . import events, exporter, job, passes, reaper, tasks, workers
from .work import work

CLI_RETRIES = 3


class CliState:
    """The context object: global options and a ``taskq.Client`` made on first use.

    Commands that never touch Redis (``--help``, ``demo`` with its own server) never
    open a connection.
    """

    def __init__(self, url: str | None, prefix: str | None) -> None:
        self.url = url
        self.prefix = prefix
        self._client: taskq.Client | None = None

    @property
    def client(self) -> taskq.Client:
        """The shared client (created on first use)."""
        if self._client is None:
            # a few quick retries: an operator waits ~1 s, not ~5 s, for "cannot reach"
            self._client = taskq.Client(self.url, key_prefix=self.prefix, retries=CLI_RETRIES)
        return self._client


def fail(message: str, exit_code: int = 1) -> NoReturn:
    """Print ``taskq: error: message`` (one line) to stderr and exit."""
    line = " ".join(str(message).split()) or "unknown error"
    click.echo(f"taskq: error: {line}", err=True)
    sys.exit(exit_code)


class TaskqGroup(click.Group):
    """A group that reports every expected failure as one line on stderr.

    ``invoke`` turns library errors into ``click.ClickException``; ``main`` prints any
    ``ClickException`` (usage errors included) as a single line instead of click's
    multi-line usage block.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except taskq.TaskqError as e:
            raise click.ClickException(str(e)) from e
        except redis.exceptions.RedisError as e:
            raise click.ClickException(f"Redis error: {e}") from e

    def main(  # type: ignore[override]
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as e:
            hint = ""
            if e.ctx is not None:
                hint = f" (see '{e.ctx.command_path} --help')"
            fail(f"{e.format_message()}{hint}", e.exit_code)
        except click.ClickException as e:
            fail(e.format_message(), e.exit_code)
        except click.Abort:
            fail("aborted", 1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=TaskqGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", envvar="TASKQ_REDIS_URL", metavar="URL",
              help="Redis URL (redis://, rediss://, unix://, redis+cluster://, "
                   "redis+sentinel://); env TASKQ_REDIS_URL, default redis://127.0.0.1:6379/0.")
@click.option("--prefix", envvar="TASKQ_PREFIX", metavar="PREFIX",
              help="Key prefix of taskq's keys; env TASKQ_PREFIX, default 'taskq'.")
@click.version_option(taskq.__version__, prog_name="taskq")
@click.pass_context
def cli(ctx: click.Context, url: str | None, prefix: str | None) -> None:
    """taskq: a Redis-backed work queue feeding data-set chunks to elastic trainers.

    Create a job from a data set, let trainers lease its tasks pass after pass, and
    manage passes, tasks and workers from here. Start with `taskq demo`.

    Shell completion (bash): eval "$(_TASKQ_COMPLETE=bash_source taskq)".
    """
    ctx.obj = CliState(url, prefix)


cli.add_command(job.job)
cli.add_command(passes.pass_group)
cli.add_command(tasks.tasks)
cli.add_command(workers.workers)
cli.add_command(events.events)
cli.add_command(reaper.reaper)
cli.add_command(exporter.exporter)
cli.add_command(demo_module.demo)

cli.add_command(work)


def main() -> None:
    """Console-script entry point (``taskq``)."""
    cli.main(prog_name="taskq")
