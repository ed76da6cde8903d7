"""Samples read again after trainers are SIGKILLed, with progress inside tasks and without.

Where it sits: `run.py`'s `resume` section calls `run(recorder, quick, redis_port_factory)`
(or by hand: `python bench/reread.py [--full]`). It writes Parquet files (pyarrow; one
task per file, read by `taskq.data.read_task` through `taskq.torch.DataLoader`, which
skips to a resumed task's start by row-group metadata) to a temp dir, and for progress on
and off runs one job of several passes on its own redis-server: two trainer processes
(this file with `--trainer`, 1 DataLoader worker each, batches of 32, a short sleep per
step) read it while the driver SIGKILLs one at a random moment (1-3 s apart) and starts a
replacement, a bounded number of times, then lets the job finish (bounded in time).
"Progress off" drops the loader's progress reports (the feeder's `progress` is a no-op),
which is how a task was re-read before progress existed: from its sample 0.

Every trainer appends the rows its loop took (pass, file, row) to its own file, flushed
per step, so a SIGKILLed trainer's rows count too. Per pass: samples the loops took ÷
the data set's size, and samples taken more than once; the audit's resumed tasks and the
samples their next holders skipped beside them. Loopback only.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import common
import pyarrow as pa
import pyarrow.parquet as pq

import taskq
import taskq.data

SECTION = "resume"
PortFactory = Callable[[], tuple[int, Callable[[], None]]]
_STEP_S = 0.02  # a training step's time (the loop sleeps it)
_BATCH = 32


def write_files(directory: Path, files: int, rows: int) -> list[dict[str, object]]:
    """``files`` Parquet files of ``rows`` rows ``{"f", "i"}`` (row groups of 250); one
    chunk (one task) per file."""
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        table = pa.table({"f": [f] * rows, "i": list(range(rows))})
        pq.write_table(table, str(directory / f"part-{f:03d}.parquet"), row_group_size=250)
    return taskq.data.build_chunks(
        str(directory / "*.parquet"), row_groups_per_chunk=(rows + 249) // 250
    )


def _trainer(url: str, job: str, out: str, progress: bool) -> int:
    """One trainer process: every pass of the job through a taskq.torch.DataLoader."""
    import taskq.torch
    from taskq.torchdata import feeder

    if not progress:
        feeder.Feeder.progress = lambda self, reached: None  # type: ignore[method-assign]
    ds = taskq.torch.TaskDataset(job, url=url, shuffle=False)
    loader = taskq.torch.DataLoader(ds, batch_size=_BATCH, num_workers=1)
    with open(out, "a", buffering=1) as sink:
        while loader.state not in ("completed", "cancelled"):
            for batch in loader:
                p = loader.pass_no
                sink.write(
                    "".join(
                        f"{p} {f} {i}\n"
                        for f, i in zip(batch["f"].tolist(), batch["i"].tolist(), strict=True)
                    )
                )
                time.sleep(_STEP_S)
    loader.close()
    return 0


def one_run(
    url: str, tmp: Path, chunks: list[dict[str, object]], progress: bool, passes: int, kills: int
) -> dict[str, object]:
    """One job: trainers, ``kills`` SIGKILLs at random moments, until the job completes.

    Returns:
        Per pass rows taken / re-read, the audit's reread_samples, kills done, seconds.
    """
    client = taskq.Client(url)
    job = f"reread-{'on' if progress else 'off'}"
    client.create_job(job, chunks, passes=passes, worker_ttl=2.0, heartbeat_interval=0.5)
    rng = random.Random(7)
    outs: list[Path] = []

    def start() -> subprocess.Popen[bytes]:
        out = tmp / f"{job}-{len(outs)}.rows"
        outs.append(out)
        cmd = [sys.executable, __file__, "--trainer", url, job, str(out)]
        return subprocess.Popen(cmd + ([] if progress else ["--no-progress"]))

    procs = [start(), start()]
    started = time.monotonic()
    done_kills = 0
    deadline = started + 180.0

    def lines(p: subprocess.Popen[bytes]) -> int:
        out = outs[procs_out[p.pid]]
        return out.read_bytes().count(b"\n") if out.exists() else 0

    procs_out = {p.pid: k for k, p in enumerate(procs)}
    try:
        while time.monotonic() < deadline and client.status(job, summaries=0).state != "completed":
            if done_kills >= kills:
                time.sleep(0.2)
                continue
            # a victim whose loop took samples, at a random moment after that
            busy = [p for p in procs if lines(p) > 0]
            if not busy:
                time.sleep(0.1)
                continue
            victim = rng.choice(busy)
            time.sleep(rng.uniform(0.5, 4.0))
            if client.status(job, summaries=0).state == "completed":
                break
            procs.remove(victim)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            done_kills += 1
            fresh = start()
            procs_out[fresh.pid] = len(outs) - 1
            procs.append(fresh)
        state = client.status(job, summaries=0).state
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
    taken: Counter[tuple[int, int, int]] = Counter()
    for out in outs:
        if out.exists():
            for line in out.read_text().splitlines():
                p, f, i = line.split()
                taken[int(p), int(f), int(i)] += 1
    per_pass: dict[int, tuple[int, int, int]] = {}
    for (p, _, _), n in taken.items():
        read, again, distinct = per_pass.get(p, (0, 0, 0))
        per_pass[p] = (read + n, again + n - 1, distinct + 1)
    audit = client.audit(job)
    client.redis.close()
    return {
        "state": state,
        "per_pass": per_pass,
        "resumed": [(s.get("resumed", 0), s.get("resumed_samples", 0)) for s in audit["passes"]],
        "kills": done_kills,
        "seconds": time.monotonic() - started,
    }


def run(recorder: common.Recorder, quick: bool, redis_port_factory: PortFactory) -> None:
    """Adds the rows: samples re-read per pass with progress on and off."""
    files, rows = 8, 4000 if quick else 10000
    passes, kills = (2, 3) if quick else (3, 6)
    with tempfile.TemporaryDirectory(prefix="taskq-reread-") as d:
        tmp = Path(d)
        chunks = write_files(tmp / "data", files, rows)
        size = files * rows
        for progress in (True, False):
            port, stop = redis_port_factory()
            try:
                r = one_run(f"redis://127.0.0.1:{port}/0", tmp, chunks, progress, passes, kills)
            finally:
                stop()
            per_pass = r["per_pass"]
            assert isinstance(per_pass, dict)
            again = sum(a for _, a, _ in per_pass.values())
            ratios = ", ".join(
                f"pass {p}: {read / size:.3f} ({a} again"
                + (f", {size - k} MISSING)" if k != size else ")")
                for p, (read, a, k) in sorted(per_pass.items())
            )
            recorder.add(
                SECTION,
                f"samples re-read after {r['kills']} SIGKILLs, progress {'on' if progress else 'off'}",
                again,
                "samples",
                f"{files} tasks x {rows} rows (Parquet), {passes} passes, 2 trainers x 1 worker, "
                f"batches of {_BATCH}; read / data set per pass: {ratios}; audit (tasks resumed, "
                f"samples skipped) per pass {r['resumed']}; job {r['state']} in "
                f"{r['seconds']:.0f} s",
            )
            print(
                f"  progress {'on' if progress else 'off'}: {again} re-read; {ratios}", flush=True
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--trainer", nargs=3, metavar=("URL", "JOB", "OUT"))
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args()
    if a.trainer:
        return _trainer(*a.trainer, progress=not a.no_progress)
    common.install_signal_handlers()
    recorder = common.Recorder(mode="full" if a.full else "quick")
    try:
        run(recorder, not a.full, common.redis_port_factory)
    finally:
        common.stop_all_servers()
    for row in recorder.rows:
        print(row)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
