"""The ``taskq`` CLI: commands through click's CliRunner and through the installed entry
point, against the suite's real redis-server."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import threading
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from support import ENTRY_POINT, assert_no_job, free_port, job_keys, one_error_line
from taskq.cli import job as cli_job
from taskq.cli.main import cli

import taskq
from taskq.keys import jobs_index


def run(url: str, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["--url", url, *args], input=input)


@pytest.fixture
def manifest(tmp_path: Path) -> str:
    path = tmp_path / "chunks.jsonl"
    path.write_text(
        "".join(json.dumps({"path": f"s{i}", "offset": 0, "length": 10}) + "\n" for i in range(10))
    )
    return str(path)


@pytest.fixture
def lines_file(tmp_path: Path) -> str:
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"record {i}\n" for i in range(95)))
    return str(path)


# -- job create ---------------------------------------------------------------------
def test_create_from_manifest_json_has_every_status_key(
    url: str, client: taskq.Client, job_name: str, manifest: str
) -> None:
    options = "--chunks-per-task 3 --passes 2 --json".split()
    r = run(url, "job", "create", job_name, "--manifest", manifest, *options)
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert set(client.status(job_name).as_dict()) <= set(data)
    assert (data["tasks"], data["passes"], data["config"]["chunks"]) == (4, 2, 10)


def test_create_from_files_one_chunk_per_file_sorted(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path
) -> None:
    for name in ("c.bin", "a.bin", "b.bin"):
        (tmp_path / name).write_bytes(b"x")
    r = run(url, "job", "create", job_name, "--files", str(tmp_path / "*.bin"))
    assert r.exit_code == 0, r.output
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        paths = [os.path.basename(t.chunks[0]["path"]) for t in trainer]
    assert paths == ["a.bin", "b.bin", "c.bin"]


def test_create_from_lines_with_options(
    url: str, client: taskq.Client, job_name: str, lines_file: str
) -> None:
    options = (
        "--records-per-chunk 10 --chunks-per-task 2 --passes inf --worker-ttl 3 "
        "--heartbeat-interval 0.5 --task-timeout none --max-failures 2 "
        "--max-attempts 4 --shuffle --seed 7 --manual-advance"
    ).split()
    r = run(url, "job", "create", job_name, "--lines", lines_file, *options)
    assert r.exit_code == 0, r.output
    s = client.status(job_name)
    assert (s.tasks, s.passes, s.config["chunks"]) == (5, None, 10)
    assert s.config == {
        **s.config,
        "worker_ttl": 3.0,
        "heartbeat_interval": 0.5,
        "task_timeout": None,
        "max_failures": 2,
        "max_attempts": 4,
        "shuffle": True,
        "seed": 7,
        "auto_advance": False,
    }


def test_create_has_one_option_per_job_setting_and_no_other() -> None:
    """``taskq job create``'s settings are ``JobConfig``'s fields, named alike, with its
    defaults: a field added without an option (or an option without a field) fails here."""
    command = cli_job.create
    settings = {
        p.name: p for p in command.params if p.expose_value and p.name not in cli_job.CREATE_CALL
    }
    fields = {f.name: f.default for f in dataclasses.fields(taskq.JobConfig)}
    assert set(settings) == set(fields)
    ctx = click.Context(command)
    for name, default in fields.items():
        given = settings[name].get_default(ctx)
        assert (given if given is None else settings[name].type_cast_value(ctx, given)) == default


def test_create_options_take_their_bounds_and_help_from_the_fields() -> None:
    """A setting's option is generated from its field: a number's range is the field's
    bounds (what ``validate_config`` checks), a bool is a flag with an "off" form, and
    the help is the field's (a field named in it reads as its option)."""
    options = {p.name: p for p in cli_job.create.params if isinstance(p, click.Option)}
    for f in dataclasses.fields(taskq.JobConfig):
        option = options[f.name]
        assert option.help and "``" not in option.help and option.show_default
        if isinstance(f.default, bool):
            assert option.is_flag and option.secondary_opts
        elif "min" in f.metadata and f.name not in cli_job.OPTION_TYPES:
            assert isinstance(option.type, (click.IntRange, click.FloatRange))
            assert (option.type.min, option.type.min_open) == (f.metadata["min"], False)
        elif "above" in f.metadata:
            assert isinstance(option.type, click.FloatRange)
            assert (option.type.min, option.type.min_open) == (f.metadata["above"], True)
    assert options["auto_advance"].secondary_opts == ["--manual-advance"]
    assert "--backup-factor x the median" in (options["backup_leases"].help or "")


def test_create_with_bad_settings_says_one_line_and_writes_nothing(
    url: str, client: taskq.Client, job_name: str, manifest: str
) -> None:
    for args, says in (
        (("--heartbeat-interval", "9"), "--heartbeat-interval (9.0) must be shorter"),
        (("--shards", "99"), "shards must be 2.."),
        (("--stream", "--shards", "1", "--max-backlog", "0"), "--max-backlog"),
    ):
        r = run(url, "job", "create", job_name, "--manifest", manifest, *args)
        assert r.exit_code != 0 and says in one_error_line(r.stderr), r.stderr
        assert job_name not in client.list_jobs()


def test_a_settings_error_names_every_setting_as_its_option(
    url: str, client: taskq.Client, job_name: str
) -> None:
    """Any JobConfig setting an InvalidConfig names reads as its option (cli/main.py
    SETTING_WORDS), not only the first eight fields: a mixed job's refusal names three."""
    client.create_job(f"{job_name}-src", [{"i": 0}])
    r = run(url, "job", "create", job_name, "--mix", f"{job_name}-src=1", "--shuffle")
    assert r.exit_code != 0
    assert "no --shards, --stream or --shuffle" in one_error_line(r.stderr), r.stderr
    assert job_name not in client.list_jobs()


def test_passes_zero_means_until_cancelled(
    url: str, client: taskq.Client, job_name: str, manifest: str
) -> None:
    assert (
        run(url, "job", "create", job_name, "--manifest", manifest, "--passes", "0").exit_code == 0
    )
    assert client.status(job_name).passes is None


def test_bad_manifest_line_is_one_line_exit_1_and_no_job(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n' * 4999 + '{"a": \n')
    r = run(url, "job", "create", job_name, "--manifest", str(path))
    assert r.exit_code == 1
    assert "bad manifest line 5000" in one_error_line(r.stderr)
    assert_no_job(client, job_name)


def test_duplicate_name_exit_1_and_job_unchanged(
    url: str, client: taskq.Client, job_name: str, manifest: str, lines_file: str
) -> None:
    assert run(url, "job", "create", job_name, "--manifest", manifest).exit_code == 0
    before = client.status(job_name)
    r = run(url, "job", "create", job_name, "--lines", lines_file, "--records-per-chunk", "1")
    assert r.exit_code == 1
    assert "exists" in one_error_line(r.stderr)
    after = client.status(job_name)
    assert (after.incarnation, after.tasks) == (before.incarnation, before.tasks)


def test_exist_ok_leaves_an_existing_job_as_it_is_and_exits_0(
    url: str, client: taskq.Client, job_name: str, manifest: str, lines_file: str
) -> None:
    assert run(url, "job", "create", job_name, "--manifest", manifest).exit_code == 0
    before = client.status(job_name)
    options = "--records-per-chunk 1 --exist-ok".split()
    r = run(url, "job", "create", job_name, "--lines", lines_file, *options)
    assert r.exit_code == 0, r.output
    assert "exists: left as it is" in r.stdout
    after = client.status(job_name)
    assert (after.incarnation, after.tasks) == (before.incarnation, before.tasks)
    assert not [k for k in job_keys(client, job_name) if "staging" in k]
    r = run(url, "job", "create", job_name, "--manifest", manifest, "--exist-ok", "--replace")
    assert r.exit_code == 2 and "exclude each other" in r.stderr


def test_replace_makes_a_new_incarnation(
    url: str, client: taskq.Client, job_name: str, manifest: str, lines_file: str
) -> None:
    assert run(url, "job", "create", job_name, "--manifest", manifest).exit_code == 0
    before = client.status(job_name).incarnation
    options = "--records-per-chunk 50 --replace".split()
    r = run(url, "job", "create", job_name, "--lines", lines_file, *options)
    assert r.exit_code == 0, r.output
    after = client.status(job_name)
    assert after.incarnation != before and after.tasks == 2


@pytest.mark.parametrize(
    "args",
    [
        [],  # no source
        ["--manifest", "{manifest}", "--files", "*.none"],  # two sources
        ["--lines", "{lines}"],  # no --records-per-chunk
        ["--manifest", "{manifest}", "--records-per-chunk", "3"],
        ["--lines", "{lines}", "--records-per-chunk", "0"],
        ["--manifest", "{manifest}", "--passes", "-1"],
        ["--manifest", "{manifest}", "--passes", "three"],
        ["--manifest", "{manifest}", "--task-timeout", "soon"],
        ["--manifest", "{manifest}", "--task-timeout", "-5"],
        ["--manifest", "{manifest}", "--worker-ttl", "abc"],
        ["--manifest", "{manifest}", "--worker-ttl", "0"],
        ["--manifest", "{manifest}", "--chunks-per-task", "0"],
        ["--manifest", "{manifest}", "--max-failures", "0"],
        ["--manifest", "{manifest}", "--bogus-option"],
    ],
    ids=lambda a: " ".join(a) or "no-source",
)
def test_bad_option_values_are_usage_errors_exit_2(
    url: str, client: taskq.Client, job_name: str, manifest: str, lines_file: str, args: list[str]
) -> None:
    args = [a.format(manifest=manifest, lines=lines_file) for a in args]
    r = run(url, "job", "create", job_name, *args)
    assert r.exit_code == 2, r.output
    one_error_line(r.stderr)
    assert_no_job(client, job_name)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--files", "/nonexistent-dir/*.bin"], "no files match"),
        (["--lines", "/nonexistent-file.txt", "--records-per-chunk", "5"], "cannot read"),
    ],
)
def test_invalid_values_exit_1_and_no_job(
    url: str, client: taskq.Client, job_name: str, manifest: str, args: list[str], message: str
) -> None:
    if "--files" not in args and "--lines" not in args:
        args = ["--manifest", manifest, *args]
    r = run(url, "job", "create", job_name, *args)
    assert r.exit_code == 1, r.output
    assert message in one_error_line(r.stderr)
    assert_no_job(client, job_name)


def test_bad_job_name_exit_1(url: str, manifest: str) -> None:
    r = run(url, "job", "create", "bad name!", "--manifest", manifest)
    assert r.exit_code == 1
    assert "bad job name" in one_error_line(r.stderr)


# -- unknown job and unreachable Redis --------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["job", "status"],
        ["job", "delete", "--yes"],
        ["job", "cancel"],
        ["job", "audit"],
        ["pass", "next"],
        ["pass", "reset"],
        ["pass", "watch"],
        ["tasks", "list"],
        ["tasks", "retry"],
        ["tasks", "revoke", "{job}", "0"],
        ["workers", "list"],
        ["workers", "drain", "{job}", "w1"],
        ["events"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_unknown_job_is_one_line_exit_1(
    url: str, client: taskq.Client, job_name: str, args: list[str]
) -> None:
    argv = [a.format(job=job_name) for a in args]
    if "{job}" not in args:
        argv.append(job_name)
    r = run(url, *argv)
    assert r.exit_code == 1, r.output
    assert "not found" in one_error_line(r.stderr)
    assert_no_job(client, job_name)


def test_redis_unreachable_is_one_line_exit_1(manifest: str) -> None:
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    for args in (
        ["job", "status", "x"],
        ["job", "create", "x", "--manifest", manifest],
        ["job", "list"],
    ):
        r = run(dead_url, *args)
        assert r.exit_code == 1, r.output
        assert "cannot reach Redis" in one_error_line(r.stderr)


# -- job status / list / delete / cancel / audit ----------------------------------------
def test_status_shows_state_pass_counts_and_summaries(
    url: str, client: taskq.Client, job_name: str, manifest: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(4)], passes=2)
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        for _ in range(5):
            trainer.ack(trainer.lease(timeout=1))
    r = run(url, "job", "status", job_name)
    assert r.exit_code == 0, r.output
    for text in (
        "running",
        "pass",
        "1 (2 of 2)",
        "todo / leased / done / dead",
        "3 / 0 (reserved 0) / 1 / 0",
        "throughput",
        "eta",
        "passes",
        "completed",
    ):
        assert text in r.stdout, text


def test_list_shows_jobs_and_json(url: str, client: taskq.Client, job_name: str) -> None:
    client.create_job(job_name, [1, 2, 3], passes=None)
    r = run(url, "job", "list", "--json")
    assert r.exit_code == 0, r.output
    rows = {row["job"]: row for row in json.loads(r.stdout)}
    assert rows[job_name]["tasks"] == 3 and rows[job_name]["passes"] is None
    r = run(url, "job", "list")
    assert job_name in r.stdout and "0 (1 of inf)" in r.stdout


def test_list_repair_adds_a_job_missing_from_the_index(
    url: str, client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [1])
    client.redis.srem(
        jobs_index(client.connection.prefix), job_name
    )  # as after an interrupted create
    assert job_name not in client.list_jobs()
    r = run(url, "job", "list", "--repair", "--json")
    assert r.exit_code == 0, r.output
    assert job_name in [row["job"] for row in json.loads(r.stdout)]


def test_list_shows_an_unreadable_job_without_failing(
    url: str, client: taskq.Client, job_name: str
) -> None:
    good, foreign = f"{job_name}-ok", f"{job_name}-foreign"
    client.create_job(good, [1])
    client.redis.set(client.keys(foreign).meta, "a string another tool wrote")
    client.redis.sadd(jobs_index(client.connection.prefix), foreign)
    try:
        r = run(url, "job", "list", "--json")
        assert r.exit_code == 0, r.output
        states = {row["job"]: row["state"] for row in json.loads(r.stdout)}
        assert (states[good], states[foreign]) == ("running", "unreadable")
    finally:
        client.redis.delete(client.keys(foreign).meta)
        client.redis.srem(jobs_index(client.connection.prefix), foreign)


def test_delete_asks_and_yes_deletes(url: str, client: taskq.Client, job_name: str) -> None:
    client.create_job(job_name, [1, 2])
    r = run(url, "job", "delete", job_name, input="n\n")
    assert r.exit_code == 1 and "aborted" in r.stderr
    assert client.status(job_name).tasks == 2
    r = run(url, "job", "delete", job_name, "--yes")
    assert r.exit_code == 0, r.output
    assert_no_job(client, job_name)


def test_cancel_then_status_is_cancelled(url: str, client: taskq.Client, job_name: str) -> None:
    client.create_job(job_name, [1, 2])
    assert run(url, "job", "cancel", job_name).exit_code == 0
    r = run(url, "job", "status", job_name, "--json")
    assert json.loads(r.stdout)["state"] == "cancelled"


def test_audit_json_reports_passes_and_ok(url: str, client: taskq.Client, job_name: str) -> None:
    client.create_job(job_name, [1, 2, 3], passes=1)
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        for _task in trainer:
            pass
    r = run(url, "job", "audit", job_name, "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["ok"] and report["passes"][0]["done"] == 3
    r = run(url, "job", "audit", job_name)
    assert r.exit_code == 0 and "done_matches_bitmap" in r.stdout


# -- passes -------------------------------------------------------------------------
def test_pass_next_refuses_incomplete_pass_then_force_skips(
    url: str, client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [1, 2, 3], passes=3, auto_advance=False)
    r = run(url, "pass", "next", job_name)
    assert r.exit_code == 1
    assert "--force" in one_error_line(r.stderr)
    assert client.status(job_name).pass_no == 0
    r = run(url, "pass", "next", job_name, "--force")
    assert r.exit_code == 0, r.output
    assert client.status(job_name).pass_no == 1
    skipped = [s for s in client.audit(job_name)["passes"] if s["pass"] == 0]
    assert skipped[-1]["skipped"] == 3


def test_pass_next_at_manual_boundary_and_reset(
    url: str, client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [1, 2], passes=2, auto_advance=False)
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        trainer.ack(trainer.lease(timeout=1))
        trainer.ack(trainer.lease(timeout=1))
    assert client.status(job_name).reason == "manual_advance"
    r = run(url, "pass", "next", job_name)
    assert r.exit_code == 0 and "pass 1" in r.stdout
    r = run(url, "pass", "next", job_name, "--expect", "0")
    assert r.exit_code == 1
    one_error_line(r.stderr)
    r = run(url, "pass", "reset", job_name)
    assert r.exit_code == 0, r.output
    assert client.status(job_name).pass_attempt == 1


def test_pass_watch_ends_when_the_job_completes(
    url: str, client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, list(range(6)), passes=2)

    def train() -> None:
        with taskq.Trainer(job_name, url=url, handle_signals=False) as trainer:
            for _task in trainer:
                pass

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    r = run(url, "pass", "watch", job_name, "--interval", "0.1")
    thread.join(30)
    assert r.exit_code == 0, r.output
    assert "completed" in r.stdout


# -- tasks, workers, events -----------------------------------------------------------
def test_tasks_list_leased_retry_dead_and_revoke(
    url: str, client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, list(range(4)), max_failures=1)
    trainer = taskq.Trainer(job_name, url=url, heartbeat=False)
    try:
        held = trainer.lease(timeout=1)
        bad = trainer.lease(timeout=1)
        assert held is not None and bad is not None
        trainer.fail(bad, "boom")
        r = run(url, "tasks", "list", job_name, "--json")
        rows = json.loads(r.stdout)
        assert [(x["id"], x["worker"], x["token"]) for x in rows] == [
            (held.id, trainer.worker_id, held.token)
        ]
        assert "age_s" in rows[0] and rows[0]["attempt"] >= 1
        r = run(url, "tasks", "list", job_name, "--state", "dead", "--json")
        assert [x["id"] for x in json.loads(r.stdout)] == [bad.id]
        r = run(url, "tasks", "retry", job_name, "--id", str(bad.id))
        assert r.exit_code == 0 and "1 task(s) retried" in r.stdout
        assert client.status(job_name).dead == 0
        r = run(url, "tasks", "revoke", job_name, str(held.id))
        assert r.exit_code == 0 and "revoked" in r.stdout
        assert client.status(job_name).leased == 0
        r = run(url, "tasks", "list", job_name, "--state", "todo", "--limit", "2", "--json")
        assert len(json.loads(r.stdout)) == 2
    finally:
        trainer.close()


def test_workers_list_and_drain(url: str, client: taskq.Client, job_name: str) -> None:
    client.create_job(job_name, list(range(4)))
    trainer = taskq.Trainer(job_name, url=url, heartbeat=False)
    try:
        trainer.lease(timeout=1)
        r = run(url, "workers", "list", job_name, "--json")
        rows = json.loads(r.stdout)
        assert [(w["id"], w["pid"], w["leases"]) for w in rows] == [
            (trainer.worker_id, os.getpid(), 1)
        ]
        r = run(url, "workers", "list", job_name)
        assert trainer.worker_id in r.stdout
        r = run(url, "workers", "drain", job_name, trainer.worker_id)
        assert r.exit_code == 0, r.output
        assert json.loads(run(url, "workers", "list", job_name, "--json").stdout)[0]["draining"]
        r = run(url, "workers", "drain", job_name)
        assert r.exit_code == 2
        one_error_line(r.stderr)
    finally:
        trainer.close()


def test_events_json_lines(url: str, client: taskq.Client, job_name: str) -> None:
    client.create_job(job_name, [1])
    with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
        for _task in trainer:
            pass
    r = run(url, "events", job_name, "--json")
    assert r.exit_code == 0, r.output
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    types = [e["type"] for e in lines]
    assert "step" in types and "job_completed" in types
    assert any(e.get("acked") == [0] for e in lines if e["type"] == "step")
    r = run(url, "events", job_name, "-n", "1")
    assert len(r.stdout.splitlines()) == 1


def test_events_json_keeps_the_entry_id_of_a_checkpoint_event(
    url: str, client: taskq.Client, job_name: str
) -> None:
    """A checkpoint event names its checkpoint in ``checkpoint``; ``id`` is the stream
    entry's id on every line, as ``--follow`` resumes from it."""
    client.create_job(job_name, [1, 2])
    ckpt = client.job(job_name).checkpoint()
    r = run(url, "events", job_name, "--json")
    assert r.exit_code == 0, r.output
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    entry_ids = [event_id for event_id, _ in client.events(job_name, since="-", count=100)]
    assert [e["id"] for e in lines] == entry_ids
    [event] = [e for e in lines if e["type"] == "checkpoint"]
    assert event["checkpoint"] == ckpt["id"]


# -- the installed entry point -----------------------------------------------------------
def sh(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ENTRY_POINT, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd="/"
    )


def test_entry_point_version_and_help() -> None:
    r = sh("--version")
    assert r.returncode == 0 and taskq.__version__ in r.stdout
    r = sh("--help")
    assert r.returncode == 0
    for command in (
        "job",
        "pass",
        "tasks",
        "workers",
        "events",
        "reaper",
        "exporter",
        "demo",
        "work",
    ):
        assert command in r.stdout


def test_entry_point_create_and_status_via_env_url(
    url: str, job_name: str, lines_file: str
) -> None:
    env = {**os.environ, "TASKQ_REDIS_URL": url}
    r = sh("job", "create", job_name, "--lines", lines_file, "--records-per-chunk", "10", env=env)
    assert r.returncode == 0, r.stderr
    r = sh("job", "status", job_name, "--json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["tasks"] == 10


def test_entry_point_errors_are_one_line(
    url: str, client: taskq.Client, job_name: str, tmp_path: Path, manifest: str
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\nnope\n')
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    cases = [
        (["--url", url, "job", "status", job_name], 1, "not found"),
        (
            ["--url", url, "job", "create", job_name, "--manifest", str(bad)],
            1,
            "bad manifest line 2",
        ),
        (["--url", dead_url, "job", "list"], 1, "cannot reach Redis"),
        (
            ["--url", url, "job", "create", job_name, "--manifest", manifest, "--passes", "x"],
            2,
            "--passes",
        ),
        (["--url", url, "nosuchcommand"], 2, "nosuchcommand"),
    ]
    for args, code, text in cases:
        r = sh(*args)
        assert r.returncode == code, (args, r.stderr)
        assert text in one_error_line(r.stderr)
        assert "Traceback" not in r.stderr
    assert_no_job(client, job_name)
    assert sh("--url", url, "job", "create", job_name, "--manifest", manifest).returncode == 0
    r = sh("--url", url, "job", "create", job_name, "--manifest", manifest)
    assert r.returncode == 1 and "exists" in one_error_line(r.stderr)


def test_reaper_gives_up_when_redis_unreachable() -> None:
    r = sh("--url", f"redis://127.0.0.1:{free_port()}/0", "reaper", "--give-up-after", "1")
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1].startswith("taskq: error: reaper gave up")


def test_exporter_port_in_use_is_one_line(url: str) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = sh("--url", url, "exporter", "--port", str(port), "--addr", "127.0.0.1")
    assert r.returncode == 1
    assert "cannot listen" in one_error_line(r.stderr)


def test_demo_without_redis_server_names_the_install_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TASKQ_REDIS_URL"}
    env["PATH"] = str(tmp_path)  # no redis-server here
    r = sh("demo", env=env)
    assert r.returncode == 1
    assert one_error_line(r.stderr) == (
        "taskq: error: redis-server not found; install with: sudo apt-get install -y redis-server"
    )


def test_shell_completion_completes_commands_and_options() -> None:
    env = {
        **os.environ,
        "_TASKQ_COMPLETE": "bash_complete",
        "COMP_WORDS": "taskq jo",
        "COMP_CWORD": "1",
    }
    r = subprocess.run([ENTRY_POINT], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0 and "plain,job" in r.stdout.split()
    env.update(COMP_WORDS="taskq job create x --records", COMP_CWORD="4")
    r = subprocess.run([ENTRY_POINT], capture_output=True, text=True, env=env, timeout=30)
    assert "plain,--records-per-chunk" in r.stdout.split()


def test_events_follow_prints_new_events_until_ctrl_c(
    url: str, client: taskq.Client, job_name: str
) -> None:
    import signal

    client.create_job(job_name, [1, 2])
    proc = subprocess.Popen(
        [ENTRY_POINT, "--url", url, "events", job_name, "--follow", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["type"] == "job_created"
        with taskq.Trainer(job_name, url=url, heartbeat=False) as trainer:
            task = trainer.lease(timeout=1)
            assert task is not None
            trainer.ack(task)
        seen: list[str] = []  # the kinds of the step entries, in order
        while "acked" not in seen:
            e = json.loads(proc.stdout.readline())
            seen += [k for k in ("leased", "acked") if e["type"] == "step" and k in e]
        assert seen.index("leased") < seen.index("acked")
        proc.send_signal(signal.SIGINT)
        proc.wait(15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0
