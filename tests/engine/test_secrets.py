"""Lease secrets on a real Redis: whoever reads a job's leases hash learns each lease's
worker, incarnation and token, and still cannot end, start or renew another worker's
lease with them; the true holder's ack then counts, and its repeats stay quiet."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from taskq.cli.work import work

import taskq
from taskq.admin.stats import parse_lease
from taskq.engine.contract import Code
from taskq.testing import lease_secret


def make_job(client: taskq.Client, name: str, n: int, **kw: Any) -> None:
    kw.setdefault("worker_ttl", 5.0)
    kw.setdefault("heartbeat_interval", 0.5)
    client.create_job(name, [{"i": i} for i in range(n)], **kw)


def trainer(
    client: taskq.Client, job: str, worker_id: str | None = None, **kw: Any
) -> taskq.Trainer:
    return taskq.Trainer(
        job, client=client, worker_id=worker_id, heartbeat=False, handle_signals=False, **kw
    )


def holding(client: taskq.Client, job: str, n: int, **kw: Any) -> tuple[taskq.Trainer, taskq.Task]:
    """A job of ``n`` tasks (``kw`` go to ``make_job``) and trainer ``holder`` holding one."""
    make_job(client, job, n, **kw)
    holder = trainer(client, job, "holder")
    task = holder.lease(timeout=0)
    assert task is not None
    return holder, task


def ack_args(who: list[Any], task_id: int, token: int, secret: str) -> list[Any]:
    """The ``ack`` function's arguments: acks ``task_id`` in ``who``'s name, leases none."""
    return [*who, 10**6, 1, task_id, token, 0, 0, "S", -1, secret]


class Forger:
    """Someone with the job's credential: reads the lease records, then calls the
    trainer's functions in the holder's name with a secret of its own."""

    def __init__(self, client: taskq.Client, job: str) -> None:
        self.client, self.job = client, job
        self.keys = client.keys(job)
        self.secret = secrets.token_hex(16)

    def lease_of(self, task_id: int, backup: bool = False) -> dict[str, Any]:
        """The record of a task's lease, or of its backup lease (field ``b:<task>``)."""
        field = f"b:{task_id}" if backup else str(task_id)
        lease = parse_lease(self.client.redis.hget(self.keys.leases, field))
        assert lease is not None
        return lease

    def who(self, task_id: int, backup: bool = False) -> list[Any]:
        lease = self.lease_of(task_id, backup)
        inc = self.client.redis.hget(self.keys.meta, "inc")
        return [inc, lease["worker"], lease["worker_incarnation"]]

    def run(self, verb: str, args: list[Any]) -> list[Any]:
        reply: list[Any] = self.client.connection.run(
            self.job, verb, args, passthrough=(Code.REREGISTER,)
        )
        return reply

    def ack(self, task_id: int, backup: bool = False) -> list[Any]:
        tok = self.lease_of(task_id, backup)["token"]
        who = self.who(task_id, backup)
        return self.run("ack", ack_args(who, task_id, tok, self.secret))

    def fail(self, task_id: int, backup: bool = False) -> list[Any]:
        tok = self.lease_of(task_id, backup)["token"]
        who = self.who(task_id, backup)
        return self.run("fail", [*who, "forged", 1, task_id, tok, self.secret])

    def release(self, task_id: int, backup: bool = False) -> list[Any]:
        tok = self.lease_of(task_id, backup)["token"]
        who = self.who(task_id, backup)
        return self.run("release", [*who, 1, task_id, tok, self.secret])


def counters(client: taskq.Client, job: str) -> dict[str, int]:
    return client.status(job, summaries=0).counters


def test_a_copied_token_cannot_ack_fail_or_release_and_the_holders_ack_counts(
    client: taskq.Client, job_name: str
) -> None:
    holder, task = holding(client, job_name, 3)
    forger = Forger(client, job_name)
    before = forger.lease_of(task.id)
    assert forger.ack(task.id)[4] == [Code.STALE]
    assert forger.fail(task.id)[1] == [Code.STALE]
    assert forger.release(task.id)[1] == [Code.STALE]
    # still the holder's lease, untouched: same record, nothing counted but the forgeries
    assert forger.lease_of(task.id) == before
    c = counters(client, job_name)
    assert (c["acked"], c["failed"], c["released"], c["stale"], c["forged"]) == (0, 0, 0, 0, 3)
    holder.ack(task)  # no LeaseLost: nobody ended it
    status = client.status(job_name, summaries=0)
    assert (status.done, status.counters["acked"], status.counters["stale"]) == (1, 1, 0)
    holder.close()
    assert client.audit(job_name)["ok"]


def test_a_second_trainer_with_a_copied_task_gets_lease_lost(
    client: taskq.Client, job_name: str
) -> None:
    """Through the public API: a Trainer of the same job handed a copy of another's task
    (its id and token, as read from the leases hash) cannot end it."""
    make_job(client, job_name, 2)
    holder, other = trainer(client, job_name, "holder"), trainer(client, job_name, "other")
    task = holder.lease(timeout=0)
    assert task is not None
    copy = taskq.Task(
        id=task.id,
        pass_no=task.pass_no,
        chunks=[],
        job=job_name,
        token=Forger(client, job_name).lease_of(task.id)["token"],
        attempt=1,
    )
    for end in (other.ack, other.fail, other.release):
        with pytest.raises(taskq.LeaseLost):
            end(copy)
    holder.ack(task)
    c = counters(client, job_name)
    assert (c["acked"], c["stale"] + c["forged"]) == (1, 3)
    holder.close()
    other.close()


def test_the_true_holders_repeated_ack_stays_quiet_a_forged_one_does_not(
    client: taskq.Client, job_name: str
) -> None:
    holder, task = holding(client, job_name, 2)
    holder.ack(task)
    who = [holder.job_incarnation, holder.worker_id, holder.incarnation]
    # the holder's retry (its reply was lost, say): a quiet success, nothing counted
    again = client.connection.run(
        job_name, "ack", ack_args(who, task.id, task.token, lease_secret(holder))
    )
    assert again[4] == [Code.DUP]
    # the same repeat with another secret (a reader of the ended record): stale, forged
    forged = client.connection.run(
        job_name,
        "ack",
        ack_args(who, task.id, task.token, secrets.token_hex(16)),
        passthrough=(Code.REREGISTER,),
    )
    assert forged[4] == [Code.STALE]
    c = counters(client, job_name)
    assert (c["acked"], c["stale"], c["forged"]) == (1, 0, 1)
    holder.close()


def test_the_quiet_repeat_survives_the_worker_record(client: taskq.Client, job_name: str) -> None:
    """The ended lease record keeps the digest: after the worker left (its record gone),
    its late repeat is still recognised as the holder's."""
    holder, task = holding(client, job_name, 2)
    holder.ack(task)
    who = [holder.job_incarnation, holder.worker_id, holder.incarnation]
    secret = lease_secret(holder)
    holder.close()
    assert client.redis.hget(client.keys(job_name).winfo, "holder") is None
    reply = client.connection.run(
        job_name,
        "ack",
        ack_args(who, task.id, task.token, secret),
        passthrough=(Code.REREGISTER,),
    )
    assert reply[4] == [Code.DUP]
    assert counters(client, job_name)["stale"] == 0


def test_a_late_write_after_a_re_register_is_stale_not_forged(
    client: taskq.Client, job_name: str
) -> None:
    """A trainer declared lost joins again under a new incarnation and a new secret; its
    late writes about its old leases name the new incarnation: stale, never forged."""
    holder, task = holding(client, job_name, 2, manual_clock=True, task_timeout=None)
    old = holder.incarnation
    client.advance_clock(job_name, 60_000)
    assert client.reap(job_name)[0] == 1  # lost: its lease expired
    with pytest.raises(taskq.LeaseLost):
        holder.ack(task)  # answered REREGISTER too: the trainer joins again
    assert holder.incarnation != old
    with pytest.raises(taskq.LeaseLost):
        holder.ack(task)  # the same late ack, now under the new incarnation
    c = counters(client, job_name)
    assert (c["stale"], c["forged"], c["acked"]) == (2, 0, 0)
    holder.close()


def test_forged_attempts_show_in_counters_and_events(client: taskq.Client, job_name: str) -> None:
    holder, task = holding(client, job_name, 2)
    forger = Forger(client, job_name)
    forger.fail(task.id)
    events = [f for _, f in client.events(job_name) if f["type"] == "forged"]
    assert events == [
        {
            "type": "forged",
            "pass": "0",
            "task": str(task.id),
            "worker": "holder",
            "token": str(task.token),
            "op": "fail",
        }
    ]
    assert [f for _, f in client.events(job_name) if f["type"] == "stale"] == []
    holder.close()


@pytest.mark.parametrize("op", ["lease", "heartbeat"])
def test_a_lease_or_heartbeat_in_a_workers_name_needs_its_secret(
    client: taskq.Client, job_name: str, op: str
) -> None:
    """The worker's name and incarnation are readable too. With another secret, a lease
    under them grants nothing, and a heartbeat listing none of the worker's leases (which,
    past its last reply, would revoke them all) revokes nothing; neither renews the
    worker, and both are counted. The same call with the worker's own secret works."""
    make_job(client, job_name, 3, manual_clock=True)
    holder = trainer(client, job_name, "holder")
    held = 0
    if op == "heartbeat":
        assert holder.lease(timeout=0) is not None
        held = 1
    keys = client.keys(job_name)
    m = f"holder|{holder.incarnation}"
    deadline = client.redis.zscore(keys.workers, m)
    client.advance_clock(job_name, 1000)
    who = [holder.job_incarnation, "holder", holder.incarnation]
    args = [2, 10**6, "S", -1] if op == "lease" else [10**6, 0]
    reply = client.connection.run(
        job_name, op, [*who, *args, secrets.token_hex(16)], passthrough=(Code.REREGISTER,)
    )
    assert (reply[0], reply[1]) == (Code.REREGISTER, [])
    assert client.redis.zscore(keys.workers, m) == deadline, "a forged call is no heartbeat"
    status = client.status(job_name, summaries=0)
    assert (status.leased, status.counters["revoked"], status.counters["forged"]) == (held, 0, 1)
    events = [f for _, f in client.events(job_name) if f["type"] == "forged"]
    assert events == [{"type": "forged", "pass": "0", "worker": "holder", "op": op}]
    if op == "lease":
        assert holder.lease(timeout=0) is not None  # the holder itself is unaffected
    else:
        # the same heartbeat with the holder's secret is the worker's own: it renews it
        # and revokes the lease it does not list (so the forged one would have)
        reply = client.connection.run(job_name, "heartbeat", [*who, *args, lease_secret(holder)])
        assert reply[0] == Code.OK
        assert client.redis.zscore(keys.workers, m) > deadline
        assert client.status(job_name, summaries=0).counters["revoked"] == 1
    holder.close()


def test_a_reserved_lease_is_not_started_with_another_secret(
    client: taskq.Client, job_name: str
) -> None:
    make_job(client, job_name, 3)
    holder = trainer(client, job_name, "holder", prefetch=1)
    keys = client.keys(job_name)
    reply = client.connection.run(
        job_name,
        "lease",
        [
            holder.job_incarnation,
            "holder",
            holder.incarnation,
            2,
            1,
            "F",
            -1,
            lease_secret(holder),
        ],
    )
    started, reserved = (int(r[0]) for r in reply[1])
    forger = Forger(client, job_name)
    tok = forger.lease_of(reserved)["token"]
    got = forger.run(
        "ack", [*forger.who(reserved), 10**6, 0, 1, reserved, tok, 0, "R", -1, forger.secret]
    )
    assert got[5] == [Code.STOLEN]
    lease = parse_lease(client.redis.hget(keys.leases, str(reserved)))
    assert lease is not None and lease["live"] and not lease["started"]
    holder.close()
    assert started != reserved


def test_a_leave_in_a_workers_name_needs_its_secret(client: taskq.Client, job_name: str) -> None:
    holder, task = holding(client, job_name, 3)
    forger = Forger(client, job_name)
    reply = forger.run("leave", [*forger.who(task.id), forger.secret])
    assert (reply[0], reply[1]) == (Code.REREGISTER, 0)
    status = client.status(job_name, summaries=0)
    assert (status.leased, status.workers, status.counters["released"]) == (1, 1, 0)
    assert status.counters["forged"] == 1
    holder.ack(task)
    holder.close()  # the holder's own leave works
    status = client.status(job_name, summaries=0)
    assert (status.done, status.workers, status.counters["forged"]) == (1, 0, 1)


def test_register_without_a_secret_is_refused_with_an_upgrade_message(
    client: taskq.Client, job_name: str
) -> None:
    make_job(client, job_name, 1)
    keys = client.keys(job_name).script
    for extra in ([], ["short"]):
        reply = client.connection.scripts.call(
            "register", keys, ["", "old", "inc", 0, "h", 1, *extra]
        )
        assert reply[0] == Code.INVALID
        assert "upgrade" in reply[1] and "short" not in reply[1].replace("shorter", "")
    assert client.redis.hget(client.keys(job_name).winfo, "old") is None
    assert client.status(job_name, summaries=0).workers == 0


def test_the_secret_is_in_no_key_record_event_or_status(
    client: taskq.Client, job_name: str
) -> None:
    make_job(client, job_name, 4)
    holder = trainer(client, job_name, "holder", prefetch=1)
    forger = Forger(client, job_name)
    for n, task in enumerate(holder):
        if n == 0:
            forger.release(task.id)
        if n == 2:
            break
    secret = lease_secret(holder)
    keys = client.keys(job_name)
    r = client.redis
    seen: list[str] = list(r.scan_iter(match=f"*{job_name}*"))
    seen += [json.dumps(r.hgetall(k)) for k in (keys.leases, keys.winfo, keys.meta)]
    seen += [json.dumps(f) for _, f in client.events(job_name, count=1000)]
    seen.append(json.dumps(client.status(job_name).__dict__, default=str))
    seen.append(json.dumps(client.workers(job_name)))
    seen.append(json.dumps(client.tasks(job_name, "leased")))
    assert not [s for s in seen if secret in s]
    # what the records keep is a short digest of it
    digest = hashlib.sha1(secret.encode()).hexdigest()[:16]
    record = r.hget(keys.leases, str(holder.held[0].id))
    assert record.endswith("|" + digest)
    assert r.hget(keys.winfo, "holder").split("|")[6] == digest
    holder.close()


def test_admin_verbs_need_no_secret(client: taskq.Client, job_name: str) -> None:
    """revoke, cancel and the reaper act on any lease without the holder's secret."""
    make_job(client, job_name, 3, manual_clock=True, task_timeout=None)
    holder = trainer(client, job_name, "holder")
    a, b = holder.lease(timeout=0), holder.lease(timeout=0)
    assert a is not None and b is not None
    assert client.revoke(job_name, a.id)
    client.advance_clock(job_name, 60_000)  # the holder is lost: the reaper reclaims b
    reclaimed, _, _ = client.reap(job_name)
    assert reclaimed == 1
    c = counters(client, job_name)
    assert (c["revoked"], c["expired_worker_lost"], c["forged"]) == (1, 1, 0)
    client.cancel_job(job_name)
    assert client.status(job_name, summaries=0).state == "cancelled"


def test_taskq_work_keeps_the_secret_from_its_command(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """The command sees its task (stdin, environment, arguments), and nothing in them
    hashes to the digest its lease record keeps: the secret stayed in ``taskq work``."""
    make_job(client, job_name, 1)
    seen = tmp_path / "seen.json"
    script = f"""
import json, os, sys
with open({str(seen)!r}, "w") as f:
    json.dump({{"stdin": sys.stdin.read(), "env": dict(os.environ), "argv": sys.argv}}, f)
"""
    result = CliRunner().invoke(
        work, [job_name, "--url", url, "--", sys.executable, "-c", script], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert client.status(job_name, summaries=0).counters["acked"] == 1
    record = client.redis.hget(client.keys(job_name).leases, "0")
    digest = record.rsplit("|", 1)[1]
    assert re.fullmatch(r"[0-9a-f]{16}", digest), record
    text = seen.read_text()
    candidates = set(re.findall(r"[0-9a-f]{16,}", text))
    assert candidates, "the task's token at least is there"
    hashed = {
        hashlib.sha1(c[i : i + n].encode()).hexdigest()[:16]
        for c in candidates
        for n in (16, 32, 64)
        for i in range(len(c) - n + 1)
    }
    assert digest not in hashed
    assert digest not in result.output


def test_progress_in_a_holders_name_needs_its_secret(client: taskq.Client, job_name: str) -> None:
    holder, task = holding(client, job_name, 2)
    forger = Forger(client, job_name)
    tok = forger.lease_of(task.id)["token"]
    reply = forger.run("progress", [*forger.who(task.id), 1, task.id, tok, 5, forger.secret])
    assert reply[1] == [Code.STALE]
    keys = client.keys(job_name)
    assert client.redis.hget(keys.progress, str(task.id)) is None
    assert counters(client, job_name)["forged"] == 1
    holder.progress(task, 3)
    assert holder.flush_progress() == []
    assert client.redis.hget(keys.progress, str(task.id)) == "3"
    holder.close()


def test_a_backup_lease_is_checked_against_its_own_holders_secret(
    client: taskq.Client, job_name: str
) -> None:
    """A backup lease (field b:<task>) keeps its holder's digest: its worker, incarnation
    and token read from the hash, with another secret, end nothing; its holder's ack then
    wins over the straggler's lease as ever."""
    n = 12  # a median task time needs 10 acks
    client.create_job(
        job_name,
        [{"i": i} for i in range(n)],
        manual_clock=True,
        worker_ttl=5.0,
        heartbeat_interval=1.0,
        task_timeout=None,
        backup_leases=True,
    )
    fast, slow = trainer(client, job_name, "fast"), trainer(client, job_name, "slow")
    straggler = slow.lease(timeout=0)
    assert straggler is not None
    for _ in range(n - 1):  # 100 ms each: the median; the straggler is past 2 x that
        task = fast.lease(timeout=0)
        assert task is not None
        client.advance_clock(job_name, 100)
        fast.ack(task)
    slow.heartbeat()
    backup = fast.lease(timeout=0)
    assert backup is not None and backup.id == straggler.id
    keys = client.keys(job_name)
    field = f"b:{backup.id}"
    rec = client.redis.hget(keys.leases, field)
    lease = parse_lease(rec)
    assert lease is not None and (lease["worker"], lease["token"]) == ("fast", backup.token)
    assert rec.endswith("|" + hashlib.sha1(lease_secret(fast).encode()).hexdigest()[:16])
    forger = Forger(client, job_name)
    assert forger.ack(backup.id, backup=True)[4] == [Code.STALE]
    assert forger.fail(backup.id, backup=True)[1] == [Code.STALE]
    assert forger.release(backup.id, backup=True)[1] == [Code.STALE]
    assert client.redis.hget(keys.leases, field) == rec, "the backup lease is untouched"
    c = counters(client, job_name)
    assert (c["acked"], c["failed"], c["released"], c["forged"]) == (n - 1, 0, 0, 3)
    fast.ack(backup)  # the true holder's ack counts, and wins
    c = counters(client, job_name)
    assert (c["acked"], c["revoked"], c["forged"]) == (n, 1, 3)
    assert client.status(job_name, summaries=0).state == "completed"
    fast.close()
    slow.close()
    assert client.audit(job_name)["ok"]
