"""Checks of deploy/redis/acl.conf: its shape, and what each user may run.

Where it sits: nothing here runs taskq. A private server loads acl.conf and answers
`ACL DRYRUN` for each user, including every command the Lua scripts in taskq/engine/lua/ call.
Which keys a trainer's or reaper's function may delete, and which verbs are the
reaper's, come from taskq/ops/acl.py (the per-job rules say the same).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from support import ROOT, RedisServer, free_port

from taskq.ops.acl import REAPER_VERBS, SCRATCH_KEYS

ACL = ROOT / "deploy" / "redis" / "acl.conf"
LUA = ROOT / "taskq" / "engine" / "lua"


# --- Redis ACL -------------------------------------------------------------------------

ACL_USERS = {"default", "trainer", "reaper", "exporter", "admin"}
#: Script verbs only the admin (the CLI) runs; any other verb but the reaper's is a
#: trainer's.
ADMIN_VERBS = {
    "create", "stage", "flip", "replace", "delete", "cancel", "advance", "next", "reset",
    "retry", "revoke", "drain", "force", "clock", "config", "audit", "repair", "purge",
    "checkpoint", "rewind",
}  # fmt: skip


def acl_lines() -> list[list[str]]:
    return [line.split() for line in ACL.read_text().splitlines()]


def top_level_rules(words: list[str]) -> list[str]:
    """The rules of a user line outside any `( ... )` selector."""
    text = " ".join(words)
    return re.sub(r"\([^)]*\)", " ", text).split()


def test_acl_file_has_one_user_per_line_and_placeholder_passwords() -> None:
    names = []
    for words in acl_lines():
        assert words[0] == "user" and len(words) > 2, words  # Redis allows no comments here
        names.append(words[1])
        passwords = [w for w in words if w.startswith(">")]
        if words[1] == "default":
            assert "nopass" in words and not passwords
        else:
            assert passwords == [f">CHANGE_ME_{words[1]}"]
    assert sorted(names) == sorted(ACL_USERS)


def test_acl_trainer_cannot_delete_flush_or_rename_at_top_level() -> None:
    trainer = next(words for words in acl_lines() if words[1] == "trainer")
    rules = {rule.lower() for rule in top_level_rules(trainer)}
    assert not rules & {
        "+del",
        "+unlink",
        "+flushall",
        "+flushdb",
        "+rename",
        "+@all",
        "+@write",
        "+@keyspace",
    }
    assert "-@dangerous" in rules


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    """A private server with acl.conf plus a `tester` user allowed ACL DRYRUN."""
    workdir = tmp_path_factory.mktemp("acl")
    aclfile = workdir / "acl.conf"
    aclfile.write_text(ACL.read_text() + "user tester on >tester ~* &* +@all\n")
    port = free_port()
    client = redis.Redis(port=port, username="tester", password="tester", decode_responses=True)

    def ready() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    # a server that refuses the ACL file exits: RedisServer says so, naming its log
    server = RedisServer(
        extra=["--aclfile", str(aclfile)], port=port, directory=workdir, ready=ready
    )
    try:
        yield client
    finally:
        client.close()
        server.cleanup()


def dryrun(client: redis.Redis, user: str, *command: str) -> bool:
    """True when `user` may run `command`; an arity error is a bug in the test."""
    reply = client.execute_command("ACL", "DRYRUN", user, *command)
    if reply == "OK":
        return True
    assert "no permissions" in str(reply), reply
    return False


def key(name: str) -> str:
    return f"taskq:{{job-1}}:{name}"


ACL_CASES = [
    ("default", ("PING",), True),
    ("default", ("GET", key("meta")), False),
    ("trainer", ("FCALL", "no_such_function", "1", key("meta")), True),
    ("trainer", ("FUNCTION", "LOAD", "#!lua name=x\nreturn 1"), False),
    ("trainer", ("EVAL", "return 1", "0"), False),
    ("trainer", ("BLPOP", key("wake"), "1"), True),
    ("trainer", ("XREAD", "BLOCK", "1", "STREAMS", key("events"), "0"), True),
    ("trainer", ("HSET", key("meta"), "f", "v"), True),
    ("trainer", ("UNLINK", key("done"), key("front"), key("owned"), key("started")), True),
    ("trainer", ("DEL", key("bcast0")), True),
    ("trainer", ("DEL", key("meta")), False),
    ("trainer", ("UNLINK", key("chunks")), False),
    ("trainer", ("UNLINK", key("done"), key("meta")), False),
    ("trainer", ("DEL", "taskq:jobs"), False),
    ("trainer", ("RENAME", key("meta"), key("x")), False),
    ("trainer", ("FLUSHALL",), False),
    ("trainer", ("FLUSHDB",), False),
    ("trainer", ("KEYS", "*"), False),
    ("trainer", ("CONFIG", "SET", "maxmemory", "0"), False),
    ("trainer", ("GET", "other:key"), False),
    # BCAST pushes would name other jobs' changed keys; REDIRECT reaches another client
    ("trainer", ("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "taskq:"), False),
    ("trainer", ("CLIENT", "TRACKING", "ON", "REDIRECT", "7"), False),
    ("trainer", ("CLIENT", "CACHING", "YES"), False),
    ("trainer", ("CLIENT", "SETNAME", "w1"), True),
    ("trainer", ("CLIENT", "ID"), True),
    ("reaper", ("CLIENT", "TRACKING", "ON", "BCAST"), False),
    ("exporter", ("CLIENT", "TRACKING", "ON", "BCAST"), False),
    ("reaper", ("SET", key("lock"), "me", "PX", "1000"), True),
    ("reaper", ("FCALL", "no_such_function", "1", key("meta")), True),
    ("reaper", ("DEL", key("meta")), False),
    ("reaper", ("FLUSHALL",), False),
    ("exporter", ("HGETALL", key("meta")), True),
    ("exporter", ("SCAN", "0", "MATCH", "taskq:*"), True),
    ("exporter", ("HSET", key("meta"), "f", "v"), False),
    ("exporter", ("FCALL_RO", "no_such_function", "1", key("meta")), True),  # the no-writes stats
    ("exporter", ("FCALL", "no_such_function", "1", key("meta")), False),
    ("exporter", ("TIME",), True),
    ("exporter", ("SET", key("clock"), "1"), False),
    ("exporter", ("XADD", key("events"), "*", "f", "v"), False),
    ("exporter", ("DEL", key("wake")), False),
    ("admin", ("UNLINK", key("meta"), key("chunks")), True),
    ("admin", ("FCALL", "no_such_function", "1", key("meta")), True),
    ("admin", ("SCAN", "0"), True),
    ("admin", ("FLUSHALL",), False),
    ("admin", ("FUNCTION", "LOAD", "#!lua name=x\nreturn 1"), True),
    ("exporter", ("FUNCTION", "LOAD", "#!lua name=x\nreturn 1"), False),
    ("reaper", ("FUNCTION", "LOAD", "#!lua name=x\nreturn 1"), False),
    ("admin", ("FUNCTION", "FLUSH"), False),
    ("admin", ("FUNCTION", "DELETE", "taskq_x"), False),
    ("admin", ("CONFIG", "GET", "maxmemory"), False),
    ("admin", ("DEL", "other:key"), False),
]


@pytest.mark.parametrize(
    ("user", "command", "allowed"),
    ACL_CASES,
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else str(v),
)
def test_acl_dryrun(
    acl_redis: redis.Redis, user: str, command: tuple[str, ...], allowed: bool
) -> None:
    assert dryrun(acl_redis, user, *command) is allowed


#: `redis.call` is bound to the local `rcall` in each Lua part and verb (`local rcall = redis.call`)
LUA_CALL = re.compile(r"(?:\bredis\.p?call|\brcall)\(\s*['\"]([A-Za-z]+)['\"]")


def lua_calls(path: Path) -> list[tuple[str, list[str]]]:
    """Each `redis.call('CMD', args...)` of a script: the command and its top-level args."""
    text = path.read_text()
    calls = []
    for match in LUA_CALL.finditer(text):
        depth, index, args, current = 1, match.end(), [], ""
        while depth and index < len(text):
            char = text[index]
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 1 and char == ",":
                args.append(current.strip())
                current = ""
            elif depth:
                current += char
            index += 1
        args.append(current.strip())
        calls.append((match.group(1).upper(), [a for a in args if a]))
    return calls


def resolve_key_args(path: Path, args: list[str]) -> list[str] | None:
    """Job key names for `K_*` args (a local assigned from K_* counts); None if unknown."""
    text = path.read_text()
    keys = []
    for arg in args:
        candidates = (
            [arg]
            if arg.startswith("K_")
            else re.findall(rf"\b{re.escape(arg)}\s*=\s*(K_\w+)", text)
        )
        if not candidates:
            return None
        keys.extend(c[2:].lower() for c in candidates)
    return keys


def role_of(script: Path) -> set[str]:
    """The users that run a script: _lib is part of every writing script; a read-only
    one (`#!lua flags=no-writes`: stats, peek) is the exporter's and the CLI's."""
    verb = script.stem.rsplit("-", 1)[0]
    if verb == "_lib":
        return {"trainer", "reaper", "admin"}
    if "no-writes" in script.read_text().splitlines()[0]:
        return {"exporter", "admin"}
    if verb in REAPER_VERBS:
        return {"reaper", "admin"}
    if verb in ADMIN_VERBS:
        return {"admin"}
    return {"trainer", "admin"}


def dryrun_any_arity(client: redis.Redis, user: str, command: str, keys: list[str]) -> bool:
    """ACL DRYRUN with filler args until the arity fits (scripts' args are runtime values).

    Unresolved key args and the fillers are the job's meta key (a filler may sit in a key
    position, as RENAME's second arg does): a key outside taskq:* would be denied for a
    reason that has nothing to do with the command.
    """
    attempts = [[key(k) for k in keys]] if keys else [[], [key("meta")]]
    for head in attempts:
        for filler in range(8 if head else 1):  # a keyless command takes no filler
            try:
                reply = client.execute_command(
                    "ACL", "DRYRUN", user, command, *head, *[key("meta")] * filler
                )
            except redis.ResponseError as e:
                if "wrong number of arguments" in str(e):
                    continue
                raise
            return bool(reply == "OK")
    raise AssertionError(f"no arity fits {command}")


def test_acl_allows_every_command_the_lua_scripts_call(acl_redis: redis.Redis) -> None:
    """Scripts run with the caller's ACL: a command a role's script needs and the role
    lacks would stop that script half-way with NOPERM."""
    scripts = sorted(LUA.glob("*.lua"))
    assert scripts, "taskq/engine/lua/ has no scripts"
    checked = 0
    for script in scripts:
        for command, args in lua_calls(script):
            users = role_of(script)
            if command in {"DEL", "UNLINK"}:
                keys = resolve_key_args(script, args)
                if keys is None:
                    # Any key under taskq:* is the admin's to delete (a staging hash...).
                    assert users == {"admin"}, (
                        f"{script.name}: which keys does {command} {args} delete?"
                    )
                    keys = ["meta"]
            else:
                keys = (resolve_key_args(script, args[:1]) if args else None) or []
            for user in users:
                if command in {"DEL", "UNLINK"} and user != "admin":
                    outside = set(keys) - set(SCRATCH_KEYS)
                    assert not outside, (
                        f"{script.name} ({user}) deletes {outside}: the {user} ACL denies it. "
                        f"If {script.name} is an admin script add its verb to ADMIN_VERBS."
                    )
                assert dryrun_any_arity(acl_redis, user, command, keys), (
                    f"{script.name} calls {command} {keys}, which the {user} ACL denies "
                    "(scripts run with the caller's ACL): update deploy/redis/acl.conf"
                )
                checked += 1
    assert checked > 0
