"""``taskq acl ROLE [JOB]``: print (or apply) the Redis ACL user of one job's trainers, a
reaper or an exporter, for the taskq library of this version.

One command per role of ``taskq.ops.acl.ROLES``, generated from that table.

Data flow: operator -> cli/acl.py -> taskq.ops.acl (rules) -> stdout, or ``ACL SETUSER`` on
Redis with ``--apply``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

import taskq
from taskq.engine.connection import translate
from taskq.engine.library import LIBRARY
from taskq.ops import acl as rules

from .common import client_of


def _password(password_env: str | None, password_file: Path | None) -> str | None:
    if password_env and password_file:
        raise click.UsageError("give --password-env or --password-file, not both")
    if password_env:
        value = os.environ.get(password_env)
        if not value:
            raise taskq.InvalidInput(f"environment variable {password_env} is not set or empty")
        return value
    if password_file:
        try:
            value = password_file.read_text().rstrip("\r\n")
        except OSError as e:
            raise taskq.InvalidInput(
                f"cannot read the password file {password_file}: {e.strerror}"
            ) from e
        if not value:
            raise taskq.InvalidInput(f"the password file {password_file} is empty")
        return value
    return None


def _options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--apply",
        "apply_",
        is_flag=True,
        help="Run ACL SETUSER on the server (the --url user needs ACL rights: "
        "@admin, which acl.conf's admin does not have). Replaces the "
        "user if it exists.",
    )(f)
    f = click.option(
        "--format",
        "fmt",
        type=click.Choice(["setuser", "aclfile"]),
        default="setuser",
        show_default=True,
        help="setuser: an `ACL SETUSER` command (quoted for a shell or "
        "redis-cli); aclfile: a line of an ACL file.",
    )(f)
    f = click.option(
        "--password-file",
        type=click.Path(dir_okay=False, path_type=Path),
        metavar="FILE",
        help="Read the password from FILE (one line).",
    )(f)
    f = click.option(
        "--password-env", metavar="VAR", help="Read the password from the environment variable VAR."
    )(f)
    f = click.option(
        "--user", metavar="NAME", help="The user name (default: <role>-<job>, or <role>-all)."
    )(f)
    return f


def _shards(ctx: click.Context, job: str | None, apply_: bool) -> list[str] | None:
    """The shards of ``job`` when it is a sharded job (the rule must cover them), read
    from Redis when a URL is given (``--url``, ``TASKQ_REDIS_URL``) or with ``--apply``;
    None for a plain job, or when no Redis was asked (said on stderr)."""
    if job is None:
        return None
    if not (apply_ or ctx.find_root().obj.url or os.environ.get("TASKQ_REDIS_URL")):
        click.echo(
            f"# no --url: the rule is for a plain job {job}; give --url (or "
            f"TASKQ_REDIS_URL) if it is a sharded job, so the rule covers its shards",
            err=True,
        )
        return None
    handle = client_of(ctx).job(job)
    return handle.parts() if handle.sharded else None


def _emit(ctx: click.Context, rule: rules.Rule, fmt: str, apply_: bool) -> None:
    if apply_:
        client = client_of(ctx)
        with translate(client.url):
            rules.apply(client.redis, rule)
        click.echo(
            f"applied user {rule.user} on {client.url} (in memory: ACL SAVE, or "
            f"CONFIG REWRITE, keeps it across restarts)"
        )
    else:
        click.echo(rule.setuser_line() if fmt == "setuser" else rule.aclfile_line())
    click.echo(
        f"# taskq {taskq.__version__}, library {LIBRARY}: allows "
        f"{' '.join(rule.functions())}; the names change with the library, so apply "
        f"this again after upgrading taskq",
        err=True,
    )


@click.group("acl")
def acl() -> None:
    """Redis ACL users scoped to one job (or to taskq's keys) for this taskq version.

    Prints the rule (the password as its SHA-256, never in clear), or applies it with
    --apply. See docs/security.md, "Per-job credentials".
    """


def _command(role: rules.Role) -> click.Command:
    """``taskq acl <role> [JOB]``: one command per role of ``taskq.ops.acl.ROLES``."""

    @click.pass_context
    def command(
        ctx: click.Context,
        job: str | None,
        user: str | None,
        password_env: str | None,
        password_file: Path | None,
        fmt: str,
        apply_: bool,
    ) -> None:
        prefix = ctx.find_root().obj.prefix
        password = _password(password_env, password_file)
        rule = rules.rule(role.name, job, user, password, prefix)  # bad input: said first
        shards = _shards(ctx, job, apply_)
        if shards:
            rule = rules.rule(role.name, job, user, password, prefix, shards)
        _emit(ctx, rule, fmt, apply_)

    command.__doc__ = (
        f"{role.summary}\n\nExample: taskq acl {role.name} mnist --password-env MNIST_PW --apply"
    )
    command = _options(command)
    command = click.argument("job", required=role.needs_job)(command)
    return acl.command(role.name)(command)


for _role in rules.ROLES.values():
    _command(_role)
