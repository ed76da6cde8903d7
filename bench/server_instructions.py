"""Instructions redis-server runs per hot-path FCALL, counted by valgrind (by hand).

Usage: .venv/bin/python bench/server_instructions.py [--calls 200] [--before DIR]
           [--shapes 'prefetch 1,prefetch 0,batches(16),prefetch 16']

Where it sits: beside `hot_call.py`, whose server µs per FCALL move with a shared
machine's load by 20-30 % from run to run; an instruction count does not (±2 %: hash seeds,
the Lua GC's phase). redis-server runs under `valgrind --tool=callgrind`; one trainer (no
heartbeat) warms up, the counters are zeroed (`callgrind_control -z`), `--calls` calls of
the shape run, and the dump's total (`callgrind_control -d`) over the FCALLs counted by
INFO commandstats is printed, in thousands of instructions. `--before DIR` (a tree of an
older commit's taskq, `git archive REV taskq | tar -x -C DIR`) runs the same against
DIR's library and client. For where the instructions go, keep the dump
(`--keep FILE`) and read it with `callgrind_annotate --inclusive=yes FILE`
(bench/README.md has the reading of one). Needs valgrind with callgrind_control.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import redis

SHAPES = ("prefetch 1", "prefetch 0", "batches(16)", "prefetch 16")


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


def measure(shape: str, calls: int, keep: str = "") -> float:
    """Thousands of server instructions per FCALL of `shape` (this interpreter's taskq)."""
    import taskq

    port, d = _free_port(), tempfile.mkdtemp(prefix="taskq-cg-")
    out = os.path.join(d, "cg.out")
    server = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            d,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        admin = redis.Redis(host="127.0.0.1", port=port)
        for _ in range(300):
            try:
                admin.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.1)
        url = f"redis://127.0.0.1:{port}/0"
        client = taskq.connect(url)
        client.create_job("cg", [{"i": i} for i in range(calls * 16 + 2_000)], passes=None)
        batch = 16 if shape.startswith("batches") else 1
        prefetch = int(shape.split()[1]) if shape.startswith("prefetch") else 0
        trainer = taskq.Trainer(
            "cg", url=url, prefetch=prefetch, heartbeat=False, handle_signals=False
        )
        items = iter(trainer) if batch == 1 else trainer.batches(batch)
        for _ in range(100):
            next(items)
        admin.config_resetstat()
        subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True)
        for _ in range(calls):
            next(items)
        subprocess.run(["callgrind_control", "-d", str(server.pid)], capture_output=True)
        fcalls = admin.info("commandstats")["cmdstat_fcall"]["calls"]
        trainer.close()
        total = 0
        with open(out + ".1", errors="replace") as f:
            for line in f:
                if line.startswith("summary:"):
                    total = int(line.split()[1])
        if keep:
            os.replace(out + ".1", keep)
        return total / fcalls / 1000
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--before", default="")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--keep", default="", help="keep the (last) dump in this file")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if args.one:
        for shape in shapes:
            print(json.dumps([shape, measure(shape, args.calls, args.keep)]), flush=True)
        return
    trees = [("before", args.before), ("after", "")] if args.before else [("this tree", "")]
    got: dict[tuple[str, str], float] = {}
    for label, code_dir in trees:
        env = dict(os.environ)
        if code_dir:
            env["PYTHONPATH"] = os.pathsep.join([code_dir, env.get("PYTHONPATH", "")])
        cmd = [sys.executable, __file__, "--one", "--calls", str(args.calls)]
        cmd += ["--shapes", ",".join(shapes), "--keep", args.keep]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        if run.returncode != 0:
            raise SystemExit(f"{label}: exited {run.returncode}: {run.stderr[-800:]}")
        for line in run.stdout.splitlines():
            if line.startswith("["):
                shape, k = json.loads(line)
                got[(label, shape)] = k
    print(
        "| shape | " + " | ".join(f"{label}: k instructions / FCALL" for label, _ in trees) + " |"
    )
    print("|---|" + "---:|" * len(trees))
    for shape in shapes:
        print(
            f"| {shape} | " + " | ".join(f"{got[(label, shape)]:.0f}" for label, _ in trees) + " |"
        )


if __name__ == "__main__":
    main()
