"""``taskq events NAME``: the recent events of a job, optionally followed live.

The stream is a window for humans (trimmed); the counters in ``job status`` are the record.

Data flow: operator -> cli/events.py -> taskq.Client.events -> Redis stream.
"""

from __future__ import annotations

import collections
import datetime
import json

import click

from .common import client_of

PAGE = 1000


def _line(event_id: str, fields: dict[str, str], as_json: bool) -> str:
    if as_json:
        return json.dumps({"id": event_id, **fields}, sort_keys=True)
    ms = int(event_id.split("-")[0])
    when = datetime.datetime.fromtimestamp(ms / 1000.0).strftime("%H:%M:%S.%f")[:-3]
    rest = " ".join(f"{k}={v}" for k, v in fields.items() if k != "type")
    return f"{when} {fields.get('type', '?'):<16} {rest}"


@click.command("events")
@click.argument("name")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events (Ctrl-C ends).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--count", "-n", type=click.IntRange(min=0), default=50, show_default=True,
              help="How many of the latest events to print first.")
@click.pass_context
def events(ctx: click.Context, name: str, follow: bool, as_json: bool, count: int) -> None:
    """Recent events of job NAME (leased, acked, expired, pass_completed, ...)."""
    client = client_of(ctx)
    client.status(name, summaries=0)  # an unknown job fails here, not as an empty list
    latest: collections.deque[tuple[str, dict[str, str]]] = collections.deque(maxlen=count)
    last = "-"
    while True:  # the stream is trimmed (bounded), so paging to its end is bounded too
        page = client.events(name, since=last, count=PAGE)
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
            for event_id, fields in client.events(name, since=last, count=PAGE,
                                                  block_ms=1000):
                click.echo(_line(event_id, fields, as_json))
                last = event_id
    except KeyboardInterrupt:
        return
