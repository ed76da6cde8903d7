"""The Lua library as built (taskq/engine/library.py) loaded into a real server: every part
keeps its headroom under Lua 5.1's limits, and a part can take a new helper."""

from __future__ import annotations

import os

from support import part_with

import taskq
from taskq.engine import library
from taskq.engine.contract import Code
from taskq.keys import JobKeys
from taskq.testing import script_function


def _stats(client: taskq.Client, function: str, job: str) -> list[object]:
    """The stats verb of library function `function`, called as a raw client would."""
    keys = JobKeys(job).script
    reply = client.redis.execute_command("FCALL", function, len(keys), *keys, "1")
    assert isinstance(reply, list)
    return reply


def test_the_library_loads_and_every_part_stays_10_below_luas_limits(client, job_name):
    """Lua 5.1 stops a function at 200 locals and 60 upvalues: each part's closure, each
    verb's callback and the chunk around them keeps 10 of each spare."""
    client.redis.execute_command("FUNCTION", "LOAD", "REPLACE", library.SOURCE)
    client.create_job(job_name, chunks=[{"i": i} for i in range(4)])
    # the first call after a load builds every part
    assert _stats(client, script_function("stats")[0], job_name)[0] == Code.OK
    units = {f"lib/{p}" for p in library.LIB_PARTS} | {f"{v}.lua" for v in library.VERBS}
    units |= {"the library's chunk"}
    assert units <= set(library.BUDGETS)
    for unit in units:
        got = library.BUDGETS[unit]
        assert len(got.locals) <= library.LUA_MAX_LOCALS - 10, unit
        for function, used in got.upvalues.items():
            assert len(used) <= library.LUA_MAX_UPVALUES - 10, (unit, function)


def test_a_helper_added_to_the_largest_part_still_loads_and_runs(client, job_name):
    """The headroom is real: the part with the most locals takes a helper of its own
    (bindings and a function) and the library still loads and answers."""
    largest = max(library.LIB_PARTS, key=lambda p: len(library.BUDGETS[f"lib/{p}"].locals))
    helper = (
        "local extra_call, extra_number = redis.call, tonumber\n"
        "local function extra_helper(key)\n"
        "  return extra_number(extra_call('EXISTS', key))\n"
        "end\n"
    )
    changed = part_with(largest, helper, "extra_helper = extra_helper, ")
    name, source, functions, budgets = library.build({f"lib/{largest}": changed})
    assert name != library.LIBRARY and "extra_helper" in budgets[f"lib/{largest}"].locals
    client.redis.execute_command("FUNCTION", "LOAD", "REPLACE", source)
    try:
        client.create_job(job_name, chunks=[{"i": i} for i in range(4)])
        assert _stats(client, functions["stats"][0], job_name)[0] == Code.OK
    finally:
        client.redis.execute_command("FUNCTION", "DELETE", name)


def test_the_cached_library_is_the_built_one_and_a_damaged_entry_is_built_again(
    tmp_path, monkeypatch
):
    """cached_build() keeps build()'s result under a hash of its inputs: read back, it is the
    same library (text, functions, budgets); an entry that does not parse is built again
    and rewritten."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = library.build()
    first = library.cached_build()
    (entry,) = (tmp_path / "taskq").glob("library-*.json")
    assert library.cached_build() == first == built
    entry.write_text('{"name": "taskq_')
    assert library.cached_build() == built
    assert entry.read_text().startswith('{"name": "' + built.name)


def test_the_cache_keeps_the_newest_entries(tmp_path, monkeypatch):
    """Entries of other versions of the Lua beyond library.CACHE_KEEP go, the oldest first."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = tmp_path / "taskq"
    folder.mkdir()
    for i in range(library.CACHE_KEEP + 2):
        old = folder / f"library-old{i}.json"
        old.write_text("{}")
        os.utime(old, (i, i))
    library.cached_build()
    left = {p.name for p in folder.glob("library-*.json")}
    assert len(left) == library.CACHE_KEEP
    assert "library-old0.json" not in left and "library-old1.json" not in left
    assert f"library-old{library.CACHE_KEEP + 1}.json" in left
