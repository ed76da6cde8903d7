"""The CLI's views of a sharded job's status and audit: the job as one (sums) with a
per-shard breakdown. The commands themselves are the same for every job (they call the
job's handle through ``taskq.Client``); these only draw what a sharded job's status and
audit hold beyond a plain job's.

Data flow: cli/job_view.py -> cli/shards.py -> rich tables (no Redis calls).
"""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from taskq.admin.shardset import ShardedStatus

from .common import add_stream_row, pass_label, show


def status_tables(st: ShardedStatus) -> tuple[Table, Table]:
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
    add_stream_row(table, st)
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


def show_audit(report: dict[str, Any]) -> None:
    """A sharded job's audit: the passes over all shards, each shard, the checks."""
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
