"""``taskq events NAME``: the recent events of a job, optionally followed live.

The stream is a window for humans (trimmed); the counters in ``job status`` are the record.

Data flow: operator -> cli/events.py -> taskq.Client.events -> Redis stream.
"""

from __future__ import annotations

import collections
import datetime
import json
import re
from typing import Any

import click

from taskq.admin.stats_tasks import STEP_KINDS

from .common import client_of

PAGE = 1000
#: Fields that hold text even when it looks like a number (a hex incarnation may be all
#: digits; a worker id may be).
TEXT_FIELDS = {"type", "worker", "from", "by", "incarnation", "error", "reason", "op"}
_INT = re.compile(r"-?\d+")


#: A ``step`` entry's lists: per kind (acked, started, leased, reserved) its task ids and
#: their tokens (docs/design.md, "Events").
STEP_LISTS = {f"{kind}{end}" for kind in STEP_KINDS for end in ("", "_tokens")}


def typed(fields: dict[str, str]) -> dict[str, Any]:
    """The stream's fields with numbers as numbers (a ``step`` entry's lists of tasks and
    tokens, and a batch event's ``tasks`` and ``tokens``: lists of numbers)."""
    out: dict[str, Any] = {}
    step = fields.get("type") == "step"
    for key, value in fields.items():
        if key in TEXT_FIELDS:
            out[key] = value
        elif (
            (step and key in STEP_LISTS) or (key in ("tasks", "tokens") and "count" in fields)
        ) and all(_INT.fullmatch(v) for v in value.split(",")):
            out[key] = [int(v) for v in value.split(",")]
        elif _INT.fullmatch(value):
            out[key] = int(value)
        else:
            out[key] = value
    return out


def one_line(value: str) -> str:
    """A multi-line value (a command's stderr tail) as its first line and a count of the
    rest, so one event stays one line; ``--json`` and ``taskq tasks show`` have it all."""
    lines = [line for line in value.splitlines() if line.strip()]
    if len(lines) <= 1:
        return value.strip()
    return f"{lines[0]} (+{len(lines) - 1} more lines)"


def _line(event_id: str, fields: dict[str, str], as_json: bool) -> str:
    if as_json:
        # the entry's id last: no field of the event may stand in its place
        return json.dumps({**typed(fields), "id": event_id}, sort_keys=True)
    ms = int(event_id.split("-")[0])
    when = datetime.datetime.fromtimestamp(ms / 1000.0).strftime("%H:%M:%S.%f")[:-3]
    rest = " ".join(
        f"{k}={one_line(v) if ' ' not in v else repr(one_line(v))}"
        for k, v in fields.items()
        if k != "type"
    )
    return f"{when} {fields.get('type', '?'):<16} {rest}"


@click.command("events")
@click.argument("name")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events (Ctrl-C ends).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option(
    "--count",
    "-n",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    help="How many of the latest events to print first.",
)
@click.pass_context
def events(ctx: click.Context, name: str, follow: bool, as_json: bool, count: int) -> None:
    """Recent events of job NAME (step, expired, failed, pass_completed, ...).

    A trainer's call is one ``step`` entry: per kind (acked, started, leased, reserved)
    the tasks it lists and their tokens."""
    client = client_of(ctx)
    client.job(name).status(summaries=0)  # an unknown job fails here, not as an empty list
    latest: collections.deque[tuple[str, dict[str, str]]] = collections.deque(maxlen=count)
    last = "-"
    while True:  # the stream is trimmed (bounded), so paging to its end is bounded too
        page = client.job(name).events(since=last, count=PAGE)
        latest.extend(page)
        if page:
            last = page[-1][0]
        if len(page) < PAGE:
            break
    for event_id, fields in latest:
        click.echo(_line(event_id, fields, as_json))
    if not follow:
        return
    try:
        while True:
            if last == "-":
                last = "0-0"
            for event_id, fields in client.job(name).events(since=last, count=PAGE, block_ms=1000):
                click.echo(_line(event_id, fields, as_json))
                last = event_id
    except KeyboardInterrupt:
        return
