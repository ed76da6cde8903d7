"""``taskq demo``: elastic trainers, scaling and a SIGKILL, with every task acked once.

Starts a local redis-server when no URL is given, creates a job from generated chunks,
runs trainer processes (from a fork server) and a reaper process, scales the trainers up and down
mid-run (SIGTERM) and SIGKILLs one (``--chaos``), shows live progress, then checks the
job's audit and the trainers' own logs. Everything it started is stopped on the way out,
Ctrl-C included.

Data flow: cli/demo.py -> taskq.Client (job) ; trainer processes -> taskq.Trainer ->
Redis <- taskq.reaper.Reaper (process).
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import multiprocessing
import os
import random
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import taskq
from taskq import devserver

from .common import age, console

DEMO_WORKER_TTL_S = 2.0
DEMO_HEARTBEAT_S = 0.5
FINISH_TIMEOUT_S = 120.0


def local_redis() -> devserver.RedisServer:
    """A throw-away redis-server on a free loopback port, in a temp dir (no persistence).

    In its own session: Ctrl-C is the demo's to handle, not redis-server's.
    """
    return devserver.RedisServer(binary="redis-server", new_session=True)


def _child_stdio(path: str) -> None:
    """Point a child's stdio at ``path`` (the parent's live display stays clean)."""
    out = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    sys.stdout = sys.stderr = out


def _trainer_main(url: str, prefix: str | None, job: str, index: int, run_dir: str,
                  step_s: float) -> None:
    """A demo trainer: lease, "train" (sleep), log ``pass task token``, ack by iterating."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us with SIGTERM
    _child_stdio(os.path.join(run_dir, f"trainer-{index}.err"))
    rng = random.Random(f"{index}:{os.getpid()}")
    client = taskq.Client(url, key_prefix=prefix)
    worker_id = f"demo-trainer-{index}:{os.getpid()}"
    try:
        with open(os.path.join(run_dir, f"trainer-{index}.log"), "a", buffering=1) as log, \
                taskq.Trainer(job, client=client, worker_id=worker_id) as trainer:
            for task in trainer:
                time.sleep(step_s * rng.uniform(0.5, 1.5))
                log.write(f"{task.pass_no} {task.id} {task.token}\n")
    except taskq.TaskqError as e:
        print(f"trainer {index}: {e}")
        sys.exit(1)


def _reaper_main(url: str, prefix: str | None, job: str, run_dir: str) -> None:
    """The demo's reaper: bounds recovery when nobody asks for work."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _child_stdio(os.path.join(run_dir, "reaper.err"))
    from taskq.reaper import Reaper

    sys.exit(Reaper(taskq.Client(url, key_prefix=prefix), jobs=[job], interval=0.25).run())


@dataclass
class Fleet:
    """The processes the demo started, and what it did to them."""

    ctx: Any
    url: str
    prefix: str | None
    job: str
    run_dir: str
    step_s: float
    trainers: dict[int, BaseProcess] = field(default_factory=dict)
    reaper: BaseProcess | None = None
    started: int = 0
    terminated: int = 0
    killed: int = 0
    #: (worker id prefix, server time in ms) of every SIGKILL, to time the recovery
    kills: list[tuple[str, int]] = field(default_factory=list)
    #: set by Ctrl-C; checked between steps
    stop_flag: threading.Event = field(default_factory=threading.Event)

    def spawn(self, count: int) -> list[int]:
        new = []
        for _ in range(count):
            if self.stop_flag.is_set():
                raise KeyboardInterrupt
            index = self.started
            self.started += 1
            sys.stdout.flush()
            sys.stderr.flush()
            proc = self.ctx.Process(
                target=_trainer_main, name=f"taskq-demo-trainer-{index}", daemon=True,
                args=(self.url, self.prefix, self.job, index, self.run_dir, self.step_s))
            proc.start()
            self.trainers[index] = proc
            new.append(index)
        return new

    def start_reaper(self) -> bool:
        if importlib.util.find_spec("taskq.reaper") is None:
            return False
        sys.stdout.flush()
        sys.stderr.flush()
        self.reaper = self.ctx.Process(target=_reaper_main, name="taskq-demo-reaper",
                                       daemon=True,
                                       args=(self.url, self.prefix, self.job, self.run_dir))
        self.reaper.start()
        return True

    def alive(self) -> list[int]:
        return [i for i, p in self.trainers.items() if p.is_alive()]

    def signal(self, index: int, signum: int) -> None:
        pid = self.trainers[index].pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        if signum == signal.SIGKILL:
            self.killed += 1
        else:
            self.terminated += 1

    def stop_all(self, grace_s: float = 5.0) -> None:
        """SIGTERM every process still running, then SIGKILL what outlives the grace."""
        procs = list(self.trainers.values()) + ([self.reaper] if self.reaper else [])
        for p in procs:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(2)


def _plan(trainers: int, chaos: bool) -> list[tuple[float, str]]:
    """(fraction of all work done, action): scale up, SIGKILL one, scale down, up again."""
    plan = [(0.15, "up"), (0.55, "down"), (0.75, "up1")]
    if chaos:
        plan.append((0.35, "kill"))
    return sorted(plan)


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


@click.command("demo")
@click.option("--url", "demo_url", metavar="URL",
              help="Use this Redis (default: --url / TASKQ_REDIS_URL, else a local "
                   "redis-server started for the demo).")
@click.option("--trainers", type=click.IntRange(min=1, max=64), default=4, show_default=True,
              help="Trainer processes at the start.")
@click.option("--passes", type=click.IntRange(min=1, max=50), default=3, show_default=True,
              help="Passes over the data set.")
@click.option("--tasks", "ntasks", type=click.IntRange(min=1, max=100000), default=60,
              show_default=True, help="Tasks in the job (two generated chunks each).")
@click.option("--step", "step_s", type=click.FloatRange(min=0), default=0.2,
              show_default=True, help="Mean seconds a trainer spends on one task.")
@click.option("--chaos/--no-chaos", default=True, show_default=True,
              help="SIGKILL one trainer mid-run.")
@click.pass_context
def demo(ctx: click.Context, demo_url: str | None, trainers: int, passes: int, ntasks: int,
         step_s: float, chaos: bool) -> None:
    """Run elastic trainers over a generated data set and prove every task of every pass
    was acked exactly once, while trainers join, leave (SIGTERM) and die (SIGKILL)."""
    root = ctx.find_root().obj
    url, prefix = demo_url or root.url, root.prefix
    out = console()
    began = time.monotonic()
    run_dir = tempfile.mkdtemp(prefix="taskq-demo-")
    server: devserver.RedisServer | None = None
    fleet: Fleet | None = None
    # Ctrl-C only sets a flag, checked between steps: a KeyboardInterrupt raised inside a
    # fork's at-fork handlers would be swallowed and the demo would run on.
    stop = threading.Event()
    old_sigint = signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    try:
        if url is None:
            server = local_redis()
            url = server.url
            out.print(f"started redis-server at {url} (stopped at the end)")
        client = taskq.Client(url, key_prefix=prefix)
        job = f"demo-{secrets.token_hex(3)}"
        chunks = [{"path": f"demo://shard-{i // 16:03d}", "offset": (i % 16) * 4096,
                   "length": 4096} for i in range(2 * ntasks)]
        client.create_job(job, chunks, chunks_per_task=2, passes=passes,
                          worker_ttl=DEMO_WORKER_TTL_S, heartbeat_interval=DEMO_HEARTBEAT_S)
        out.print(f"job {job}: {ntasks} tasks x {passes} passes, worker_ttl "
                  f"{DEMO_WORKER_TTL_S:g}s, heartbeat {DEMO_HEARTBEAT_S:g}s")
        # the demo's own threads (the live display, the client's pool) must not be forked:
        # trainers start from a fork server, a clean process that has only imported taskq
        mp = multiprocessing.get_context("forkserver")
        mp.set_forkserver_preload(["taskq", "taskq.cli.demo"])
        fleet = Fleet(mp, url, prefix, job, run_dir, step_s)
        if fleet.start_reaper():
            out.print("reaper: running (interval 0.25s)")
        else:
            out.print("reaper: taskq.reaper not available; the lease script reclaims lazily")
        fleet.stop_flag = stop
        first = fleet.spawn(trainers)
        out.print(f"{time.strftime('%H:%M:%S')} start: {len(first)} trainer(s) {first}")
        _run(out, client, fleet, job, ntasks, passes, trainers, chaos)
        fleet.stop_all()
        ok = _summary(out, client, job, ntasks, passes, run_dir, fleet,
                      time.monotonic() - began,
                      kept_in=None if server is not None else client.url)
    except KeyboardInterrupt:
        click.echo("taskq: demo interrupted; stopping what it started", err=True)
        ctx.exit(130)
    finally:
        signal.signal(signal.SIGINT, old_sigint)
        if fleet is not None:
            fleet.stop_all()
        if server is not None:
            server.cleanup()
    if not ok:
        raise taskq.TaskqError(f"demo: the audit found a problem (trainer logs kept in "
                               f"{run_dir})")
    shutil.rmtree(run_dir, ignore_errors=True)


def _run(out: Any, client: taskq.Client, fleet: Fleet, job: str, ntasks: int, passes: int,
         trainers: int, chaos: bool) -> None:
    """Watch the job until it completes, scaling the fleet as planned."""
    total = ntasks * passes
    plan = _plan(trainers, chaos)
    rng = random.Random()
    bar = Progress(TextColumn("{task.description:<14}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=out)
    overall = bar.add_task("all passes", total=total, info="")
    current = bar.add_task("pass 0", total=ntasks, info="")
    deadline = time.monotonic() + FINISH_TIMEOUT_S
    with bar:
        while True:
            status = client.status(job, summaries=0)
            finished = status.state == "completed"
            done_all = total if finished else status.pass_no * ntasks + status.done
            alive = fleet.alive()
            bar.update(overall, completed=done_all,
                       info=f"trainers {len(alive)}  workers {status.workers}")
            bar.update(current, completed=ntasks if finished else status.done,
                       description=f"pass {status.pass_no}",
                       info=f"leased {status.leased}  todo {status.todo}")
            while plan and done_all >= plan[0][0] * total and not finished:
                _act(out, client, fleet, plan.pop(0)[1], trainers, rng)
            if finished or status.state == "cancelled":
                break
            if not fleet.alive():
                raise taskq.TaskqError(f"demo: every trainer exited before job {job} "
                                       f"completed; see {fleet.run_dir}")
            if time.monotonic() > deadline:
                raise taskq.TaskqError(f"demo: job {job} did not complete within "
                                       f"{FINISH_TIMEOUT_S:g}s")
            if fleet.stop_flag.wait(0.1):
                raise KeyboardInterrupt
    for proc in fleet.trainers.values():  # their loops end by themselves on completion
        if fleet.stop_flag.is_set():
            raise KeyboardInterrupt
        proc.join(10)


def _act(out: Any, client: taskq.Client, fleet: Fleet, action: str, trainers: int,
         rng: random.Random) -> None:
    alive = fleet.alive()
    stamp = time.strftime("%H:%M:%S")
    if action == "up":
        added = fleet.spawn(max(1, trainers // 2))
        out.print(f"{stamp} scale up: +{len(added)} trainer(s) {added}")
    elif action == "up1":
        added = fleet.spawn(1)
        out.print(f"{stamp} scale up: +1 trainer {added}")
    elif action == "kill" and alive:
        victim = rng.choice(alive)
        fleet.signal(victim, signal.SIGKILL)
        fleet.kills.append((f"demo-trainer-{victim}:", client.status(fleet.job, 0).now_ms))
        out.print(f"{stamp} chaos: SIGKILL trainer {victim} (its task comes back after "
                  f"worker_ttl {DEMO_WORKER_TTL_S:g}s)")
    elif action == "down" and len(alive) > 1:
        leaving = rng.sample(alive, max(1, min(len(alive) - 1, len(alive) // 3)))
        for index in leaving:
            fleet.signal(index, signal.SIGTERM)
        out.print(f"{stamp} scale down: SIGTERM trainer(s) {sorted(leaving)} "
                  f"(they release what they hold)")


def _recoveries(client: taskq.Client, job: str, fleet: Fleet) -> list[str]:
    """For each SIGKILLed trainer: how long after the kill its tasks were leased again
    (from the job's events, on the server's clock)."""
    if not fleet.kills:
        return []
    events: list[tuple[str, dict[str, str]]] = []
    last = "-"
    while True:
        page = client.events(job, since=last, count=1000)
        events.extend(page)
        if len(page) < 1000:
            break
        last = page[-1][0]
    lines = []
    for prefix, kill_ms in fleet.kills:
        lost = [(i, e["task"]) for i, (_, e) in enumerate(events)
                if e.get("type") == "expired" and e.get("worker", "").startswith(prefix)]
        if not lost:
            lines.append(f"SIGKILLed {prefix.rstrip(':')}: held no task")
        for at, task in lost:
            again = next((int(eid.split("-")[0]) for eid, e in events[at:]
                          if e.get("type") == "leased"
                          and task in e.get("tasks", "").split(",")), None)
            expired_ms = int(events[at][0].split("-")[0])
            late_ms = int(events[at][1].get("lateness_ms") or 0)
            deadline_s = (expired_ms - late_ms - kill_ms) / 1000.0
            back = "was not leased again" if again is None else \
                f"was leased again {(again - kill_ms) / 1000.0:.2f}s after the kill"
            # the deadline counts from the last heartbeat, so it comes before kill + ttl
            lines.append(f"SIGKILLed {prefix.rstrip(':')}: the lease of task {task} ran out "
                         f"{deadline_s:.2f}s after the kill (last heartbeat + worker_ttl "
                         f"{DEMO_WORKER_TTL_S:g}s), was reclaimed {late_ms / 1000.0:.2f}s "
                         f"past that deadline and {back}")
    return lines


def _summary(out: Any, client: taskq.Client, job: str, ntasks: int, passes: int,
             run_dir: str, fleet: Fleet, took_s: float, kept_in: str | None) -> bool:
    """Print the per-pass table and the verdict; True when every check holds.

    ``kept_in``: the (masked) URL of a Redis the job stays in after the demo, or None
    when the demo's own server goes with it."""
    report = client.audit(job)
    processed = _read_logs(run_dir)
    summaries = {s["pass"]: s for s in report["passes"] if s.get("state") == "completed"}
    table = Table(title=f"job {job}", title_justify="left")
    for col in ("pass", "acked once", "processed", "re-runs", "stale rejected", "expired",
                "max lateness"):
        table.add_column(col, justify="right")
    all_once = report["ok"]
    missing = 0
    for p in range(passes):
        s = summaries.get(p, {})
        ran = [processed[(p, t)] for t in range(ntasks)]
        missing += sum(1 for n in ran if n == 0)
        acked_ok = s.get("done") == ntasks
        all_once = all_once and acked_ok
        table.add_row(str(p), f"{s.get('done', 0)}/{ntasks}", str(sum(ran)),
                      str(sum(n - 1 for n in ran if n > 1)), str(s.get("stale", 0)),
                      str(s.get("expired", 0)),
                      age((s.get("max_lateness_ms") or 0) / 1000.0))
    all_once = all_once and missing == 0
    longest_ms = max([s.get("max_lateness_ms") or 0 for s in summaries.values()] or [0])
    out.print(table)
    out.print(f"every task acked exactly once per pass: "
              f"{'yes' if all_once else 'NO'} ({passes} passes x {ntasks} tasks; "
              f"audit checks {'ok' if report['ok'] else 'FAILED'}"
              f"{f', {missing} task(s) never processed' if missing else ''})")
    out.print(f"max lateness: {longest_ms / 1000.0:.2f}s (how long an expired lease waited "
              f"past its deadline, the worker's last heartbeat + worker_ttl "
              f"{DEMO_WORKER_TTL_S:g}s, before it was handed out again)")
    for line in _recoveries(client, job, fleet):
        out.print(line)
    out.print(f"trainers: {fleet.started} started, {fleet.terminated} SIGTERMed, "
              f"{fleet.killed} SIGKILLed")
    out.print(f"total time: {took_s:.1f}s")
    if kept_in is not None:
        url = f"--url {kept_in} "
        out.print(f"job {job} is left in Redis at {kept_in}")
        out.print(f"inspect: taskq {url}job status {job}; taskq {url}job audit {job}")
        out.print(f"remove:  taskq {url}job delete {job} --yes")
    return bool(all_once)
