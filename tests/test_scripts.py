"""The build of the Lua Function library (taskq/engine/library.py): per-call state, meta field
names, key counts, and the order of the parts. No Redis needed: these check the text."""

from __future__ import annotations

import re
from importlib import resources

import pytest

import taskq
from taskq.engine import contract, library
from taskq.keys import COLD_KEYS, JOB_KEYS, META_FIELDS, SCRIPT_KEYS


def test_library_refuses_a_top_level_local_that_is_not_marked_per_call():
    """A library's locals outlive a call: state begin() does not reset would leak."""
    parts = {"x.lua": "local A, B = 0, {}  -- per call\nlocal D = 1\n"}
    with pytest.raises(taskq.TaskqError, match=r"lib/x.lua: top-level `local D = 1`"):
        library._begin(parts)
    parts["x.lua"] = parts["x.lua"].replace("local D = 1", "local D = 1  -- per call")
    begin = library._begin(parts)
    assert "  A, B = 0, {}\n" in begin and "  D = 1\n" in begin


def test_a_multi_line_declaration_is_refused_as_it_could_not_be_reset():
    with pytest.raises(taskq.TaskqError, match="not marked"):
        library._begin({"x.lua": "local T = {\n  1,\n}  -- per call\n"})


def test_begin_resets_every_per_call_local_of_the_real_library():
    pkg = resources.files("taskq.engine") / "lua" / "lib"
    declared = set()
    for part in library.LIB_PARTS:
        for line in (pkg / part).read_text().splitlines():
            if line.startswith("local ") and not line.startswith("local function "):
                names = line[len("local ") :].partition("=")[0]
                declared |= {n.strip() for n in names.split(",")}
    body = re.search(r"^local function begin\(keys\)\n(.*?)^end$", library.SOURCE, re.S | re.M)
    assert body is not None
    reset = {
        n.strip()
        for line in body.group(1).splitlines()
        if "=" in line
        for n in line.partition("=")[0].split(",")
    }
    assert {"NOW", "M", "EVT", "GRANTED", "COUNTS_EMPTY"} <= declared
    # what bind_globals() sets on every call is not reset first (no upvalue of begin)
    bound = library._bound_globals({"meta.lua": (pkg / "meta.lua").read_text()})
    assert {"rcall", "tonum", "lipairs"} <= bound
    assert declared - bound <= reset
    assert not bound & reset
    assert "bind_globals()" in body.group(1)


def test_the_build_refuses_a_library_near_luas_local_and_upvalue_limits():
    """Lua 5.1 stops loading a chunk at 200 locals and a function at 60 upvalues; the
    build refuses 180 / 50 with a message that says what to do."""
    n_locals, upvalues = library.headroom(library.SOURCE.replace(f"{library.LIBRARY}_", "%FN%"))
    assert n_locals <= library.MAX_LOCALS and max(upvalues.values()) <= library.MAX_UPVALUES
    assert upvalues["begin"] > 0 and upvalues["verb ack"] > 0
    many = "".join(f"local v{i} = nil  -- per call\n" for i in range(181))
    with pytest.raises(taskq.TaskqError, match=r"181 top-level locals .*write constants"):
        library._check_headroom(many)
    uses = " + ".join(f"u{i}" for i in range(51))
    wide = "".join(f"local function u{i}() end\n" for i in range(51))
    wide += f"local function big()\n  return {uses}\nend\n"
    with pytest.raises(taskq.TaskqError, match=r"function big uses 51 library locals .*split"):
        library._check_headroom(wide)


def test_codes_and_bounds_are_written_as_numbers_and_unknown_codes_refused():
    text = library._constants("x.lua", "return {C.OK, C.JOB_NOT_FOUND, MAX_BATCH, K_CKPT}")
    assert text == f"return {{0, (-1), {contract.MAX_BATCH}, kc('ckpt')}}"
    with pytest.raises(taskq.TaskqError, match=r"x.lua: C.NOPE is not a contract.Code"):
        library._constants("x.lua", "C.NOPE")


def test_every_lua_file_is_under_400_lines():
    pkg = resources.files("taskq.engine") / "lua"
    files = [*pkg.glob("*.lua"), *(pkg / "lib").glob("*.lua")]  # type: ignore[attr-defined]
    assert files
    long = {f.name: n for f in files if (n := len(f.read_text().splitlines())) >= 400}
    assert long == {}


def test_the_parts_are_every_file_of_lua_lib_in_a_fixed_order():
    pkg = resources.files("taskq.engine") / "lua" / "lib"
    assert sorted(library.LIB_PARTS) == sorted(p.name for p in pkg.iterdir())
    offsets = [library.SOURCE.index(f"-- lib/{part}\n") for part in library.LIB_PARTS]
    assert offsets == sorted(offsets)


def test_an_unknown_meta_field_is_refused_and_known_ones_become_literals():
    slots = library.META_SLOTS
    assert library._fields("x.lua", "mget(F.PASS, F.C_ACKED)") == (
        f"mget({slots['PASS']}, {slots['C_ACKED']})"
    )
    assert library._fields("x.lua", "rcall('HGET', K_META, N.PASS)") == (
        "rcall('HGET', K_META, 'pass')"
    )
    with pytest.raises(taskq.TaskqError, match=r"x.lua: F.PASSS is not in keys.MetaField"):
        library._fields("x.lua", "mget(F.PASSS)")
    with pytest.raises(taskq.TaskqError, match=r"x.lua: N.PASSS is not in keys.MetaField"):
        library._fields("x.lua", "rcall('HGET', K_META, N.PASSS)")
    # a command on the hash naming a field by its slot would read or write field '11'
    with pytest.raises(taskq.TaskqError, match=r"names a field as F.NAME"):
        library._fields("x.lua", "rcall('HGET', K_META, F.PASS)")


def test_meta_slots_name_every_field_once_and_the_hot_ones_first():
    """load_meta's HMGET reply is the cache itself: slot i is the i-th field it names."""
    names = sorted(library.META_SLOTS, key=library.META_SLOTS.get)
    assert sorted(names) == sorted(META_FIELDS)
    assert tuple(names[: len(library.HOT_META)]) == library.HOT_META
    assert list(library.META_SLOTS.values()) == list(range(1, len(META_FIELDS) + 1))


def test_no_meta_field_name_is_written_as_a_literal_in_the_lua():
    """Meta fields are named through F.<NAME> only, so the check above sees every one."""
    pkg = resources.files("taskq.engine") / "lua"
    files = [p for p in pkg.iterdir() if p.name.endswith(".lua")]
    files += [p for p in (pkg / "lib").iterdir() if p.name.endswith(".lua")]
    literal = re.compile(r"\b(?:mget|mnum|mput|mincr|mset)\('|K_META, '")
    for path in files:
        assert not literal.search(path.read_text()), path.name
    assert not re.search(r"\b[FN]\.[A-Za-z_]", library.SOURCE)
    assert len(set(META_FIELDS.values())) == len(META_FIELDS)


def test_the_key_count_comes_from_the_keys_header_line():
    n = len(SCRIPT_KEYS)
    assert library._nkeys("v.lua", "-- KEYS: the job's keys (keys.SCRIPT_KEYS)\n") == n
    extra = "-- KEYS: the job's keys (keys.SCRIPT_KEYS) + staging, other (why)\n"
    assert library._nkeys("v.lua", extra) == n + 2
    with pytest.raises(taskq.TaskqError, match="v.lua: needs a header line"):
        library._nkeys("v.lua", "-- KEYS: some keys\n")
    assert library._FUNCTIONS["create"][1] == n + 1
    assert library._FUNCTIONS["ack"][1] == n


def test_the_keys_passed_and_the_cold_ones_are_every_key_once():
    """A script is passed SCRIPT_KEYS and makes the cold ones; none is both or neither."""
    assert sorted(SCRIPT_KEYS + COLD_KEYS) == sorted(JOB_KEYS)
    assert SCRIPT_KEYS[0] == "meta"  # kc() makes a cold key from the meta key's base
    assert not re.search(r"\bK_(" + "|".join(k.upper() for k in COLD_KEYS) + r")\b", library.SOURCE)
    assert library._FUNCTIONS["stats"][2] and not library._FUNCTIONS["ack"][2]
