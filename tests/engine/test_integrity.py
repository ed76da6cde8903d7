"""``integrity.decode_chunks``: the chunk lists a trainer decodes from a lease reply are
exactly what ``json.loads`` makes of the stored value, and what it refuses is refused as
``CorruptData`` naming the key and the field."""

from __future__ import annotations

import json
import math

import pytest

import taskq
from taskq.integrity import decode_chunks

KEY = "taskq:{job}:chunks"

#: values json.loads accepts, each a list, some only through its wrapper (whitespace)
ACCEPTED = [
    "[]",
    '[{"i": 7}]',
    '[["data/part-00001.parquet", 3, 0, 1024]]',
    "[123456789012345678901234567890, -9223372036854775809]",  # past 64 bits: exact ints
    "[1e400, -1e400, 1e-400, -0.0]",
    "[NaN, Infinity, -Infinity]",  # json.loads's constants, taken as it takes them
    '["\\ud800", "\\u00e9", "caf\u00e9"]',  # a lone surrogate escape, a non-ASCII char
    " \t[1, 2]\n ",
    '[{"a": 1, "a": 2}]',
]

#: values json.loads refuses (or that are not lists)
REFUSED = [
    "",
    "{not json",
    "[1,]",
    "[1] x",
    "[1][2]",
    "\ufeff[1]",
    "[01]",
    '["\t"]',
    "[nan]",
]


@pytest.mark.parametrize("raw", ACCEPTED)
def test_decode_chunks_gives_what_json_loads_gives(raw: str) -> None:
    got = decode_chunks(raw, KEY, 3)
    want = json.loads(raw)
    assert type(got) is list
    # NaN != NaN: compare the JSON texts (repr keeps the int/float distinction)
    assert repr(got) == repr(want)
    assert [type(x) for x in got] == [type(x) for x in want]


def test_decode_chunks_keeps_big_ints_exact_and_nan_a_float() -> None:
    got = decode_chunks("[18446744073709551617, NaN]", KEY, 3)
    assert got[0] == 18446744073709551617 and type(got[0]) is int
    assert math.isnan(got[1])


@pytest.mark.parametrize("raw", REFUSED)
def test_decode_chunks_refuses_what_json_loads_refuses(raw: str) -> None:
    with pytest.raises(ValueError):
        json.loads(raw)
    with pytest.raises(taskq.CorruptData, match="not JSON") as e:
        decode_chunks(raw, KEY, 3)
    assert KEY in str(e.value) and "field 3" in str(e.value)


@pytest.mark.parametrize("raw", ['{"path": "x"}', '"x"', "1", "null"])
def test_decode_chunks_refuses_json_that_is_not_a_list(raw: str) -> None:
    with pytest.raises(taskq.CorruptData, match="must be a JSON list") as e:
        decode_chunks(raw, KEY, 5)
    assert KEY in str(e.value) and "field 5" in str(e.value)


def test_decode_chunks_refuses_a_value_that_is_not_text() -> None:
    with pytest.raises(taskq.CorruptData, match="not JSON"):
        decode_chunks(None, KEY, 1)
    assert decode_chunks(b'[{"i": 1}]', KEY, 1) == [{"i": 1}]  # bytes: json.loads's rules
