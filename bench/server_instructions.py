"""Instructions redis-server runs per hot-path FCALL, counted by valgrind (by hand).

Usage: .venv/bin/python bench/server_instructions.py [--calls 200] [--before DIR]
           [--shapes 'prefetch 1,prefetch 0,batches(16),prefetch 16'] [--bullmq 1,16]
           [--jobs 2000]

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

Each row gives instructions per FCALL, per task (tasks handed out in the window: calls x
the batch) and Redis commands per FCALL (INFO commandstats: a script's inner commands are
counted there, so this is redis.calls + 1). The BullMQ rows (`--bullmq`, concurrency list;
needs node and `npm ci` in bench/peers/bullmq) run in the same invocation on their own
callgrind'ed server: peers/bullmq/drain_once.mjs drains a warm-up, enqueues `--jobs` no-op
jobs, the counters are zeroed, one Worker drains them: instructions / jobs.
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
BULLMQ_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers", "bullmq")


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


def _server(d: str, out: str) -> tuple[subprocess.Popen[bytes], int, redis.Redis]:
    port = _free_port()
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
    admin = redis.Redis(host="127.0.0.1", port=port)
    for _ in range(300):
        try:
            admin.ping()
            break
        except redis.exceptions.ConnectionError:
            time.sleep(0.1)
    return server, port, admin


def _total(out: str, keep: str) -> int:
    total = 0
    with open(out + ".1", errors="replace") as f:
        for line in f:
            if line.startswith("summary:"):
                total = int(line.split()[1])
    if keep:
        os.replace(out + ".1", keep)
    return total


def _commands(admin: redis.Redis) -> tuple[int, int]:
    """(FCALLs, all other commands) since the last CONFIG RESETSTAT."""
    stats = admin.info("commandstats")
    fcalls = int(stats.get("cmdstat_fcall", {}).get("calls", 0))
    others = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_fcall")
    return fcalls, others


def _batch(shape: str) -> int:
    """Tasks a call leases in ``shape``."""
    return 16 if shape.startswith("batches") else 1


def _window(
    server: subprocess.Popen[bytes], admin: redis.Redis, url: str, shape: str, calls: int
) -> tuple[int, int]:
    """Lease job "cg" in ``shape`` for 100 calls (warm), then ``calls`` more between
    callgrind's zeroed counters and its dump: (FCALLs, all other commands) of that window."""
    import taskq

    batch = _batch(shape)
    prefetch = int(shape.split()[1]) if shape.startswith("prefetch") else 0
    # no heartbeats (a second's cost, not a call's), so an hour's ttl: lease and ack do
    # not renew a worker, and under valgrind the window runs past the 5 s default
    trainer = taskq.Trainer(
        "cg",
        url=url,
        prefetch=prefetch,
        heartbeat=False,
        handle_signals=False,
        worker_ttl=3600,
    )
    items = iter(trainer) if batch == 1 else trainer.batches(batch)
    for _ in range(100):
        next(items)
    admin.config_resetstat()
    subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True)
    for _ in range(calls):
        next(items)
    subprocess.run(["callgrind_control", "-d", str(server.pid)], capture_output=True)
    counted = _commands(admin)
    trainer.close()
    return counted


def measure(shape: str, calls: int, keep: str = "") -> dict[str, float]:
    """Thousands of server instructions per FCALL and per task of `shape` (this
    interpreter's taskq), and Redis commands per FCALL."""
    import taskq

    d = tempfile.mkdtemp(prefix="taskq-cg-")
    out = os.path.join(d, "cg.out")
    server, port, admin = _server(d, out)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        client = taskq.connect(url)
        client.create_job("cg", [{"i": i} for i in range(calls * 16 + 2_000)], passes=None)
        fcalls, others = _window(server, admin, url, shape, calls)
        total = _total(out, keep)
        return {
            "call": total / fcalls / 1000,
            "task": total / (calls * _batch(shape)) / 1000,
            "cmds": (others + fcalls) / fcalls,
        }
    finally:
        server.terminate()
        server.wait()


def measure_bullmq(concurrency: int, jobs: int, keep: str = "") -> dict[str, float]:
    """Thousands of server instructions per job: one BullMQ Worker drains `jobs` no-op jobs
    enqueued before the counters were zeroed; Redis commands per job."""
    d = tempfile.mkdtemp(prefix="bullmq-cg-")
    out = os.path.join(d, "cg.out")
    server, port, admin = _server(d, out)
    node = None
    try:
        node = subprocess.Popen(
            ["node", "drain_once.mjs", "--port", str(port), "--jobs", str(jobs)]
            + ["--concurrency", str(concurrency)],
            cwd=BULLMQ_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert node.stdin is not None and node.stdout is not None
        if node.stdout.readline().strip() != "ready":
            raise SystemExit("bullmq: drain_once.mjs did not get ready")
        admin.config_resetstat()
        subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True)
        node.stdin.write("go\n")
        node.stdin.flush()
        if node.stdout.readline().strip() != "done":
            raise SystemExit("bullmq: drain_once.mjs did not finish")
        subprocess.run(["callgrind_control", "-d", str(server.pid)], capture_output=True)
        fcalls, others = _commands(admin)
        node.stdin.write("end\n")
        node.stdin.flush()
        node.wait(timeout=120)
        total = _total(out, keep)
        return {"call": 0.0, "task": total / jobs / 1000, "cmds": (others + fcalls) / jobs}
    finally:
        if node is not None and node.poll() is None:
            os.killpg(node.pid, 9)
            node.wait()
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--before", default="")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--keep", default="", help="keep the (last) dump in this file")
    parser.add_argument("--bullmq", default="", help="BullMQ Worker concurrencies, e.g. 1,16")
    parser.add_argument("--jobs", type=int, default=2000, help="BullMQ jobs drained")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if args.one:
        for shape in shapes:
            print(json.dumps([shape, measure(shape, args.calls, args.keep)]), flush=True)
        return
    trees = [("before", args.before), ("after", "")] if args.before else [("this tree", "")]
    got: dict[tuple[str, str], dict[str, float]] = {}
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
    peers = [int(c) for c in args.bullmq.split(",") if c.strip()]
    bull = {c: measure_bullmq(c, args.jobs) for c in peers}
    head = "".join(f" {label}: k instr / task | per FCALL | cmds / FCALL |" for label, _ in trees)
    print("| shape |" + head)
    print("|---|" + "---:|---:|---:|" * len(trees))
    for shape in shapes:
        cells = ""
        for label, _ in trees:
            g = got[(label, shape)]
            cells += f" {g['task']:.0f} | {g['call']:.0f} | {g['cmds']:.1f} |"
        print(f"| taskq {shape} |" + cells)
    for c, g in bull.items():
        print(f"| BullMQ 6.7 c{c} (per job) | {g['task']:.0f} | | {g['cmds']:.1f} / job |")


if __name__ == "__main__":
    main()
