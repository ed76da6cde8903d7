"""rq peer rows: empty-job throughput and how long a SIGKILLed worker's job waits to run again.

Where it sits: called by `bench/run.py` (section "rq"); every row uses a private
redis-server from `common.start_redis()`.

Throughput: enqueue N no-op jobs (`enqueue_many`, pipelined), then drain them in burst
mode with one SimpleWorker, four SimpleWorker processes, and one forking Worker.

Recovery: a job that records its start time and sleeps runs on an `rq_worker.py`
subprocess; once it has started, the worker and its work horse (forked into its own
process group) are SIGKILLed, a fresh worker is started, and the row is the time from the
kill until the job starts again. rq only requeues an abandoned job when a worker's
maintenance pass finds its started-registry entry expired: the entry lives
min(job_timeout, job_monitoring_interval) + 60 s past the last heartbeat, and maintenance
runs every `maintenance_interval` (600 s by default), between blocking dequeues of
worker_ttl - 15 s. Without a Retry the abandoned job goes to the failed registry and never
runs again, so both variants enqueue with Retry(max=3).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import common
import psutil
import redis
from rq import Queue, Retry, SimpleWorker, Worker

SECTION = "rq"
PEERS_DIR = Path(__file__).resolve().parent
NOOP = "peers.rq_jobs.noop"
RECORD_AND_SLEEP = "peers.rq_jobs.record_start_and_sleep"
STARTS_KEY = "bench:rq:starts"
_stop_waiting = threading.Event()

# variant -> (row label, job_timeout for the enqueued job; None = rq's default 180 s)
RECOVERY_VARIANTS = {
    "default": ("SIGKILL recovery, rq defaults + Retry(max=3)", None),
    "tuned": (
        "SIGKILL recovery, tuned (job_timeout 5 s, maintenance 1 s, monitoring 1 s, "
        "worker_ttl 20 s)",
        5,
    ),
}


def run(recorder: common.Recorder, quick: bool, max_wait_s: float | None = None) -> None:
    """Adds the rq throughput rows (jobs/s) and the two recovery rows (seconds)."""
    jobs = 2_000 if quick else 10_000
    throughput_rows(recorder, jobs)
    max_wait_s = max_wait_s if max_wait_s is not None else (120.0 if quick else 1200.0)
    trials = 1 if quick else 3
    # The two variants mostly sleep; running them side by side halves the wall time.
    _stop_waiting.clear()
    with ThreadPoolExecutor(max_workers=len(RECOVERY_VARIANTS)) as pool:
        futures = {
            variant: pool.submit(recovery_trials, variant, trials, max_wait_s)
            for variant in RECOVERY_VARIANTS
        }
        try:
            for variant, future in futures.items():
                label, _ = RECOVERY_VARIANTS[variant]
                value, note = future.result()
                recorder.add(SECTION, label, value, "s", note)
        except KeyboardInterrupt:
            _stop_waiting.set()  # the trials' finally blocks then kill their workers
            raise


def throughput_rows(recorder: common.Recorder, jobs: int) -> None:
    """Enqueue rate plus drain rates for 1 and 4 SimpleWorkers and 1 forking Worker."""
    with common.start_redis() as server:
        enqueue_rate = enqueue_noops(server.port, jobs)
        recorder.add(SECTION, "enqueue empty jobs", enqueue_rate, "jobs/s", f"{jobs} jobs")
        rate, note = drain(server.port, SimpleWorker, processes=1, jobs=jobs)
        recorder.add(SECTION, "empty jobs, 1 SimpleWorker", rate, "jobs/s", note)
    with common.start_redis() as server:
        enqueue_noops(server.port, jobs)
        rate, note = drain(server.port, SimpleWorker, processes=4, jobs=jobs)
        recorder.add(SECTION, "empty jobs, 4 SimpleWorker procs", rate, "jobs/s", note)
    forked_jobs = max(jobs // 10, 100)
    with common.start_redis() as server:
        enqueue_noops(server.port, forked_jobs)
        rate, note = drain(server.port, Worker, processes=1, jobs=forked_jobs)
        recorder.add(
            SECTION,
            "empty jobs, 1 Worker (fork per job)",
            rate,
            "jobs/s",
            note + "; rq's default worker class",
        )


def enqueue_noops(port: int, jobs: int) -> float:
    """Enqueues `jobs` no-op jobs in pipelined batches of 500; returns jobs/s."""
    connection = redis.Redis(host=common.LOOPBACK, port=port)
    queue = Queue("bench", connection=connection)
    started = time.perf_counter()
    for offset in range(0, jobs, 500):
        batch = [Queue.prepare_data(NOOP) for _ in range(min(500, jobs - offset))]
        queue.enqueue_many(batch)
    elapsed = time.perf_counter() - started
    connection.close()
    return jobs / elapsed


def drain(port: int, worker_class: type, processes: int, jobs: int) -> tuple[float, str]:
    """Runs `processes` burst workers until the queue is empty; returns (jobs/s, note)."""
    connection = redis.Redis(host=common.LOOPBACK, port=port)
    commands_before = int(connection.info("stats")["total_commands_processed"])
    ctx = mp.get_context("fork")
    go = ctx.Event()
    workers = [
        ctx.Process(target=_burst_worker, args=(port, worker_class, go)) for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        time.sleep(0.5)  # let every worker register before the clock starts
        started = time.perf_counter()
        go.set()
        for worker in workers:
            worker.join(timeout=600)
        elapsed = time.perf_counter() - started
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
                worker.join()
    commands = int(connection.info("stats")["total_commands_processed"]) - commands_before
    finished = Queue("bench", connection=connection).finished_job_registry.count
    connection.close()
    note = f"{jobs} jobs, burst, {commands / jobs:.0f} Redis commands/job"
    if finished != jobs:
        note += f"; only {finished} finished"
    return finished / elapsed, note


def _burst_worker(port: int, worker_class: type, go) -> None:
    connection = redis.Redis(host=common.LOOPBACK, port=port)
    worker = worker_class([Queue("bench", connection=connection)], connection=connection)
    go.wait()
    worker.work(burst=True, logging_level="WARNING")


def recovery_trials(variant: str, trials: int, max_wait_s: float) -> tuple[float | None, str]:
    """Runs up to `trials` recovery trials; returns (median seconds or None, note)."""
    results: list[float] = []
    for _ in range(trials):
        seconds, problem = recovery_trial(variant, max_wait_s)
        if seconds is None:
            if variant == "default" and problem.startswith("not within"):
                problem += (
                    " (rq requeues it only in a maintenance pass, every 600 s, once its"
                    " registry entry expired 90 s after the last heartbeat)"
                )
            return None, problem or f"not within {max_wait_s:.0f} s"
        results.append(seconds)
    note = f"{trials} trial(s): " + ", ".join(f"{s:.1f}" for s in results)
    if variant == "tuned":
        note += "; cost: rq kills every job running longer than job_timeout (5 s)"
    return common.percentile(results, 50), note


def recovery_trial(variant: str, max_wait_s: float) -> tuple[float | None, str]:
    """One SIGKILL trial; returns (seconds from kill to re-start, "") or (None, why)."""
    _, job_timeout = RECOVERY_VARIANTS[variant]
    log_dir = common.RESULTS_DIR / "tmp"
    log_dir.mkdir(parents=True, exist_ok=True)
    spawned: list[subprocess.Popen] = []
    with common.start_redis() as server:
        connection = server.client()
        queue_name = f"recovery-{variant}"
        queue = Queue(queue_name, connection=connection)
        queue.enqueue(
            RECORD_AND_SLEEP, STARTS_KEY, 3600, retry=Retry(max=3), job_timeout=job_timeout
        )
        try:
            first = _spawn_worker(server.port, variant, queue_name, log_dir / f"rq-{variant}-1.log")
            spawned.append(first)
            if not _wait_for_starts(connection, 1, timeout_s=60):
                return None, "the job never started on the first worker"
            victims = [first.pid] + [c.pid for c in psutil.Process(first.pid).children(True)]
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            killed_at = time.time()
            if len(victims) < 2:
                return None, "no work horse found under the first worker"
            second = _spawn_worker(
                server.port, variant, queue_name, log_dir / f"rq-{variant}-2.log"
            )
            spawned.append(second)
            if not _wait_for_starts(connection, 2, timeout_s=max_wait_s):
                return None, f"not within {max_wait_s:.0f} s"
            restarted_at = float(connection.lindex(STARTS_KEY, 1))
            return restarted_at - killed_at, ""
        finally:
            for process in spawned:
                _kill_tree(process)
            connection.close()


def _spawn_worker(port: int, variant: str, queue_name: str, log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(PEERS_DIR.parent))
    argv = [sys.executable, str(PEERS_DIR / "rq_worker.py"), str(port), variant, queue_name]
    with log_path.open("w") as log:
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait_for_starts(connection, count: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not _stop_waiting.is_set():
        if connection.llen(STARTS_KEY) >= count:
            return True
        time.sleep(0.05)
    return False


def _kill_tree(process: subprocess.Popen) -> None:
    """SIGKILLs a process this bench spawned and every descendant it still has."""
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    for child in descendants:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)
