"""Helpers shared by the CLI's command modules: option types, output, time formatting.

Data flow: cli/<noun>.py -> cli/common.py (formatting only; no Redis calls).
"""

from __future__ import annotations

import json
import logging
import math
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

import taskq
from taskq.mix import parse_mix
from taskq.models import JobStatus


def client_of(ctx: click.Context) -> taskq.Client:
    """The lazily created client of the context object (see ``main.CliState``)."""
    return ctx.find_root().obj.client  # type: ignore[no-any-return]


def setup_logging() -> None:
    """Log lines to stderr for the long-running commands (reaper, exporter)."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def echo_json(data: Any) -> None:
    """Print ``data`` as one JSON document on stdout."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr, for progress that must not mix with JSON)."""
    # piped output is for reading later: size tables to their content, not to 80 columns
    width = None if interactive(stderr) else 200
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def show(*renderables: Any) -> None:
    """Print rich renderables on stdout: as they are on a terminal; off one (a pipe, a
    file) without the padding rich adds to fill each line to the widest one."""
    out = console()
    if interactive(stderr=False):
        for r in renderables:
            out.print(r)
        return
    with out.capture() as captured:
        for r in renderables:
            out.print(r)
    click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def interactive(stderr: bool = True) -> bool:
    """True when the stream is a terminal (live displays only make sense there)."""
    stream = sys.stderr if stderr else sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)())


class PassesType(click.ParamType):
    """A number of passes >= 1, or 0 / ``inf`` for "until cancelled" (None)."""

    name = "N|inf"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | None:
        if value is None or isinstance(value, int):
            return None if value in (None, 0) else int(value)
        text = str(value).strip().lower()
        if text in ("inf", "infinite", "forever", "0"):
            return None
        try:
            n = int(text)
        except ValueError:
            self.fail(
                f"{value!r} is not a number of passes (an integer >= 1, or 0/inf)", param, ctx
            )
        if n < 0:
            self.fail(f"{value!r}: passes must be >= 1 (or 0/inf for until cancelled)", param, ctx)
        return n or None


class MixType(click.ParamType):
    """A mixed job's weights, ``web=0.5,code=0.3,books=0.2`` (``taskq.mix.parse_mix``)."""

    name = "JOB=W,..."

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> dict[str, float] | None:
        if value is None or isinstance(value, dict):
            return value
        try:
            return parse_mix(str(value))
        except taskq.InvalidInput as e:
            self.fail(str(e), param, ctx)


class TaskTimeoutType(click.ParamType):
    """``auto``, ``none`` or a number of seconds > 0."""

    name = "auto|none|SECONDS"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float | str | None:
        if value is None:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            text = str(value).strip().lower()
            if text == "auto":
                return "auto"
            if text in ("none", "off", "no"):
                return None
            try:
                seconds = float(text)
            except ValueError:
                self.fail(f"{value!r} is not auto, none or a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{value!r}: a task timeout must be a positive number of seconds", param, ctx)
        return seconds


def age(seconds: float | None) -> str:
    """``1.2s``, ``3m04s``, ``2h05m`` or ``-``."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def pass_label(pass_no: int, passes: int | None) -> str:
    """``0 (1 of 3)``: pass numbers count from 0, as in every command and the JSON."""
    return f"{pass_no} ({pass_no + 1} of {'inf' if passes is None else passes})"


def add_stream_row(table: Table, status: JobStatus) -> None:
    """The "appended / backlog" row of a stream or a job appended to (plain or sharded)."""
    if not (status.stream or status.appended):
        return
    stream = f"stream {status.stream}, " if status.stream else ""
    limit = status.config.get("max_backlog")
    table.add_row(
        "appended / backlog",
        f"{stream}{status.appended} tasks appended, {status.done} done, backlog "
        f"{status.backlog}{f' (max {limit})' if limit else ''}, oldest unfinished "
        f"{age(status.oldest_unfinished_age_s)}",
    )
