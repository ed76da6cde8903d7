"""The admin ``Client`` holds the engine's connection and opens job handles: every method
that takes a job name is one call of its handle's verb (the verb is written in the
handles, taskq/admin/jobs.py and taskq/admin/sharded.py), none inheriting from another;
a dropped client is freed at once. No server is needed: a ``Client`` connects on its
first call."""

from __future__ import annotations

import ast
import gc
import inspect
import textwrap
import weakref

import taskq
from taskq.admin.caller import Job
from taskq.admin.jobs import PlainJob
from taskq.admin.sharded import ShardedJob
from taskq.engine.connection import Connection

URL = "redis://127.0.0.1:1/0"  # never reached
#: Client methods that take no job name, or make one (the connection, the index, create).
OWN = {"keys", "run", "ping", "memory_policy", "check_memory_policy", "list_jobs"}
OWN |= {"repair_index", "job", "create_job"}


def test_no_class_of_the_client_inherits_from_another() -> None:
    for cls in [taskq.Client, Connection, PlainJob, ShardedJob]:
        assert cls.__bases__ == (object,), cls


def _public(cls: type) -> dict[str, object]:
    return {n: m for n, m in vars(cls).items() if not n.startswith("_") and inspect.isfunction(m)}


def test_each_name_taking_verb_of_the_client_is_one_call_of_its_handle() -> None:
    verbs = {n: m for n, m in _public(taskq.Client).items() if n not in OWN}
    assert len(verbs) == 24
    handle = set(_public(Job))  # type: ignore[arg-type]
    for name, method in verbs.items():
        assert method.__doc__, name  # type: ignore[attr-defined]
        tree = ast.parse(textwrap.dedent(inspect.getsource(method)))  # type: ignore[arg-type]
        body = tree.body[0].body  # type: ignore[attr-defined]
        call = body[-1].value
        assert len(body) == 2 and isinstance(call, ast.Call), name  # docstring + one call
        target = call.func if isinstance(call.func, ast.Attribute) else call.args[0].func
        assert ast.unparse(target.value) == "self.job(name)" or name == "iter_tasks", name
        assert name == "iter_tasks" or target.attr in handle, name


def test_both_handles_implement_every_verb_of_the_surface() -> None:
    for cls in (PlainJob, ShardedJob):
        assert set(_public(Job)) <= set(_public(cls)) | {"sharded"}, cls  # type: ignore[arg-type]


def test_a_dropped_client_is_freed_without_the_cycle_collector() -> None:
    gc.disable()
    try:
        client = taskq.Client(URL)
        ref = weakref.ref(client)
        del client
        assert ref() is None
    finally:
        gc.enable()


def test_the_client_exposes_its_connection() -> None:
    client = taskq.Client(URL, key_prefix="tq-parts", allow_eviction=True)
    assert client.url.startswith("redis://") and client.prefix == "tq-parts"
    assert client.allow_eviction and client.scripts is not None and client.redis is not None
    assert client.keys("a").meta == client.keys("a").meta
    assert isinstance(client.connection, Connection)
