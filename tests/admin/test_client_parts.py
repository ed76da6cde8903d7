"""The admin ``Client`` holds the engine's connection and opens job handles; a job's verbs
are written once, on ``Job`` (taskq/admin/jobs.py), each with a route for sharded jobs
in ``ROUTES``; the client's short forms are generated from them, none written; no class
of the surface inherits from another; a dropped client is freed at once. No server is
needed: a ``Client`` connects on its first call."""

from __future__ import annotations

import gc
import inspect
import weakref

import taskq
from taskq.admin import client as client_module
from taskq.admin.jobs import ROUTES, Job
from taskq.engine.connection import Connection

URL = "redis://127.0.0.1:1/0"  # never reached
#: Client methods written in client.py: the connection, the index, create, job(name).
OWN = {"keys", "run", "ping", "memory_policy", "check_memory_policy", "list_jobs"}
OWN |= {"repair_index", "job", "create_job"}


def test_no_class_of_the_surface_inherits_from_another() -> None:
    for cls in [taskq.Client, Connection, Job]:
        assert cls.__bases__ == (object,), cls


def _public(cls: type) -> dict[str, object]:
    return {n: m for n, m in vars(cls).items() if not n.startswith("_") and inspect.isfunction(m)}


def test_the_client_writes_no_verb_its_short_forms_are_generated_from_the_job() -> None:
    source = inspect.getsource(client_module.Client)
    short = {n: m for n, m in _public(taskq.Client).items() if n not in OWN}
    assert set(short) == set(client_module.SHORT_FORMS)
    for name, method in short.items():
        verb = client_module.SHORT_FORMS[name]
        assert f"def {name}(" not in source, name
        assert method.__wrapped__ is getattr(Job, verb), name  # type: ignore[attr-defined]
        assert method.__doc__ and verb in method.__doc__, name


def test_every_verb_of_the_job_has_a_sharded_route_and_every_route_a_verb() -> None:
    verbs = {n for n, m in _public(Job).items() if hasattr(m, "__wrapped__")}
    assert verbs == set(ROUTES)
    assert len(verbs) >= 29


def test_a_dropped_client_is_freed_without_the_cycle_collector() -> None:
    gc.disable()
    try:
        client = taskq.Client(URL)
        ref = weakref.ref(client)
        del client
        assert ref() is None
    finally:
        gc.enable()


def test_the_client_shows_what_a_user_looks_at_and_its_connection_the_rest() -> None:
    client = taskq.Client(URL, key_prefix="tq-parts", allow_eviction=True)
    conn = client.connection
    assert isinstance(conn, Connection) and conn.prefix == "tq-parts" and conn.allow_eviction
    assert client.redis is conn.redis and client.url == conn.url and client.prefix == conn.prefix
    assert client.url.startswith("redis://") and conn.scripts is not None
    assert client.keys("a").meta == conn.keys("a").meta == "tq-parts:{a}:meta"
    assert "allow_eviction" not in dir(client)  # the connection's setting, not the client's
