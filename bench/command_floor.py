"""The floor of taskq's data model at one task per call, counted by valgrind.

Usage: .venv/bin/python bench/command_floor.py [--calls 500] [--variants]

Where it sits: beside `server_instructions.py` (whose server and counting it uses). A
prefetch-1 `ack` FCALL runs 22 commands (MONITOR shows them): the meta HMGET, the worker's
record, TIME, the acked task's record and its three writes and done bit, the emptiness
EXISTS, the started task's record and its three writes, the next task's done bit and
record and its three writes, its chunks, the step event, the histogram bucket and the meta
HSET. This bench runs those same commands, with the same keys (a real job's, 28 KEYS) and
arguments of the same sizes, from a Lua function that does nothing else: no checks, no
cache, no parsing, one reply of the same shape. Instructions per call of it, beside the
real call's in the same run, split what a call costs into the data model's part (the
commands, the FCALL, moving KEYS, ARGV, the replies in and out of Lua) and the library's
logic (everything else). `--variants` runs the floor again with one change of the data
model each (a command fewer, a flat reply, fewer KEYS ...): what each change could save at
most. bench/HISTORY.md has the reading.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from server_instructions import _commands, _server, _total, measure  # noqa: E402

FLOOR = r"""#!lua name=floor
redis.register_function('floor', function(KEYS, ARGV)
  local rcall = redis.call
  local meta, chunks, done, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[7]
  local i = tonumber(ARGV[1])
  local w, winc, dig = ARGV[2], ARGV[3], '16f44d5309b8f376'
  local a, s, l = tostring(i - 2), tostring(i - 1), tostring(i)
  local owned, started, reserved = KEYS[8], KEYS[11], KEYS[10]
  local winfo, events, hist = KEYS[13], KEYS[19], KEYS[18]
  local m = rcall('HMGET', meta, 'inc', 'mclock', 'seen', 'ttl', 'hbi', 'offset', 'round',
    'state', 'evmax', 'due', 'pass', 'gen', 'reason', 'paused', 'n', 'cursor', 'ndone',
    'nleased', 'nreserved', 'last_token', 'tt', 'auto_tt', 'p_backups', 'dur_med',
    'acked_job', 'c_acked', 'c_leased', 'p_leased', 'shuffle', 'dur_sum', 'nwaiting')
  rcall('HGET', winfo, w)
  local t = rcall('TIME')
  local now = t[1] .. string.sub(t[2], 1, 3)
  local tok = t[1] .. t[2]
  rcall('HGET', leases, a)
  rcall('ZREM', owned, w .. '|' .. winc .. '|' .. a)
  rcall('ZREM', started, a)
  rcall('HSET', leases, a, 'E|' .. w .. '|' .. winc .. '|' .. tok .. '|1|A|' .. dig)
  rcall('SETBIT', done, a, 1)
  rcall('EXISTS', KEYS[15], KEYS[4], KEYS[25], KEYS[6])
  rcall('HGET', leases, s)
  rcall('HSET', leases, s, 'L|' .. w .. '|' .. winc .. '|' .. tok .. '|1|S|' .. now .. '|'
    .. s .. '|1|' .. dig)
  rcall('ZREM', reserved, s)
  rcall('ZADD', started, now, s)
  rcall('GETBIT', done, l)
  rcall('HGET', leases, l)
  rcall('HSET', leases, l, 'L|' .. w .. '|' .. winc .. '|' .. tok .. '|1|R|' .. now .. '|'
    .. l .. '|1|' .. dig)
  rcall('ZADD', owned, 0, w .. '|' .. winc .. '|' .. l)
  rcall('ZADD', reserved, now, l)
  local c = rcall('HMGET', chunks, l)
  rcall('XADD', events, 'MAXLEN', '~', '10000', '*', 'type', 'step', 'pass', '0', 'worker', w,
    'acked', a, 'acked_tokens', tok, 'started', s, 'started_tokens', tok, 'reserved', l,
    'reserved_tokens', tok)
  rcall('HINCRBY', hist, 'dur:1', 1)
  rcall('HSET', meta, 'seen', now, 'cursor', l, 'ndone', a, 'last_token', tok, 'dur_med',
    '210', 'acked_job', a, 'c_acked', a, 'c_leased', l, 'p_leased', l, 'dur_sum', '309',
    'last_ack', now)
  return {0, {{i, tok, 1, c[1], 0, 0}}, 0, {0, 0, m[8], ''}, {0}, {0}}
end)
"""


# A no-op for a command a variant leaves out, and a pass-through for a record it writes
# later (the HSETs merged): the strings are still built.
_HELPERS = (
    "local rcall = redis.call\n  local function nop(...) end\n  local function same(x) return x end"
)


def _without(src: str, *commands: str) -> str:
    for c in commands:
        assert c in src, c
        src = src.replace(c, "nop" + c.removeprefix("rcall"))
    return src.replace("local rcall = redis.call", _HELPERS)


def _hsets_merged(src: str) -> str:
    for task, rec, var in (("a", "'E|'", "r1"), ("s", "'L|'", "r2"), ("l", "'L|'", "r3")):
        src = src.replace(f"rcall('HSET', leases, {task}, {rec}", f"local {var} = same({rec}")
    src = src.replace(
        "  local c = rcall('HMGET', chunks, l)",
        "  rcall('HSET', leases, a, r1, s, r2, l, r3)\n  local c = rcall('HMGET', chunks, l)",
    )
    return src.replace("local rcall = redis.call", _HELPERS)


_HOT_META_12 = (
    "rcall('HMGET', meta, 'inc', 'seen', 'ttl', 'hbi', 'round', 'state', 'due', 'pass', 'n', "
    "'cursor', 'last_token', 'tt')"
)
# (name, the floor's text changed, KEYS passed): each one change of the data model
VARIANTS: tuple[tuple[str, str, int], ...] = (
    ("the floor", FLOOR, 28),
    ("no step event (XADD)", _without(FLOOR, "rcall('XADD'"), 28),
    ("no histogram bucket (HINCRBY)", _without(FLOOR, "rcall('HINCRBY'"), 28),
    (
        "no reserved zset (its ZREM and ZADD)",
        _without(FLOOR, "rcall('ZREM', reserved", "rcall('ZADD', reserved"),
        28,
    ),
    ("no emptiness check (EXISTS)", _without(FLOOR, "rcall('EXISTS'"), 28),
    ("the three lease records in one HSET", _hsets_merged(FLOOR), 28),
    (
        "the three lease reads in one HMGET",
        FLOOR.replace("rcall('HGET', leases, a)", "rcall('HMGET', leases, a, s, l)")
        .replace("  rcall('HGET', leases, s)\n", "")
        .replace("  rcall('HGET', leases, l)\n", ""),
        28,
    ),
    (
        "the done bits in one BITFIELD",
        FLOOR.replace(
            "rcall('SETBIT', done, a, 1)",
            "rcall('BITFIELD', done, 'SET', 'u1', a, 1, 'GET', 'u1', l)",
        ).replace("  rcall('GETBIT', done, l)\n", ""),
        28,
    ),
    (
        "the meta read of 12 fields, not 31",
        re.sub(r"rcall\('HMGET', meta, .*?'nwaiting'\)", _HOT_META_12, FLOOR, flags=re.S),
        28,
    ),
    (
        "a flat reply (one table)",
        FLOOR.replace(
            "return {0, {{i, tok, 1, c[1], 0, 0}}, 0, {0, 0, m[8], ''}, {0}, {0}}",
            "return {0, 0, 0, 0, m[8], '', 1, 0, 1, 0, 1, i, tok, 1, c[1], 0, 0}",
        ),
        28,
    ),
    (
        "16 KEYS, not 28 (the cold ones made when used)",
        FLOOR.replace("KEYS[19]", "KEYS[12]")
        .replace("KEYS[18]", "KEYS[14]")
        .replace("KEYS[25]", "KEYS[16]"),
        16,
    ),
)


def measure_floor(calls: int, src: str = FLOOR, nkeys: int = 28) -> dict[str, float]:
    """Thousands of server instructions per call of the floor function `src` (passed its
    job's first `nkeys` KEYS), and commands per call, against a real job's keys."""
    import taskq
    from taskq.keys import JOB_KEYS

    d = tempfile.mkdtemp(prefix="taskq-floor-")
    out = os.path.join(d, "cg.out")
    server, port, admin = _server(d, out)
    try:
        client = taskq.connect(f"redis://127.0.0.1:{port}/0")
        client.create_job("cg", [{"i": i} for i in range(calls + 2_200)], passes=None)
        keys = [f"taskq:{{cg}}:{name}" for name in JOB_KEYS][:nkeys]
        slots = {"meta": 1, "chunks": 2, "done": 3, "dead": 4, "front": 6, "leases": 7}
        slots.update(owned=8, reserved=10, started=11, winfo=13, counts=15, hist=18)
        slots.update(events=19, progress=25)
        assert all(JOB_KEYS[i - 1] == name for name, i in slots.items()), JOB_KEYS
        admin.function_load(src, replace=True)
        # a second lease secret's worth of ARGV, as the real ack sends: 13 arguments
        argv = ["", "vm:10813:fe1c4e", "62ad9e73eb3b", "51", "1", "50", "1796218907741980"]
        argv += ["1", "51", "1796218908044513", "1", "R", "-1", "s" * 32]

        def call(i: int) -> None:
            argv[0] = str(i)
            admin.fcall("floor", len(keys), *keys, *argv)

        for i in range(2, 102):
            call(i)
        admin.config_resetstat()
        subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True)
        for i in range(102, 102 + calls):
            call(i)
        subprocess.run(["callgrind_control", "-d", str(server.pid)], capture_output=True)
        fcalls, others = _commands(admin)
        total = _total(out, "")
        return {"call": total / fcalls / 1000, "cmds": (others + fcalls) / fcalls}
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--variants", action="store_true", help="each data-model change too")
    args = parser.parse_args()
    real = measure("prefetch 1", args.calls)
    floor = measure_floor(args.calls)
    print("| call | k instructions | commands / FCALL |")
    print("|---|---:|---:|")
    print(f"| taskq `ack`, prefetch 1 | {real['call']:.0f} | {real['cmds']:.1f} |")
    print(f"| the same commands, nothing else | {floor['call']:.0f} | {floor['cmds']:.1f} |")
    print(f"| the library's logic (the difference) | {real['call'] - floor['call']:.0f} | |")
    if not args.variants:
        return
    print()
    print("| the floor with one change | k instructions | saved | commands / FCALL |")
    print("|---|---:|---:|---:|")
    for name, src, nkeys in VARIANTS[1:]:
        got = measure_floor(args.calls, src, nkeys)
        print(
            f"| {name} | {got['call']:.0f} | {floor['call'] - got['call']:.0f} "
            f"| {got['cmds']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
