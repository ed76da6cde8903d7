"""``taskq demo``: elastic trainers, scaling and a SIGKILL, with every task acked once.

Starts a local redis-server when no URL is given, creates a job from generated chunks,
runs trainer processes (from a fork server) and a reaper process, scales the trainers up and down
mid-run (SIGTERM) and SIGKILLs one (``--chaos``), shows live progress, then checks the
job's audit and the trainers' own logs. Everything it started is stopped on the way out,
Ctrl-C included.

The processes are cli/demo_fleet.py's, the closing report cli/demo_report.py's, the
``--torch`` mode cli/demo_torch.py's; this module has the command, its plan and the live
watch.

Data flow: cli/demo.py -> taskq.Client (job) ; trainer processes (cli/demo_fleet.py) ->
taskq.Trainer -> Redis <- taskq.ops.reaper.Reaper (process); cli/demo_report.py.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import random
import secrets
import shutil
import signal
import tempfile
import threading
import time
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import taskq
from taskq import devserver
from taskq.ops.stopping import StopOnSignals

from . import demo_report
from .common import console
from .demo_fleet import DEMO_HEARTBEAT_S, DEMO_WORKER_TTL_S, Fleet, local_redis

FINISH_TIMEOUT_S = 120.0


def _plan(trainers: int, chaos: bool) -> list[tuple[float, str]]:
    """(fraction of all work done, action): scale up, SIGKILL one, scale down, up again."""
    plan = [(0.15, "up"), (0.55, "down"), (0.75, "up1")]
    if chaos:
        plan.append((0.35, "kill"))
    return sorted(plan)


@click.command("demo")
@click.option(
    "--url",
    "demo_url",
    metavar="URL",
    help="Use this Redis (default: --url / TASKQ_REDIS_URL, else a local "
    "redis-server started for the demo).",
)
@click.option(
    "--trainers",
    type=click.IntRange(min=1, max=64),
    default=4,
    show_default=True,
    help="Trainer processes at the start.",
)
@click.option(
    "--passes",
    type=click.IntRange(min=1, max=50),
    default=3,
    show_default=True,
    help="Passes over the data set.",
)
@click.option(
    "--tasks",
    "ntasks",
    type=click.IntRange(min=1, max=100000),
    default=60,
    show_default=True,
    help="Tasks in the job (two generated chunks each).",
)
@click.option(
    "--step",
    "step_s",
    type=click.FloatRange(min=0),
    default=0.2,
    show_default=True,
    help="Mean seconds a trainer spends on one task.",
)
@click.option(
    "--chaos/--no-chaos", default=True, show_default=True, help="SIGKILL one trainer mid-run."
)
@click.option(
    "--torch",
    "torch_mode",
    is_flag=True,
    help="PyTorch mode: a small model trained through taskq.torch on generated "
    "Parquet/JSONL files (needs torch and the data extra); the options "
    "above do not apply.",
)
@click.pass_context
def demo(
    ctx: click.Context,
    demo_url: str | None,
    trainers: int,
    passes: int,
    ntasks: int,
    step_s: float,
    chaos: bool,
    torch_mode: bool,
) -> None:
    """Run elastic trainers over a generated data set and prove every task of every pass
    was acked exactly once, while trainers join, leave (SIGTERM) and die (SIGKILL)."""
    root = ctx.find_root().obj
    url, prefix = demo_url or root.url, root.prefix
    if torch_mode:
        _torch_demo(ctx, url, prefix)
        return
    out = console()
    began = time.monotonic()
    run_dir = tempfile.mkdtemp(prefix="taskq-demo-")
    server: devserver.RedisServer | None = None
    fleet: Fleet | None = None
    # Ctrl-C only sets a flag, checked between steps: a KeyboardInterrupt raised inside a
    # fork's at-fork handlers would be swallowed and the demo would run on.
    stop = threading.Event()
    ctrl_c = StopOnSignals(stop, signals=(signal.SIGINT,))
    ctrl_c.install()
    try:
        if url is None:
            server = local_redis()
            url = server.url
            out.print(f"started redis-server at {url} (stopped at the end)")
        client = taskq.Client(url, key_prefix=prefix)
        job = f"demo-{secrets.token_hex(3)}"
        chunks = [
            {"path": f"demo://shard-{i // 16:03d}", "offset": (i % 16) * 4096, "length": 4096}
            for i in range(2 * ntasks)
        ]
        client.create_job(
            job,
            chunks,
            chunks_per_task=2,
            passes=passes,
            worker_ttl=DEMO_WORKER_TTL_S,
            heartbeat_interval=DEMO_HEARTBEAT_S,
        )
        out.print(
            f"job {job}: {ntasks} tasks x {passes} passes, worker_ttl "
            f"{DEMO_WORKER_TTL_S:g}s, heartbeat {DEMO_HEARTBEAT_S:g}s"
        )
        # the demo's own threads (the live display, the client's pool) must not be forked:
        # trainers start from a fork server, a clean process that has only imported taskq
        mp = multiprocessing.get_context("forkserver")
        mp.set_forkserver_preload(["taskq", "taskq.cli.demo"])
        fleet = Fleet(mp, url, prefix, job, run_dir, step_s)
        if fleet.start_reaper():
            out.print("reaper: running (interval 0.25s)")
        else:
            out.print("reaper: taskq.ops.reaper not available; the lease script reclaims lazily")
        fleet.stop_flag = stop
        first = fleet.spawn(trainers)
        out.print(f"{time.strftime('%H:%M:%S')} start: {len(first)} trainer(s) {first}")
        _run(out, client, fleet, job, ntasks, passes, trainers, chaos)
        fleet.stop_all()
        ok = demo_report.summary(
            out,
            client,
            job,
            ntasks,
            passes,
            run_dir,
            fleet,
            time.monotonic() - began,
            kept_in=None if server is not None else client.url,
        )
    except KeyboardInterrupt:
        click.echo("taskq: demo interrupted; stopping what it started", err=True)
        ctx.exit(130)
    finally:
        ctrl_c.restore()
        if fleet is not None:
            fleet.stop_all()
        if server is not None:
            server.cleanup()
    if not ok:
        raise taskq.TaskqError(f"demo: the audit found a problem (trainer logs kept in {run_dir})")
    shutil.rmtree(run_dir, ignore_errors=True)


def _torch_demo(ctx: click.Context, url: str | None, prefix: str | None) -> None:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("pyarrow") is None:
        raise taskq.errors.InvalidInput(
            "demo --torch needs torch and the data extra: pip install 'taskq-ml[data,torch]'"
        )
    from . import demo_torch

    try:
        ok = demo_torch.run(url, prefix)
    except KeyboardInterrupt:
        click.echo("taskq: demo interrupted; stopping what it started", err=True)
        ctx.exit(130)
    if not ok:
        raise taskq.TaskqError("demo --torch: the audit found a problem")


def _run(
    out: Any,
    client: taskq.Client,
    fleet: Fleet,
    job: str,
    ntasks: int,
    passes: int,
    trainers: int,
    chaos: bool,
) -> None:
    """Watch the job until it completes, scaling the fleet as planned."""
    total = ntasks * passes
    plan = _plan(trainers, chaos)
    rng = random.Random()
    bar = Progress(
        TextColumn("{task.description:<14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=out,
    )
    overall = bar.add_task("all passes", total=total, info="")
    current = bar.add_task("pass 0", total=ntasks, info="")
    deadline = time.monotonic() + FINISH_TIMEOUT_S
    with bar:
        while True:
            status = client.job(job).status(summaries=0)
            finished = status.state == "completed"
            done_all = total if finished else status.pass_no * ntasks + status.done
            alive = fleet.alive()
            bar.update(
                overall, completed=done_all, info=f"trainers {len(alive)}  workers {status.workers}"
            )
            bar.update(
                current,
                completed=ntasks if finished else status.done,
                description=f"pass {status.pass_no}",
                info=f"leased {status.leased}  todo {status.todo}",
            )
            while plan and done_all >= plan[0][0] * total and not finished:
                _act(out, client, fleet, plan.pop(0)[1], trainers, rng)
            if finished or status.state == "cancelled":
                break
            if not fleet.alive():
                raise taskq.TaskqError(
                    f"demo: every trainer exited before job {job} completed; see {fleet.run_dir}"
                )
            if time.monotonic() > deadline:
                raise taskq.TaskqError(
                    f"demo: job {job} did not complete within {FINISH_TIMEOUT_S:g}s"
                )
            if fleet.stop_flag.wait(0.1):
                raise KeyboardInterrupt
    for proc in fleet.trainers.values():  # their loops end by themselves on completion
        if fleet.stop_flag.is_set():
            raise KeyboardInterrupt
        proc.join(10)


def _act(
    out: Any, client: taskq.Client, fleet: Fleet, action: str, trainers: int, rng: random.Random
) -> None:
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
        fleet.kills.append((f"demo-trainer-{victim}:", client.job(fleet.job).status(0).now_ms))
        out.print(
            f"{stamp} chaos: SIGKILL trainer {victim} (its task comes back after "
            f"worker_ttl {DEMO_WORKER_TTL_S:g}s)"
        )
    elif action == "down" and len(alive) > 1:
        leaving = rng.sample(alive, max(1, min(len(alive) - 1, len(alive) // 3)))
        for index in leaving:
            fleet.signal(index, signal.SIGTERM)
        out.print(
            f"{stamp} scale down: SIGTERM trainer(s) {sorted(leaving)} "
            f"(they release what they hold)"
        )
