"""Every script checks every argument before its first write, against a real redis-server.

Each verb of the library is called through a raw FCALL (as any client with the role's
rights could) with malformed arguments: a wrong type, a number out of range, a separator
inside an id, a count that promises more than is given, one argument too few or too many.
Every such call must answer INVALID naming the argument and change nothing: afterwards the
job's audit is ok and the job still completes.
"""

from __future__ import annotations

from typing import Any

import pytest

import taskq
from taskq.engine import library
from taskq.engine.contract import (
    APPEND_MAX,
    MAX_BATCH,
    MAX_LISTED,
    MAX_RETRY,
    PAGE_MAX,
    POLICY_MAX,
    TRIM_MAX,
    Code,
)
from taskq.keys import JobKeys
from taskq.testing import lease_secret, script_function

BAD_BY_KIND: dict[str, list[str]] = {
    "inc": ["a|b", "a\nb"],
    "id": ["a|b", "", "x" * 201, "a\tb"],
    "int": ["x", "1.5", "", "1e3", "99999999999999999999"],
    "count": ["-1", "x", "1000000"],
    "task": ["x", "-1", "07", "4294967296", "1|2"],
    "token": ["x", "1|2", ""],
    "enum": ["Q", ""],
    "text": ["x" * 70000],
    "ckpt": ["a|b", "a:b", "", "x" * 65, "a b"],
    "cursor": ["x", "-1", "", "1" * 21],
    "conn": ["x", "-1", "1|2", "1" * 21],
    "secret": ["", "shortsecret0123"],  # (never echoed: the answer names it, not the value)
    "json": ["", "not json", "[1,", '{"a":1},{"b":2}'],
    "weights": ["", "x", "0,0", "1e400,1", "-1,1", "0x10,1", "x" * 70000],
}

SECRET = "s" * 32

#: verb -> (a well-formed ARGV, the kind of each of its arguments). The well-formed ARGV
#: itself is never sent: only copies with one argument made bad.
CASES: dict[str, tuple[list[str], list[str]]] = {
    "ack": (
        ["", "w", "i", "1", "1", "0", "5", "0", "1", "S", "-1", SECRET],
        [
            "inc",
            "id",
            "id",
            "int",
            "count",
            "task",
            "token",
            "count",
            "int",
            "enum",
            "int",
            "secret",
        ],
    ),
    "advance": (["", "0", "1"], ["inc", "int", "enum"]),
    "append": (["", "1", "1", "c0", '{"a":1}'], ["inc", "enum", "count", "text", "json"]),
    "cancel": ([""], ["inc"]),
    "clock": (["", "5", "0"], ["inc", "int", "enum"]),
    "closed": (["", "w", "i", "7", "100", "8"], ["inc", "id", "id", "token", "int", "int"]),
    "conns": (["0", "10"], ["int", "int"]),
    "create": (["0", "1", "state", "running"], ["enum", "int", "-", "-"]),
    "delete": ([""], ["inc"]),
    "drain": (["", "w"], ["inc", "id"]),
    "fail": (
        ["", "w", "i", "err", "1", "0", "5", SECRET],
        ["inc", "id", "id", "text", "count", "task", "token", "secret"],
    ),
    "heartbeat": (
        ["", "w", "i", "0", "1", "0", "5", SECRET, "7"],
        ["inc", "id", "id", "int", "count", "task", "token", "secret", "conn"],
    ),
    "lease": (
        ["", "w", "i", "1", "1", "S", "-1", SECRET],
        ["inc", "id", "id", "int", "int", "enum", "int", "secret"],
    ),
    "leave": (["", "w", "i", SECRET], ["inc", "id", "id", "secret"]),
    "pause": ([""], ["inc"]),
    "weights": (["", "1,1", "-1"], ["inc", "weights", "int"]),
    "progress": (
        ["", "w", "i", "1", "0", "5", "3", SECRET],
        ["inc", "id", "id", "count", "task", "token", "int", "secret"],
    ),
    "checkpoint": (["", "c1", "todo", "0", "0"], ["inc", "ckpt", "enum", "int", "cursor"]),
    "peek": (["todo", "0", "10"], ["enum", "-", "int"]),
    "reap": (["", "10", "1000", "r"], ["inc", "int", "int", "id"]),
    "register": (
        ["", "w", "i", "0", "h", "1", SECRET, "7"],
        ["inc", "id", "id", "int", "inc", "int", "secret", "conn"],
    ),
    "release": (
        ["", "w", "i", "1", "0", "5", SECRET],
        ["inc", "id", "id", "count", "task", "token", "secret"],
    ),
    "reset": (["", "-1"], ["inc", "int"]),
    "resume": ([""], ["inc"]),
    "retry": (["", "1", "0"], ["inc", "count", "task"]),
    "revoke": (["", "0"], ["inc", "task"]),
    "rewind": (["", "c1", "page", "0", "1"], ["inc", "ckpt", "enum", "int", "int"]),
    "seal": ([""], ["inc"]),
    "stats": (["1", "10"], ["int", "int"]),
    "trim": (["", "5"], ["inc", "int"]),
}

#: The other shapes of verbs whose arguments depend on their step ("verb step" -> as in
#: CASES); each is checked like the verb's own case.
STEPS: dict[str, tuple[list[str], list[str]]] = {
    # (a policy blob is optional: "policy" is a trailing argument that may be left out)
    "checkpoint begin": (["", "c1", "begin", "1", "p"], ["inc", "ckpt", "enum", "int", "policy"]),
    "checkpoint page": (["", "c1", "page", "0"], ["inc", "ckpt", "enum", "int"]),
    "checkpoint copy": (["", "c1", "copy", "0"], ["inc", "ckpt", "enum", "int"]),
    "checkpoint freeze": (["", "c1", "freeze", "0"], ["inc", "ckpt", "enum", "int"]),
    "checkpoint since": (["", "c1", "since", "0"], ["inc", "ckpt", "enum", "int"]),
    "checkpoint seal": (["", "c1", "seal", "1"], ["inc", "ckpt", "enum", "int"]),
    "rewind begin": (["", "c1", "begin", "1", "k"], ["inc", "ckpt", "enum", "int", "text"]),
    "rewind seal": (["", "c1", "seal", "0", "1"], ["inc", "ckpt", "enum", "int", "int"]),
}

#: Values in range for the type but past a verb's own bound (a verb or a STEPS key).
OVER_BOUND: list[tuple[str, int, str]] = [
    ("ack", 8, str(MAX_BATCH + 1)),  # want
    ("lease", 3, str(MAX_BATCH + 1)),  # want
    ("peek", 2, str(PAGE_MAX + 1)),  # count
    ("trim", 1, str(TRIM_MAX + 1)),  # max
    ("append", 2, str(APPEND_MAX + 1)),  # n
    ("retry", 1, str(MAX_RETRY + 1)),  # n
    ("heartbeat", 4, str(MAX_LISTED + 1)),  # n
    ("peek", 1, "zz"),  # not a todo cursor
    ("progress", 3, str(MAX_LISTED + 1)),  # n
    ("progress", 3, "2"),  # n: more triples than given
    ("checkpoint", 3, "4294967296"),  # page
    ("checkpoint begin", 4, "p" * (POLICY_MAX + 1)),  # the policy blob
    ("checkpoint copy", 3, "4294967296"),  # page
    ("checkpoint freeze", 3, "4294967296"),  # page
    ("checkpoint since", 3, "4294967296"),  # page
    ("checkpoint begin", 3, "0"),  # keep
    ("checkpoint seal", 3, "1001"),  # keep
    ("rewind", 3, "4294967296"),  # page
    ("rewind", 4, "9007199254740992"),  # epoch
    ("rewind begin", 3, "2"),  # once
    ("rewind begin", 4, "k" * 201),  # key
    ("rewind seal", 3, "1"),  # unused arg
]


def bad_argvs(verb: str) -> list[list[str]]:
    """Copies of the verb's well-formed ARGVs with one argument bad, one missing, one extra."""
    shapes = {verb: CASES[verb], **{k: c for k, c in STEPS.items() if k.split()[0] == verb}}
    out = []
    for name, (argv, kinds) in shapes.items():
        for pos, kind in enumerate(kinds):
            for value in BAD_BY_KIND.get(kind, []):
                bad = list(argv)
                bad[pos] = value
                out.append(bad)
        if verb != "stats":  # stats takes any number of bounds
            # a trailing connection id or policy is optional: leaving it out is a good call
            out.append(argv[:-2] if kinds[-1] in ("conn", "policy") else argv[:-1])
            out.append([*argv, "1"])
        out += [argv[:pos] + [value] + argv[pos + 1 :] for v, pos, value in OVER_BOUND if v == name]
    return out


def fcall(client: taskq.Client, job: str, verb: str, argv: list[str]) -> Any:
    """The verb's function called directly, as a raw client would."""
    name, nkeys, _ = script_function(verb)
    keys = JobKeys(job).script
    if verb == "create":
        keys = [*keys, JobKeys(job).staging_chunks("raw"), JobKeys(job).staging_sizes("raw")]
    return client.redis.execute_command("FCALL", name, nkeys, *keys, *argv)


def test_every_verb_has_its_malformed_cases():
    """A new verb must come with its cases here (every script checks every argument)."""
    assert set(CASES) == set(library.VERBS)


@pytest.mark.parametrize("verb", sorted(CASES))
def test_malformed_arguments_answer_invalid_and_change_nothing(client, job_name, verb):
    client.create_job(job_name, chunks=[{"i": i} for i in range(4)], task_timeout=None)
    t = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False)
    held = t.lease(timeout=0)
    assert held is not None
    before = client.redis.dump(JobKeys(job_name).meta), client.redis.xlen(JobKeys(job_name).events)
    for argv in bad_argvs(verb):
        reply = fcall(client, job_name, verb, argv)
        assert reply[0] == Code.INVALID, (verb, argv, reply)
        assert isinstance(reply[1], str) and ": " in reply[1], reply
        assert "shortsecret" not in reply[1], "a secret is never echoed"
    # nothing written: the meta hash and the events stream are as they were
    after = client.redis.dump(JobKeys(job_name).meta), client.redis.xlen(JobKeys(job_name).events)
    assert after == before
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]
    t.ack(held)
    assert sum(1 for _ in t) == 3
    t.close()
    status = client.status(job_name)
    assert (status.state, status.counters["acked"]) == ("completed", 4)
    assert client.audit(job_name)["ok"]


def test_ack_with_a_non_numeric_argument_sets_nothing(client, job_name):
    """The reported case: the done bit and the lease end used to land before the error."""
    client.create_job(job_name, chunks=[{"i": i} for i in range(4)], task_timeout=None)
    t = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False)
    task = t.lease(timeout=0)
    assert task is not None
    reply = fcall(
        client,
        job_name,
        "ack",
        [
            t.job_incarnation,
            "w",
            t.incarnation,
            "9",
            "1",
            str(task.id),
            str(task.token),
            "0",
            "many",
            "S",
            "-1",
            lease_secret(t),
        ],
    )
    assert reply[0] == Code.INVALID and reply[1].startswith("want: not an integer")
    assert client.redis.getbit(JobKeys(job_name).done, task.id) == 0
    assert client.status(job_name).leased == 1
    t.ack(task)  # the lease was left as it was: the real ack counts
    assert sum(1 for _ in t) == 3
    t.close()
    assert client.status(job_name).state == "completed"
    assert client.audit(job_name)["ok"]


def test_a_worker_id_with_a_separator_is_refused_by_the_script(client, job_name):
    """Refused only by the Python client before: a raw register made unparseable leases."""
    client.create_job(job_name, chunks=[{"i": i} for i in range(2)], task_timeout=None)
    reply = fcall(client, job_name, "register", ["", "evil|id", "i1", "0", "h", "1", SECRET])
    assert reply[0] == Code.INVALID and reply[1].startswith("worker: contains '|'")
    assert client.redis.hlen(JobKeys(job_name).winfo) == 0
    reply = fcall(client, job_name, "lease", ["", "evil|id", "i1", "1", "1", "S", "-1", SECRET])
    assert reply[0] == Code.INVALID
    assert client.status(job_name).leased == 0


def test_the_client_raises_invalid_input_naming_the_argument(client, job_name):
    client.create_job(job_name, chunks=[{"i": 0}], task_timeout=None)
    with pytest.raises(taskq.InvalidInput, match=r"task: not an integer"):
        client.connection.run(job_name, "revoke", ["", "x"])


def test_every_step_and_bound_names_a_case():
    """A typo in STEPS or OVER_BOUND would silently check nothing."""
    assert {k.split()[0] for k in STEPS} <= set(CASES)
    assert {v for v, _, _ in OVER_BOUND} <= set(CASES) | set(STEPS)


def test_progress_reports_are_bounded_and_named(client, job_name):
    client.create_job(job_name, chunks=[{"i": 0}], task_timeout=None)
    t = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False)
    task = t.lease(timeout=0)
    assert task is not None
    base = [t.job_incarnation, "w", t.incarnation]
    reply = fcall(client, job_name, "progress", [*base, str(MAX_LISTED + 1)])
    assert reply[0] == Code.INVALID
    assert reply[1].startswith(f"reports: not in [0, {MAX_LISTED}]")
    reply = fcall(client, job_name, "progress", [*base, "2", str(task.id), str(task.token), "3"])
    assert reply[0] == Code.INVALID and reply[1].startswith("reports: more triples than given")
    reply = fcall(
        client,
        job_name,
        "progress",
        [*base, "1", str(task.id), str(task.token), "3", lease_secret(t)],
    )
    assert reply[0] == Code.OK
    assert client.redis.hget(JobKeys(job_name).progress, str(task.id)) == "3"
    t.close()


def test_a_checkpoint_id_with_a_separator_is_refused_by_the_script(client, job_name):
    client.create_job(job_name, chunks=[{"i": 0}], task_timeout=None)
    reply = fcall(client, job_name, "checkpoint", ["", "c:d:0", "begin", "1"])
    assert reply[0] == Code.INVALID and reply[1].startswith("checkpoint: not 1-64 of")
    assert client.redis.hlen(JobKeys(job_name).ckpt) == 0


def test_an_incarnation_that_only_begins_like_the_workers_record_is_refused(client, job_name):
    """The ack checks the worker's ids only when they differ from its record: an incarnation
    that is the record's first two fields ('|' between) is refused as ever."""
    client.create_job(job_name, chunks=[{"i": 0}])
    t = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False)
    rec = client.redis.hget(JobKeys(job_name).winfo, "w")
    winc = "|".join(rec.split("|")[:2])
    keys = client.keys(job_name)
    reply = client.connection.scripts.call(
        "ack", keys.script, ["", "w", winc, 1, 0, 0, 1, "S", -1, "s" * 16]
    )
    assert reply[0] == Code.INVALID and reply[1].startswith("winc: contains '|'")
    t.close()
