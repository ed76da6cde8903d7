"""``taskq demo --torch``: a small PyTorch model trained through ``taskq.torch``.

Writes a generated data set (Parquet files and JSONL files of ``y = 3x + 1`` plus noise,
every row with a unique ``id``), builds its chunks with ``taskq.data.build_chunks``,
creates a two-pass job, and runs three trainer processes, each a
``taskq.torch.DataLoader`` (the default readers, two DataLoader workers) over its own
copy of a one-weight linear model (no gradient exchange: the data path is the point).
Each trainer saves its weights after every step; one whose first step falls in a later
pass starts from the latest saved (as an elastic job's late joiner restores the last
checkpoint), so the loss per pass falls whoever joined when.
Mid-pass one trainer is SIGKILLed and another one is added. At the end it prints the loss
per pass and the per-sample audit: every row taken once per pass, except what the killed
trainer took after its last progress record (read again by the next holder, at most one
heartbeat's worth), next to the job's own audit. ``TASKQ_DEMO_KEEP=1`` keeps the run
directory (data, trainer logs); ``TASKQ_DEMO_TIMEOUT`` bounds each wait (default 150 s).

Data flow: cli/demo_torch.py -> taskq.data (files -> chunks) -> taskq.Client (job);
trainer processes -> taskq.torch.DataLoader -> (feeder: taskq.Trainer -> Redis;
workers: taskq.data.read_task -> samples) -> the model.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import taskq

from .common import console

PASSES = 2
FILES = 3  # of each format
ROWS = 120  # per file
HEARTBEAT_S = 0.5
STEP_S = 0.01
#: trainer 0's step is this many times longer: the trainer the demo SIGKILLs is then
#: always partway into a task it holds (a fast one is often between tasks)
SLOW_STEP = 40
TIMEOUT_S = float(os.environ.get("TASKQ_DEMO_TIMEOUT", "150"))


def _write_data(root: str) -> list[dict[str, Any]]:
    """FILES Parquet files (4 row groups each) and FILES JSONL files; their chunks."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from taskq.data import build_chunks

    gen = torch.Generator().manual_seed(0)
    for f in range(2 * FILES):
        x = torch.rand(ROWS, generator=gen) * 2 - 1
        y = 3 * x + 1 + 0.1 * torch.randn(ROWS, generator=gen)
        ids = list(range(f * ROWS, (f + 1) * ROWS))
        if f < FILES:
            table = pa.table({"id": ids, "x": x.tolist(), "y": y.tolist()})
            pq.write_table(table, os.path.join(root, f"part-{f}.parquet"), row_group_size=ROWS // 2)
        else:
            with open(os.path.join(root, f"part-{f}.jsonl"), "w") as out:
                out.writelines(
                    json.dumps({"id": i, "x": a, "y": b}) + "\n"
                    for i, a, b in zip(ids, x.tolist(), y.tolist(), strict=True)
                )
    return build_chunks(os.path.join(root, "*.parquet")) + build_chunks(
        os.path.join(root, "*.jsonl"), records_per_chunk=ROWS // 2
    )


def to_tensors(row: dict[str, Any]) -> dict[str, Any]:
    """A row (Parquet dict or JSON object) as the model's input (in the workers)."""
    import torch

    return {
        "id": int(row["id"]),
        "x": torch.tensor([float(row["x"])]),
        "y": torch.tensor([float(row["y"])]),
    }


def _trainer_main(url: str, prefix: str, job: str, index: str, run_dir: str) -> None:
    """A trainer process: the loader, the model, and a log of ``pass id`` per sample
    taken and ``loss pass sum n`` per pass (arguments as strings: its command line)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    err = open(os.path.join(run_dir, f"trainer-{index}.err"), "a", buffering=1)  # noqa: SIM115
    os.dup2(err.fileno(), 2)
    import torch

    import taskq.torch

    torch.manual_seed(int(index))
    torch.set_num_threads(1)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    weights = os.path.join(run_dir, "weights.pt")
    steps = 0
    ds = taskq.torch.TaskDataset(
        job, to_tensors, client=taskq.Client(url, key_prefix=prefix or None)
    )
    loader = taskq.torch.DataLoader(
        ds, batch_size=16, num_workers=2, worker_id=f"demo-torch-{index}:{os.getpid()}"
    )
    with open(os.path.join(run_dir, f"trainer-{index}.log"), "a", buffering=1) as log:
        while loader.state not in ("completed", "cancelled"):
            total, n = 0.0, 0
            for batch in loader:
                if steps == 0 and (loader.pass_no or 0) > 0 and os.path.exists(weights):
                    # joined after the first pass: start where the others got to
                    model.load_state_dict(torch.load(weights))
                loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                steps += 1
                # saved before the batch's samples are acked: when a pass ends, the
                # weights of its last step are on disk
                torch.save(model.state_dict(), f"{weights}.{index}")
                os.replace(f"{weights}.{index}", weights)
                total += float(loss) * len(batch["id"])
                n += len(batch["id"])
                log.write("".join(f"{loader.pass_no} {i}\n" for i in batch["id"].tolist()))
                time.sleep(STEP_S * (SLOW_STEP if index == "0" else 1))
            if n:
                log.write(f"loss {loader.pass_no} {total} {n}\n")
    loader.close()


def run(url: str | None, prefix: str | None) -> bool:
    """Run the demo; True when the audit found every sample of every pass.

    Args:
        url: the Redis URL (None: a local redis-server for the demo).
        prefix: the key prefix.

    Returns:
        True when the audit is clean.

    Raises:
        TaskqError: the job did not complete in time.
    """
    from .demo_fleet import local_redis

    out = console()
    began = time.monotonic()
    run_dir = tempfile.mkdtemp(prefix="taskq-demo-torch-")
    server = None
    procs: dict[int, subprocess.Popen[bytes]] = {}
    try:
        if url is None:
            server = local_redis()
            url = server.url
            out.print(f"started redis-server at {url} (stopped at the end)")
        client = taskq.Client(url, key_prefix=prefix)
        data_dir = os.path.join(run_dir, "data")
        os.mkdir(data_dir)
        chunks = _write_data(data_dir)
        job = f"demo-torch-{secrets.token_hex(3)}"
        client.create_job(
            job, chunks, passes=PASSES, worker_ttl=2.0, heartbeat_interval=HEARTBEAT_S
        )
        samples = 2 * FILES * ROWS
        out.print(
            f"job {job}: {len(chunks)} tasks ({FILES} Parquet + {FILES} JSONL files, "
            f"{samples} samples) x {PASSES} passes; 3 trainers x 2 DataLoader workers"
        )

        def spawn(index: int) -> None:
            # a process of its own (not a multiprocessing child): nothing of ours is
            # copied, and the semaphores of a SIGKILLed trainer are its own resource
            # tracker's to clean up (a shared tracker reports them "leaked")
            code = (
                "import sys; from taskq.cli.demo_torch import _trainer_main as m; m(*sys.argv[1:])"
            )
            argv = [sys.executable, "-c", code, url, prefix or "", job, str(index), run_dir]
            procs[index] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
            )

        # trainer 0 first, the others once its loop took a batch: whatever the machine's
        # load (a slow start), the trainer to SIGKILL holds work when the others come
        # (fast, they would otherwise take the whole pass, splitting its tasks first)
        spawn(0)
        _wait(
            lambda: _lines(os.path.join(run_dir, "trainer-0.log")) >= 1,
            "a batch taken by trainer 0",
            procs,
        )
        for i in (1, 2):
            spawn(i)
        _wait(
            lambda: (
                client.job(job).status().done >= len(chunks) // 4
                and _lines(os.path.join(run_dir, "trainer-0.log")) >= 16  # a batch
                and _partway(client, job, "demo-torch-0:")[0] > 0
            ),
            "a quarter of pass 0 with trainer 0 partway into a task",
            procs,
        )
        into, held = _partway(client, job, "demo-torch-0:")
        procs[0].send_signal(signal.SIGKILL)
        status = client.job(job).status()
        out.print(
            f"{time.strftime('%H:%M:%S')} pass {status.pass_no}, {status.done} of "
            f"{len(chunks)} tasks done: SIGKILL trainer 0 ({into} samples into the "
            f"{_plural(held, 'task')} it holds, recorded), add trainer 3"
        )
        spawn(3)
        _wait(lambda: client.job(job).status().state == "completed", "the job's completion", procs)
        for p in procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        return _summary(out, client, job, run_dir, samples, time.monotonic() - began)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(5)
        if server is not None:
            server.cleanup()
        if os.environ.get("TASKQ_DEMO_KEEP") is None:
            shutil.rmtree(run_dir, ignore_errors=True)


def _partway(client: taskq.Client, job: str, worker_prefix: str) -> tuple[int, int]:
    """Samples recorded as taken of the tasks the worker(s) of ``worker_prefix`` hold, and
    how many tasks they hold."""
    held = [
        t["id"]
        for t in client.job(job).tasks("leased")
        if str(t.get("worker", "")).startswith(worker_prefix)
    ]
    if not held:
        return 0, 0
    progress = client.redis.hmget(client.keys(job).progress, [str(t) for t in held])
    return sum(int(n) for n in progress if n is not None), len(held)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _lines(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def _wait(cond: Any, what: str, procs: dict[int, subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not cond():
        if all(p.poll() == 0 for p in procs.values()):
            raise taskq.TaskqError(f"demo --torch: the trainers finished with no {what}")
        if all(p.poll() not in (None, 0) for p in procs.values()):
            raise taskq.TaskqError(
                f"demo --torch: every trainer failed (exit codes "
                f"{[p.poll() for p in procs.values()]})"
            )
        if time.monotonic() > deadline:
            raise taskq.TaskqError(f"demo --torch: no {what} after {TIMEOUT_S:g}s")
        time.sleep(0.1)


def _summary(
    out: Any, client: taskq.Client, job: str, run_dir: str, samples: int, took: float
) -> bool:
    taken: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    killed: dict[int, set[int]] = collections.defaultdict(set)
    loss: dict[int, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for index in range(4):
        path = os.path.join(run_dir, f"trainer-{index}.log")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                parts = line.split()
                if parts[0] == "loss":
                    loss[int(parts[1])][0] += float(parts[2])
                    loss[int(parts[1])][1] += float(parts[3])
                    continue
                p, i = int(parts[0]), int(parts[1])
                taken[p][i] += 1
                if index == 0:
                    killed[p].add(i)
    audit = client.job(job).audit()
    ok = audit["ok"]
    for p in range(PASSES):
        cnt = taken[p]
        # the killed trainer's loss was never written: the others' mean
        total, n = loss[p]
        mean = f"{total / n:.4f}" if n else "-"
        missing = samples - len(cnt)
        twice = [i for i, c in cnt.items() if c > 1]
        unexplained = [i for i in twice if cnt[i] > 2 or i not in killed[p]]
        ok = ok and missing == 0 and not unexplained
        out.print(
            f"pass {p}: loss {mean} (mean over the samples of the trainers that "
            f"finished it); samples taken {sum(cnt.values())}, distinct "
            f"{len(cnt)} of {samples}, read again after the SIGKILL {len(twice)}"
        )
    resumed = sum(int(p.get("resumed", 0)) for p in audit["passes"])
    resumed_samples = sum(int(p.get("resumed_samples", 0)) for p in audit["passes"])
    out.print(
        f"resumed: {_plural(resumed, 'task')} (re-dispatched after the SIGKILL, started at "
        f"their recorded progress: {_plural(resumed_samples, 'sample')} not read again)"
    )
    out.print(
        f"every sample taken once per pass (re-reads only of what the killed trainer "
        f"took after its last progress record): {'yes' if ok else 'NO'} "
        f"({PASSES} passes x {samples} samples)"
    )
    out.print(f"total time: {took:.1f}s")
    return bool(ok)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(0 if run(None, None) else 1)
