"""BullMQ peer rows: empty-job throughput and stalled-job recovery after a SIGKILL.

Where it sits: called by `bench/run.py` (section "bullmq"). Installs the pinned BullMQ
from `bench/peers/bullmq/package.json` with `npm install` (node_modules stays out of git),
then runs `throughput.mjs` and `stalled.mjs` there against a private redis-server.
Skipped, with a note, when `node`/`npm` are absent or the install fails.

- throughput.mjs: addBulk 2,000 + N no-op jobs (removeOnComplete), drain with one Worker
  at concurrency 1 and 16; jobs/s over the last N (steady state: the Worker's start and
  the first 2,000 jobs excluded). `bench/steady.py` runs it in rounds next to taskq.
- stalled.mjs: BullMQ defaults (lockDuration 30 s, stalledInterval 30 s); a long job on a
  forked worker child, SIGKILLed once started; seconds until a second worker child
  starts it again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import common

SECTION = "bullmq"
BULLMQ_DIR = Path(__file__).resolve().parent / "bullmq"


def run(recorder: common.Recorder, quick: bool, max_wait_s: float | None = None) -> None:
    """Adds the BullMQ throughput rows (jobs/s) and the stalled-recovery row (seconds)."""
    problem = prepare()
    if problem:
        recorder.add(SECTION, "all rows", None, "", f"skipped: {problem}")
        return
    version = installed_version()
    jobs = 10_000 if quick else 40_000
    with common.start_redis() as server:
        lines, problem = run_node(
            ["throughput.mjs", "--port", str(server.port), "--jobs", str(jobs), "--warmup", "2000"],
            timeout_s=600,
        )
    results = [json.loads(line) for line in lines]
    throughputs = [result for result in results if "jobs_per_s" in result]
    if problem or not throughputs:
        errors = [result["error"] for result in results if "error" in result]
        recorder.add(SECTION, "empty jobs", None, "jobs/s", problem or "; ".join(errors))
    for result in throughputs:
        note = (
            f"bullmq {version}, {jobs} jobs after 2,000 warm-up, removeOnComplete; "
            f"{result['start_jobs_per_s']:,.0f}/s counting the Worker's start"
        )
        if result["concurrency"] == 1:
            recorder.add(
                SECTION, "enqueue empty jobs", result["enqueue_jobs_per_s"], "jobs/s", note
            )
        recorder.add(
            SECTION,
            f"empty jobs, 1 Worker, concurrency {result['concurrency']}",
            result["jobs_per_s"],
            "jobs/s",
            note,
        )

    max_wait_s = max_wait_s if max_wait_s is not None else (120.0 if quick else 600.0)
    trials = 1 if quick else 3
    recoveries: list[float] = []
    note = ""
    for _ in range(trials):
        with common.start_redis() as server:
            lines, problem = run_node(
                ["stalled.mjs", "--port", str(server.port), "--max-wait-s", str(max_wait_s)],
                timeout_s=max_wait_s + 90,
            )
        result = json.loads(lines[-1]) if lines else {}
        if problem or result.get("recovery_s") is None:
            note = problem or result.get("error", "no result")
            break
        recoveries.append(result["recovery_s"])
    label = "SIGKILL recovery, defaults (stalled check)"
    if len(recoveries) < trials:
        recorder.add(SECTION, label, None, "s", note)
        return
    note = f"bullmq {version}, {trials} trial(s): " + ", ".join(f"{s:.1f}" for s in recoveries)
    recorder.add(SECTION, label, common.percentile(recoveries, 50), "s", note)


def prepare() -> str:
    """Installs node_modules when missing or older than package.json; returns a problem or ""."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node/npm not on PATH"
    marker = BULLMQ_DIR / "node_modules" / ".package-lock.json"
    package_json = BULLMQ_DIR / "package.json"
    if marker.exists() and marker.stat().st_mtime >= package_json.stat().st_mtime:
        return ""
    try:
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund"],
            cwd=BULLMQ_DIR,
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
    except subprocess.CalledProcessError as error:
        return f"npm install failed: {error.stderr.strip()[-300:]}"
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"npm install failed: {error}"
    return ""


def installed_version() -> str:
    """Returns the installed bullmq version, or "?"."""
    try:
        package = BULLMQ_DIR / "node_modules" / "bullmq" / "package.json"
        return json.loads(package.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return "?"


def run_node(argv: list[str], timeout_s: float) -> tuple[list[str], str]:
    """Runs `node argv...` in the bullmq dir in a session of its own; (JSON lines, problem).

    On timeout or Ctrl-C the whole session (node and the worker children it forked) is
    SIGKILLed by its process group id.
    """
    process = subprocess.Popen(
        ["node", *argv],
        cwd=BULLMQ_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    problem = ""
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
        if process.returncode != 0:
            problem = f"node {argv[0]} exited {process.returncode}: {stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        stdout, problem = "", f"node {argv[0]} did not finish within {timeout_s:.0f} s"
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return lines, problem
