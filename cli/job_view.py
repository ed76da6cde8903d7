"""``taskq job status``, ``list`` and ``audit``: the read-only views of jobs (a sharded
job as one, with its shards' breakdown drawn by cli/shards.py), registered on the ``job``
group of cli/job.py.

Data flow: operator -> cli/job_view.py -> taskq.Client (stats.py) -> Redis.
"""

from __future__ import annotations

import datetime
from typing import Any

import click
from rich.table import Table

import taskq
from taskq.admin import inputwait_view
from taskq.admin.shardset import ShardedStatus
from taskq.models import JobStatus

from . import shards as shards_cli
from .common import add_stream_row, age, client_of, echo_json, pass_label, show
from .job import job


def _when(ms: int) -> str:
    if not ms:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000.0).strftime("%Y-%m-%d %H:%M:%S")


def status_table(status: JobStatus) -> Table:
    """The human view of one status snapshot (used by `job status`)."""
    d = status.as_dict()
    cfg = status.config
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    state = status.state + (f" ({status.reason})" if status.reason else "")
    table.add_row("job", f"{status.job}  (incarnation {status.incarnation})")
    table.add_row("state", state)
    attempt = f", attempt {status.pass_attempt + 1}" if status.pass_attempt else ""
    table.add_row("pass", pass_label(status.pass_no, status.passes) + attempt)
    table.add_row(
        "tasks",
        f"{status.tasks} ({cfg.get('chunks')} chunks, {cfg.get('chunks_per_task')} per task)",
    )
    table.add_row(
        "todo / leased / done / dead",
        f"{status.todo} / {status.leased} (reserved {status.reserved}) / "
        f"{status.done} / {status.dead}",
    )
    add_stream_row(table, status)
    table.add_row("workers", str(status.workers))
    table.add_row("throughput", f"{d['throughput_per_s']:.2f} tasks/s (this pass)")
    table.add_row("eta (this pass)", age(d["eta_s"]))
    table.add_row("oldest lease", age(status.oldest_lease_age_s))
    if status.input:
        table.add_row("input", inputwait_view.line(status.input, status.stream))
    tt = cfg.get("task_timeout")
    if tt == "auto":
        auto = cfg.get("auto_task_timeout_s")
        tt = f"auto ({age(auto) if auto else 'not yet known'})"
    table.add_row(
        "config",
        f"worker_ttl {cfg.get('worker_ttl')}s, heartbeat "
        f"{cfg.get('heartbeat_interval')}s, task_timeout {tt}, "
        f"max_failures {cfg.get('max_failures')}, max_attempts "
        f"{cfg.get('max_attempts')}, shuffle {cfg.get('shuffle')}, "
        f"auto_advance {cfg.get('auto_advance')}, split_tails {cfg.get('split_tails')}, "
        f"backup_leases {cfg.get('backup_leases')}",
    )
    c = status.counters
    table.add_row("counters", ", ".join(f"{k} {v}" for k, v in c.items() if not k.endswith("_ms")))
    table.add_row("created", _when(status.created_ms))
    return table


def summaries_table(summaries: list[dict[str, Any]], first_lease_ms: int | None) -> Table:
    """Per-pass summaries (pass, round, how it ended, done, dead, ...).

    ``took`` runs from a pass's start to its end; pass 0 starts at its first lease
    (``first_lease_ms``), not at the job's creation, so waiting for trainers is not
    counted (marked ``*`` when the first lease is no longer in the events).
    """
    table = Table(title="passes (docs/operations.md: reading the tables)", title_justify="left")
    for col in (
        "pass",
        "round",
        "ended",
        "done",
        "dead",
        "skipped",
        "stale",
        "expired",
        "max lateness",
        "took",
    ):
        table.add_column(col, justify="right" if col not in ("ended",) else "left")
    for s in summaries:
        took, mark = None, ""
        started, ended = s.get("started_ms"), s.get("ended_ms")
        if s.get("pass") == 0 and s.get("round") == 1 and started:
            if first_lease_ms:
                started = max(started, first_lease_ms)
            else:
                mark = "*"
        if ended and started:
            took = (ended - started) / 1000.0
        table.add_row(
            str(s.get("pass")),
            str(s.get("round")),
            str(s.get("state")),
            str(s.get("done")),
            str(s.get("dead")),
            str(s.get("skipped")),
            str(s.get("stale")),
            str(s.get("expired")),
            age((s.get("max_lateness_ms") or 0) / 1000.0),
            age(took) + mark if took is not None else "-",
        )
    return table


@job.command("status")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option(
    "--summaries",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Per-pass summaries to show (the latest).",
)
@click.pass_context
def status_cmd(ctx: click.Context, name: str, as_json: bool, summaries: int) -> None:
    """State, pass k of n, todo/leased/done/dead, workers, throughput, ETA, passes (a
    sharded job: the sums and a breakdown by shard)."""
    client = client_of(ctx)
    status = client.job(name).status(summaries=summaries)
    if isinstance(status, ShardedStatus):  # the sums, then one row per shard
        if as_json:
            echo_json(status.as_dict())
        else:
            show(*shards_cli.status_tables(status))
        return
    if as_json:
        data = status.as_dict()
        data["histograms"] = status.histograms
        data["lease_ages"] = status.lease_ages
        data["input"] = status.input
        echo_json(data)
        return
    if status.summaries:
        show(
            status_table(status),
            summaries_table(status.summaries, client.job(name).first_lease_ms()),
        )
    else:
        show(status_table(status))


@job.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
@click.option(
    "--repair",
    is_flag=True,
    help="First rebuild the job index from the jobs' keys (after an interrupted create or delete).",
)
@click.pass_context
def list_cmd(ctx: click.Context, as_json: bool, repair: bool) -> None:
    """The jobs in this Redis (under the key prefix); a sharded job is listed as one row
    (its sums), beside its shards."""
    client = client_of(ctx)
    if repair:
        added, removed = client.repair_index()
        if not as_json:
            click.echo(
                f"index repaired: {len(added)} added {added}, {len(removed)} removed {removed}",
                err=True,
            )
    rows: list[dict[str, Any]] = []
    for name in client.list_jobs(sharded=True):
        try:
            s = client.job(name).status(summaries=0)
        except (taskq.JobNotFound, taskq.CorruptData) as e:
            # one broken entry must not hide the others
            state = "missing" if isinstance(e, taskq.JobNotFound) else "unreadable"
            rows.append(
                {
                    "job": name,
                    "state": state,
                    "error": str(e),
                    "pass": None,
                    "passes": None,
                    "tasks": None,
                    "done": None,
                    "dead": None,
                    "workers": None,
                }
            )
            continue
        row: dict[str, Any] = {
            "job": name,
            "state": s.state,
            "pass": s.pass_no,
            "passes": s.passes,
            "tasks": s.tasks,
            "done": s.done,
            "dead": s.dead,
            "workers": s.workers,
        }
        if isinstance(s, ShardedStatus):
            row["shards"] = len(s.shards)
        rows.append(row)
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("no jobs")
        return
    table = Table()
    for col in ("job", "state", "pass", "done", "dead", "workers"):
        table.add_column(col, justify="left" if col in ("job", "state") else "right")
    for r in rows:
        if r["state"] == "missing":
            table.add_row(r["job"], "missing (taskq job list --repair)", "-", "-", "-", "-")
            continue
        if r["state"] == "unreadable":
            table.add_row(r["job"], f"unreadable: {r['error']}", "-", "-", "-", "-")
            continue
        table.add_row(
            r["job"] + (f" ({r['shards']} shards)" if r.get("shards") else ""),
            r["state"],
            pass_label(r["pass"], r["passes"]),
            f"{r['done']}/{r['tasks']}",
            str(r["dead"]),
            str(r["workers"]),
        )
    show(table)


@job.command("audit")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the audit as JSON.")
@click.pass_context
def audit(ctx: click.Context, name: str, as_json: bool) -> None:
    """Per pass: done, dead, skipped, stale writes rejected, resets, longest re-dispatch
    delay; and whether the counters agree with the sets they count (exit 1 if not). A
    sharded job: every shard, and whether the shards agree on every pass."""
    report = client_of(ctx).job(name).audit()
    if as_json:
        echo_json(report)
    elif "shards" in report:  # a sharded job's: every shard and the agreement
        shards_cli.show_audit(report)
    else:
        show(summaries_table(report["passes"], report.get("first_lease_ms")))
        cur = report["current"]
        click.echo(
            f"current: pass {cur['pass']} ({report['state']}): done {cur['done']}, "
            f"leased {cur['leased']}, todo {cur['todo']}, dead {cur['dead']}"
        )
        splits = report.get("splits") or {}
        if splits.get("tasks"):
            click.echo(f"split tasks: {splits['tasks']}, both pieces acked {splits['acked']}")
        for check, ok in report["checks"].items():
            click.echo(f"{'ok  ' if ok else 'FAIL'} {check}")
        for b in splits.get("bad", [])[:10]:
            click.echo(f"  task {b['task']}: {b['why']}")
    if not report["ok"]:
        failed = [k for k, ok in report["checks"].items() if not ok]
        raise taskq.TaskqError(f"job {name}: audit failed: {', '.join(failed)}")
