"""``taskq mix set | status | export``: a mixed job's weights from a stated slot, its
per-source counts, and the sequence it charged (docs/mixing.md). Each is the job handle's
``set_weights`` / ``mix_status`` / ``mix_sequence``; ``taskq job create --mix`` makes one.

Data flow: operator / a mixing policy -> cli/mix.py -> taskq.Client's job handle -> Redis.
"""

from __future__ import annotations

import json

import click

from .common import MixType, client_of, echo_json


@click.group("mix")
def mix() -> None:
    """A mixed job's weights, counts and sequence (docs/mixing.md)."""


@mix.command("set")
@click.argument("name")
@click.argument("weights", type=MixType())
@click.option(
    "--at",
    type=click.IntRange(min=0),
    default=None,
    help="The slot the weights hold from (default, or when charged already: the first "
    "slot not charged).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the slot as JSON.")
@click.pass_context
def set_weights(
    ctx: click.Context, name: str, weights: dict[str, float], at: int | None, as_json: bool
) -> None:
    """Set mixed job NAME's weights (every source, e.g. web=0.2,code=0.3,books=0.5);
    prints the slot from which they hold."""
    slot = client_of(ctx).job(name).set_weights(weights, at=at)
    if as_json:
        echo_json({"job": name, "slot": slot})
    else:
        shown = ",".join(f"{s}={w:g}" for s, w in weights.items())
        click.echo(f"job {name}: weights {shown} hold from slot {slot}")


@mix.command("status")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.pass_context
def status(ctx: click.Context, name: str, as_json: bool) -> None:
    """Mixed job NAME per source: weight now, charged and acked this pass, the acked
    tasks' samples (? when a task does not say its size), tasks, pass (a source's pass is
    the mixed job's but under cycle), debt (the slots an open stream source owes, as of
    the slots the schedule charged; 0 for a fixed source); and, when the charge waits for
    a starving stream source's feed, the slot it waits at (docs/mixing.md)."""
    st = client_of(ctx).job(name).mix_status()
    if as_json:
        echo_json(st)
        return
    click.echo(
        f"job {name}: pass {st['pass']}, {st['charged']} slots charged, next slot "
        f"{st['next_slot']}, on_exhausted {st['on_exhausted']}"
    )
    click.echo(
        f"{'source':<24} {'weight':>8} {'charged':>8} {'acked':>8} {'samples':>10} "
        f"{'tasks':>8} {'pass':>5} {'debt':>5}"
    )
    for row in st["sources"]:
        samples = "?" if row["samples"] is None else row["samples"]
        click.echo(
            f"{row['source']:<24} {row['weight']:>8.4g} {row['charged']:>8} {row['acked']:>8} "
            f"{samples:>10} {row['tasks']:>8} {row['pass']:>5} {row['debt']:>5}"
        )
    if st["waits_on"] is not None:
        click.echo(f"waits on {st['waits_on']['source']} at slot {st['waits_on']['slot']}")


@mix.command("export")
@click.argument("name")
@click.option(
    "--pass",
    "pass_no",
    type=click.IntRange(min=0),
    default=None,
    help="The pass (default: the current one).",
)
@click.pass_context
def export(ctx: click.Context, name: str, pass_no: int | None) -> None:
    """Mixed job NAME's charged slots of a pass, one JSON line each: slot, pass,
    position, source, source_task, source_pass, task, repaid (the slot repaid a stream
    source's debt). A trimmed mix (fed by an open stream source) starts at its watermark,
    and says `# trimmed below slot S` on stderr first."""
    rows = client_of(ctx).job(name).mix_sequence(pass_no)
    if rows and rows[0]["position"] > 0:
        click.echo(f"# trimmed below slot {rows[0]['slot']}", err=True)
    for row in rows:
        click.echo(json.dumps(row, sort_keys=True))
