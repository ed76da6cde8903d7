"""The idle cost of `taskq job follow` over a folder of files it appended long ago: CPU
seconds of the follower process per wall second, and the Redis time of its calls.

Usage: .venv/bin/python bench/follow_idle.py [--files 20000] [--every 1] [--window 30]
       [--age 7200] [--wildcard-folder [--folders 10]]

Where it sits: a diagnostic beside `streams.py`, against a private redis-server it starts
and stops. It writes `--files` one-line JSONL files in a temp folder (modified `--age`
seconds ago), creates a stream job and marks every file appended in the job's `follow`
record as a follower does (so nothing is appended: the follower only lists), starts
`taskq job follow --every EVERY`, lets it take its first listings, then measures the
follower's user+system CPU (/proc) and the server's `INFO commandstats` over `--window`
seconds. A local pattern is watched folder by folder: each interval stats the folders
(a wildcard folder: its parent listed), and a folder is listed again only when its mtime
moves. `--wildcard-folder` names the folder with a wildcard (`DIR*/*.jsonl`), and with
`--folders N` the files are spread over N folders (`DIR/day-*/*.jsonl`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

import taskq

ROOT = Path(__file__).resolve().parent.parent
TASKQ = os.path.join(os.path.dirname(sys.executable), "taskq")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--every", type=float, default=1.0)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--age", type=float, default=7200.0)
    ap.add_argument(
        "--wildcard-folder",
        action="store_true",
        help="a pattern with a wildcard in its folder part",
    )
    ap.add_argument(
        "--folders", type=int, default=1, help="--wildcard-folder: the files spread over N folders"
    )
    args = ap.parse_args()
    if args.folders > 1 and not args.wildcard_folder:
        ap.error("--folders needs --wildcard-folder")
    common.install_signal_handlers()
    server = common.start_redis()
    folder = Path(tempfile.mkdtemp(prefix="taskq-follow-idle-"))
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        client = taskq.Client(url)
        client.create_job("idle", [], stream=True)
        job = client.job("idle")
        when = time.time() - args.age
        keys = []
        dirs = (
            [folder]
            if args.folders == 1
            else [folder / f"day-{d:04d}" for d in range(args.folders)]
        )
        for d in dirs[1:] if args.folders == 1 else dirs:
            d.mkdir()
        for i in range(args.files):
            p = dirs[i % len(dirs)] / f"part-{i:07d}.jsonl"
            p.write_text('{"x": 1}\n')
            os.utime(p, (when, when))
            st = p.stat()
            keys.append(f"{p}|{st.st_size}|{st.st_mtime}")
        raw = server.client()
        for lo in range(0, len(keys), 1000):
            raw.hset(job.keys.follow, mapping={k: 1 for k in keys[lo : lo + 1000]})
        for d in dirs:  # an old folder: its mtime is trusted at once
            os.utime(d, (when, when))
        pattern = str(folder / "*.jsonl")
        if args.wildcard_folder:
            pattern = f"{folder}*/*.jsonl" if args.folders == 1 else f"{folder}/day-*/*.jsonl"
        follower = subprocess.Popen(
            [
                TASKQ,
                "--url",
                url,
                "job",
                "follow",
                "idle",
                "--files",
                pattern,
                "--every",
                str(args.every),
            ],
            stderr=subprocess.DEVNULL,
        )
        # its first listings: every file is older than the horizon, so the watermark
        # passes them all and the record shrinks to it alone; then two intervals more
        deadline = time.monotonic() + 600
        while raw.hlen(job.keys.follow) > 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2 * args.every)
        raw.config_resetstat()
        c0, t0 = cpu_seconds(follower.pid), time.monotonic()
        time.sleep(args.window)
        c1, t1 = cpu_seconds(follower.pid), time.monotonic()
        stats = raw.info("commandstats")
        follower.terminate()
        follower.wait(timeout=30)
        redis_us = sum(
            v["usec"]
            for k, v in stats.items()
            if k not in ("cmdstat_info", "cmdstat_config|resetstat")
        )
        calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()}
        print(
            f"files {args.files} in {args.folders} folder(s), pattern {pattern.replace(str(folder), 'DIR')}, "
            f"--every {args.every:g}s, window {t1 - t0:.1f}s: follower CPU "
            f"{100 * (c1 - c0) / (t1 - t0):.1f} % of a core; Redis "
            f"{redis_us / 1000 / (t1 - t0):.2f} ms per second; record fields "
            f"{raw.hlen(job.keys.follow)}; calls {calls}"
        )
    finally:
        server.cleanup()
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
