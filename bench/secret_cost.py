"""What lease secrets cost an ack+lease call: this tree's library next to an older one's.

Usage: .venv/bin/python bench/secret_cost.py [--before main] [--calls 20000] [--rounds 5]

Where it sits: a diagnostic beside `taskq_profile.py` (not a section of run.py). The
library of git revision `--before` (exported with `git archive` into a temp dir) and this
tree's run in turns, each round in a child process against a fresh private redis-server:
register one worker, then `--calls` raw `ack` calls that ack the task the last one leased
and lease the next (1 per call, mode S). Per call it prints the server's time inside
FCALL (INFO commandstats: what the script costs Redis) and the client's wall time, the
median over the rounds of each; the difference is what the secret check adds (hashing
the secret once per call, comparing digests, 17 more bytes per lease record). On a
shared, loaded machine that difference drowns in the rounds' spread, so the parts are
also timed alone, each in a loop inside one script, beside one HGET for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import common
import redis

ROOT = Path(__file__).resolve().parent.parent


def child(calls: int) -> dict[str, float]:
    """One round, with whichever taskq is first on sys.path."""
    from importlib import resources

    import taskq

    header = (resources.files("taskq.engine") / "lua" / "register.lua").read_text()
    with_secret = "secret" in header.split("\n-- returns", 1)[0]
    with common.start_redis() as server:
        client = taskq.Client(f"redis://{common.LOOPBACK}:{server.port}/0")
        job = "cost"
        client.create_job(job, [{"i": i} for i in range(calls + 300)], task_timeout=None)
        keys = client.keys(job).script
        secret = secrets.token_hex(16)
        extra = [secret] if with_secret else []
        reg = client.connection.scripts.call(
            "register", keys, ["", "w", "inc1", 0, "host", os.getpid(), *extra]
        )
        job_inc = reg[1]
        admin = redis.Redis(host=common.LOOPBACK, port=server.port)
        prev: list[object] = []
        call_no = 0

        def step() -> None:
            nonlocal prev, call_no
            call_no += 1
            reply = client.connection.scripts.call(
                "ack",
                keys,
                [job_inc, "w", "inc1", call_no, len(prev) // 2, *prev, 0, 1, "S", -1, *extra],
            )
            row = reply[1][0]
            prev = [row[0], row[1]]

        for _ in range(200):  # warm up (the library load, the first records)
            step()
        admin.config_resetstat()
        t0 = time.perf_counter()
        for _ in range(calls):
            step()
        wall = time.perf_counter() - t0
        stat = admin.info("commandstats")["cmdstat_fcall"]
        admin.close()
    return {
        "server_us": stat["usec"] / stat["calls"],
        "wall_us": wall / calls * 1e6,
        "secret": with_secret,
    }


#: The work a secret adds to a call, each timed alone inside one script (no client, no
#: network): {name: (Lua body run `n` times, what it stands for)}. `s` is a secret, `rec`
#: and `rec2` lease records without and with the digest, `k` a scratch hash.
MICRO = {
    "loop": ("local x = i", "the empty loop (subtracted from the others)"),
    "hash": ("local d = string.sub(redis.sha1hex(s), 1, 16)", "hash the secret once (use_secret)"),
    "parse8": (
        "local a, b, c, d, e, f, g, h = string.match(rec, P8)",
        "parse a record without the digest",
    ),
    "parse9": (
        "local a, b, c, d, e, f, g, h, j = string.match(rec2, P9)",
        "parse a record with it",
    ),
    "hset8": ("redis.call('HSET', k, 'f', rec)", "write a record without the digest"),
    "hset9": ("redis.call('HSET', k, 'f', rec2)", "write a record with it"),
    "hget": (
        "local v = redis.call('HGET', k, 'f')",
        "for scale: one HGET (a call of 1 task makes ~30 commands)",
    ),
}


def micro(n: int, rounds: int = 7) -> dict[str, float]:
    """µs per run of each MICRO body, on a private redis-server: the parts take turns,
    `rounds` times, and each gets the median of its rounds (a shared machine's load
    comes and goes)."""
    field = "([^|]*)"
    p8 = "^L|" + "|".join([field] * 8) + "$"
    p9 = "^L|" + "|".join([field] * 9) + "$"
    rec = "L|host:1234:abcdef|0123456789ab|1764590000123456|3|S|1764590000123|42|1"
    prelude = (
        f"local s, k = ARGV[1], KEYS[1]\nlocal rec = '{rec}'\n"
        f"local rec2 = rec .. '|0123456789abcdef'\nlocal P8, P9 = '{p8}', '{p9}'\n"
    )
    times: dict[str, list[float]] = {name: [] for name in MICRO}
    with common.start_redis() as server:
        r = redis.Redis(host=common.LOOPBACK, port=server.port)
        secret = secrets.token_hex(16)
        scripts = {
            name: prelude + f"for i = 1, {n} do {body} end\nreturn 1"
            for name, (body, _) in MICRO.items()
        }
        for script in scripts.values():
            r.eval(script, 1, "micro:k", secret)  # warm up
        for _ in range(rounds):
            for name, script in scripts.items():
                t0 = time.perf_counter()
                r.eval(script, 1, "micro:k", secret)
                times[name].append((time.perf_counter() - t0) / n * 1e6)
        r.close()
    return {name: statistics.median(ts) for name, ts in times.items()}


def export(rev: str, into: Path) -> Path:
    """The taskq package of git revision ``rev``, unpacked under ``into``."""
    archive = into / "taskq.tar"
    subprocess.run(
        ["git", "-C", str(ROOT), "archive", "-o", str(archive), rev, "taskq"], check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="main", help="git revision to compare with")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--micro-n", type=int, default=200000, help="runs of each part in the per-part timing"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.calls)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        variants = {f"before ({args.before})": export(args.before, Path(tmp)), "after": ROOT}
        got: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, root in variants.items():
                env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{ROOT / 'bench'}")
                run = subprocess.run(
                    [sys.executable, __file__, "--child", "--calls", str(args.calls)],
                    env=env,
                    cwd=tmp,
                    capture_output=True,
                    text=True,
                )
                if run.returncode != 0:
                    sys.exit(f"{name}: the round failed:\n{run.stderr}")
                got[name].append(json.loads(run.stdout.strip().splitlines()[-1]))
    print(
        f"ack+lease, 1 task per call, {args.calls} calls x {args.rounds} rounds "
        f"(median; all rounds)"
    )
    print("| library | lease secrets | server µs / call (FCALL) | client wall µs / call |")
    print("|---|---|---:|---:|")
    for name, rows in got.items():
        srv = [r["server_us"] for r in rows]
        wall = [r["wall_us"] for r in rows]
        print(
            f"| {name} | {'yes' if rows[0]['secret'] else 'no'} "
            f"| {statistics.median(srv):.1f} ({', '.join(f'{v:.1f}' for v in srv)}) "
            f"| {statistics.median(wall):.1f} ({', '.join(f'{v:.0f}' for v in wall)}) |"
        )
    parts = micro(args.micro_n)
    print(
        f"\nThe parts, each timed alone in a script ({args.micro_n} runs; median of 7 "
        "rounds taken in turns; µs per run, less the empty loop)"
    )
    print("| part | µs |")
    print("|---|---:|")
    for name, (_, what) in MICRO.items():
        if name != "loop":
            print(f"| {what} | {parts[name] - parts['loop']:.3f} |")
    # an ack+lease call of 1 task hashes its secret once, parses the acked lease's record
    # (the grant's is_free skips ended records unparsed) and writes two records (the
    # ended one, the granted one)
    per_call = (
        (parts["hash"] - parts["loop"])
        + (parts["parse9"] - parts["parse8"])
        + 2 * (parts["hset9"] - parts["hset8"])
    )
    print(
        f"\nadded per ack+lease call of 1 task (one hash, one parse and two writes "
        f"of a longer record): {per_call:.2f} µs = "
        f"{per_call / (parts['hget'] - parts['loop']):.1f} HGETs on this machine now"
    )


if __name__ == "__main__":
    main()
