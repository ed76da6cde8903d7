"""The ``taskq`` click group: global options, the lazy client, and error reporting.

Every expected failure (a ``taskq.TaskqError``, a usage error) is turned into one line
``taskq: error: ...`` on stderr here, once for all commands: exit 1, or 2 for usage.

Data flow: operator -> cli/main.py -> cli/<noun>.py -> taskq.Client -> Redis.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from typing import Any, NoReturn

import click
import redis

import taskq
from taskq.models import JobConfig

from . import checkpoints as _checkpoints  # noqa: F401  (adds job checkpoints / rewind)
from . import demo as demo_module
from . import dev as dev_module
from . import events, exporter, job, mix, passes, reaper, tasks, workers
from . import job_view as _job_view  # noqa: F401  (adds job status / list / audit)
from . import streams as _streams  # noqa: F401  (adds job append / seal / follow)
from .acl import acl as acl_group
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
        self.allow_eviction = False
        self._client: taskq.Client | None = None

    @property
    def client(self) -> taskq.Client:
        """The shared client (created on first use)."""
        if self._client is None:
            # a few quick retries: an operator waits ~1 s, not ~5 s, for "cannot reach"
            self._client = taskq.Client(
                self.url,
                key_prefix=self.prefix,
                retries=CLI_RETRIES,
                allow_eviction=self.allow_eviction,
            )
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
        except taskq.errors.InvalidConfig as e:
            # a bad option value (or combination) is a usage error, whoever found it;
            # said in the CLI's words (--worker-ttl), not the API's (worker_ttl)
            raise click.UsageError(_option_words(str(e))) from e
        except taskq.JobExists as e:
            raise click.ClickException(
                f"{e} (--replace replaces it, --exist-ok leaves it as it is)"
            ) from e
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
            fail(f"{e.format_message()}{_glob_hint(e, args)}{hint}", e.exit_code)
        except click.ClickException as e:
            fail(e.format_message(), e.exit_code)
        except click.Abort:
            fail("aborted", 1)
        sys.exit(rv if isinstance(rv, int) else 0)


#: ``JobConfig``'s settings as whole words: each is ``taskq job create``'s option of its name.
SETTING_WORDS = re.compile(
    r"\b(" + "|".join(f.name for f in dataclasses.fields(JobConfig)) + r")\b"
)


def _option_words(message: str) -> str:
    message = message.replace("allow_eviction=True", "--allow-eviction")
    return SETTING_WORDS.sub(lambda m: "--" + m[1].replace("_", "-"), message)


def _glob_hint(error: click.UsageError, args: Any) -> str:
    """For "unexpected extra arguments" that are existing paths: the shell expanded an
    unquoted glob (``--files data/*.jsonl``), so say to quote it."""
    if not error.message.startswith("Got unexpected extra argument"):
        return ""
    argv = list(sys.argv[1:] if args is None else args)
    if not any(isinstance(a, str) and os.path.exists(a) for a in argv):
        return ""
    return (
        "; a shell expanded an unquoted pattern into these paths: quote it, e.g. "
        "--files 'data/part-*.jsonl'"
    )


def _set_url(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """The callback of a subcommand's ``--url``: it overrides the group's (and the env's)."""
    state = ctx.find_root().obj
    if value is not None and isinstance(state, CliState):
        state.url = value


URL_HELP = (
    "Redis URL (redis://, rediss://, unix://, redis+cluster://, redis+sentinel://); "
    "accepted before or after the subcommand; env TASKQ_REDIS_URL, default "
    "redis://127.0.0.1:6379/0."
)


def add_url_option(command: click.Command) -> None:
    """Give ``command`` (every leaf command, for a group) the shared ``--url`` option, so
    ``taskq --url U job status J`` and ``taskq job status J --url U`` both work."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            add_url_option(sub)
        return
    if any("--url" in p.opts for p in command.params):
        return
    command.params.append(
        click.Option(
            ["--url"],
            metavar="URL",
            expose_value=False,
            is_eager=True,
            callback=_set_url,
            help=URL_HELP,
        )
    )


def _set_allow_eviction(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    state = ctx.find_root().obj
    if value and isinstance(state, CliState):
        state.allow_eviction = True


ALLOW_EVICTION = click.Option(
    ["--allow-eviction"],
    is_flag=True,
    expose_value=False,
    callback=_set_allow_eviction,
    help="Create the job even if Redis's maxmemory-policy is not noeviction (eviction "
    "silently drops leases and done marks).",
)


@click.group(cls=TaskqGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", envvar="TASKQ_REDIS_URL", metavar="URL", help=URL_HELP)
@click.option(
    "--prefix",
    envvar="TASKQ_PREFIX",
    metavar="PREFIX",
    help="Key prefix of taskq's keys; env TASKQ_PREFIX, default 'taskq'.",
)
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
cli.add_command(mix.mix)
cli.add_command(passes.pass_group)
cli.add_command(tasks.tasks)
cli.add_command(workers.workers)
cli.add_command(events.events)
cli.add_command(reaper.reaper)
cli.add_command(exporter.exporter)
cli.add_command(demo_module.demo)
cli.add_command(dev_module.dev)

cli.add_command(work)
cli.add_command(acl_group)
job.job.commands["create"].params.append(ALLOW_EVICTION)
for _command in cli.commands.values():
    if _command is not dev_module.dev:  # it starts servers: no URL to take
        add_url_option(_command)


def main() -> None:
    """Console-script entry point (``taskq``)."""
    cli.main(prog_name="taskq")
