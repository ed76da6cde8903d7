"""taskq's own bench rows: throughput vs the probe, idle cost, scale; then recovery and big jobs.

Where it sits: `run.py` imports this module and calls `run(recorder, quick,
redis_port_factory)` for the `taskq` section. Every row starts its own private
redis-server from the factory, forks its trainers (`taskq_util.Children`, SIGKILLed when a
row ends, also on Ctrl-C), is bounded in time, and stops its server. The re-dispatch rows
live in `taskq_recovery.py`, the big-job and memory rows in `taskq_big.py`.

Rows (bench/HISTORY.md, "What each row measures", reads them):
  throughput  tasks acked/s, 1/call (`for task in trainer`, prefetch 0 and 1) and 16/call
              (`trainer.batches(16)`), 1/4/16 processes, with the ratio to the probe row
              of the same shape and the server's cost per script call (INFO commandstats)
  idle        Redis commands/s and trainer CPU while 50 trainers wait at a pass barrier
  scale       1,000 trainers (threads in 4 processes) heartbeating and leasing
"""

from __future__ import annotations

import heapq
import random
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import common
import probe
import redis
import taskq_big
import taskq_recovery
from taskq_util import CTX, Children, cpu_seconds, create_job, redis_cpu_seconds, url_of

import taskq

SECTION = "taskq"
PortFactory = Callable[[], tuple[int, Callable[[], None]]]


def run(recorder: common.Recorder, quick: bool, redis_port_factory: PortFactory) -> None:
    """Adds the taskq rows (see the module docstring) to `recorder`."""
    recorder.add(SECTION, "taskq code measured", None, "", _code_version())
    parts = [
        ("throughput", throughput_rows),
        ("re-dispatch", taskq_recovery.run),
        ("idle", idle_row),
        ("scale", scale_row),
        ("big jobs", taskq_big.run),
    ]
    for label, part in parts:
        try:
            part(recorder, quick, redis_port_factory)
        except Exception as error:  # one broken part must not hide the others' rows
            traceback.print_exc()
            recorder.add(
                SECTION, f"{label} rows failed", None, "", f"{type(error).__name__}: {error}"
            )
        finally:
            common.stop_all_servers()


def _code_version() -> str:
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "taskq")
    except (OSError, subprocess.TimeoutExpired):
        return "git unavailable"
    return f"commit {head}" + (" with uncommitted changes under taskq/" if dirty else "")


# -- throughput ----------------------------------------------------------------------------
def throughput_rows(recorder: common.Recorder, quick: bool, factory: PortFactory) -> None:
    """Nine rows: {1 task per call at prefetch 0 and 1, 16 per call} x {1, 4, 16} trainer
    processes. Issue 8 states the 1/call goal at prefetch 1 (each call also starts the
    reserved task and reserves the next); prefetch 0 is the plain ack-and-lease-next."""
    duration_s = 4.0 if quick else 15.0
    probe_rows = {r["name"]: r["value"] for r in recorder.rows if r["section"] == "probe"}
    for batch, prefetch in ((1, 0), (1, 1), (16, 0)):
        for processes in (1, 4, 16):
            name = f"throughput {batch}/call{' prefetch 1' if prefetch else ''}, {processes} proc"
            port, stop = factory()
            try:
                result = measure_throughput(port, processes, batch, duration_s, quick, prefetch)
            finally:
                stop()
            if result["tasks_per_s"] is None:
                recorder.add(SECTION, name, None, "tasks/s", result["problem"])
                continue
            probe_name = f"ack+lease {batch}/call, {processes} proc"
            probe_rate = probe_rows.get(probe_name)
            probe_src = "probe row of this run"
            if probe_rate is None:
                probe_rate = _own_probe(factory, processes, batch, 3.0 if quick else 15.0)
                probe_src = "probe run here"
            ratio = result["tasks_per_s"] / probe_rate if probe_rate else 0.0
            note = (
                f"{ratio:.0%} of the probe ({probe_rate:,.0f}/s, {probe_src}; goal ≥ 70%); "
                f"{duration_s:.0f} s, call p50 {result['p50_ms']:.2f} ms "
                f"p99 {result['p99_ms']:.2f} ms; redis-server CPU "
                f"{result['redis_cpu']:.0%}, trainer CPU {result['client_us']:.0f} µs per "
                f"task; {result['profile']}"
            )
            if result["problem"]:
                note += f"; {result['problem']}"
            recorder.add(SECTION, name, result["tasks_per_s"], "tasks/s", note)


def _own_probe(factory: PortFactory, processes: int, batch: int, duration_s: float) -> float:
    port, stop = factory()
    try:
        return probe.measure(port, processes, batch, duration_s)["tasks_per_s"]
    finally:
        stop()


def measure_throughput(
    port: int, processes: int, batch: int, duration_s: float, quick: bool, prefetch: int = 0
) -> dict:
    """Closed-loop trainers with empty bodies for `duration_s`; the server's counters check
    the count and INFO commandstats give the cost per script call."""
    job = "tput"
    client = create_job(port, job, 50_000 if quick else 200_000, passes=None)
    admin = redis.Redis(host=common.LOOPBACK, port=port)
    start = CTX.Event()
    results = CTX.Queue()
    with Children() as children:
        for _ in range(processes):
            children.start(
                _throughput_child, url_of(port), job, batch, prefetch, duration_s, start, results
            )
        _wait_workers(client, job, processes, timeout_s=30)
        acked_before = client.status(job, summaries=0).counters["acked"]
        admin.config_resetstat()
        cpu_before = redis_cpu_seconds(port)
        client_cpu_before = cpu_seconds([p.pid for p in children.procs])
        start.set()
        reports = []
        try:
            for _ in range(processes):
                reports.append(results.get(timeout=duration_s + 30))
        except Exception:  # queue.Empty: a trainer hung; the row says so
            pass
        cpu_after = redis_cpu_seconds(port)
        stats = admin.info("commandstats")
        client_cpu = cpu_seconds([p.pid for p in children.procs])
        children.stop(grace_s=5)
    admin.close()
    if not reports:
        return {
            "tasks_per_s": None,
            "p50_ms": 0,
            "p99_ms": 0,
            "redis_cpu": 0,
            "profile": "",
            "client_us": 0,
            "stats": stats,
            "problem": "no trainer reported within the bound",
        }
    acked = sum(r["acked"] for r in reports)
    window = max(r["ended"] for r in reports) - min(r["started"] for r in reports)
    server_acked = client.status(job, summaries=0).counters["acked"] - acked_before
    latencies = [x for r in reports for x in r["latencies_ms"]]
    problem = ""
    if len(reports) < processes:
        problem = f"only {len(reports)} of {processes} trainers reported"
    if server_acked < acked:
        problem += f" CHECK FAILED: server counted {server_acked} acks for {acked}"
    return {
        "tasks_per_s": acked / window,
        "p50_ms": common.percentile(latencies, 50),
        "p99_ms": common.percentile(latencies, 99),
        "redis_cpu": (cpu_after - cpu_before) / window,
        "client_us": (client_cpu - client_cpu_before) / max(acked, 1) * 1e6,
        "profile": script_profile(stats, acked),
        "stats": stats,
        "problem": problem.strip(),
    }


#: Commands in commandstats that no FCALL ran: the calls themselves, the trainers' waits
#: and connection set-up, and the bench's own INFO / CONFIG RESETSTAT / FUNCTION LOAD.
OUTSIDE = frozenset(
    {
        "fcall",
        "fcall_ro",
        "blpop",
        "info",
        "config|resetstat",
        "ping",
        "hello",
        "client|setinfo",
        "function|load",
    }
)


def script_profile(stats: dict, acked: int) -> str:
    """Server cost per FCALL (µs and Redis commands run inside it) from commandstats."""
    calls = {k.removeprefix("cmdstat_"): v for k, v in stats.items()}
    evalsha = calls.get("fcall", {"calls": 0, "usec": 0})
    if not evalsha["calls"]:
        return "no script calls"
    inner = {k: v["calls"] for k, v in calls.items() if k not in OUTSIDE}
    inner_calls = sum(inner.values())
    top = sorted(inner.items(), key=lambda kv: -calls[kv[0]]["usec"])[:5]
    per = evalsha["calls"]
    detail = ", ".join(f"{k} {v / per:.1f}" for k, v in top)
    return (
        f"{per} FCALL, {evalsha['usec'] / per:.0f} µs each, "
        f"{evalsha['usec'] / max(acked, 1):.0f} µs server time per task, "
        f"{inner_calls / per:.0f} Redis commands per call (top by time: {detail})"
    )


def _wait_workers(client: taskq.Client, job: str, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(client.workers(job)) >= count:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{count} trainers did not register within {timeout_s:.0f} s")


def _throughput_child(url, job, batch, prefetch, duration_s, start, results) -> None:
    trainer = taskq.Trainer(job, url=url, prefetch=prefetch, handle_signals=False)
    start.wait()
    latencies_ms: list[float] = []
    acked = held = 0
    started = time.time()
    deadline = time.monotonic() + duration_s
    last = time.monotonic()
    items = iter(trainer) if batch == 1 else trainer.batches(batch)
    for item in items:
        now = time.monotonic()
        latencies_ms.append((now - last) * 1000.0)
        last = now
        acked += held  # the call that handed out `item` acked what was held before
        held = 1 if batch == 1 else len(item)
        if now >= deadline:
            break
    ended = time.time()
    trainer.close()
    results.put({"acked": acked, "started": started, "ended": ended, "latencies_ms": latencies_ms})


# -- idle cost -----------------------------------------------------------------------------
def idle_row(recorder: common.Recorder, quick: bool, factory: PortFactory) -> None:
    """50 trainers (10 threads in each of 5 processes) and one reaper wait at a manual pass
    boundary; what do they cost the server and themselves?"""
    window_s = 10.0 if quick else 30.0
    trainers, processes = 50, 5
    port, stop = factory()
    job = "idle"
    try:
        client = create_job(port, job, 100, passes=2, auto_advance=False)
        stop_event = CTX.Event()
        with Children() as children:
            for _ in range(processes):
                children.start(_idle_child, url_of(port), job, trainers // processes, stop_event)
            reaper = children.start(_reaper_child, url_of(port))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                status = client.status(job, summaries=0)
                if status.state == "waiting" and len(client.workers(job)) >= trainers:
                    break
                time.sleep(0.2)
            else:
                raise RuntimeError("the trainers did not reach the pass barrier in 60 s")
            time.sleep(2.0)  # let every trainer settle into its blocking wait
            pids = [p.pid for p in children.procs if p is not reaper]
            cpu_before = cpu_seconds(pids)
            reaper_before = cpu_seconds([reaper.pid])
            started = time.monotonic()
            rate, per_command = common.command_rate(port, window_s)
            elapsed = time.monotonic() - started
            trainer_cpu = (cpu_seconds(pids) - cpu_before) / elapsed
            reaper_cpu = (cpu_seconds([reaper.pid]) - reaper_before) / elapsed
            client.cancel_job(job)
            children.stop(grace_s=5)
    finally:
        stop()
    scripts = (per_command.get("fcall", 0) + per_command.get("fcall_ro", 0)) / window_s
    blpops = per_command.get("blpop", 0) / window_s
    recorder.add(
        SECTION,
        "idle: 50 trainers at a pass barrier + 1 reaper",
        rate,
        "commands/s",
        f"{window_s:.0f} s window; {scripts:.1f} FCALL/s (heartbeats 1/s per trainer, "
        f"reaper ticks, lease retries), {blpops:.1f} BLPOP/s, the rest inside scripts; "
        f"trainer CPU {trainer_cpu:.1%} of a core for all 50 ({trainer_cpu / trainers:.2%} "
        f"each), reaper {reaper_cpu:.1%}",
    )


def _idle_child(url, job, count, stop_event) -> None:
    def one() -> None:
        trainer = taskq.Trainer(job, url=url, handle_signals=False)
        try:
            for epoch in trainer.passes():
                for _task in epoch:
                    pass
        except taskq.TaskqError:
            pass
        finally:
            trainer.close()

    threads = [threading.Thread(target=one, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)


def _reaper_child(url) -> None:
    from taskq.ops.reaper import Reaper

    Reaper(taskq.connect(url), interval=0.5).run()


# -- scale ---------------------------------------------------------------------------------
def scale_row(recorder: common.Recorder, quick: bool, factory: PortFactory) -> None:
    """1,000 trainers (250 in each of 4 processes, driven by a few threads each), each
    heartbeating every second and leasing tasks that take `task_s`; Redis CPU per worker
    and the ack+lease call's latency."""
    workers, processes, task_s = 1000, 4, 1.0
    window_s = 10.0 if quick else 30.0
    port, stop = factory()
    job = "scale"
    try:
        client = create_job(port, job, 40_000 if quick else 100_000, passes=None)
        stop_event = CTX.Event()
        results = CTX.Queue()
        with Children() as children:
            for _ in range(processes):
                children.start(
                    _scale_child,
                    url_of(port),
                    job,
                    workers // processes,
                    task_s,
                    stop_event,
                    results,
                )
            _wait_workers(client, job, workers, timeout_s=120)
            time.sleep(3.0)  # past the start-up burst
            cpu_before = redis_cpu_seconds(port)
            trainer_before = cpu_seconds([p.pid for p in children.procs])
            window_start = time.time()
            time.sleep(window_s)
            window_end = time.time()
            redis_cpu = (redis_cpu_seconds(port) - cpu_before) / window_s
            trainer_cpu = cpu_seconds([p.pid for p in children.procs]) - trainer_before
            trainer_cpu /= window_s
            counters = client.status(job, summaries=0).counters
            acked, lost = counters["acked"], counters["expired_worker_lost"]
            stop_event.set()
            reports = []
            try:
                for _ in range(processes):
                    reports.append(results.get(timeout=60))
            except Exception:  # queue.Empty: reported below
                pass
            children.stop(grace_s=10)
    finally:
        stop()
    latencies = [lat for r in reports for (t, lat) in r if window_start <= t <= window_end]
    if not latencies:
        recorder.add(SECTION, "scale: 1,000 trainers", None, "", "no lease in the window")
        return
    calls_per_s = len(latencies) * processes / max(len(reports), 1) / window_s
    note = (
        f"{window_s:.0f} s window, tasks sleep {task_s:.0f} s; Redis CPU "
        f"{redis_cpu:.0%} of a core in all ({redis_cpu / workers * 1e6:.0f} µs/s per "
        f"worker), {calls_per_s:.0f} ack+lease calls/s + ~{workers} heartbeats/s; "
        f"ack+lease latency p50 {common.percentile(latencies, 50):.1f} ms p99 "
        f"{common.percentile(latencies, 99):.1f} ms max {max(latencies):.0f} ms; "
        f"trainer processes {trainer_cpu:.0%} CPU; {acked} acked in all, {lost} leases "
        "expired by a lost worker (a late heartbeat)"
    )
    recorder.add(
        SECTION,
        "scale: 1,000 trainers, Redis CPU per worker",
        redis_cpu / workers * 100.0,
        "% of a core",
        note,
    )
    recorder.add(
        SECTION,
        "scale: 1,000 trainers, ack+lease p99",
        common.percentile(latencies, 99),
        "ms",
        f"p50 {common.percentile(latencies, 50):.1f} ms; {len(latencies)} calls",
    )


def _scale_child(url, job, count, task_s, stop_event, results) -> None:
    # Thousands of Python threads on two cores would measure the GIL, not taskq: each
    # process drives its trainers from a few scheduler threads (a trainer's next task is
    # due `task_s` after it got its last one) and one thread beats for all of them, each
    # trainer once per heartbeat interval, staggered.
    trainers = [
        taskq.Trainer(job, url=url, handle_signals=False, heartbeat=False) for _ in range(count)
    ]
    done = threading.Event()
    samples: list[tuple[float, float]] = []
    lock = threading.Lock()

    def drive(mine: list[taskq.Trainer]) -> None:
        iterators = [iter(t) for t in mine]
        due = [(time.monotonic() + random.random() * task_s, i) for i in range(len(mine))]
        heapq.heapify(due)
        got: list[tuple[float, float]] = []
        while due and not done.is_set():
            when, i = heapq.heappop(due)
            done.wait(max(0.0, when - time.monotonic()))
            started = time.monotonic()
            try:
                next(iterators[i])
            except (StopIteration, taskq.TaskqError):
                continue
            now = time.monotonic()
            got.append((time.time(), (now - started) * 1000.0))
            heapq.heappush(due, (now + task_s, i))
        with lock:
            samples.extend(got)

    def beat() -> None:
        interval = trainers[0].heartbeat_interval
        next_due = time.monotonic()
        while not done.is_set():
            for k, trainer in enumerate(trainers):
                done.wait(max(0.0, next_due + interval * k / count - time.monotonic()))
                try:
                    trainer.heartbeat()
                except taskq.TaskqError:
                    pass
            next_due += interval

    drivers = [
        threading.Thread(target=drive, args=(trainers[k::4],), daemon=True) for k in range(4)
    ]
    threads = [*drivers, threading.Thread(target=beat, daemon=True)]
    for thread in threads:
        thread.start()
    stop_event.wait()
    done.set()
    for thread in threads:
        thread.join(timeout=10)
    results.put(list(samples))
    for trainer in trainers:
        trainer.close()
