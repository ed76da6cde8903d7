"""The demo's report: per pass, the tasks acked once, processed and re-run (from the
job's audit and the trainers' own logs), the lateness, how each SIGKILL was recovered
from, and the verdict.

Data flow: cli/demo.py -> cli/demo_report.py -> taskq.Client (audit, events) -> Redis;
the trainers' logs in the run directory.
"""

from __future__ import annotations

import collections
import os
from typing import Any

from rich.table import Table

import taskq

from .common import age
from .demo_fleet import DEMO_WORKER_TTL_S, Fleet


def _read_logs(run_dir: str) -> collections.Counter[tuple[int, int]]:
    counts: collections.Counter[tuple[int, int]] = collections.Counter()
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("trainer-") and name.endswith(".log"):
            with open(os.path.join(run_dir, name)) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 3:
                        counts[(int(parts[0]), int(parts[1]))] += 1
    return counts


def _recoveries(client: taskq.Client, job: str, fleet: Fleet) -> list[str]:
    """For each SIGKILLed trainer: how long after the kill its tasks were leased again
    (from the job's events, on the server's clock)."""
    if not fleet.kills:
        return []
    events: list[tuple[str, dict[str, str]]] = []
    last = "-"
    while True:
        page = client.job(job).events(since=last, count=1000)
        events.extend(page)
        if len(page) < 1000:
            break
        last = page[-1][0]
    lines = []
    for prefix, kill_ms in fleet.kills:
        lost = [
            (i, e["task"])
            for i, (_, e) in enumerate(events)
            if e.get("type") == "expired" and e.get("worker", "").startswith(prefix)
        ]
        if not lost:
            lines.append(f"SIGKILLed {prefix.rstrip(':')}: held no task")
        for at, task in lost:
            again = next(
                (
                    int(eid.split("-")[0])
                    for eid, e in events[at:]
                    if task in e.get("leased", "").split(",")
                ),
                None,
            )
            expired_ms = int(events[at][0].split("-")[0])
            late_ms = int(events[at][1].get("lateness_ms") or 0)
            deadline_s = (expired_ms - late_ms - kill_ms) / 1000.0
            back = (
                "was not leased again"
                if again is None
                else f"was leased again {(again - kill_ms) / 1000.0:.2f}s after the kill"
            )
            # the deadline counts from the last heartbeat, so it comes before kill + ttl
            lines.append(
                f"SIGKILLed {prefix.rstrip(':')}: the lease of task {task} ran out "
                f"{deadline_s:.2f}s after the kill (last heartbeat + worker_ttl "
                f"{DEMO_WORKER_TTL_S:g}s), was reclaimed {late_ms / 1000.0:.2f}s "
                f"past that deadline and {back}"
            )
    return lines


def summary(
    out: Any,
    client: taskq.Client,
    job: str,
    ntasks: int,
    passes: int,
    run_dir: str,
    fleet: Fleet,
    took_s: float,
    kept_in: str | None,
) -> bool:
    """Print the per-pass table and the verdict; True when every check holds.

    ``kept_in``: the (masked) URL of a Redis the job stays in after the demo, or None
    when the demo's own server goes with it."""
    report = client.job(job).audit()
    processed = _read_logs(run_dir)
    summaries = {s["pass"]: s for s in report["passes"] if s.get("state") == "completed"}
    table = Table(title=f"job {job}", title_justify="left")
    for col in (
        "pass",
        "acked once",
        "processed",
        "re-runs",
        "stale rejected",
        "expired",
        "max lateness",
    ):
        table.add_column(col, justify="right")
    all_once = report["ok"]
    missing = 0
    for p in range(passes):
        s = summaries.get(p, {})
        ran = [processed[(p, t)] for t in range(ntasks)]
        missing += sum(1 for n in ran if n == 0)
        acked_ok = s.get("done") == ntasks
        all_once = all_once and acked_ok
        table.add_row(
            str(p),
            f"{s.get('done', 0)}/{ntasks}",
            str(sum(ran)),
            str(sum(n - 1 for n in ran if n > 1)),
            str(s.get("stale", 0)),
            str(s.get("expired", 0)),
            age((s.get("max_lateness_ms") or 0) / 1000.0),
        )
    all_once = all_once and missing == 0
    longest_ms = max([s.get("max_lateness_ms") or 0 for s in summaries.values()] or [0])
    out.print(table)
    out.print(
        f"every task acked exactly once per pass: "
        f"{'yes' if all_once else 'NO'} ({passes} passes x {ntasks} tasks; "
        f"audit checks {'ok' if report['ok'] else 'FAILED'}"
        f"{f', {missing} task(s) never processed' if missing else ''})"
    )
    out.print(
        f"max lateness: {longest_ms / 1000.0:.2f}s (how long an expired lease waited "
        f"past its deadline, the worker's last heartbeat + worker_ttl "
        f"{DEMO_WORKER_TTL_S:g}s, before it was handed out again)"
    )
    for line in _recoveries(client, job, fleet):
        out.print(line)
    out.print(
        f"trainers: {fleet.started} started, {fleet.terminated} SIGTERMed, {fleet.killed} SIGKILLed"
    )
    out.print(f"total time: {took_s:.1f}s")
    if kept_in is not None:
        url = f"--url {kept_in} "
        out.print(f"job {job} is left in Redis at {kept_in}")
        out.print(f"inspect: taskq {url}job status {job}; taskq {url}job audit {job}")
        out.print(f"remove:  taskq {url}job delete {job} --yes")
    return bool(all_once)
