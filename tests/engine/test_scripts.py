"""The build of the Lua Function library (taskq/engine/library.py): per-call state, meta field
names, key counts, and the order of the parts. No Redis needed: these check the text."""

from __future__ import annotations

import re
from importlib import resources

import pytest
from support import part_with

import taskq
from taskq.engine import contract, library
from taskq.keys import COLD_KEYS, JOB_KEYS, META_FIELDS, SCRIPT_KEYS
from taskq.testing import script_function


def test_a_part_refuses_top_level_state_that_is_not_marked_per_call():
    """A part's locals outlive a call: state its reset() does not set back would leak."""
    with pytest.raises(taskq.TaskqError, match=r"lib/cuts.lua: top-level `local D` outlives"):
        library.build({"lib/cuts.lua": "local D = 1\nreturn {}\n"})
    with pytest.raises(taskq.TaskqError, match=r"lib/cuts.lua: its per-call locals \(B\) need"):
        library.build(
            {"lib/cuts.lua": part_with("cuts.lua", "local A, B = 0, {}  -- per call\n"
                                       "local function reset() A = 0 end\n", "reset = reset, ")}
        )  # fmt: skip
    assert "lib.cuts.reset()" not in library.SOURCE  # cuts.lua as shipped has no state
    state = "local A, B = 0, {}  -- per call\nlocal function reset()\n  A, B = 0, {}\nend\n"
    built = library.build({"lib/cuts.lua": part_with("cuts.lua", state, "reset = reset, ")})
    assert built.budgets["lib/cuts.lua"].per_call == ["A", "B"]
    begin = built.source[built.source.index("local function begin(keys)") :]
    assert "  lib.cuts.reset()\n" in begin.partition("\nend")[0] + "\n"
    assert "lib.cuts = (function()\n-- lib/cuts.lua\n" in built.source


def test_bindings_and_constants_are_not_per_call_state():
    """A local bound once when the part is built (a global, another part's function) or
    marked constant needs no reset."""
    text = (
        "local rcall, tonum = redis.call, tonumber\n"
        "local mget, mnum =\n  lib.meta.mget, lib.meta.mnum\n"
        "local T = {  -- constant\n  1, 2,\n}\n"
    )
    built = library.build({"lib/cuts.lua": part_with("cuts.lua", text)})
    assert built.budgets["lib/cuts.lua"].per_call == [] and "lib.cuts.reset()" not in built.source
    with pytest.raises(taskq.TaskqError, match="`local n` outlives a call"):
        library.build({"lib/cuts.lua": part_with("cuts.lua", "local n = lib.meta.mnum('x')\n")})


def test_begin_resets_every_part_with_per_call_state_and_builds_the_parts_once():
    body = re.search(r"^local function begin\(keys\)\n(.*?)^end$", library.SOURCE, re.S | re.M)
    assert body is not None
    assert body.group(1).startswith("  if not BUILT then build() end\n")
    pkg = resources.files("taskq.engine") / "lua" / "lib"
    stateful = {
        part.removesuffix(".lua")
        for part in library.LIB_PARTS
        if library.budget((pkg / part).read_text()).per_call
    }
    assert {"meta", "events", "call", "dispatch"} <= stateful
    assert set(re.findall(r"lib\.(\w+)\.reset\(\)", body.group(1))) == stateful
    assert "bind_globals" not in library.SOURCE


def test_the_guard_reads_tokens_so_indentation_and_strings_cannot_fool_it():
    """An `end` at column 0 inside a function, or a keyword in a string or a comment,
    does not end it (the column-0 `end` heuristic this replaced would have)."""
    text = (
        "local a, b, c = 1, 2, 3  -- constant\n"
        "local function f()\n"
        "if a then\n"
        "return b\n"
        "end\n"
        "return c  -- end\n"
        "end\n"
        "local function g() return 'end' .. [[\nend]] .. a end\n"
    )
    got = library.budget(text)
    assert got.locals == ["a", "b", "c", "f", "g"]
    assert got.upvalues["f"] == {"a", "b", "c"} and got.upvalues["g"] == {"a"}
    with pytest.raises(taskq.TaskqError, match="line 2: an unfinished string"):
        library.lua_tokens("local a = 1\nlocal b = 'x\n")


def test_the_build_refuses_a_part_near_luas_local_and_upvalue_limits():
    """Lua 5.1 stops loading a function at 200 locals or 60 upvalues; the build refuses a
    part at 191 / 51 with a message that names the part and says what to do."""
    many = "".join(f"local v{i} = redis.call\n" for i in range(191)) + "return {}\n"
    with pytest.raises(
        taskq.TaskqError, match=r"lib/cuts.lua declares 191 top-level locals .*part"
    ):
        library.build({"lib/cuts.lua": many})
    uses = " + ".join(f"u{i}()" for i in range(51))
    wide = "".join(f"local function u{i}() end\n" for i in range(51))
    wide += f"local function big()\n  return {uses}\nend\nreturn {{}}\n"
    with pytest.raises(taskq.TaskqError, match=r"lib/cuts.lua's function big uses 51 locals"):
        library.build({"lib/cuts.lua": wide})


def test_codes_and_bounds_are_written_as_numbers_and_unknown_codes_refused():
    text = library.expand("x.lua", "return {C.OK, C.JOB_NOT_FOUND, MAX_BATCH, K_CKPT}")
    assert text == f"return {{0, (-1), {contract.MAX_BATCH}, kc('ckpt')}}"
    with pytest.raises(taskq.TaskqError, match=r"x.lua: C.NOPE is not a contract.Code"):
        library.expand("x.lua", "C.NOPE")
    with pytest.raises(taskq.TaskqError, match=r"lib/cuts.lua: C.NOPE is not a contract.Code"):
        library.build({"lib/cuts.lua": part_with("cuts.lua", "local X = C.NOPE\n")})


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
    assert library.expand("x.lua", "mget(F.PASS, F.C_ACKED)") == (
        f"mget({slots['PASS']}, {slots['C_ACKED']})"
    )
    assert library.expand("x.lua", "rcall('HGET', K_META, N.PASS)") == (
        "rcall('HGET', K_META, 'pass')"
    )
    with pytest.raises(taskq.TaskqError, match=r"x.lua: F.PASSS is not in keys.MetaField"):
        library.expand("x.lua", "mget(F.PASSS)")
    with pytest.raises(taskq.TaskqError, match=r"x.lua: N.PASSS is not in keys.MetaField"):
        library.expand("x.lua", "rcall('HGET', K_META, N.PASSS)")
    # a command on the hash naming a field by its slot would read or write field '11'
    with pytest.raises(taskq.TaskqError, match=r"names a field as F.NAME"):
        library.expand("x.lua", "rcall('HGET', K_META, F.PASS)")


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
    toy = "#!lua flags=no-writes\n-- toy: answers OK.\n{keys}\nreturn {{C.OK}}\n"
    built = library.build(
        {"toy.lua": toy.format(keys="-- KEYS: the job's keys (keys.SCRIPT_KEYS)")}
    )
    assert built.functions["toy"][1:] == (n, True)
    extra = "-- KEYS: the job's keys (keys.SCRIPT_KEYS) + staging, other (why)"
    assert library.build({"toy.lua": toy.format(keys=extra)}).functions["toy"][1] == n + 2
    with pytest.raises(taskq.TaskqError, match="toy.lua: needs a header line"):
        library.build({"toy.lua": toy.format(keys="-- KEYS: some keys")})
    assert script_function("create")[1] == n + 2  # + staging, sizes
    assert script_function("ack")[1] == n


def test_the_keys_passed_and_the_cold_ones_are_every_key_once():
    """A script is passed SCRIPT_KEYS and makes the cold ones; none is both or neither."""
    assert sorted(SCRIPT_KEYS + COLD_KEYS) == sorted(JOB_KEYS)
    assert SCRIPT_KEYS[0] == "meta"  # kc() makes a cold key from the meta key's base
    assert not re.search(r"\bK_(" + "|".join(k.upper() for k in COLD_KEYS) + r")\b", library.SOURCE)
    assert script_function("stats")[2] and not script_function("ack")[2]


# what the library may read as a global: Lua's and Redis's, and a verb's KEYS / ARGV
_GLOBALS = {
    "redis", "cjson", "cmsgpack", "bit", "struct", "string", "table", "math", "unpack",
    "tonumber", "tostring", "type", "pairs", "ipairs", "next", "select", "error", "pcall",
    "assert", "setmetatable", "getmetatable", "rawget", "rawset", "KEYS", "ARGV",
}  # fmt: skip
_KEYWORDS = {
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in",
    "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
}  # fmt: skip


def _free_names(text: str) -> set[str]:
    """Names ``text`` reads that it declares nowhere (as a local, a parameter or a loop
    variable): globals to Lua, an error when the line runs if Redis has no such global."""
    code = [t for t in library.lua_tokens(text) if t.kind != "comment"]
    declared, used = set(), set()
    for k, t in enumerate(code):
        if t.kind != "name" or t.text in _KEYWORDS:
            continue
        prev = code[k - 1].text if k else ""
        if prev in (".", ":"):
            continue
        if k + 1 < len(code) and code[k + 1].text == "=" and prev in ("{", ","):
            continue  # a table constructor's key (or a multiple assignment: read anyway)
        used.add(t.text)
    for k, t in enumerate(code):
        if t.text == "local" or t.text == "for":
            j = k + 1 + (code[k + 1].text == "function")
            while j < len(code) and code[j].kind == "name":
                declared.add(code[j].text)
                if code[j + 1].text != ",":
                    break
                j += 2
        elif t.text == "function":
            j = k + 1
            while code[j].text != "(":
                j += 1
            while code[j].text != ")":
                if code[j].kind == "name":
                    declared.add(code[j].text)
                j += 1
    return used - declared - _GLOBALS - library.CHUNK_NAMES


def test_no_part_or_verb_reads_a_name_it_does_not_bind():
    """A name a unit neither declares nor binds is a global, and Redis answers an error
    only when the line runs: a part's function a verb forgot to bind, say."""
    pkg = resources.files("taskq.engine") / "lua"
    texts = {f"lib/{p}": (pkg / "lib" / p).read_text() for p in library.LIB_PARTS}
    texts |= {f"{v}.lua": (pkg / f"{v}.lua").read_text().partition("\n")[2] for v in library.VERBS}
    free = {}
    for unit, text in texts.items():
        names = _free_names(library.expand(unit, text))
        if names:
            free[unit] = sorted(names)
    assert free == {}
    assert _free_names("local a = 1\nreturn a + b") == {"b"}
