"""``taskq work JOB -- CMD``: a command that succeeds, fails, is killed (and SIGTERM to
``taskq work`` itself), and outlives its lease. Real redis-server, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import support
from click.testing import CliRunner
from support import free_port, wait_until
from taskq.cli.work import work

import taskq

ROOT = Path(__file__).resolve().parents[2]
TASKQ = ROOT / ".venv" / "bin" / "taskq"


make_job = partial(support.make_job, worker_ttl=1.0, heartbeat_interval=0.2)


def run_work(url: str, job: str, script: str, *opts: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        work, [job, "--url", url, *opts, "--", sys.executable, "-c", script], catch_exceptions=False
    )
    return result.exit_code, result.output


def spawn_work(url: str, job: str, script: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, TASKQ_REDIS_URL=url, PYTHONPATH=str(ROOT))
    cmd = (
        [str(TASKQ)]
        if TASKQ.exists()
        else [sys.executable, "-c", "from taskq.cli.main import main; main()"]
    )
    return subprocess.Popen(
        [*cmd, "work", job, "--grace", "2", "--", sys.executable, "-c", script], env=env, cwd=ROOT
    )


def events(client: taskq.Client, job: str, kind: str) -> list[dict[str, str]]:
    return [f for _, f in client.events(job, count=1000) if f["type"] == kind]


def test_command_succeeds_with_task_on_stdin_and_env(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """Three tasks, each run takes 1.5 s under a 1 s ttl: heartbeats go on meanwhile."""
    out = tmp_path / "out.jsonl"
    script = f"""
import json, os, sys, time
task = json.load(sys.stdin)
time.sleep(1.5 if task["id"] == 0 else 0)  # task 0's run outlasts the 1 s ttl
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


def test_command_fails_with_stderr_tail(client: taskq.Client, url: str, job_name: str) -> None:
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
        # the cause (the last stderr line) first, then the tail before it
        assert f["error"].startswith(f"exit 3: boom on {f['task']}\nnoise\n")
        assert len(f["error"]) <= 500
    st = client.status(job_name)
    assert st.state == "completed" and st.counters["acked"] == 2 and st.counters["failed"] == 2


def test_command_killed_by_a_signal_fails(client: taskq.Client, url: str, job_name: str) -> None:
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


def test_sigterm_is_passed_on_and_the_lease_released(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """The command traps SIGTERM and exits 0: still released (not acked), at once."""
    started, got = tmp_path / "started", tmp_path / "got-term"
    script = f"""
import signal, sys, time
def term(*_):
    open({str(got)!r}, "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
open({str(started)!r}, "w").close()
time.sleep(30)  # runs until signalled
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


def test_command_outliving_its_lease_is_terminated(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    marker, ran = tmp_path / "marker", tmp_path / "ran"
    script = f"""
import os, time
with open({str(ran)!r}, "a") as f:
    f.write(os.environ["TASKQ_TOKEN"] + "\\n")
if not os.path.exists({str(marker)!r}):
    open({str(marker)!r}, "w").close()
    time.sleep(30)  # runs until signalled
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purpose
        return f.read().split(")")[-1].split()[0] != "Z"


GRANDCHILD = """
import os, subprocess, sys, time
kid = subprocess.Popen(["sh", "-c", "cat >/dev/null; sleep 30"], stdin=subprocess.PIPE)
with open({pids!r}, "a") as f:
    f.write(f"{{os.getpid()}} {{kid.pid}}\\n")
sys.stdin.read()
time.sleep(30)  # runs until signalled
"""


def _grandchildren_gone(pids_file: Path) -> None:
    pids = [int(p) for p in pids_file.read_text().split()]
    assert pids and wait_until(lambda: not any(_alive(p) for p in pids), 10), pids


def test_revoke_terminates_the_commands_whole_process_group(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    make_job(client, job_name, 1, task_timeout=None)
    proc = spawn_work(url, job_name, GRANDCHILD.format(pids=str(pids)))
    try:
        assert wait_until(lambda: pids.exists() and pids.read_text().strip(), 15)
        assert client.revoke(job_name, 0)
        _grandchildren_gone(pids)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
        proc.kill()


def test_sigterm_reaches_the_commands_grandchildren(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    make_job(client, job_name, 1, task_timeout=None)
    proc = spawn_work(url, job_name, GRANDCHILD.format(pids=str(pids)))
    try:
        assert wait_until(lambda: pids.exists() and pids.read_text().strip(), 15)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 128 + signal.SIGTERM
        _grandchildren_gone(pids)
    finally:
        proc.kill()


def _ignores_sigterm(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGTERM (the SigIgn mask of its /proc status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:"))
    return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)


def test_grace_escalates_to_sigkill_for_the_group(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """A grandchild that ignores SIGTERM is SIGKILLed after --grace (here 2 s)."""
    pids = tmp_path / "pids"
    script = f"""
import os, signal, subprocess, sys, time
kid = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
with open({str(pids)!r}, "w") as f:
    f.write(str(kid.pid))
time.sleep(60)  # runs until signalled
"""
    make_job(client, job_name, 1, task_timeout=None)
    proc = spawn_work(url, job_name, script)
    try:
        assert wait_until(lambda: pids.exists() and pids.read_text().strip(), 15)
        assert wait_until(lambda: _ignores_sigterm(int(pids.read_text())), 15)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 128 + signal.SIGTERM
        _grandchildren_gone(pids)
    finally:
        proc.kill()


def test_a_task_ending_dead_gives_a_summary_and_exit_3(
    client: taskq.Client, url: str, job_name: str
) -> None:
    script = """
import os, sys
if os.environ["TASKQ_TASK_ID"] == "1":
    sys.exit("cannot decode shard 1")
"""
    make_job(client, job_name, 3, max_failures=1)
    env = dict(os.environ, TASKQ_REDIS_URL=url)
    r = subprocess.run(
        [str(TASKQ), "work", job_name, "--", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 3, r.stderr
    summary = [line for line in r.stderr.splitlines() if "leaving:" in line]
    assert len(summary) == 1
    assert summary[0].endswith(
        "2 done, 1 failed (1 now dead: task(s) [1]), 0 released, 0 revoked; exit 3"
    )
    failed = events(client, job_name, "failed")
    assert failed[0]["error"] == "exit 1: cannot decode shard 1"


def test_a_clean_run_logs_its_summary_and_exits_0(
    client: taskq.Client, url: str, job_name: str
) -> None:
    make_job(client, job_name, 2)
    env = dict(os.environ, TASKQ_REDIS_URL=url)
    r = subprocess.run(
        [str(TASKQ), "work", job_name, "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "leaving: 2 done, 0 failed, 0 released, 0 revoked; exit 0" in r.stderr


def test_on_complete_wait_stays_until_sigterm_holding_nothing(
    client: taskq.Client, url: str, job_name: str
) -> None:
    """A Deployment's pod: the job completed, the worker leaves it and waits (an exit 0
    would be restarted, in a loop); SIGTERM ends it with 0."""
    make_job(client, job_name, 2)
    proc = subprocess.Popen(
        [str(TASKQ), "work", job_name, "--on-complete", "wait", "--", "true"],
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TASKQ_REDIS_URL=url),
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    assert support.wait_until(lambda: any("waiting for SIGTERM" in x for x in lines), timeout=60)
    st = client.status(job_name, summaries=0)
    assert (st.state, st.workers, proc.poll()) == ("completed", 0, None)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    reader.join(timeout=5)
    assert any("leaving: 2 done, 0 failed, 0 released, 0 revoked; exit 0" in x for x in lines)


def test_bad_seconds_and_a_ttl_under_the_heartbeat_are_usage_errors(
    client: taskq.Client, url: str, job_name: str
) -> None:
    make_job(client, job_name, 1, worker_ttl=5.0, heartbeat_interval=1.0)
    for opts, text in (
        (["--worker-ttl", "nan"], "finite number of seconds"),
        (["--worker-ttl", "inf"], "finite number of seconds"),
        (["--grace", "nan"], "finite number of seconds"),
        (["--grace", "-1"], "finite number of seconds"),
        (["--worker-ttl", "0.5"], "must be longer than job"),
    ):
        r = subprocess.run(
            [str(TASKQ), "--url", url, "work", job_name, *opts, "--", "true"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2, (opts, r.stderr)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("taskq: error: ") and text in lines[0]
    assert client.status(job_name).counters["leased"] == 0


def test_redis_down_at_start_says_what_it_waits_for(job_name: str) -> None:
    port = free_port()
    url = f"redis://:s3cret@127.0.0.1:{port}/0"
    proc = subprocess.Popen(
        [str(TASKQ), "--url", url, "work", job_name, "--", "true"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
    assert "waiting for Redis at redis://:***@127.0.0.1:" in line, line
    assert f":{port}/0 to answer: unreachable for" in line and "giving up after 60 s" in line
    assert "s3cret" not in line
