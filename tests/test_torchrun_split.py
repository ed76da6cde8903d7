"""DDP under a real ``torchrun`` (2 ranks x 2 DataLoader workers, gloo, CPU) over a job
with tail splitting on, ``pass_end="local"`` and ``Join``, 3 passes: the job completes
and every sample is taken once per pass, whatever the splits, hand-backs and pass ends
interleave. ``TASKQ_TORCHRUN_RUNS`` runs it that many times (1 by default)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import taskq

HERE = Path(__file__).resolve().parent
SIZES = [30, 30, 6, 6, 6, 6, 6, 6]  # two long tasks: the slow rank's is split at the tail


def write_chunks(directory: Path) -> list[dict]:
    """One JSONL file per task, rows ``{"f": file, "i": line}``, each chunk saying its
    samples (so a started task can be split)."""
    directory.mkdir(parents=True, exist_ok=True)
    chunks = []
    for f, n in enumerate(SIZES):
        path = directory / f"part-{f}.jsonl"
        path.write_text("".join(json.dumps({"f": f, "i": i}) + "\n" for i in range(n)))
        size = path.stat().st_size
        chunks.append(
            {"format": "jsonl", "path": str(path), "offset": 0, "length": size, "samples": n}
        )
    return chunks


@pytest.mark.slow
@pytest.mark.parametrize("run", range(int(os.environ.get("TASKQ_TORCHRUN_RUNS", "1"))))
def test_ddp_under_torchrun_with_splits_completes_every_sample_once_per_pass(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, run: int
) -> None:
    client.create_job(
        job_name,
        write_chunks(tmp_path / "data"),
        passes=3,
        split_tails=True,
        worker_ttl=2.0,
        heartbeat_interval=0.3,
    )
    log = tmp_path / "samples.log"
    path = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(HERE / "torchrun_split_proc.py"),
            url,
            job_name,
            str(log),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = agent.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        agent.send_signal(signal.SIGTERM)  # the agent stops its ranks (docs/torch.md)
        out, _ = agent.communicate(timeout=60)
        st = client.status(job_name, summaries=0)
        raise AssertionError(
            f"the run hung: {st.state}, todo {st.todo}, leased {st.leased}"
        ) from None
    assert agent.returncode == 0, out.decode()[-3000:]
    st = client.status(job_name, summaries=0)
    assert st.state == "completed"
    rows = [line.split() for line in log.read_text().splitlines()]
    per_pass = Counter((int(p), int(f), int(i)) for _, p, f, i in rows)
    everything = {(p, f, i) for p in range(3) for f, n in enumerate(SIZES) for i in range(n)}
    if set(per_pass) != everything:
        for _, f in client.events(job_name, count=100000):
            if f["type"] not in ("step", "worker_joined", "worker_left"):
                print(dict(f))
        print(sorted(everything - set(per_pass)), sorted(set(per_pass) - everything))
        print([r for r in rows if r[2] in {str(f) for _, f, _ in everything - set(per_pass)}])
    assert set(per_pass) == everything, "a sample of a pass never taken"
    assert [k for k, c in per_pass.items() if c > 1] == [], "a sample taken twice in a pass"
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]
    print("splits", st.counters["splits"])
