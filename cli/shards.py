"""The CLI's view of sharded jobs: one job (sums) with a per-shard breakdown.

``taskq job status|audit|delete`` and ``taskq pass next|reset`` call ``handle`` first; for
a sharded job it does the work over every shard and says so, otherwise the command goes
on as for a job of one shard. (``job cancel|pause|resume|checkpoint|checkpoints|rewind``
go through ``taskq.Client``, which acts on every shard of a sharded job.)

Data flow: operator -> cli/job.py, cli/passes.py -> cli/shards.py -> taskq.sharded ->
taskq.Client -> Redis.
"""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

import taskq
from taskq import sharded

from .common import client_of, echo_json, pass_label, show


def status_tables(st: sharded.ShardedStatus) -> tuple[Table, Table]:
    """The job as one (sums) and the shard breakdown."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("job", f"{st.job}  ({len(st.shards)} shards)")
    table.add_row("state", st.state + (f" ({st.reason})" if st.reason else ""))
    table.add_row("pass", pass_label(st.pass_no, st.passes))
    table.add_row("tasks", str(st.tasks))
    table.add_row(
        "todo / leased / done / dead",
        f"{st.todo} / {st.leased} (reserved {st.reserved}) / {st.done} / {st.dead}",
    )
    table.add_row("workers", f"{st.workers} (registrations over the shards)")
    shards = Table(title="shards", title_justify="left")
    for col in ("shard", "master", "state", "pass", "todo", "leased", "done", "dead", "workers"):
        shards.add_column(col, justify="left" if col in ("shard", "master", "state") else "right")
    for s, master in zip(st.shards, st.masters, strict=True):
        shards.add_row(
            s.job,
            master or "-",
            s.state + (f" ({s.reason})" if s.reason else ""),
            str(s.pass_no),
            str(s.todo),
            str(s.leased),
            f"{s.done}/{s.tasks}",
            str(s.dead),
            str(s.workers),
        )
    return table, shards


def _audit(client: taskq.Client, name: str, as_json: bool) -> None:
    report = sharded.audit(client, name)
    if as_json:
        echo_json(report)
    else:
        table = Table(title="passes (all shards)", title_justify="left")
        for col in ("pass", "done", "dead", "skipped", "stale"):
            table.add_column(col, justify="right")
        for p in report["passes"]:
            table.add_row(*(str(p[c]) for c in ("pass", "done", "dead", "skipped", "stale")))
        show(table)
        for a in report["shards"]:
            bad = [k for k, ok in a["checks"].items() if not ok]
            click.echo(
                f"{'ok  ' if not bad else 'FAIL'} shard {a['job']} (pass {a['pass']}, "
                f"{a['state']}){': ' + ', '.join(bad) if bad else ''}"
            )
        for check, ok in report["checks"].items():
            click.echo(f"{'ok  ' if ok else 'FAIL'} {check}")
    if not report["ok"]:
        failed = [k for k, ok in report["checks"].items() if not ok]
        raise taskq.TaskqError(f"job {name}: audit failed: {', '.join(failed)}")


def handle(ctx: click.Context, verb: str, name: str, as_json: bool, **kw: Any) -> bool:
    """Run ``verb`` (status, audit, delete, next, reset) over every shard when
    ``name`` is a sharded job.

    Returns:
        False when ``name`` is not a sharded job (the caller goes on).
    """
    client = client_of(ctx)
    if sharded.load(client, name) is None:
        return False
    if verb == "status":
        st = sharded.status(client, name)
        if as_json:
            echo_json(st.as_dict())
        else:
            show(*status_tables(st))
    elif verb == "audit":
        _audit(client, name, as_json)
    elif verb == "delete":
        st = sharded.status(client, name)
        if not kw.get("yes"):
            click.confirm(
                f"delete sharded job {name} ({st.state}, {st.tasks} tasks in "
                f"{len(st.shards)} shards)?",
                abort=True,
                err=True,
            )
        sharded.delete(client, name)
        out: dict[str, Any] = {
            "job": name,
            "deleted": True,
            "state_before": st.state,
            "tasks": st.tasks,
        }
    elif verb == "next":
        new_pass = sharded.next_pass(
            client, name, expected_pass=kw.get("expected"), force=bool(kw.get("force"))
        )
        out = {"job": name, "pass": new_pass, "state": sharded.status(client, name).state}
    elif verb == "reset":
        out = {"job": name, "pass": sharded.reset_pass(client, name, kw.get("expected"))}
    else:
        raise click.UsageError(f"{verb} does not apply to a sharded job", ctx)
    if verb not in ("status", "audit"):
        if as_json:
            echo_json(out)
        else:
            click.echo(
                f"job {name}: {verb} done on every shard "
                f"({', '.join(f'{k} {v}' for k, v in out.items() if k != 'job')})"
            )
    return True
