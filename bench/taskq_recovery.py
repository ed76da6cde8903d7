"""taskq re-dispatch latency rows: SIGKILL, SIGTERM and task timeout, reaper on and off.

Where it sits: called by `taskq_rows.run`. One trial is one job on the row's private
redis-server with three processes: the *victim* leases a task first (started) and then
sleeps; a *busy* process holds the job's two other tasks with two trainers (sleeping,
heartbeating); an *idle* trainer then blocks in `lease()`. The clock starts at the kill
(parent's `time.monotonic()` just before `os.kill`; CLOCK_MONOTONIC is system-wide) or,
for the task-timeout row, at the victim's lease time + 5 s (its timeout); it stops when
the idle trainer's `lease()` returns the victim's task. The trials of a wave run at once,
each in its own job, with kills spread at random over one second so their phase against
heartbeats and reaper ticks varies. "Reaper off" means lazy reclaim only: the idle
trainer's wait is bounded by the earliest deadline and the busy trainers' heartbeats
reclaim too.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import time

import common
import redis
from taskq_util import CTX, Children, url_of

import taskq

SECTION = "taskq"
TASK_TIMEOUT_S = 5.0
GOALS = {
    "sigkill": "goal p99 ≤ worker_ttl + 1 s = 6 s",
    "sigterm": "goal p99 ≤ 100 ms",
    "timeout": "no goal; time past the 5 s timeout",
}
#: With a reaper, a SIGKILLed trainer's closed connection gives it away (connwatch.py).
GOAL_SIGKILL_REAPER = "goal p99 ≤ 1.5 s (closed connection seen by the reaper)"


def run(recorder: common.Recorder, quick: bool, factory) -> None:
    """Six rows: {SIGKILL, SIGTERM, task timeout} x {reaper on, reaper off}."""
    trials = 10 if quick else 100
    wave = 10 if quick else 25
    for kind in ("sigkill", "sigterm", "timeout"):
        for reaper in (True, False):
            port, stop = factory()
            try:
                latencies, problems = [], []
                for first in range(0, trials, wave):
                    got, bad = run_wave(port, kind, reaper, first, min(wave, trials - first))
                    latencies += got
                    problems += bad
            finally:
                stop()
            label = {"sigkill": "SIGKILL", "sigterm": "SIGTERM", "timeout": "task timeout 5 s"}
            name = f"re-dispatch after {label[kind]}, reaper {'on' if reaper else 'off'}"
            if not latencies:
                recorder.add(SECTION, name, None, "s", "; ".join(problems[:3]) or "no trial")
                continue
            p50 = common.percentile(latencies, 50)
            p99 = common.percentile(latencies, 99)
            goal = GOAL_SIGKILL_REAPER if kind == "sigkill" and reaper else GOALS[kind]
            note = (
                f"{len(latencies)} trials ({wave} at once, one job each): p50 {p50:.3f} s "
                f"p99 {p99:.3f} s max {max(latencies):.3f} s; {goal}"
            )
            if problems:
                note += f"; {len(problems)} trial(s) failed: {problems[0]}"
            recorder.add(SECTION, name, p99, "s (p99)", note)


def run_wave(port: int, kind: str, reaper: bool, first: int, count: int) -> tuple[list, list]:
    """Runs `count` trials at once; returns (latencies in s, problems)."""
    url = url_of(port)
    client = taskq.connect(url)
    admin = redis.Redis(host=common.LOOPBACK, port=port)
    jobs = [f"trial-{first + i}" for i in range(count)]
    timeout = TASK_TIMEOUT_S if kind == "timeout" else "auto"
    for job in jobs:
        client.create_job(job, [{"i": i} for i in range(3)], task_timeout=timeout)
    events = CTX.Queue()
    problems: list[str] = []
    latencies: list[float] = []
    with Children() as children:
        if reaper:
            children.start(_reaper_child, url)
        victims = {job: children.start(_victim, url, job, events) for job in jobs}
        held = _collect(events, "held", count, 30)
        for job in jobs:
            children.start(_busy, url, job, events)
        _collect(events, "busy", count, 30)
        for job in jobs:
            children.start(_idle, url, job, events)
        _collect(events, "waiting", count, 30)
        _wait_blocked(admin, client, jobs, timeout_s=10)
        starts: dict[str, float] = {}
        if kind == "timeout":
            starts = {job: held[job][1] + TASK_TIMEOUT_S for job in held}
        else:
            sig = signal.SIGKILL if kind == "sigkill" else signal.SIGTERM
            base = time.monotonic() + 0.1
            plan = sorted((base + random.random(), job) for job in jobs)
            for when, job in plan:
                time.sleep(max(0.0, when - time.monotonic()))
                starts[job] = time.monotonic()
                os.kill(victims[job].pid, sig)
        got = _collect(events, "got", count, 30)
        for job in jobs:
            if job not in got:
                problems.append(f"{job}: not re-dispatched within 30 s")
            elif job not in held or got[job][0] != held[job][0]:
                problems.append(f"{job}: the idle trainer got task {got[job][0]}, not the victim's")
            else:
                latencies.append(got[job][1] - starts[job])
        if kind == "timeout":
            late = [job for job in jobs if job in got and got[job][2] > starts[job]]
            if late:
                problems.append(f"{len(late)} idle trainer(s) were not blocked before the deadline")
    admin.close()
    return latencies, problems


def _collect(events, what: str, count: int, timeout_s: float) -> dict[str, tuple]:
    found: dict[str, tuple] = {}
    deadline = time.monotonic() + timeout_s
    while len(found) < count and time.monotonic() < deadline:
        try:
            job, kind, *rest = events.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if kind == what:
            found[job] = tuple(rest)
    return found


def _wait_blocked(
    admin: redis.Redis, client: taskq.Client, jobs: list[str], timeout_s: float
) -> None:
    """Until every idle trainer is registered as waiting (blocked in lease)."""
    deadline = time.monotonic() + timeout_s
    pending = list(jobs)
    while pending and time.monotonic() < deadline:
        pending = [job for job in pending if admin.zcard(client.keys(job).waiting) < 1]
        if pending:
            time.sleep(0.02)


def _victim(url, job, events) -> None:
    with taskq.Trainer(job, url=url) as trainer:
        task = trainer.lease(timeout=10)
        events.put((job, "held", task.id if task else None, time.monotonic()))
        time.sleep(600)


def _busy(url, job, events) -> None:
    trainers = [taskq.Trainer(job, url=url, handle_signals=False) for _ in range(2)]
    for trainer in trainers:
        trainer.lease(timeout=10)
    events.put((job, "busy"))
    time.sleep(600)


def _idle(url, job, events) -> None:
    trainer = taskq.Trainer(job, url=url, handle_signals=False)
    waiting_since = time.monotonic()
    events.put((job, "waiting"))
    task = trainer.lease(timeout=60)
    now = time.monotonic()
    events.put((job, "got", task.id if task else None, now, waiting_since))
    time.sleep(600)


def _reaper_child(url) -> None:
    from taskq.ops.reaper import Reaper

    Reaper(taskq.connect(url), interval=0.5).run()


def main() -> int:
    """Only the SIGKILL rows, printed: ``python bench/taskq_recovery.py [--trials N]
    [--reaper on|off|both]``."""
    import argparse

    ap = argparse.ArgumentParser(description="SIGKILL re-dispatch rows only")
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--wave", type=int, default=10)
    ap.add_argument("--reaper", choices=("on", "off", "both"), default="on")
    a = ap.parse_args()
    common.install_signal_handlers()
    for reaper in {"on": (True,), "off": (False,), "both": (True, False)}[a.reaper]:
        port, stop = common.redis_port_factory()
        latencies: list[float] = []
        problems: list[str] = []
        try:
            for first in range(0, a.trials, a.wave):
                got, bad = run_wave(port, "sigkill", reaper, first, min(a.wave, a.trials - first))
                latencies += got
                problems += bad
        finally:
            stop()
        if latencies:
            print(
                f"SIGKILL, reaper {'on' if reaper else 'off'}: {len(latencies)} trials, "
                f"p50 {common.percentile(latencies, 50):.3f} s, "
                f"p99 {common.percentile(latencies, 99):.3f} s, max {max(latencies):.3f} s"
                + (f"; {len(problems)} problem(s): {problems[0]}" if problems else "")
            )
        else:
            print(f"SIGKILL, reaper {'on' if reaper else 'off'}: no trial; {problems[:3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
