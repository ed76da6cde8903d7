"""Per-job credentials (``taskq acl``) on a real redis-server with ACL users.

The server runs deploy/redis/acl.conf (test passwords) plus a superuser ``tester`` that
applies the generated users. Two jobs, A and B, each with a trainer user made by
``taskq.ops.acl.trainer_rule``: a trainer of A runs whole passes of A and can neither read nor
change anything of B, even holding B's lease token; it cannot run the admin functions of
A either (first-argument ``FCALL`` rules); what it can still do within A is pinned here
too, as docs/security.md states it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from support import SERVER_BINARY, free_port, stop_process, wait_until

import taskq
from taskq.admin.stats import parse_lease
from taskq.engine.contract import Code
from taskq.engine.library import LIBRARY, SOURCE, VERBS
from taskq.keys import JOB_KEYS, META_FIELDS, JobKeys
from taskq.ops import acl
from taskq.ops.exporter import TaskqCollector
from taskq.ops.reaper import Reaper
from taskq.testing import lease_secret, script_function

ROOT = Path(__file__).resolve().parents[2]
ACL_FILE = ROOT / "deploy" / "redis" / "acl.conf"
TASKQ_CLI = os.path.join(os.path.dirname(sys.executable), "taskq")
ROLES = ("trainer", "reaper", "exporter", "admin")
TESTER = ("tester", "tester-pw")


def password(user: str) -> str:
    return f"pw-{user}-s3cr3t"


class AclServer:
    """A redis-server loaded with acl.conf (+ ``tester``), its ACL file kept for ACL LOAD."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="taskq-tenants-"))
        text = ACL_FILE.read_text()
        for role in ROLES:
            text = text.replace(f">CHANGE_ME_{role}", f">{password(role)}")
        self.aclfile = self.dir / "acl.conf"
        self.aclfile.write_text(text + f"user {TESTER[0]} on >{TESTER[1]} ~* &* +@all\n")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                SERVER_BINARY,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                "--aclfile",
                str(self.aclfile),
                "--logfile",
                str(self.dir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.tester = redis.Redis(
            port=self.port, username=TESTER[0], password=TESTER[1], decode_responses=True
        )

        def up() -> bool:
            try:
                return bool(self.tester.ping())
            except redis.exceptions.RedisError:
                return self.proc.poll() is not None

        if not wait_until(up) or self.proc.poll() is not None:
            self.cleanup()
            raise RuntimeError("redis-server with the ACL file did not start")

    def url(self, user: str, pw: str | None = None) -> str:
        return f"redis://{user}:{pw or password(user)}@127.0.0.1:{self.port}/0"

    def apply(self, rule: acl.Rule) -> str:
        """Create the user; returns its URL."""
        acl.apply(self.tester, rule)
        return self.url(rule.user)

    def dryrun(self, user: str, *command: str) -> bool:
        reply = self.tester.execute_command("ACL", "DRYRUN", user, *command)
        if reply == "OK":
            return True
        assert "no permissions" in str(reply), reply
        return False

    def cleanup(self) -> None:
        stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def server() -> Iterator[AclServer]:
    s = AclServer()
    yield s
    s.cleanup()


class Jobs:
    """Jobs A and B (created by acl.conf's admin) and a trainer user for each."""

    def __init__(self, server: AclServer, base: str, **config: Any) -> None:
        self.server = server
        self.admin = taskq.connect(server.url("admin"))
        self.a, self.b = f"{base}-a", f"{base}-b"
        for job in (self.a, self.b):
            self.admin.create_job(job, [{"i": i} for i in range(6)], **config)
        self.url_a = server.apply(acl.trainer_rule(self.a, password=password(f"trainer-{self.a}")))
        self.url_b = server.apply(acl.trainer_rule(self.b, password=password(f"trainer-{self.b}")))
        self.client_a = taskq.connect(self.url_a, retries=0)
        self.raw_a = redis.Redis.from_url(self.url_a, decode_responses=True)
        self.user_a = f"trainer-{self.a}"


@pytest.fixture
def jobs(server: AclServer, job_name: str) -> Jobs:
    return Jobs(server, job_name[:50])


def assert_refused(exc: BaseException, user: str) -> None:
    """One readable taskq error: says ACL, masks the URL, never shows the password."""
    text = str(exc)
    assert isinstance(exc, taskq.TaskqError), type(exc)
    assert "refused by ACL" in text and "***" in text, text
    assert password(user) not in text and "\n" not in text


def admin_calls(c: taskq.Client, job: str) -> list[Callable[[], object]]:
    """What an operator does to ``job`` (cancel, advance, reset, delete, retry, revoke,
    drain, reap): no trainer's function among them."""
    return [
        lambda: c.cancel_job(job),
        lambda: c.next_pass(job, 0, force=True),
        lambda: c.reset_pass(job, 0),
        lambda: c.delete_job(job),
        lambda: c.retry(job),
        lambda: c.revoke(job, 0),
        lambda: c.drain(job, "w"),
        lambda: c.reap(job),
    ]


def refused(call: Any, user: str) -> None:
    with pytest.raises(taskq.TaskqError) as e:
        call()
    assert_refused(e.value, user)


# --- what a trainer of A can do --------------------------------------------------------------


def test_trainer_credential_runs_whole_passes_of_its_job(jobs: Jobs) -> None:
    jobs.admin.create_job(jobs.a, [{"i": i} for i in range(6)], passes=2, replace=True)
    seen = []
    with taskq.Trainer(jobs.a, url=jobs.url_a, prefetch=1) as trainer:
        first = trainer.lease(timeout=1)
        assert first is not None
        trainer.fail(first, "once")  # back for a retry
        second = trainer.lease(timeout=1)
        assert second is not None
        trainer.release(second)
        assert trainer.heartbeat() == []
        for tasks in trainer.passes():  # the ack that ends pass 0 starts pass 1
            seen += [(t.pass_no, t.id) for t in tasks]
    assert sorted(seen) == [(p, i) for p in range(2) for i in range(6)]
    status = jobs.admin.status(jobs.a)
    assert status.state == "completed"
    assert (status.counters["failed"], status.counters["released"]) == (1, 1)
    assert status.workers == 0  # left on close
    assert jobs.admin.audit(jobs.a)["ok"]
    assert jobs.client_a.status(jobs.a).state == "completed"  # stats is the trainer's


# --- nothing of B ------------------------------------------------------------------------


def test_trainer_of_a_cannot_read_b(jobs: Jobs) -> None:
    keys_b = jobs.admin.keys(jobs.b)
    for command in (
        ("HGETALL", keys_b.chunks),
        ("HGETALL", keys_b.leases),
        ("HGETALL", keys_b.meta),
        ("XRANGE", keys_b.events, "-", "+"),
        ("SMEMBERS", "taskq:jobs"),
        ("SCAN", "0"),
        ("KEYS", "*"),
        # client-side caching would push the names of B's changed keys (BCAST), or send
        # pushes to another client's connection (REDIRECT)
        ("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "taskq:"),
        ("CLIENT", "TRACKING", "ON"),
        ("CLIENT", "CACHING", "YES"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            jobs.raw_a.execute_command(*command)
    refused(lambda: jobs.client_a.status(jobs.b), jobs.user_a)
    refused(jobs.client_a.list_jobs, jobs.user_a)
    refused(lambda: jobs.client_a.tasks(jobs.b, "todo"), jobs.user_a)
    refused(lambda: taskq.Trainer(jobs.b, url=jobs.url_a, reconnect_timeout=0), jobs.user_a)


def test_trainer_of_a_cannot_ack_fail_or_release_b_even_with_its_token(jobs: Jobs) -> None:
    holder = taskq.Trainer(jobs.b, url=jobs.url_b, heartbeat=False)
    task = holder.lease(timeout=1)
    assert task is not None
    who = [holder.job_incarnation, holder.worker_id, holder.incarnation]
    writes = {
        "ack": [*who, 99, 1, task.id, task.token, 0, 0, "S", -1, lease_secret(holder)],
        "fail": [*who, "x", 1, task.id, task.token, lease_secret(holder)],
        "release": [*who, 1, task.id, task.token, lease_secret(holder)],
        "heartbeat": [*who, 99, 1, task.id, task.token, lease_secret(holder)],
        "leave": [*who, lease_secret(holder)],
    }
    for verb, args in writes.items():
        refused(
            lambda verb=verb, args=args: jobs.client_a.connection.run(jobs.b, verb, args),
            jobs.user_a,
        )
    holder.ack(task)  # the real holder's ack counts: it was nobody's quiet repeat
    status = jobs.admin.status(jobs.b)
    assert (status.done, status.counters["acked"], status.counters["stale"]) == (1, 1, 0)
    assert (status.counters["failed"], status.counters["released"]) == (0, 0)
    holder.close()


def test_trainer_of_a_cannot_cancel_advance_reset_or_change_b(jobs: Jobs) -> None:
    b = jobs.b
    for call in admin_calls(jobs.client_a, b):
        refused(call, jobs.user_a)
    meta_b = jobs.admin.keys(b).meta
    for command in (
        ("HSET", meta_b, "state", "cancelled"),
        ("HDEL", meta_b, "inc"),
        ("DEL", meta_b),
        ("DEL", jobs.admin.keys(b).done),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            jobs.raw_a.execute_command(*command)
    status = jobs.admin.status(b)
    assert (status.state, status.pass_no, status.tasks, status.todo) == ("running", 0, 6, 6)
    assert jobs.admin.audit(b)["ok"]


# --- within A: no admin functions; the writes of its own functions stay possible ----------


def test_trainer_of_a_cannot_run_the_admin_functions_of_a(jobs: Jobs) -> None:
    c, a = jobs.client_a, jobs.a
    for call in (
        *admin_calls(c, a),
        lambda: c.advance_clock(a, 10),
        lambda: c.tasks(a, "todo"),
        lambda: c.create_job(a, [{"i": 0}], replace=True),
    ):
        refused(call, jobs.user_a)
    with pytest.raises(redis.exceptions.NoPermissionError):
        jobs.raw_a.function_load(
            "#!lua name=x\nredis.register_function('x', function() return 1 end)"
        )
    # another library's functions (an older or newer taskq) are refused by name as well
    assert not jobs.server.dryrun(
        jobs.user_a, "FCALL", "taskq_000000000000_ack", "1", jobs.admin.keys(a).meta
    )
    # names match case-insensitively, as FCALL finds functions: no way around by case
    meta = jobs.admin.keys(a).meta
    assert jobs.server.dryrun(jobs.user_a, "FCALL", f"{LIBRARY}_ACK".upper(), "1", meta)
    assert not jobs.server.dryrun(jobs.user_a, "FCALL", f"{LIBRARY}_cancel".upper(), "1", meta)
    status = jobs.admin.status(a)
    assert (status.state, status.pass_no, status.tasks, status.todo) == ("running", 0, 6, 6)


def test_trainer_of_a_keeps_the_raw_writes_its_functions_make_on_a(
    server: AclServer, jobs: Jobs
) -> None:
    """What cannot be fenced: the commands inside the trainer's functions are allowed on
    their own too (docs/security.md says so); the chunks, the clock and deletes of
    anything but per-pass keys are not."""
    k = jobs.admin.keys(jobs.a)
    user = jobs.user_a
    allowed = [
        ("HSET", k.meta, "state", "cancelled"),
        ("HDEL", k.meta, "inc"),
        ("HGETALL", k.leases),
        ("HGETALL", k.chunks),
        ("ZADD", k.front, "1", "0"),
        ("DEL", k.done),
        ("UNLINK", k.owned),
        ("BLPOP", k.wake, "1"),
    ]
    denied = [
        ("HSET", k.chunks, "0", "[]"),
        ("DEL", k.meta),
        ("UNLINK", k.chunks),
        ("DEL", k.leases),
        ("DEL", k.counts),
        ("UNLINK", k.events),
        ("DEL", k.dead),
        ("SET", k.clock, "1"),
        ("SET", k.lock, "x"),
        ("SET", k.meta, "x"),
        ("RENAME", k.meta, k.lock),
        ("BLPOP", k.meta, "1"),
        ("HSET", k.passes + "x", "a", "b"),
        ("FLUSHALL",),
        ("CONFIG", "GET", "maxmemory"),
    ]
    assert [c for c in allowed if not server.dryrun(user, *c)] == []
    assert [c for c in denied if server.dryrun(user, *c)] == []


def test_within_a_a_read_token_cannot_end_another_workers_lease(jobs: Jobs) -> None:
    """Whoever holds A's credential reads A's leases (tokens included), but ending a
    lease takes its holder's lease secret, which no key holds: an ack in another A
    worker's name with the token read there is refused (stale, counted forged), and the
    holder's own ack then counts."""
    holder = taskq.Trainer(jobs.a, url=jobs.url_a, heartbeat=False)
    task = holder.lease(timeout=1)
    assert task is not None
    k = jobs.admin.keys(jobs.a)
    lease = parse_lease(jobs.raw_a.hget(k.leases, str(task.id)))
    assert lease is not None and lease["token"] == task.token
    job_inc = jobs.raw_a.hget(k.meta, "inc")
    reply = jobs.client_a.connection.run(
        jobs.a,
        "ack",
        [
            job_inc,
            lease["worker"],
            lease["worker_incarnation"],
            10**6,
            1,
            task.id,
            lease["token"],
            0,
            0,
            "S",
            -1,
            "a guess of my own making",
        ],
        passthrough=(Code.REREGISTER,),
    )
    assert reply[4] == [Code.STALE]
    holder.ack(task)  # counts: the forged ack ended nothing
    status = jobs.admin.status(jobs.a)
    assert (status.done, status.counters["acked"], status.counters["stale"]) == (1, 1, 0)
    assert status.counters["forged"] == 1
    holder.close()


def test_within_a_a_raw_hdel_of_the_meta_breaks_the_job_until_replaced(jobs: Jobs) -> None:
    k = jobs.admin.keys(jobs.a)
    assert jobs.raw_a.hdel(k.meta, "inc") == 1  # allowed: the functions HDEL the meta
    with pytest.raises(taskq.CorruptData):
        jobs.admin.status(jobs.a)
    with pytest.raises(taskq.JobNotFound):
        jobs.admin.delete_job(jobs.a)
    jobs.admin.create_job(jobs.a, [{"i": 0}], replace=True)
    assert jobs.admin.status(jobs.a).todo == 1
    assert jobs.admin.status(jobs.b).todo == 6  # B is out of its reach


#: `redis.call` is bound to the local `rcall` in each Lua part and verb (`local rcall = redis.call`)
LUA_CALL = re.compile(r"(?:\bredis\.p?call|\brcall)\(\s*'([A-Za-z]+)'\s*(?:,\s*(K_[A-Z0-9_]+))?")


def library_calls(verbs: tuple[str, ...]) -> set[tuple[str, str | None]]:
    """(command, job key or None) of every redis.call in the shared definitions and in the
    bodies of ``verbs`` (the library text as loaded: the generated ground, the lib/ parts,
    then each verb's closure, ``VERBS.<verb> = (function() ... end)()``)."""
    closure = re.compile(r"^VERBS\.(\w+) = \(function\(\)\n(.*?)\nend\)\(\)\n", re.S | re.M)
    bodies = {m.group(1): m.group(2) for m in closure.finditer(SOURCE)}
    first = SOURCE.index("\nVERBS.")
    shared = SOURCE[:first] + SOURCE[SOURCE.index("\nBUILT = true", first) :]
    assert set(verbs) <= set(bodies), "the library's layout changed: update this test"
    found = set()
    for text in [shared, *(bodies[v] for v in verbs)]:
        for command, key in LUA_CALL.findall(text):
            found.add((command.upper(), key[2:].lower() if key else None))
    return found


_PART = re.compile(r"^lib\.(\w+) = \(function\(\)\n(.*?)\nend\)\(\)\n", re.S | re.M)
_FUNC = re.compile(r"^local function (\w+)\(", re.M)
_ALIAS = re.compile(r"^local ([\w, ]+?) =\s*([\w.]+(?:,\s*[\w.]+)*)", re.M)


def _aliases(text: str) -> dict[str, tuple[str, str]]:
    """``local a, b = lib.x.a, lib.y.b``: name -> (part, function)."""
    out = {}
    for names, values in _ALIAS.findall(text):
        for name, value in zip(names.split(","), values.split(","), strict=False):
            m = re.fullmatch(r"lib\.(\w+)\.(\w+)", value.strip())
            if m:
                out[name.strip()] = (m.group(1), m.group(2))
    return out


def reached_calls(verb: str) -> set[tuple[str, str | None]]:
    """(command, job key or None) of every redis.call in ``verb``'s body and in the lib/
    functions it reaches, transitively (each part's ``local function``s, through the
    aliases a part or a verb makes of another's): what the verb can run, no more."""
    parts = {}
    for name, text in _PART.findall(SOURCE):
        starts = [(m.group(1), m.start()) for m in _FUNC.finditer(text)]
        bodies = {
            fn: text[at : starts[k + 1][1] if k + 1 < len(starts) else len(text)]
            for k, (fn, at) in enumerate(starts)
        }
        parts[name] = (_aliases(text), bodies)
    closure = re.compile(r"^VERBS\.(\w+) = \(function\(\)\n(.*?)\nend\)\(\)\n", re.S | re.M)
    body = dict(closure.findall(SOURCE))[verb]

    def refs(text: str, part: str | None) -> set[tuple[str, str]]:
        aliases = parts[part][0] if part else _aliases(text)
        text = re.sub(r"--[^\n]*", "", text)  # (a function named in a comment is not called)
        got = set(re.findall(r"\blib\.(\w+)\.(\w+)", text))
        for word in set(re.findall(r"\b[A-Za-z_]\w*\b", text)):
            if word in aliases:
                got.add(aliases[word])
            if part and word in parts[part][1]:
                got.add((part, word))
        return got

    texts, seen, todo = [body], set(), list(refs(body, None))
    while todo:
        ref = todo.pop()
        if ref in seen:
            continue
        seen.add(ref)
        text = parts[ref[0]][1].get(ref[1])
        if text is not None:
            texts.append(text)
            todo += refs(text, ref[0])
    assert len(seen) > 5, "the library's layout changed: update this test"
    return {
        (command.upper(), key[2:].lower() if key else None)
        for text in texts
        for command, key in LUA_CALL.findall(text)
    }


def every_key(keys: JobKeys) -> list[str]:
    """The job's keys and one of each family a script names itself (keys.KEY_FAMILIES: a
    mixed job's sequence blocks, lib/mixseq.lua): a command with no K_ key may touch any."""
    return [*keys.all, keys.mixseq_block(0, 0)]


def dryrun_fits(server: AclServer, user: str, command: str, keys: list[str]) -> bool:
    """ACL DRYRUN with filler arguments until the arity fits; allowed on any of ``keys``."""
    for key in keys:
        for filler in range(8):
            try:
                if server.dryrun(user, command, key, *["1"] * filler):
                    return True
                break
            except redis.exceptions.ResponseError as e:
                if "wrong number of arguments" not in str(e):
                    raise
    return False


@pytest.mark.parametrize("role", ["trainer", "reaper"])
def test_rule_allows_every_command_its_functions_call(server: AclServer, role: str) -> None:
    """A function runs with its caller's ACL: a command it needs and the rule lacks would
    stop it half-way with NOPERM."""
    job = f"drift-{role}"
    rule = acl.rule(role, job, password="x")
    server.apply(rule)
    spec = acl.ROLES[role]
    verbs = spec.verbs if role == "reaper" else spec.verbs + spec.ro_verbs
    keys = JobKeys(job)
    calls = library_calls(verbs)
    assert calls
    missing = []
    for command, key in sorted(calls, key=str):
        candidates = [getattr(keys, key)] if key else every_key(keys)
        if command == "TIME":
            ok = server.dryrun(rule.user, "TIME")
        else:
            ok = dryrun_fits(server, rule.user, command, candidates)
        if not ok:
            missing.append((command, key))
    assert missing == [], f"the {role} rule denies what its functions call"
    for verb in verbs:
        name, nkeys, read_only = script_function(verb)
        assert server.dryrun(
            rule.user,
            "FCALL_RO" if read_only else "FCALL",
            name,
            str(nkeys),
            *keys.script,
            *["1"] * 12,
        )


def test_producer_rule_allows_every_command_append_can_run(server: AclServer) -> None:
    """The producer's rule is narrower than the shared parts' commands: every command of
    ``append`` and of the lib/ functions it reaches is allowed on its key (a missing one
    would stop an append half-way with NOPERM), and none else is needed."""
    job = "drift-producer"
    rule = acl.rule("producer", job, password="x")
    server.apply(rule)
    keys = JobKeys(job)
    calls = reached_calls("append")
    assert ("HSETNX", "chunks") in calls and ("XADD", "events") in calls
    missing = []
    for command, key in sorted(calls, key=str):
        candidates = [getattr(keys, key)] if key else every_key(keys)
        ok = (
            server.dryrun(rule.user, "TIME")
            if command == "TIME"
            else dryrun_fits(server, rule.user, command, candidates)
        )
        if not ok:
            missing.append((command, key))
    assert missing == [], "the producer rule denies what append runs"
    name, nkeys, _ = script_function("append")
    assert server.dryrun(rule.user, "FCALL", name, str(nkeys), *keys.script, *["1"] * 12)


def test_function_names_are_the_current_librarys() -> None:
    assert {v: acl.function_name(v) for v in VERBS} == {v: script_function(v)[0] for v in VERBS}
    with pytest.raises(taskq.TaskqError, match="no 'nope' function"):
        acl.function_name("nope")


# --- reaper and exporter users -------------------------------------------------------------


def test_reaper_of_a_reaps_a_only_and_reaper_of_all_lists_jobs(
    server: AclServer, job_name: str
) -> None:
    jobs = Jobs(server, job_name[:50], manual_clock=True, worker_ttl=2.0, heartbeat_interval=0.5)
    for job, url in ((jobs.a, jobs.url_a), (jobs.b, jobs.url_b)):
        lost = taskq.Trainer(job, url=url, heartbeat=False)
        assert lost.lease(timeout=0) is not None
        jobs.admin.advance_clock(job, 3000)
    one = acl.reaper_rule(jobs.a, password=password(f"reaper-{jobs.a}"))
    reaper_a = taskq.connect(server.apply(one), retries=0)
    assert Reaper(reaper_a, jobs=[jobs.a]).tick() == {jobs.a: 1}
    refused(lambda: reaper_a.reap(jobs.b), one.user)
    refused(lambda: reaper_a.cancel_job(jobs.a), one.user)
    refused(lambda: reaper_a.connection.run(jobs.a, "leave", ["", "w", "i"]), one.user)
    every = acl.reaper_rule(user=f"reaper-all-{jobs.a}", password=password(f"reaper-all-{jobs.a}"))
    reaper_all = taskq.connect(server.apply(every), retries=0)
    assert Reaper(reaper_all, jobs=None).tick()[jobs.b] == 1
    refused(lambda: reaper_all.delete_job(jobs.b), every.user)
    assert jobs.admin.status(jobs.b).counters["expired_worker_lost"] == 1


def test_exporter_user_reads_every_job_and_writes_nothing(server: AclServer, jobs: Jobs) -> None:
    rule = acl.exporter_rule(user=f"exporter-{jobs.a}", password=password(f"exporter-{jobs.a}"))
    exporter = taskq.connect(server.apply(rule), retries=0)
    assert {jobs.a, jobs.b} <= set(exporter.list_jobs())
    assert exporter.status(jobs.b).todo == 6
    assert len(exporter.tasks(jobs.a, "todo", limit=10)) == 6
    families = {f.name: f for f in TaskqCollector(exporter, jobs=None).collect()}
    assert families["taskq_exporter_scrape_errors"].samples[0].value == 0
    assert {jobs.a, jobs.b} <= {s.labels.get("job_name") for s in families["taskq_tasks"].samples}
    refused(lambda: exporter.cancel_job(jobs.a), rule.user)
    refused(lambda: taskq.Trainer(jobs.a, client=exporter, reconnect_timeout=0), rule.user)
    assert not server.dryrun(rule.user, "HSET", jobs.admin.keys(jobs.a).meta, "f", "v")
    only_a = acl.exporter_rule(jobs.a, password=password(f"exporter-{jobs.a}"))
    exporter_a = taskq.connect(server.apply(only_a), retries=0)
    assert exporter_a.status(jobs.a).todo == 6
    refused(lambda: exporter_a.status(jobs.b), only_a.user)


# --- the CLI ----------------------------------------------------------------------------------


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TASKQ_CLI, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_cli_prints_the_rule_with_the_password_hashed(jobs: Jobs, tmp_path: Path) -> None:
    secret = "cli-s3cr3t-value"
    out = cli("acl", "trainer", jobs.a, "--password-env", "TQ_PW", env={"TQ_PW": secret})
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert "\n" not in line and line.startswith(f"ACL SETUSER trainer-{jobs.a} reset on ")
    assert secret not in out.stdout + out.stderr
    assert f"'#{hashlib.sha256(secret.encode()).hexdigest()}'" in line
    assert f"'~taskq:{{{jobs.a}}}:*'" in line
    assert f"'+fcall|{LIBRARY}_ack'" in line and f"{LIBRARY}_cancel" not in line
    assert LIBRARY in out.stderr and "after upgrading" in out.stderr
    (tmp_path / "pw").write_text(secret + "\n")
    from_file = cli("acl", "trainer", jobs.a, "--password-file", str(tmp_path / "pw"))
    assert from_file.stdout == out.stdout
    placeholder = cli("acl", "trainer", jobs.a, "--format", "aclfile")
    assert placeholder.stdout.startswith(f"user trainer-{jobs.a} on >CHANGE_ME_trainer-{jobs.a} ")
    prefixed = cli("--prefix", "other", "acl", "reaper", "--format", "aclfile")
    assert " ~other:{*}:* %R~other:jobs " in prefixed.stdout and "taskq:" not in prefixed.stdout
    env_prefixed = cli("acl", "exporter", jobs.a, env={"TASKQ_PREFIX": "env-p"})
    assert f"'%R~env-p:{{{jobs.a}}}:*'" in env_prefixed.stdout


def test_cli_aclfile_line_loads_and_works(server: AclServer, jobs: Jobs) -> None:
    secret = "file-s3cr3t"
    out = cli(
        "acl",
        "trainer",
        jobs.a,
        "--user",
        "filetrainer",
        "--format",
        "aclfile",
        "--password-env",
        "TQ_PW",
        env={"TQ_PW": secret},
    )
    assert out.returncode == 0, out.stderr
    base = server.aclfile.read_text()
    try:
        server.aclfile.write_text(base + out.stdout)
        server.tester.execute_command("ACL", "LOAD")
        url = server.url("filetrainer", secret)
        with taskq.Trainer(jobs.a, url=url) as trainer:
            assert sorted(t.id for t in trainer) == list(range(6))
        refused(lambda: taskq.connect(url, retries=0).status(jobs.b), "filetrainer")
    finally:
        server.aclfile.write_text(base)


def test_cli_applies_the_rule_and_refusals_are_one_line(server: AclServer, jobs: Jobs) -> None:
    tester_url = server.url(*TESTER)
    env = {"TQ_PW": "applied-pw"}
    applied = cli(
        "--url",
        tester_url,
        "acl",
        "trainer",
        jobs.a,
        "--user",
        "applied",
        "--password-env",
        "TQ_PW",
        "--apply",
        env=env,
    )
    assert applied.returncode == 0, applied.stderr
    assert "applied user applied" in applied.stdout and TESTER[1] not in applied.stdout
    url = server.url("applied", "applied-pw")
    with taskq.Trainer(jobs.a, url=url) as trainer:
        assert trainer.lease(timeout=1) is not None
    for args, env_, expect in (
        (["--url", tester_url, "acl", "trainer", jobs.a, "--apply"], {}, "no password given"),
        (["acl", "trainer", "bad name"], {}, "bad job name"),
        (["acl", "trainer", jobs.a, "--password-env", "TQ_UNSET_VAR"], {}, "not set"),
        (
            [
                "--url",
                server.url("admin"),
                "acl",
                "trainer",
                jobs.a,
                "--password-env",
                "TQ_PW",
                "--apply",
            ],
            env,
            "refused by ACL",
        ),  # acl.conf's admin may not manage users
        (["--url", url, "job", "cancel", jobs.b], {}, "refused by ACL"),
        (["--url", url, "job", "cancel", jobs.a], {}, "refused by ACL"),
    ):
        out = cli(*args, env=env_)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1, out.stderr
        assert lines[0].startswith("taskq: error:") and expect in lines[0], lines
        assert "applied-pw" not in out.stderr and password("admin") not in out.stderr
    assert jobs.admin.status(jobs.b).state == "running"
    assert jobs.admin.status(jobs.a).state == "running"


def test_rules_refuse_bad_names_and_prefixes() -> None:
    for call in (
        lambda: acl.trainer_rule("a b"),
        lambda: acl.trainer_rule("a", user="x y"),
        lambda: acl.trainer_rule("a", key_prefix="p (x)"),
        lambda: acl.trainer_rule("a", password="has space"),
    ):
        with pytest.raises(taskq.InvalidInput):
            call()
    assert acl.trainer_rule("a", key_prefix="p*x").rules[3] == r"~p\*x:{a}:*"
    assert len(JOB_KEYS) == len(acl.WRITTEN_KEYS) + len(acl.READ_ONLY_KEYS)


def test_producer_credential_appends_to_its_job_only(server: AclServer, job_name: str) -> None:
    """A producer appends on every path of ``append`` (ids, duplicates, trainers waiting
    on a drained stream, a full backlog, a sealed stream, a completed job it may not
    reopen); it cannot append to another job, lease, cancel or seal."""
    admin = taskq.connect(server.url("admin"))
    a, s, b = (f"{job_name[:50]}-{x}" for x in "asb")
    admin.create_job(a, [{"i": -2}, {"i": -1}], max_backlog=3)
    admin.create_job(s, [], stream=True)
    admin.create_job(b, [], stream=True)
    producer_a = taskq.connect(
        server.apply(acl.producer_rule(a, password=password(f"producer-{a}"))), retries=0
    )
    producer_s = taskq.connect(
        server.apply(acl.producer_rule(s, password=password(f"producer-{s}"))), retries=0
    )
    trainer = taskq.Trainer(a, url=server.url("admin"), worker_id="t", heartbeat=False)
    trainer.ack(trainer.lease(timeout=0))
    assert producer_a.job(a).append([{"i": 0}], ids=["x"]).tasks == 1
    assert producer_a.job(a).append([{"i": 0}, {"i": 1}], ids=["x", "y"]).tasks == 1
    with pytest.raises(taskq.BacklogFull):
        producer_a.job(a).append([{"i": 2}], block=False)
    assert admin.status(a).tasks == 4
    with contextlib.suppress(taskq.JobCompleted):
        while (task := trainer.lease(timeout=0)) is not None:
            trainer.ack(task)
    assert admin.status(a).state == "completed"
    # the script's own refusal (no NOPERM half-way: it writes nothing), one readable line
    with pytest.raises(taskq.InvalidInput, match="reopen needs the job's owner") as e:
        producer_a.job(a).append([{"i": 3}], ids=["z"])
    assert "\n" not in str(e.value)
    assert (admin.status(a).state, admin.status(a).tasks) == ("completed", 4)
    trainer.close()
    waiter = taskq.Trainer(s, url=server.url("admin"), worker_id="w", heartbeat=False)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(waiter.lease(timeout=10)))
    thread.start()
    assert wait_until(lambda: admin.redis.zcard(admin.keys(s).waiting) == 1)
    assert producer_s.job(s).append([{"i": 0}]).tasks == 1  # a wake-up token for it
    thread.join()
    waiter.ack(got[0])
    waiter.close()
    for producer, job in ((producer_a, a), (producer_s, s)):
        user = f"producer-{job}"
        refused(lambda p=producer: p.job(b).append([{"i": 0}]), user)
        refused(lambda p=producer, j=job: p.cancel_job(j), user)
        refused(lambda p=producer, j=job: p.job(j).seal(), user)
        with pytest.raises(taskq.TaskqError):
            taskq.Trainer(job, client=producer, worker_id="x", heartbeat=False).lease(timeout=0)
    admin.job(s).seal()  # the job's owner seals it; drained, it completes
    assert admin.status(s).state == "completed"
    with pytest.raises(taskq.InvalidInput, match="sealed"):  # the script's refusal
        producer_s.job(s).append([{"i": 1}])


def test_producer_cannot_make_the_writes_it_must_not(server: AclServer, job_name: str) -> None:
    """Every write a producer must not make is refused by Redis itself (NOPERM): no field
    of the meta (its state, its counters), no overwrite of a task's descriptor or of an
    id's task, no delete of any key of the job, no function but append; what append
    writes it may still write, and append still works (on every server the tests run:
    Redis 7's ACL selectors, which Valkey 8 has too)."""
    admin = taskq.connect(server.url("admin"))
    admin.create_job(job_name, [], stream=True)
    admin.job(job_name).append([{"i": i} for i in range(3)], ids=["a", "b", "c"])
    trainer = taskq.Trainer(job_name, url=server.url("admin"), worker_id="t", heartbeat=False)
    trainer.ack(trainer.lease(timeout=0))
    trainer.close()
    admin.checkpoint(job_name)
    rule = acl.producer_rule(job_name, password=password(f"producer-{job_name}"))
    raw = redis.Redis.from_url(server.apply(rule), decode_responses=True)
    k = admin.keys(job_name)
    denied: list[tuple[str, ...]] = [
        ("HSET", k.meta, "state", "cancelled"),
        ("HSET", k.meta, "reason", "manual_advance"),
        *(("HSET", k.meta, field, "0") for field in META_FIELDS.values()),
        ("HSETNX", k.meta, "new_field", "1"),
        ("HDEL", k.meta, "state"),
        ("HINCRBY", k.meta, "n", "1"),
        ("HSET", k.chunks, "0", '[{"evil": 1}]'),
        ("HSET", k.chunks, "99", "[]"),
        ("HSET", k.appids, "a", "2"),
        ("HSET", k.appidx, "0", "[]"),
        ("HSET", k.appended, "tasks", "0"),
        ("SETBIT", k.done, "0", "0"),
        ("HDEL", k.progress, "0"),
        ("HSET", k.progress, "0", "1"),
        ("ZREM", k.ckpts, "x"),
        ("ZREMRANGEBYRANK", k.ckpts, "0", "-1"),
        ("HDEL", k.ckpt, "x"),
        ("HSET", k.ckpt, "x", "y"),
        ("HDEL", k.chunks, "0"),
        ("HDEL", k.appids, "x"),
        ("ZREM", k.appends, "x"),
        ("HSET", k.leases, "0", "x"),
        ("HDEL", k.leases, "0"),
        ("HSET", k.counts, "f:0", "9"),
        ("SADD", k.dead, "0"),
        ("ZADD", k.front, "0", "0"),
        ("XTRIM", k.events, "MAXLEN", "0"),
        ("RPUSH", k.bcast0, "1"),
        ("SET", k.clock, "1"),
        ("SET", k.lock, "x"),
        ("RENAME", k.meta, k.lock),
        ("FLUSHALL",),
    ]
    denied += [(cmd, key) for key in k.all for cmd in ("DEL", "UNLINK")]
    denied += [
        ("FCALL", acl.function_name(v), "1", k.meta, "") for v in sorted(VERBS) if v != "append"
    ]
    made = []
    for command in denied:
        try:
            raw.execute_command(*command)
            made.append(command)
        except redis.exceptions.NoPermissionError:
            pass
    assert made == []
    # what append writes, and only so: a new descriptor may be added, none replaced
    assert server.dryrun(rule.user, "HSETNX", k.chunks, "99", "[]")
    assert raw.hsetnx(k.chunks, "0", '[{"evil": 1}]') == 0
    assert json.loads(admin.redis.hget(k.chunks, "0")) == [{"i": 0}]
    # and append, its reads and its refusals still work
    producer = taskq.connect(server.url(rule.user), retries=0)
    assert producer.job(job_name).append([{"i": 3}, {"i": 0}], ids=["d", "a"]).tasks == 1
    assert producer.status(job_name).tasks == 4
    admin.job(job_name).seal()
    with pytest.raises(taskq.InvalidInput, match="sealed"):
        producer.job(job_name).append([{"i": 4}], ids=["e"])
    st = admin.status(job_name)
    assert (st.state, st.tasks, st.done, st.appended) == ("running", 4, 1, 4)
    assert len(admin.checkpoints(job_name)) == 1
    assert admin.audit(job_name)["ok"]


def test_producer_credential_runs_a_follower(
    server: AclServer, job_name: str, tmp_path: Path
) -> None:
    """`taskq job follow` with a producer's URL: appends, keeps and trims its record."""
    admin = taskq.connect(server.url("admin"))
    admin.create_job(job_name, [], stream=True)
    url = server.apply(acl.producer_rule(job_name, password=password(f"producer-{job_name}")))
    for i in range(3):
        (tmp_path / f"p{i}.jsonl").write_text('{"x": 1}\n')
    proc = subprocess.Popen(
        [
            TASKQ_CLI,
            "--url",
            url,
            "job",
            "follow",
            job_name,
            "--files",
            str(tmp_path / "*.jsonl"),
            "--every",
            "0.05",
            "--settle",
            "0",
            "--horizon",
            "0",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    keys = admin.keys(job_name)
    assert wait_until(lambda: admin.status(job_name).tasks == 3, timeout=20)
    assert wait_until(lambda: admin.redis.hlen(keys.follow) == 1)
    proc.terminate()
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err


def test_reaper_credential_trims_a_stream(server: AclServer, job_name: str) -> None:
    """The reaper's rule runs a stream's trim (its deletes of done tasks' descriptors and
    of the appends' log below the watermark) on its job."""
    admin = taskq.connect(server.url("admin"))
    admin.create_job(job_name, [], stream=True)
    admin.job(job_name).append([{"i": i} for i in range(3)], ids=["a", "b", "c"])
    trainer = taskq.Trainer(job_name, url=server.url("admin"), worker_id="t", heartbeat=False)
    trainer.ack([trainer.lease(timeout=0) for _ in range(3)])
    trainer.close()
    url = server.apply(acl.reaper_rule(job_name, password=password(f"reaper-{job_name}")))
    reaper = taskq.connect(url, retries=0)
    assert reaper.job(job_name).trim() == 3
    assert admin.status(job_name).trimmed == 3


def test_reaper_credential_trims_a_mixed_job_fed_by_a_stream(jobs: Jobs) -> None:
    """The reaper (its rule, its tick) trims a mixed job fed by an open stream source
    (docs/mixing.md, "Trim"): the done positions' copies and records, their feed ids, and
    the feed and weight logs below what a charge reads (ZREM, ZREMRANGEBYSCORE, HINCRBY
    of the trimmed counts)."""
    admin, news, mix = jobs.admin, f"{jobs.a}-news", f"{jobs.a}-m"
    admin.create_job(news, [], stream=True)
    admin.create_job(mix, mix={jobs.a: 1, news: 1}, max_debt=0)
    admin.job(mix).set_weights({jobs.a: 1, news: 2}, at=1)
    admin.job(mix).set_weights({jobs.a: 2, news: 1}, at=2)
    trainer = taskq.Trainer(mix, url=jobs.server.url("admin"), worker_id="t", heartbeat=False)
    for k in range(3):  # each feed answers a wait: the next charge starts a page
        ids = [f"n{k}-{i}" for i in range(2)]
        admin.job(mix).append([{"i": i} for i in ids], ids=ids, feed=news)
        while (task := trainer.lease(timeout=0)) is not None:
            trainer.ack(task)
    trainer.close()
    keys = admin.keys(mix)
    before = (admin.redis.zcard(keys.mixfeed), admin.redis.zcard(keys.mixlog))
    handed = len(admin.job(mix).mix_sequence())
    url = jobs.server.apply(acl.reaper_rule(mix, password=password(f"reaper-{mix}")))
    Reaper(taskq.connect(url, retries=0), jobs=[mix]).tick()
    assert admin.status(mix).trimmed == handed
    assert admin.job(mix).mix_sequence() == []
    assert admin.redis.hlen(keys.appids) == admin.redis.hlen(keys.appidx) == 0
    assert (
        admin.redis.zcard(keys.mixfeed) < before[0] and admin.redis.zcard(keys.mixlog) < before[1]
    )
    status = admin.job(mix).mix_status()
    assert sum(row["acked"] for row in status["sources"]) == handed
    assert admin.audit(mix)["ok"]


def test_trainer_credential_runs_a_mixed_job(jobs: Jobs) -> None:
    """A mixed job's lease writes its sequence (SETRANGE) and drops an old pass's (UNLINK):
    a trainer credential of the mixed job runs its passes."""
    mix = f"{jobs.a}-m"
    jobs.admin.create_job(mix, mix={jobs.a: 1, jobs.b: 2}, passes=4)
    url = jobs.server.apply(acl.trainer_rule(mix, password=password(f"trainer-{mix}")))
    seen = []
    with taskq.Trainer(mix, url=url) as trainer:
        for task in trainer:
            seen.append((task.pass_no, task.source))
    assert len(seen) == 4 * 12
    assert seen[:3] == [(0, jobs.b), (0, jobs.a), (0, jobs.b)]
    assert jobs.admin.status(mix).state == "completed"
