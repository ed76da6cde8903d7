"""The ``taskq`` CLI as an operator meets it: --url on either side of the subcommand,
precise errors instead of silent successes, --json on every mutating command, one-line
events, task details, tables that read the same piped, and bad values refused with one
line. Real redis-server; CliRunner and the installed entry point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from support import ENTRY_POINT, RedisServer, free_port, one_error_line, wait_until
from taskq.cli.main import cli

import taskq


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def sh(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60, cwd: str = "/"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ENTRY_POINT, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )


def fail_once(client: taskq.Client, url: str, job: str, error: str) -> int:
    """Lease one task and fail it with ``error``; returns its id."""
    with taskq.Trainer(job, url=url, heartbeat=False) as trainer:
        task = trainer.lease(timeout=1)
        assert task is not None
        trainer.fail(task, error)
        return task.id


# -- --url on both sides ----------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["job", "status", "{job}", "--url", "{url}"],
        ["--url", "{url}", "job", "status", "{job}"],
        ["job", "status", "{job}"],  # from TASKQ_REDIS_URL
        ["--url", "{dead}", "job", "status", "{job}", "--url", "{url}"],  # the later one wins
    ],
    ids=["after", "before", "env", "both"],
)
def test_url_is_accepted_before_and_after_the_subcommand(
    url: str, client: taskq.Client, job_name: str, argv: list[str]
) -> None:
    client.create_job(job_name, [1, 2])
    dead = f"redis://127.0.0.1:{free_port()}/0"
    args = [a.format(job=job_name, url=url, dead=dead) for a in argv]
    r = run(*args, env={"TASKQ_REDIS_URL": url if "--url" not in args else dead})
    assert r.exit_code == 0, r.output
    assert job_name in r.stdout


def test_every_subcommand_accepts_url() -> None:
    from taskq.cli.main import cli as group

    def leaves(cmd: object, path: str) -> list[tuple[str, object]]:
        sub = getattr(cmd, "commands", None)
        if sub is None:
            return [(path, cmd)]
        return [leaf for name, c in sub.items() for leaf in leaves(c, f"{path} {name}")]

    every = leaves(group, "taskq")
    missing = [
        path
        for path, cmd in every
        if not any("--url" in p.opts for p in cmd.params)  # type: ignore[attr-defined]
    ]
    # `taskq dev ...` starts local servers of its own: there is no URL to give it
    assert missing == [path for path, _ in every if path.startswith("taskq dev ")]
    assert "taskq dev cluster" in missing


def test_entry_point_url_after_subcommand(url: str, client: taskq.Client, job_name: str) -> None:
    client.create_job(job_name, [1])
    env = {k: v for k, v in os.environ.items() if k != "TASKQ_REDIS_URL"}
    r = sh("job", "status", job_name, "--json", "--url", url, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks"] == 1


# -- precise errors instead of silent successes ------------------------------------------
def test_retry_of_a_task_that_is_not_dead_or_missing_exits_1(
    url: str, client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, list(range(10)), max_failures=1)
    r = run("--url", url, "tasks", "retry", job_name, "--id", "3")
    assert r.exit_code == 1
    assert one_error_line(r.stderr).endswith(
        f"job {job_name}: task 3 is todo, not dead; only dead tasks are retried (nothing retried)"
    )
    r = run("--url", url, "tasks", "retry", job_name, "--id", "99")
    assert r.exit_code == 1
    assert f"job {job_name}: no task 99 (its tasks are 0-9)" in one_error_line(r.stderr)
    dead = fail_once(client, url, job_name, "boom")
    r = run("--url", url, "tasks", "retry", job_name, "--id", str(dead), "--id", "3")
    assert r.exit_code == 1 and "task 3 is todo" in r.stderr
    assert client.status(job_name).dead == 1  # checked before any write
    r = run("--url", url, "tasks", "retry", job_name, "--id", str(dead), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"job": job_name, "retried": 1, "ids": [dead]}


def test_revoke_of_a_missing_or_unleased_task_exits_1(
    url: str, client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, list(range(10)))
    r = run("--url", url, "tasks", "revoke", job_name, "999")
    assert r.exit_code == 1
    assert "no task 999 (its tasks are 0-9)" in one_error_line(r.stderr)
    r = run("--url", url, "tasks", "revoke", job_name, "4")
    assert r.exit_code == 1
    assert "task 4 is todo, not leased; nothing to revoke" in one_error_line(r.stderr)
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        task = trainer.lease(timeout=1)
        assert task is not None
        r = run("--url", url, "tasks", "revoke", job_name, str(task.id), "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout) == {"job": job_name, "revoked": task.id}


def test_pass_next_expect_names_the_current_pass(
    url: str, client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [1, 2], passes=3, auto_advance=False)
    r = run("--url", url, "pass", "next", job_name, "--expect", "5", "--force")
    assert r.exit_code == 1
    line = one_error_line(r.stderr)
    assert "pass 5 is not reached yet (the current pass is 0)" in line
    assert "moved on" not in line
    r = run("--url", url, "pass", "next", job_name, "--force", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {
        "job": job_name,
        "from_pass": 0,
        "pass": 1,
        "state": "running",
        "skipped": 2,
    }
    r = run("--url", url, "pass", "next", job_name, "--expect", "0", "--force")
    assert r.exit_code == 1
    assert "pass 0 is over, the pass moved on to 1 meanwhile" in one_error_line(r.stderr)


def test_mutating_commands_print_json(url: str, client: taskq.Client, job_name: str) -> None:
    client.create_job(job_name, [1, 2], passes=2)
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        assert trainer.lease(timeout=1) is not None
        r = run("--url", url, "workers", "drain", job_name, "--all", "--json")
        assert json.loads(r.stdout) == {"job": job_name, "draining": [trainer.worker_id]}
        r = run("--url", url, "pass", "reset", job_name, "--json")
        assert json.loads(r.stdout) == {"job": job_name, "pass": 0, "attempt": 2}
        r = run("--url", url, "job", "cancel", job_name, "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout) == {
            "job": job_name,
            "state": "cancelled",
            "state_before": "running",
            "pass": 0,
            "leases_revoked": 0,
        }
    r = run("--url", url, "job", "delete", job_name, "--yes", "--json")
    assert json.loads(r.stdout) == {
        "job": job_name,
        "deleted": True,
        "state_before": "cancelled",
        "tasks": 2,
    }


# -- failure causes -------------------------------------------------------------------------
CAUSE = "exit 3: ValueError: cannot decode shard 2\nstep pid 77 starting\nTraceback ..."


def test_events_keep_one_line_per_event_and_json_numbers(
    url: str, client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [1, 2], max_failures=1)
    fail_once(client, url, job_name, CAUSE)
    r = run("--url", url, "events", job_name)
    lines = r.stdout.splitlines()
    failed = [line for line in lines if " failed " in line]
    assert len(failed) == 1
    assert "error='exit 3: ValueError: cannot decode shard 2 (+2 more lines)'" in failed[0]
    assert all(line[:2].isdigit() for line in lines)  # every line is an event
    r = run("--url", url, "events", job_name, "--json")
    events = [json.loads(line) for line in r.stdout.splitlines()]
    created = next(e for e in events if e["type"] == "job_created")
    assert created["tasks"] == 2 and created["pass"] == 0
    assert isinstance(created["incarnation"], str)
    leased = next(e for e in events if e["type"] == "step" and "leased" in e)
    assert leased["leased"] == [0] and isinstance(leased["leased_tokens"][0], int)
    assert next(e for e in events if e["type"] == "failed")["error"] == CAUSE


def test_tasks_show_and_dead_list_show_the_cause_and_chunks(
    url: str, client: taskq.Client, job_name: str
) -> None:
    client.create_job(
        job_name, [{"path": f"shard-{i}"} for i in range(4)], chunks_per_task=2, max_failures=1
    )
    dead = fail_once(client, url, job_name, CAUSE)
    r = run("--url", url, "tasks", "list", job_name, "--state", "dead")
    assert r.exit_code == 0, r.output
    assert "exit 3: ValueError: cannot decode shard 2" in r.stdout
    assert '[{"path":"shard-0"},{"path":"shard-1"}]' in r.stdout
    r = run("--url", url, "tasks", "list", job_name, "--state", "dead", "--json")
    row = json.loads(r.stdout)[0]
    assert (row["last_error"], row["chunks"]) == (CAUSE, [{"path": "shard-0"}, {"path": "shard-1"}])
    r = run("--url", url, "tasks", "show", job_name, str(dead))
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert f"task {dead} of job {job_name}: dead (pass 0)" in out
    assert "failures: 1 of 1; attempts: 1 of 10" in out
    assert "last error: exit 3: ValueError: cannot decode shard 2" in out
    assert '  {"path":"shard-0"}' in out
    assert "reason=max_failures" in out  # the dead event, from the history
    r = run("--url", url, "tasks", "show", job_name, str(dead), "--json", "--history", "2")
    data = json.loads(r.stdout)
    assert data["state"] == "dead" and len(data["history"]) == 2
    assert [e["type"] for e in data["history"]] == ["failed", "dead"]
    r = run("--url", url, "tasks", "show", job_name, "7")
    assert r.exit_code == 1 and "no task 7 (its tasks are 0-1)" in one_error_line(r.stderr)


def test_tasks_show_names_the_holder(url: str, client: taskq.Client, job_name: str) -> None:
    client.create_job(job_name, [1, 2])
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        task = trainer.lease(timeout=1)
        assert task is not None
        r = run("--url", url, "tasks", "show", job_name, str(task.id))
        assert f"holder: {trainer.worker_id} (token {task.token}, started, attempt 1)" in r.stdout


# -- tables -----------------------------------------------------------------------------------
def test_tasks_list_has_one_attempts_column_unchanged_by_a_revoke(
    url: str, client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [1])
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        task = trainer.lease(timeout=1)
        assert task is not None
        r = run("--url", url, "tasks", "list", job_name)
        header = r.stdout.splitlines()[1]
        assert header.count("attempt") == 1 and "attempts (max 10)" in header
        row = next(line for line in r.stdout.splitlines() if trainer.worker_id in line)
        assert row.split("│")[3].strip() == "1"
        client.revoke(job_name, task.id)
        r = run("--url", url, "tasks", "list", job_name, "--state", "todo")
        row = next(line for line in r.stdout.splitlines() if line.startswith("│"))
        assert [c.strip() for c in row.split("│")[1:4]] == [str(task.id), "0", "0"]


def test_piped_status_is_not_padded_and_pass_0_took_starts_at_the_first_lease(
    url: str, client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [1, 2], passes=1)
    # nobody trains yet: not part of pass 0's duration (real time: a manual-clock job
    # shows no duration)
    time.sleep(1.2)
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        for _task in trainer:
            pass
    env = {**os.environ, "TASKQ_REDIS_URL": url}
    r = sh("job", "status", job_name, env=env)
    assert r.returncode == 0, r.stderr
    assert all(line == line.rstrip() for line in r.stdout.splitlines())
    row = next(line for line in r.stdout.splitlines() if "completed" in line and "│" in line)
    took = row.split("│")[-2].strip()
    assert took.endswith("s") and float(took[:-1]) < 1.0, row
    audit = sh("job", "audit", job_name, env=env)
    row = next(line for line in audit.stdout.splitlines() if "completed" in line)
    assert row.split("│")[-2].strip() == took


# -- bad values: one line, exit 2 ----------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--worker-ttl", "1", "--heartbeat-interval", "2"],
            "--heartbeat-interval (2.0) must be shorter than --worker-ttl (1.0)",
        ),
        (["--heartbeat-interval", "0.0004"], "0.0004 is not in the range x>=0.01"),
        (["--task-timeout", "0.0001"], "--task-timeout must be at least 0.01 s"),
    ],
)
def test_config_out_of_range_is_a_usage_error(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path, args: list[str], message: str
) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"a": 1}\n')
    r = run("--url", url, "job", "create", job_name, "--manifest", str(manifest), *args)
    assert r.exit_code == 2, r.output
    assert message in one_error_line(r.stderr)
    assert job_name not in client.list_jobs()


def test_create_refuses_an_evicting_redis_unless_allowed(tmp_path: Path, job_name: str) -> None:
    server = RedisServer()
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"a": 1}\n')
    try:
        admin = taskq.connect(server.url)
        admin.redis.config_set("maxmemory-policy", "allkeys-lru")
        r = run("--url", server.url, "job", "create", job_name, "--manifest", str(manifest))
        assert r.exit_code == 2
        line = one_error_line(r.stderr)
        assert "maxmemory-policy allkeys-lru" in line and "--allow-eviction" in line
        assert "allow_eviction=True" not in line
        assert admin.list_jobs() == []
        r = run(
            "--url",
            server.url,
            "job",
            "create",
            job_name,
            "--manifest",
            str(manifest),
            "--allow-eviction",
        )
        assert r.exit_code == 0, r.output
        with pytest.raises(taskq.errors.InvalidConfig, match="allow_eviction=True"):
            admin.create_job(f"{job_name}-2", [1])
        taskq.Client(server.url, allow_eviction=True).create_job(f"{job_name}-2", [1])
    finally:
        server.cleanup()


def test_job_exists_says_the_cli_flags(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path
) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"a": 1}\n')
    client.create_job(job_name, [1])
    r = run("--url", url, "job", "create", job_name, "--manifest", str(manifest))
    assert r.exit_code == 1
    line = one_error_line(r.stderr)
    assert "--replace" in line and "replace=True" not in line


def test_unquoted_glob_says_to_quote_it(url: str, job_name: str, tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"part-{i}.jsonl").write_text("{}\n")
    env = {**os.environ, "TASKQ_REDIS_URL": url}
    # what a shell passes for: --files data/part-*.jsonl
    r = sh(
        "job",
        "create",
        job_name,
        "--files",
        "part-0.jsonl",
        "part-1.jsonl",
        "part-2.jsonl",
        env=env,
        cwd=str(tmp_path),
    )
    assert r.returncode == 2
    line = one_error_line(r.stderr)
    assert "unquoted pattern" in line and "quote it" in line


# -- pass watch off a terminal --------------------------------------------------------------
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_pass_watch_off_a_terminal_prints_lines_and_exits_on_signals(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path, signum: int, code: int
) -> None:
    client.create_job(job_name, [1, 2, 3], passes=None)
    out = tmp_path / "watch.log"
    with open(out, "w") as f:
        proc = subprocess.Popen(
            [ENTRY_POINT, "--url", url, "pass", "watch", job_name, "--interval", "0.1"],
            stdout=f,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        assert wait_until(lambda: "todo 3" in out.read_text(), 15)
        with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
            task = trainer.lease(timeout=1)
            assert task is not None
            trainer.ack(task)
            assert wait_until(lambda: "done 1" in out.read_text(), 15)
        proc.send_signal(signum)
        assert proc.wait(15) == code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    lines = out.read_text().splitlines()
    assert all(f"job {job_name} pass 0 (1 of inf): running" in line for line in lines)
    assert "\x1b" not in out.read_text()  # no terminal control codes
    assert len(lines) == len(set(line[9:] for line in lines))  # one line per change
    assert proc.stderr is not None and "stopped watching" in proc.stderr.read()


def test_pass_watch_on_a_terminal_puts_an_error_on_its_own_line(
    url: str, client: taskq.Client, job_name: str
) -> None:
    import pty
    import select

    client.create_job(job_name, [1, 2, 3], passes=None)
    pid, fd = pty.fork()
    if pid == 0:  # the child: taskq on a terminal
        os.execv(
            ENTRY_POINT, ["taskq", "--url", url, "pass", "watch", job_name, "--interval", "0.1"]
        )
    out = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            out += data
        if b"workers 0" in out and client.list_jobs().count(job_name):
            client.delete_job(job_name)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1
    text = out.decode(errors="replace")
    assert "\x1b[" in text  # a live display
    error = text.index("taskq: error: ")
    before = text[:error].replace("\x1b[?25h", "")  # rich shows the cursor again
    assert before.endswith("\n"), repr(text[-300:])
    assert "not found" in text[error:]
