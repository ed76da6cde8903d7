"""taskq.torch under the training frameworks' own loops (docs/frameworks.md): Lightning's
``Trainer.fit`` and accelerate's ``Accelerator`` over a ``taskq.torch.DataLoader``, real
packages on CPU, a real redis-server and real JSONL files. Each loop logs what it trained
(tests/lightning_proc.py, tests/accelerate_proc.py); the tests check those logs: every
sample once per pass, and a run killed after the framework's own checkpoint resumed from
it exactly (nothing trained twice, nothing missed). The Lightning and HF Trainer loaders
are made without flags (``DataLoader(ds, batch_size=...)``): the loader finds the
framework and sets what it needs (taskq/torchdata/frameworks.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import wait_until
from torch_helpers import make_job, write_jsonl

import taskq

pytest.importorskip("lightning")

HERE = Path(__file__).resolve().parents[1]
TIMEOUT = 120
#: The worker ttl of the SIGTERM tests' jobs: "released at once" is released before it,
#: not expired after it
WORKER_TTL_S = 30.0


def _run(
    script: str, *args: str, check: bool = True, procs: int = 1
) -> subprocess.CompletedProcess[str]:
    """The script on one process, or on ``procs`` ranks under ``torchrun``."""
    launch = [sys.executable]
    if procs > 1:
        launch += ["-m", "torch.distributed.run", "--nproc-per-node", str(procs), "--standalone"]
    proc = subprocess.Popen(
        [*launch, str(HERE / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)  # torchrun's ranks lead sessions of their own
        out, err = proc.communicate()
        raise AssertionError(f"{script} still ran after {TIMEOUT} s: {err[-3000:]}") from None
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def _kill_tree(pid: int) -> None:
    import psutil

    try:
        root = psutil.Process(pid)
        for p in [*root.children(recursive=True), root]:
            p.kill()
    except psutil.NoSuchProcess:
        pass


def _trained(log_dir: Path) -> list[dict]:
    return [
        json.loads(line)
        for path in sorted(log_dir.glob("rank*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def _per_pass(entries: list[dict]) -> dict[int, Counter[tuple[int, int]]]:
    out: dict[int, Counter[tuple[int, int]]] = {}
    for e in entries:
        out.setdefault(e["pass"], Counter()).update(tuple(r) for r in e["rows"])
    return out


def _rows(files: int, rows: int) -> set[tuple[int, int]]:
    """The (file, row) of every row of ``write_jsonl(..., files, rows)``."""
    return {(f, i) for f in range(files) for i in range(rows)}


def _each_row_once_per_pass(
    entries: list[dict], rows: set[tuple[int, int]], passes: set[int] | None = None
) -> None:
    """The log's ``entries`` train each of ``rows`` once in every pass of ``passes``
    ({0, 1} unless given), and nothing else."""
    per_pass = _per_pass(entries)
    assert set(per_pass) == (passes if passes is not None else {0, 1})
    for p, seen in per_pass.items():
        assert set(seen) == rows and max(seen.values()) == 1, p


def test_lightning_fit_trains_every_sample_once_per_pass(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """Lightning ``fit`` for 2 epochs over a job of 2 passes (6 files x 20 rows): its
    training_step log holds every row once per pass, and the job's passes are done."""
    make_job(client, job_name, write_jsonl(tmp_path / "data", 6, 20), passes=2)
    log = tmp_path / "log"
    log.mkdir()
    _run("lightning_proc.py", url, job_name, str(log), "1")
    _each_row_once_per_pass(_trained(log), _rows(6, 20))


def _per_rank(log_dir: Path) -> dict[str, list[dict]]:
    return {
        path.stem: [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted(log_dir.glob("rank*.jsonl"))
    }


@pytest.mark.parametrize("shape", ["five_tasks", "one_task"])
def test_lightning_ddp_ranks_step_evenly_and_train_every_sample_once_per_pass(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, shape: str
) -> None:
    """Lightning DDP on 2 gloo ranks, the loader made without flags (it finds ``fit``:
    ``even_steps``): taskq gives each rank the tasks it leases, so their batch counts
    differ (25 batches a pass) (without even_steps the rank with more
    waits in backward's allreduce for ever); here each epoch both ranks step equally
    often, the rank out first stepping on padding (``batch_is_padding``, loss x 0), fit
    returns, every row is trained once per pass and the job completes. ``one_task``: one
    unsplit task of 5 batches, so one rank has nothing to repeat and is sent the other's
    batch."""
    if shape == "five_tasks":
        make_job(client, job_name, write_jsonl(tmp_path / "data", 5, 20), passes=2)
        rows, passes = _rows(5, 20), {0, 1}
    else:
        chunks = write_jsonl(tmp_path / "data", 1, 18)
        make_job(client, job_name, chunks, passes=1, split_tails=False)
        rows, passes = _rows(1, 18), {0}
    log = tmp_path / "log"
    log.mkdir()
    _run("lightning_proc.py", url, job_name, str(log), "2")
    ranks = _per_rank(log)
    assert len(ranks) == 2
    steps = [Counter(e["epoch"] for e in entries) for entries in ranks.values()]
    assert steps[0] == steps[1] and set(steps[0]) == passes, steps
    trained = [e for entries in ranks.values() for e in entries if not e["padding"]]
    _each_row_once_per_pass(trained, rows, passes)
    padding = sorted(sum(e["padding"] for e in entries) for entries in ranks.values())
    if shape == "one_task":
        assert padding == [0, 5], padding
    _padding_trained_nothing(log)
    assert client.status(job_name).state == "completed"


def _padding_trained_nothing(log_dir: Path) -> None:
    """Every padding step's loss (as the framework stepped on it) is 0: the loader's
    integration weighted it, the model returned it unweighted."""
    losses = [
        json.loads(line)
        for path in sorted(log_dir.glob("loss*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert losses
    assert all(e["loss"] == 0.0 for e in losses if e["padding"]), losses
    assert any(e["loss"] != 0.0 for e in losses if not e["padding"]), losses


@pytest.mark.parametrize("devices", [1, 2])
def test_lightning_without_flags_checkpoint_crash_resume_on_one_process_trains_once(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, devices: int
) -> None:
    """A new user's ``taskq.torch.DataLoader(ds, batch_size=8)``, no flags, no callback,
    under Lightning's ``fit`` (with 2 DDP ranks: 33 batches, so the ranks' counts
    differ); ``ModelCheckpoint(every_n_train_steps=5)`` holds the loader's state (with 2
    ranks, what both took); every rank dies (SIGKILL) entering step 12, after the
    checkpoint of step 10; ``fit(ckpt_path=...)`` on one process resumes: the first run's
    steps up to the checkpoint and the resumed run's steps hold every row of the pass
    once. Lightning's fetcher took a batch ahead of the checkpointed step: the loader
    found ``fit`` and did not count it as trained (with ``ahead`` left at 0 it would
    have: 8 rows missing per rank)."""
    lines = [40] * 6 + [20]  # 6 x 5 batches + 3: odd, the ranks' counts differ
    make_job(client, job_name, write_jsonl(tmp_path / "data", 7, lines), passes=1)
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    args = [url, job_name, str(first), str(devices), "--every", "5", "--kill-at", "12"]
    done = _run("lightning_proc.py", *args, "--batch-size", "8", check=False)
    assert done.returncode != 0
    ckpts = sorted((first / "ckpt").glob("*step=10*.ckpt"))
    assert ckpts, list((first / "ckpt").iterdir())
    resume = [url, job_name, str(second), "1", "--resume", str(ckpts[0])]
    _run("lightning_proc.py", *resume, "--batch-size", "8")
    before = [e for e in _trained(first) if e["step"] < 10]
    assert len(before) == 10 * devices
    after = _trained(second)
    assert [e["step"] for e in after][:1] == [10]
    seen = Counter(tuple(r) for e in before + after for r in e["rows"])
    assert set(seen) == {(f, i) for f in range(7) for i in range(lines[f])}
    assert max(seen.values()) == 1, [k for k, v in seen.items() if v > 1][:8]
    assert client.status(job_name).state == "completed"


def test_lightning_refuses_a_contradicting_flag_at_the_first_batch(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """``ahead=0`` given by hand under Lightning's ``fit`` (whose fetcher takes a batch
    ahead: a checkpoint would count one never trained): ``fit`` fails at the loader's
    first ``iter()`` with one line naming ``ahead``, before any step; nothing is leased."""
    make_job(client, job_name, write_jsonl(tmp_path / "data", 2, 20), passes=1)
    log = tmp_path / "log"
    log.mkdir()
    done = _run("lightning_proc.py", url, job_name, str(log), "1", "--ahead", "0", check=False)
    assert done.returncode != 0
    assert "taskq.torch.DataLoader(ahead=0) under Lightning's Trainer.fit" in done.stderr
    assert _trained(log) == []
    st = client.status(job_name)
    assert st.done == 0 and st.leased == 0 and st.counters.get("leased", 0) == 0


def test_accelerate_prepare_passes_the_loader_through_and_trains_once_per_pass(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """``accelerator.prepare(model, optimizer, loader)`` returns taskq's loader itself
    (not a DataLoader rebuilt around the dataset); the loop over it for 2 passes trains
    every row once per pass."""  # 2 ranks: tests/accelerate_proc.py under torchrun below
    pytest.importorskip("accelerate")
    make_job(client, job_name, write_jsonl(tmp_path / "data", 5, 20), passes=2)
    log = tmp_path / "log"
    log.mkdir()
    _run("accelerate_proc.py", url, job_name, str(log))
    _each_row_once_per_pass(_trained(log), _rows(5, 20))


@pytest.mark.parametrize(("procs", "flags"), [(1, "join"), (2, "join"), (2, "none")])
def test_accelerate_save_state_resumes_the_loader_exactly(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, procs: int, flags: str
) -> None:
    """``accelerator.save_state`` after step 4 (every rank's, under ``torchrun`` with 2
    gloo ranks: the loader, given no ``collective``, finds accelerate calling and
    checkpoints once for both) holds the loader's state; every rank dies entering step 6;
    ``load_state`` of that directory on one process resumes: the steps before the
    checkpoint and the resumed run's hold every row of the pass once. ``flags="none"``:
    the loader made with no flags and no ``Join`` (the ranks stepped evenly by the loader,
    which found the ``Accelerator`` that prepared it)."""
    pytest.importorskip("accelerate")
    make_job(client, job_name, write_jsonl(tmp_path / "data", 5, 20), passes=1)
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    args = [url, job_name, str(first), "--every", "4", "--kill-at", "6"]
    args += ["--no-flags"] if flags == "none" else []
    done = _run("accelerate_proc.py", *args, check=False, procs=procs)
    assert done.returncode != 0
    ckpt = first / "ckpt" / "step4"
    assert (ckpt / "dl_state_dict.bin").exists(), list((first / "ckpt").iterdir())
    # one checkpoint of the job for both ranks: the loader found accelerate's save_state
    # asking every rank and made state_dict() collective (not one checkpoint per rank)
    assert len(client.checkpoints(job_name)) == 1, client.checkpoints(job_name)
    _run("accelerate_proc.py", url, job_name, str(second), "--resume", str(ckpt))
    before = [e for e in _trained(first) if e["step"] < 4 and e["pass"] is not None]
    assert len(before) == 4 * procs
    after = _trained(second)
    assert [e["step"] for e in after][:1] == [4]
    seen = Counter(tuple(r) for e in before + after for r in e["rows"])
    assert set(seen) == _rows(5, 20)
    assert max(seen.values()) == 1, [k for k, v in seen.items() if v > 1][:8]


def test_accelerate_without_flags_on_two_ranks_steps_evenly_and_trains_every_sample_once(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """``accelerator.prepare(model, optimizer, loader)`` of a ``DataLoader(ds,
    batch_size=4)`` made with no flags, a plain loop with no ``Join`` on 2 gloo ranks
    under ``torchrun`` (uneven batch counts: each rank takes the tasks it leases): the
    loader finds the ``Accelerator`` that prepared it and steps the ranks evenly (without
    that the rank with more batches waits in backward for ever); each epoch both ranks
    step equally often, every row is trained once per pass, every padding step's loss
    reached backward x 0 (the layer's output gradient 0), the job completes."""
    pytest.importorskip("accelerate")
    make_job(client, job_name, write_jsonl(tmp_path / "data", 5, 20), passes=2)
    log = tmp_path / "log"
    log.mkdir()
    _run("accelerate_proc.py", url, job_name, str(log), "--no-flags", procs=2)
    ranks = _per_rank(log)
    assert len(ranks) == 2
    assert len(ranks["rank0"]) == len(ranks["rank1"]), {k: len(v) for k, v in ranks.items()}
    entries = [e for v in ranks.values() for e in v]
    _each_row_once_per_pass([e for e in entries if e["pass"] is not None], _rows(5, 20))
    grads = [
        json.loads(line)
        for path in log.glob("rank*.grad")
        for line in path.read_text().splitlines()
    ]
    assert len(grads) == len(entries)
    assert any(g["padding"] for g in grads), "uneven ranks: one stepped on padding"
    assert all(g["grad"] == 0.0 for g in grads if g["padding"]), grads
    assert all(g["grad"] != 0.0 for g in grads if not g["padding"]), grads
    assert client.status(job_name).state == "completed"


def test_accelerate_without_flags_a_loop_that_weighs_nothing_is_refused_at_its_second_batch(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """The same loop calling ``loss.backward()`` itself (not ``accelerator.backward``) and
    never reading ``loader.loss_weight``: a padding batch would be trained again, so both
    ranks refuse at the call after their first step with one line naming
    ``loss_weight``, before any padding; no rank waits for the other."""
    pytest.importorskip("accelerate")
    make_job(client, job_name, write_jsonl(tmp_path / "data", 5, 20), passes=1)
    log = tmp_path / "log"
    log.mkdir()
    args = [url, job_name, str(log), "--no-flags", "--plain-backward"]
    done = _run("accelerate_proc.py", *args, check=False, procs=2)
    assert done.returncode != 0
    assert "InvalidInput: even_steps: the loop's first step read neither" in done.stderr
    assert "loader.loss_weight" in done.stderr
    ranks = _per_rank(log)
    assert {k: [e["step"] for e in v] for k, v in ranks.items()} == {
        "rank0": [0],
        "rank1": [0],
    }
    assert client.status(job_name).leased == 0


def _fit_in_background(
    client: taskq.Client, url: str, job: str, tmp_path: Path, devices: int
) -> tuple[subprocess.Popen[bytes], Path]:
    """A job of 8 x 200 rows (worker_ttl ``WORKER_TTL_S``) and Lightning's ``fit`` over it
    on ``devices`` processes, started; the process and its log directory."""
    make_job(client, job, write_jsonl(tmp_path / "data", 8, 200), worker_ttl=WORKER_TTL_S)
    log = tmp_path / "log"
    log.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "lightning_proc.py"), url, job, str(log), str(devices)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, log


def _released_before_the_ttl(
    client: taskq.Client, job: str, sent: float, gone: Any = lambda: True
) -> None:
    """What the job's trainers held went back, released, before their ttl ran out since the
    SIGTERM sent at ``sent`` (``time.monotonic()``): no lease left (and ``gone()``: no
    worker) by then, which nothing but a release can make (no reaper runs and nobody else
    leases: an expiry would leave the leases listed), and the release counted. How soon
    within the ttl is the machine's, not the promise: the release follows the loop's way
    out (a framework's teardown, or the interpreter's exit), which a loaded machine slows;
    the loader's own part does not wait for its workers (tests/torchdata/test_torch_signals.py)."""
    left = WORKER_TTL_S - (time.monotonic() - sent)
    assert wait_until(lambda: client.status(job).leased == 0 and gone(), left), (
        client.status(job).leased,
        client.workers(job),
    )
    assert client.status(job).counters["released"] > 0


def _sigterm_rank_one(
    client: taskq.Client,
    job: str,
    proc: subprocess.Popen[bytes],
    log: Path,
    psutil: Any,
    rank_env: str,
) -> None:
    """Once 40 steps are logged, SIGTERM the launcher's child whose ``rank_env`` is 1 (not
    a DataLoader worker: those are their rank's children); assert that the job holds no
    lease and no worker before the ttl (``_released_before_the_ttl``), the processes end,
    and no lease expired."""
    try:
        assert wait_until(lambda: len(_trained(log)) >= 40, 60.0), proc.poll()
        ranks = [k for k in psutil.Process(proc.pid).children() if k.environ().get(rank_env) == "1"]
        assert len(ranks) == 1, ranks
        assert client.status(job).leased > 0
        ranks[0].send_signal(signal.SIGTERM)
        _released_before_the_ttl(client, job, time.monotonic(), lambda: not client.workers(job))
        proc.wait(30)
        ranks[0].wait(30)
    finally:
        proc.kill()
        proc.wait()
    assert client.status(job).counters.get("expired_worker_lost", 0) == 0


def test_lightning_rank_sigterm_releases_its_leases_at_once(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """SIGTERM to a Lightning ``fit`` process (as the kubelet sends it) mid-epoch: the job
    holds no lease before the worker ttl (released, not expired:
    ``_released_before_the_ttl``), the process exits, and what its steps took is
    recorded, the step in flight at most not (4 rows).
    The loader's handler (``leave_on_sigterm()`` in ``on_train_start``) raises
    ``SystemExit(143)`` in the step; the loader releases on the way out."""
    proc, log = _fit_in_background(client, url, job_name, tmp_path, devices=1)
    try:
        assert wait_until(lambda: len(_trained(log)) >= 20, 60.0), proc.poll()
        assert client.status(job_name).leased > 0
        proc.send_signal(signal.SIGTERM)
        _released_before_the_ttl(client, job_name, time.monotonic())
        proc.wait(30)
    finally:
        proc.kill()
        proc.wait()
    st = client.status(job_name)
    recorded = st.done * 200 + sum(
        int(v) for v in client.redis.hgetall(client.keys(job_name).progress).values()
    )
    logged = sum(len(e["rows"]) for e in _trained(log))
    assert logged - 4 <= recorded <= logged, (recorded, logged)
    assert st.counters.get("expired_worker_lost", 0) == 0


def test_lightning_ddp_sigterm_of_one_rank_releases_every_lease_at_once(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """Lightning DDP on 2 gloo ranks (``even_steps=True``, ``taskq.torch.leave_on_sigterm()``
    in a callback's ``on_train_start``), SIGTERM to rank 1 mid-epoch (as the kubelet sends
    it to one pod): before the ttl the job holds no lease and no worker (rank 1 left through
    the loader; rank 0, whose next collective fails, released too: nothing waits for the
    30 s ttl), both processes end, and no lease expired. With Lightning's own handler
    instead (it broadcasts from inside the handler) the ranks kept their leases for over
    60 s in 2 of 3 runs."""
    psutil = pytest.importorskip("psutil")
    proc, log = _fit_in_background(client, url, job_name, tmp_path, devices=2)
    _sigterm_rank_one(client, job_name, proc, log, psutil, rank_env="LOCAL_RANK")


def test_accelerate_sigterm_of_one_rank_releases_every_lease_at_once(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """accelerate's loop on 2 gloo ranks under ``torchrun`` (``Join``), SIGTERM to rank 1
    mid-pass: accelerate installs no SIGTERM handler, so the loader's is in place; before
    the ttl the job holds no lease and no worker (rank 1 left; rank 0's next collective
    failed and it released too), and no lease expired."""
    psutil = pytest.importorskip("psutil")
    pytest.importorskip("accelerate")
    make_job(client, job_name, write_jsonl(tmp_path / "data", 8, 200), worker_ttl=WORKER_TTL_S)
    log = tmp_path / "log"
    log.mkdir()
    torchrun = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone"]
    proc = subprocess.Popen(
        [sys.executable, *torchrun, str(HERE / "accelerate_proc.py"), url, job_name, str(log)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _sigterm_rank_one(client, job_name, proc, log, psutil, rank_env="RANK")


def test_hf_trainer_trains_every_sample_once_per_pass(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """transformers' ``Trainer`` with ``get_train_dataloader`` returning taskq's loader
    and ``max_steps`` = the job's batches (2 passes x 25): its model's log holds every
    row once per pass."""
    pytest.importorskip("transformers")
    make_job(client, job_name, write_jsonl(tmp_path / "data", 5, 20), passes=2)
    log = tmp_path / "log"
    log.mkdir()
    _run("hf_trainer_proc.py", url, job_name, str(log), "50")
    _each_row_once_per_pass(_trained(log), _rows(5, 20))


def test_hf_trainer_ddp_on_two_ranks_steps_evenly_and_trains_every_sample_once(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path
) -> None:
    """transformers' ``Trainer`` under ``torchrun`` with 2 gloo ranks (DDP), the loader
    made without flags (it finds the Trainer: even steps), ``max_steps`` beyond the job
    (the Trainer stops at the first epoch with no batch: the job completed): both ranks
    step equally often in each pass, every row trained once per pass, and every padding
    step's loss, as the Trainer trained on it, is 0 (the loader wrapped ``compute_loss``;
    the model returns it unweighted)."""
    pytest.importorskip("transformers")
    make_job(client, job_name, write_jsonl(tmp_path / "data", 5, 20), passes=2)
    log = tmp_path / "log"
    log.mkdir()
    _run("hf_trainer_proc.py", url, job_name, str(log), "1000", procs=2)
    ranks = _per_rank(log)
    assert len(ranks) == 2
    steps = [len(entries) for entries in ranks.values()]
    assert steps[0] == steps[1], steps
    trained = [e for es in ranks.values() for e in es if not e["padding"]]
    _each_row_once_per_pass(trained, _rows(5, 20))
    assert any(e["padding"] for es in ranks.values() for e in es)  # 25 batches a pass
    _padding_trained_nothing(log)  # the model returned it unweighted
    assert client.status(job_name).state == "completed"


@pytest.mark.parametrize("procs", [1, 2])
def test_hf_trainer_resume_restores_the_loader_exactly(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, procs: int
) -> None:
    """The Trainer checkpoints every 5 steps (a callback adds the loader's state: with 2
    ranks under ``torchrun``, what both took, ``collective=True``); every rank dies
    entering step 12; ``train(resume_from_checkpoint=checkpoint-10)`` on one process
    with the loader's state loaded (no batch skipping) trains the rest: every row of the
    pass once across both runs."""
    pytest.importorskip("transformers")
    make_job(client, job_name, write_jsonl(tmp_path / "data", 6, 20), passes=1)
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    args = [url, job_name, str(first), "1000", "--every", "5", "--kill-at", "12"]
    done = _run("hf_trainer_proc.py", *args, check=False, procs=procs)
    assert done.returncode != 0
    ckpt = first / "ckpt" / "checkpoint-10"
    assert (ckpt / "taskq_loader.pt").exists(), list((first / "ckpt").iterdir())
    _run("hf_trainer_proc.py", url, job_name, str(second), "1000", "--resume", str(ckpt))
    before = [e for e in _trained(first) if e["step"] < 10]
    assert len(before) == 10 * procs
    after = _trained(second)
    assert [e["step"] for e in after][:1] == [10]
    seen = Counter(tuple(r) for e in before + after for r in e["rows"])
    assert set(seen) == {(f, i) for f in range(6) for i in range(20)}
    assert max(seen.values()) == 1, [k for k, v in seen.items() if v > 1][:8]


@pytest.mark.parametrize("form", ["--no-flags", "--no-callback"])
def test_hf_trainer_without_user_code_checkpoint_crash_resume_on_one_process_trains_once(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, form: str
) -> None:
    """transformers' ``Trainer`` under ``torchrun`` on 2 gloo ranks over a loader made
    without flags, with no callback of the user's and no ``load_state_dict``
    (``--no-flags``: not even ``ignore_data_skip`` or a ``get_resumed_dataloader``;
    ``--no-callback``: those, as older docs showed, without the callback); 31 batches,
    so the ranks' counts differ; a checkpoint every 5 steps; both ranks die (SIGKILL)
    entering step 12; ``train(resume_from_checkpoint=checkpoint-10)`` on one process:
    the first run's steps up to the checkpoint and the resumed run's steps hold every row
    of the pass once, and the job completed. The loader's state went into the Trainer's
    checkpoint and came back from it by itself (without it, the rows of steps 10 and 11
    were recorded as trained and never came again: lost from the model's lineage)."""
    pytest.importorskip("transformers")
    lines = [20] * 6 + [4]  # 6 x 5 batches + 1: the ranks' counts differ
    make_job(client, job_name, write_jsonl(tmp_path / "data", 7, lines), passes=1)
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    args = [url, job_name, str(first), "1000", "--every", "5", "--kill-at", "12", form]
    done = _run("hf_trainer_proc.py", *args, check=False, procs=2)
    assert done.returncode != 0
    ckpt = first / "ckpt" / "checkpoint-10"
    assert ckpt.is_dir(), list((first / "ckpt").iterdir())
    _run("hf_trainer_proc.py", url, job_name, str(second), "1000", "--resume", str(ckpt), form)
    before = [e for e in _trained(first) if e["step"] < 10]
    assert len(before) == 10 * 2
    after = _trained(second)
    assert [e["step"] for e in after][:1] == [10]
    seen = Counter(tuple(r) for e in before + after for r in e["rows"])
    missing = {(f, i) for f in range(7) for i in range(lines[f])} - set(seen)
    assert not missing, sorted(missing)[:8]
    assert max(seen.values()) == 1, [k for k, v in seen.items() if v > 1][:8]
    assert client.status(job_name).state == "completed"


@pytest.mark.parametrize("kept", ["none", "of_step_5"])
def test_hf_trainer_resume_from_a_checkpoint_without_the_loader_state_is_refused(
    client: taskq.Client, url: str, job_name: str, tmp_path: Path, kept: str
) -> None:
    """A checkpoint whose ``TrainerState`` holds no loader state (one saved by an older
    taskq), or one of another step (a save taskq did not see), resumed with no user code:
    ``train`` stops at the loader's first ``iter()`` with one line naming it, before any
    batch: the model's lineage misses nothing it would not know of."""
    pytest.importorskip("transformers")
    make_job(client, job_name, write_jsonl(tmp_path / "data", 6, 20), passes=1)
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    args = [url, job_name, str(first), "1000", "--every", "5", "--kill-at", "12", "--no-flags"]
    assert _run("hf_trainer_proc.py", *args, check=False).returncode != 0
    ckpt = first / "ckpt" / "checkpoint-10"
    state_file = ckpt / "trainer_state.json"
    state = json.loads(state_file.read_text())
    if kept == "none":
        del state["stateful_callbacks"]["taskq.torch.DataLoader"]
    else:
        state["stateful_callbacks"]["taskq.torch.DataLoader"]["step"] = 5
    state_file.write_text(json.dumps(state))
    resume = [url, job_name, str(second), "1000", "--resume", str(ckpt), "--no-flags"]
    done = _run("hf_trainer_proc.py", *resume, check=False)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "taskq.errors.InvalidInput: transformers' Trainer resumed from a "
        "checkpoint of step 10 that holds"
    ), done.stderr[-3000:]
    assert "resume from" in last
    assert _trained(second) == []
    assert client.status(job_name).state != "completed"
