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

HERE = Path(__file__).resolve().parents[1]
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


def _torchrun(url: str, job_name: str, log: Path, *extra: str) -> tuple[int, str]:
    """One launch of 2 ranks of torchrun_split_proc.py; (agent's exit code, its output)."""
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
            *extra,
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
        agent.communicate(timeout=60)
        raise AssertionError("the run hung") from None
    return agent.returncode, out.decode()[-3000:]


def _create(client: taskq.Client, job_name: str, tmp_path: Path) -> None:
    client.create_job(
        job_name,
        write_chunks(tmp_path / "data"),
        passes=3,
        split_tails=True,
        worker_ttl=2.0,
        heartbeat_interval=0.3,
    )


def _once_per_pass(client: taskq.Client, job_name: str, rows: list[tuple[int, int, int]]) -> None:
    """Every sample of the 3 passes taken exactly once, and the audit finds the job sound."""
    per_pass = Counter(rows)
    everything = {(p, f, i) for p in range(3) for f, n in enumerate(SIZES) for i in range(n)}
    if set(per_pass) != everything:
        for _, f in client.events(job_name, count=100000):
            if f["type"] not in ("step", "worker_joined", "worker_left"):
                print(dict(f))
        print(sorted(everything - set(per_pass)), sorted(set(per_pass) - everything))
    assert set(per_pass) == everything, "a sample of a pass never taken"
    assert [k for k, c in per_pass.items() if c > 1] == [], "a sample taken twice in a pass"
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]


@pytest.mark.slow
@pytest.mark.parametrize("run", range(int(os.environ.get("TASKQ_TORCHRUN_RUNS", "1"))))
def test_ddp_under_torchrun_with_splits_completes_every_sample_once_per_pass(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, run: int
) -> None:
    _create(client, job_name, tmp_path)
    log = tmp_path / "samples.log"
    code, out = _torchrun(url, job_name, log)
    st = client.status(job_name, summaries=0)
    assert code == 0, (st.state, st.todo, st.leased, out)
    assert st.state == "completed"
    rows = [line.split() for line in log.read_text().splitlines()]
    _once_per_pass(client, job_name, [(int(p), int(f), int(i)) for _, p, f, i in rows])
    print("splits", st.counters["splits"])


@pytest.mark.slow
@pytest.mark.parametrize("run", range(int(os.environ.get("TASKQ_TORCHRUN_RUNS", "1"))))
def test_ddp_under_torchrun_crashed_and_relaunched_twice_from_a_checkpoint_completes(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, run: int
) -> None:
    """The same run checkpointed at its first pass's end (every rank syncs, rank 0 writes
    ``state_dict()``), then rank 1 crashes 5 batches on (at 15, a launch ended its passes
    before the crash in 1-2 runs of 10); a relaunch loads the checkpoint (the job
    rewinds, every lease of the crashed launch revoked) and crashes again; a
    third launch loads it again and runs to the end: the job completes (never left
    `running` with pieces nobody takes) and, counting what the first launch took before
    the checkpoint and what the third took, every sample once per pass."""
    _create(client, job_name, tmp_path)
    log, ckpt = tmp_path / "samples.log", tmp_path / "ckpt.json"
    for launch in (1, 2, 3):
        crash = ["--crash-after", "5"] if launch < 3 else []
        code, out = _torchrun(
            url, job_name, log, "--ckpt", str(ckpt), "--launch", str(launch), *crash
        )
        st = client.status(job_name, summaries=0)
        if launch < 3:
            assert code != 0 and ckpt.exists(), out
        else:
            assert code == 0, (st.state, st.todo, st.leased, out)
    assert client.status(job_name, summaries=0).state == "completed"
    lines = log.read_text().splitlines()
    first = lines[: lines.index("CKPT")]
    kept = [line.split() for line in first if line.startswith("1 ")]
    kept += [line.split() for line in lines if line.startswith("3 ")]
    _once_per_pass(client, job_name, [(int(p), int(f), int(i)) for _, _, p, f, i in kept])
