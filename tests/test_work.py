"""``taskq work JOB -- CMD``: a command that succeeds, fails, is killed (and SIGTERM to
``taskq work`` itself), and outlives its lease. Real redis-server, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import support
from click.testing import CliRunner
from support import wait_until
from taskq.cli.work import work

import taskq

ROOT = Path(__file__).resolve().parent.parent
TASKQ = ROOT / ".venv" / "bin" / "taskq"


make_job = partial(support.make_job, worker_ttl=1.0, heartbeat_interval=0.2)


def run_work(url: str, job: str, script: str, *opts: str) -> tuple[int, str]:
    result = CliRunner().invoke(work, [job, "--url", url, *opts, "--", sys.executable, "-c",
                                       script], catch_exceptions=False)
    return result.exit_code, result.output


def spawn_work(url: str, job: str, script: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, TASKQ_REDIS_URL=url, PYTHONPATH=str(ROOT))
    cmd = [str(TASKQ)] if TASKQ.exists() else [sys.executable, "-c",
                                                "from taskq.cli.main import main; main()"]
    return subprocess.Popen([*cmd, "work", job, "--grace", "2", "--", sys.executable, "-c",
                             script], env=env, cwd=ROOT)


def events(client: taskq.Client, job: str, kind: str) -> list[dict[str, str]]:
    return [f for _, f in client.events(job, count=1000) if f["type"] == kind]


def test_command_succeeds_with_task_on_stdin_and_env(client: taskq.Client, url: str,
                                                     job_name: str, tmp_path: Path) -> None:
    """Three tasks, each run takes 1.5 s under a 1 s ttl: heartbeats go on meanwhile."""
    out = tmp_path / "out.jsonl"
    script = f"""
import json, os, sys, time
task = json.load(sys.stdin)
time.sleep(1.5 if task["id"] == 0 else 0)
with open({str(out)!r}, "a") as f:
    f.write(json.dumps({{"stdin": task, "env": json.loads(os.environ["TASKQ_TASK"]),
        "id": os.environ["TASKQ_TASK_ID"], "pass": os.environ["TASKQ_PASS"],
        "token": os.environ["TASKQ_TOKEN"]}}) + "\\n")
"""
    make_job(client, job_name, 3)
    code, _ = run_work(url, job_name, script)
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["stdin"]["id"] for r in rows) == [0, 1, 2]
    for r in rows:
        assert r["stdin"] == r["env"]
        assert r["stdin"]["chunks"] == [{"i": r["stdin"]["id"]}]
        assert r["id"] == str(r["stdin"]["id"]) and r["pass"] == "0"
        assert r["token"] == str(r["stdin"]["token"])
    st = client.status(job_name)
    assert st.state == "completed" and st.counters["acked"] == 3
    assert st.counters["expired_worker_lost"] == 0 and st.counters["stale"] == 0


def test_command_fails_with_stderr_tail(client: taskq.Client, url: str,
                                        job_name: str) -> None:
    script = """
import os, sys
if os.environ["TASKQ_ATTEMPT"] == "1":
    print("noise\\n" * 1000 + "boom on " + os.environ["TASKQ_TASK_ID"], file=sys.stderr)
    sys.exit(3)
"""
    make_job(client, job_name, 2)
    code, _ = run_work(url, job_name, script)
    assert code == 0
    failed = events(client, job_name, "failed")
    assert len(failed) == 2
    for f in failed:
        assert f["error"].startswith("exit 3: ") and f["error"].endswith(f"boom on {f['task']}")
        assert len(f["error"]) <= 500
    st = client.status(job_name)
    assert st.state == "completed" and st.counters["acked"] == 2 and st.counters["failed"] == 2


def test_command_killed_by_a_signal_fails(client: taskq.Client, url: str,
                                          job_name: str) -> None:
    script = """
import os, signal
if os.environ["TASKQ_ATTEMPT"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
"""
    make_job(client, job_name, 1)
    code, _ = run_work(url, job_name, script)
    assert code == 0
    assert events(client, job_name, "failed")[0]["error"] == "killed by signal 9"
    assert client.status(job_name).counters["acked"] == 1


def test_sigterm_is_passed_on_and_the_lease_released(client: taskq.Client, url: str,
                                                     job_name: str, tmp_path: Path) -> None:
    """The command traps SIGTERM and exits 0: still released (not acked), at once."""
    started, got = tmp_path / "started", tmp_path / "got-term"
    script = f"""
import signal, sys, time
def term(*_):
    open({str(got)!r}, "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
open({str(started)!r}, "w").close()
time.sleep(30)
"""
    make_job(client, job_name, 1, worker_ttl=30.0, heartbeat_interval=1.0)
    proc = spawn_work(url, job_name, script)
    try:
        assert wait_until(started.exists, 15)
        with taskq.Trainer(job_name, url=url, heartbeat=False) as other:
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            task = other.lease(timeout=5)
            latency = time.monotonic() - t0
            assert task is not None
            other.ack(task)
        print(f"\ntaskq work SIGTERM -> task leased by another trainer in {latency * 1000:.0f} ms")
        assert latency < 2.0
        assert proc.wait(10) == 128 + signal.SIGTERM
        assert got.exists()
    finally:
        proc.kill()
    st = client.status(job_name)
    assert st.counters["released"] == 1 and st.counters["acked"] == 1  # the other's ack
    assert st.counters["failed"] == 0 and st.workers == 0


def test_command_outliving_its_lease_is_terminated(client: taskq.Client, url: str,
                                                   job_name: str, tmp_path: Path) -> None:
    marker, ran = tmp_path / "marker", tmp_path / "ran"
    script = f"""
import os, time
with open({str(ran)!r}, "a") as f:
    f.write(os.environ["TASKQ_TOKEN"] + "\\n")
if not os.path.exists({str(marker)!r}):
    open({str(marker)!r}, "w").close()
    time.sleep(30)
"""
    make_job(client, job_name, 1)
    proc = spawn_work(url, job_name, script)
    try:
        assert wait_until(marker.exists, 15)
        t0 = time.monotonic()
        assert client.revoke(job_name, 0)
        assert proc.wait(20) == 0
        elapsed = time.monotonic() - t0
    finally:
        proc.kill()
    print(f"\nrevoked lease: command terminated and task re-run in {elapsed:.2f} s")
    assert elapsed < 5
    tokens = ran.read_text().split()
    assert len(tokens) == 2 and tokens[0] != tokens[1]
    st = client.status(job_name)
    assert st.state == "completed" and st.counters["acked"] == 1
    assert st.counters["revoked"] == 1 and st.counters["failed"] == 0


def test_missing_command_is_a_usage_error(url: str, job_name: str) -> None:
    result = CliRunner().invoke(work, [job_name, "--url", url, "--", "no-such-cmd-xyz"])
    assert result.exit_code == 2 and "command not found" in result.output
