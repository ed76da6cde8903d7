"""The admin ``Client`` is a facade composed of parts (client_*.py), none inheriting from
another: each public method hands its call to one part, carrying that part's docstring;
the parts hold the client weakly, so a dropped client is freed at once. No server is
needed: a ``Client`` connects on its first call."""

from __future__ import annotations

import gc
import inspect
import weakref

import pytest

import taskq
from taskq.admin import client_conn, client_handles, client_jobs, client_ops, client_reads

PARTS = [
    client_conn.Connection,
    client_reads.Reads,
    client_jobs.Lifecycle,
    client_ops.Operations,
    client_handles.Handles,
]
URL = "redis://127.0.0.1:1/0"  # never reached


def test_no_class_of_the_client_inherits_from_another() -> None:
    for cls in [taskq.Client, *PARTS]:
        assert cls.__bases__ == (object,), cls


def _public(cls: type) -> dict[str, object]:
    return {n: m for n, m in vars(cls).items() if not n.startswith("_") and inspect.isfunction(m)}


@pytest.mark.parametrize("part", PARTS[:-1], ids=lambda p: p.__name__)
def test_each_verb_of_a_part_is_the_clients_with_its_signature_and_docstring(
    part: type,
) -> None:
    facade = _public(taskq.Client)
    for name, method in _public(part).items():
        assert name in facade, f"{part.__name__}.{name} is not a Client method"
        mine, theirs = inspect.signature(facade[name]), inspect.signature(method)  # type: ignore[arg-type]
        assert str(mine) == str(theirs), name
        assert facade[name].__doc__ == method.__doc__ and method.__doc__, name  # type: ignore[attr-defined]


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
