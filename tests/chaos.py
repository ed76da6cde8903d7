"""The chaos harness: real trainer processes, signals, a reaper subprocess, and the audit.

Shared by ``tests/chaos/test_chaos.py`` (elastic scaling, pauses, poison, manual advance),
``tests/chaos/test_chaos_redis.py`` (Redis crashes, partitions, random schedules) and the long
form ``bench/chaos_long.py``. Trainers are started by ``multiprocessing``'s forkserver:
the test process holds threads (probes' heartbeats, redis-py, the proxy), and a fork of a
threaded process may deadlock in the child (Python 3.12+ warns). The fork server is a
single-threaded process that has imported taskq once, so a trainer still starts in
milliseconds.

Each trainer runs ``with taskq.Trainer(job, url=..., worker_id=...) as t: for task in t:``
and appends one JSON line per processed task to its own log file::

    {"worker": ID, "pass": P, "task": T, "token": TOKEN, "t": WALL_TIME_S, "start": WALL_TIME_S}

(``start``: when the task was handed to the body; ``t``: when the body finished, before
the ack that the next call carries). A second file, ``<log>.exit``, holds one JSON line
``{"worker", "state", "t", "code"}`` written when the loop ended. Exit codes: 0 the loop
ended with the job completed or cancelled; ``EXIT_EARLY`` the loop ended while the job
still had work; 1 the body raised (the ``with`` block failed the task); 143 SIGTERM
(the ``with`` block released what it held).

Data flow: test -> chaos.py -> trainer processes -> taskq.Trainer -> Redis;
``audit_job`` -> client.audit (stats.py) + the trainers' logs.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import taskq
from taskq.devserver import stop_process
from taskq.testing import wait_until

TRAINER_START = multiprocessing.get_context("forkserver")
TRAINER_START.set_forkserver_preload(["taskq", "chaos"])

#: A trainer's exit code when its loop ended while the job was neither completed nor
#: cancelled (a survivor that gave up early: the Paddle "No more available task" bug).
EXIT_EARLY = 3

#: Chunks that make the trainer body misbehave (scenario 5).
POISON_KILL = {"poison": "kill"}
POISON_RAISE = {"poison": "raise"}


# -- the trainer process ---------------------------------------------------------------
def _body(task: taskq.Task, step_s: float, until_revoked_s: float) -> bool:
    """Process one task; returns whether the body saw ``task.revoked``."""
    for chunk in task.chunks:
        if isinstance(chunk, dict) and chunk.get("poison") == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # not reached
        if isinstance(chunk, dict) and chunk.get("poison") == "raise":
            raise RuntimeError(f"poison chunk in task {task.id}")
    if until_revoked_s > 0:
        give_up = time.monotonic() + until_revoked_s
        while not task.revoked.wait(0.05):
            if time.monotonic() > give_up:
                return False
        return True
    if step_s > 0:
        time.sleep(step_s)  # the task's work
    return task.revoked.is_set()


def _trainer_main(
    url: str,
    job: str,
    worker_id: str,
    log_path: str,
    step_s: float,
    until_revoked_s: float,
    explicit_ack: bool,
    options: dict[str, Any],
) -> None:
    """The trainer process: one trainer loop, one JSON line per processed task.

    With ``explicit_ack`` the body acks each task itself (``trainer.ack``) and logs
    ``"stale": true`` when the server rejected it (``LeaseLost``); otherwise the iterator
    acks it in the call that leases the next task.
    """
    # the parent's handlers (pytest's) must not run here; Trainer installs its own
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 0
    state = "?"
    with open(log_path, "a", buffering=1) as log:
        try:
            with taskq.Trainer(job, url=url, worker_id=worker_id, **options) as trainer:
                for task in trainer:
                    start = time.time()
                    revoked = _body(task, step_s, until_revoked_s)
                    row = {
                        "worker": worker_id,
                        "pass": task.pass_no,
                        "task": task.id,
                        "token": task.token,
                        "t": time.time(),
                        "start": start,
                        "revoked": revoked,
                    }
                    if explicit_ack:
                        try:
                            trainer.ack(task)
                            row["stale"] = False
                        except taskq.LeaseLost:
                            row["stale"] = True
                    log.write(json.dumps(row) + "\n")
                state = taskq.Client(url).status(job, summaries=0).state
                if state not in ("completed", "cancelled"):
                    code = EXIT_EARLY
        except taskq.JobNotFound:
            state = "not_found"
        except Exception as e:  # the body raised: the with block failed the task
            state = f"raised {type(e).__name__}: {e}"
            code = 1
        finally:
            with open(log_path + ".exit", "a") as out:
                out.write(
                    json.dumps(
                        {"worker": worker_id, "state": state, "t": time.time(), "code": code}
                    )
                    + "\n"
                )
    sys.stdout.flush()
    os._exit(code)


@dataclass
class TrainerProc:
    """A trainer process: its process, worker id and log file."""

    worker_id: str
    log_path: Path
    proc: Any  # multiprocessing.context.ForkServerProcess
    started_at: float = field(default_factory=time.time)
    signals: list[tuple[str, float]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def alive(self) -> bool:
        return bool(self.proc.is_alive())

    @property
    def exitcode(self) -> int | None:
        return self.proc.exitcode  # type: ignore[no-any-return]

    def send(self, signum: int) -> float:
        """Send ``signum``; returns the wall time it was sent."""
        now = time.time()
        if self.proc.is_alive():
            os.kill(self.pid, signum)
        self.signals.append((signal.Signals(signum).name, now))
        return now

    def term(self) -> float:
        return self.send(signal.SIGTERM)

    def kill(self) -> float:
        return self.send(signal.SIGKILL)

    def stop(self) -> float:
        return self.send(signal.SIGSTOP)

    def cont(self) -> float:
        return self.send(signal.SIGCONT)

    def join(self, timeout: float) -> int | None:
        self.proc.join(timeout)
        return self.exitcode

    def records(self) -> list[dict[str, Any]]:
        return read_log(self.log_path)

    def exit_record(self) -> dict[str, Any] | None:
        rows = read_log(Path(str(self.log_path) + ".exit"))
        return rows[-1] if rows else None


class Fleet:
    """The trainer processes of one scenario; ``close()`` kills whatever is left.

    Args:
        url: the Redis URL the trainers use.
        job: the job name.
        log_dir: where each trainer's log goes (``<worker_id>.jsonl``).
        step_s: seconds each task's body sleeps.
    """

    def __init__(self, url: str, job: str, log_dir: Path | str, step_s: float = 0.05) -> None:
        self.url = url
        self.job = job
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.step_s = step_s
        self.trainers: list[TrainerProc] = []
        self._seq = 0

    def spawn(
        self,
        n: int = 1,
        *,
        step_s: float | None = None,
        until_revoked_s: float = 0.0,
        explicit_ack: bool = False,
        worker_id: str | None = None,
        **options: Any,
    ) -> list[TrainerProc]:
        """Start ``n`` trainers.

        Args:
            n: how many.
            step_s: seconds each task's body sleeps (default: the fleet's).
            until_revoked_s: instead, the body waits up to this long for ``task.revoked``.
            explicit_ack: the body acks each task itself and logs whether it was stale.
            worker_id: the id (only with n=1); ``wNNN`` by default.
            options: more ``taskq.Trainer`` arguments (prefetch, heartbeat, ...).
        """
        out = []
        for _ in range(n):
            self._seq += 1
            wid = worker_id or f"w{self._seq:03d}"
            log_path = self.log_dir / f"{wid}.jsonl"
            proc = TRAINER_START.Process(
                target=_trainer_main,
                name=f"trainer-{wid}",
                daemon=False,
                args=(
                    self.url,
                    self.job,
                    wid,
                    str(log_path),
                    self.step_s if step_s is None else step_s,
                    until_revoked_s,
                    explicit_ack,
                    options,
                ),
            )
            proc.start()
            tp = TrainerProc(wid, log_path, proc)
            self.trainers.append(tp)
            out.append(tp)
        return out

    def alive(self) -> list[TrainerProc]:
        return [t for t in self.trainers if t.alive()]

    def logs(self) -> list[Path]:
        return [t.log_path for t in self.trainers]

    def records(self) -> list[dict[str, Any]]:
        return read_logs(self.logs())

    def join_all(self, timeout: float, trainers: Iterable[TrainerProc] | None = None) -> bool:
        """Wait until the given (default: all) trainers exited; False on timeout."""
        deadline = time.monotonic() + timeout
        for t in list(trainers if trainers is not None else self.trainers):
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.alive() for t in (trainers if trainers is not None else self.trainers))

    def close(self) -> None:
        """SIGCONT + SIGKILL every trainer still running and reap them (always safe)."""
        for t in self.trainers:
            if t.proc.is_alive():
                for signum in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(t.pid, signum)
                    except ProcessLookupError:
                        pass
        for t in self.trainers:
            t.proc.join(5)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_log(path: Path | str) -> list[dict[str, Any]]:
    """The JSON lines of one log (a torn last line of a SIGKILLed trainer is skipped)."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return rows


def read_logs(paths: Iterable[Path | str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in paths:
        out += read_log(p)
    return out


# -- held leases, kills with a record of what the victim held -------------------------
def held_by(client: taskq.Client, job: str, worker_id: str) -> list[dict[str, Any]]:
    """The current leases of ``worker_id`` (from the server)."""
    return [
        t for t in client.tasks(job, state="leased", limit=10000) if t.get("worker") == worker_id
    ]


def remove_trainers(
    client: taskq.Client, job: str, victims: list[tuple[TrainerProc, str]], pause_s: float = 0.1
) -> list[dict[str, Any]]:
    """SIGTERM or SIGKILL trainers at once, recording what each held at that moment.

    Every victim is SIGSTOPped first (for ``pause_s``, well under any ttl) so what the
    server says it holds cannot change before the signal lands.

    Args:
        victims: (trainer, "term" | "kill") pairs.

    Returns:
        One ``{"worker", "how", "t" (wall time of the signal), "pass", "held": [task ids]}``
        per victim.
    """
    for trainer, how in victims:
        if how not in ("term", "kill"):
            raise ValueError(f"how must be 'kill' or 'term', not {how!r}")
        trainer.stop()
    time.sleep(pause_s)  # in-flight calls land before what each holds is read
    status = client.status(job, summaries=0)
    leased = client.tasks(job, state="leased", limit=100000)
    out = []
    for trainer, how in victims:
        held = [t["id"] for t in leased if t.get("worker") == trainer.worker_id]
        if how == "kill":
            t = trainer.kill()
        else:
            t = trainer.term()
            trainer.cont()
        out.append(
            {"worker": trainer.worker_id, "how": how, "t": t, "pass": status.pass_no, "held": held}
        )
    return out


def remove_trainer(
    client: taskq.Client, job: str, trainer: TrainerProc, how: str, pause_s: float = 0.1
) -> dict[str, Any]:
    """``remove_trainers`` for one trainer."""
    return remove_trainers(client, job, [(trainer, how)], pause_s)[0]


def acked_by(client: taskq.Client, job: str) -> set[tuple[str, int, int]]:
    """(worker, pass, task) of every ack in the job's events stream."""
    out: set[tuple[str, int, int]] = set()
    last = "-"
    while True:
        page = client.events(job, since=last, count=1000)
        for _, e in page:
            if e.get("type") == "step":
                for task in filter(None, e.get("acked", "").split(",")):
                    out.add((e.get("worker", ""), int(e.get("pass", -1)), int(task)))
        if len(page) < 1000:
            return out
        last = page[-1][0]


def redispatch_waits(
    removals: list[dict[str, Any]], records: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """For each task a removed trainer held: seconds from the signal to the next start of
    that task (same pass) in any trainer's log. ``wait_s`` is None if never seen."""
    starts: dict[tuple[int, int], list[float]] = defaultdict(list)
    for r in records:
        starts[(int(r["pass"]), int(r["task"]))].append(float(r.get("start", r["t"])))
    out = []
    for rm in removals:
        for task_id in rm["held"]:
            later = [s for s in starts[(rm["pass"], task_id)] if s >= rm["t"]]
            out.append(
                {
                    "worker": rm["worker"],
                    "how": rm["how"],
                    "task": task_id,
                    "pass": rm["pass"],
                    "wait_s": round(min(later) - rm["t"], 3) if later else None,
                }
            )
    return out


# -- the reaper and the CLI as subprocesses ---------------------------------------------
def taskq_cmd() -> list[str]:
    """The ``taskq`` CLI: the venv's entry point, or the same via this interpreter."""
    exe = Path(sys.executable).with_name("taskq")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "from taskq.cli.main import main; main()"]


def run_cli(url: str, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``taskq ARGS`` against ``url`` and return the finished process."""
    env = dict(os.environ, TASKQ_REDIS_URL=url)
    return subprocess.run(
        [*taskq_cmd(), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


class ReaperProc:
    """``taskq reaper`` in a subprocess; ``stop()`` ends it (SIGTERM, then SIGKILL)."""

    def __init__(
        self,
        url: str,
        interval: float = 0.2,
        jobs: Iterable[str] = (),
        log_path: Path | str | None = None,
    ) -> None:
        env = dict(os.environ, TASKQ_REDIS_URL=url)
        args = [*taskq_cmd(), "reaper", "--interval", str(interval)]
        for job in jobs:
            args += ["--job", job]
        self._log = open(log_path, "ab") if log_path else None
        self.proc = subprocess.Popen(
            args, env=env, stdout=subprocess.DEVNULL, stderr=self._log or subprocess.DEVNULL
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int | None:
        stop_process(self.proc, 5)
        if self._log:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def __enter__(self) -> ReaperProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- waiting helpers ----------------------------------------------------------------------
def wait_for(
    predicate: Any, timeout: float, interval: float = 0.05, what: str = "condition"
) -> Any:
    """Poll ``predicate`` until truthy; raises AssertionError naming ``what`` on timeout."""
    got: list[Any] = []
    if not wait_until(lambda: got.append(predicate()) or got[-1], timeout, interval):
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
    return got[-1]


def acked(client: taskq.Client, job: str) -> int:
    """The job's acked counter (all passes)."""
    return int(client.status(job, summaries=0).counters["acked"])


# -- scenario 1 at any size ------------------------------------------------------------
def scale_up_down_kill(
    client: taskq.Client,
    url: str,
    job: str,
    log_dir: Path,
    *,
    tasks: int,
    passes: int,
    first: int,
    peak: int,
    last: int,
    step_s: float,
    up_at: int,
    down_at: int,
    ttl_s: float,
    hbi_s: float,
    reaper_interval: float = 0.2,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Scenario 1 (the PaddlePaddle report) at any size; ``tests/chaos/test_chaos.py`` runs the
    CI form, ``bench/chaos_long.py`` the full one.

    ``first`` trainers, ``peak`` once ``up_at`` tasks were acked, ``last`` once
    ``down_at`` were (the removed ones alternately by SIGTERM and SIGKILL), a reaper
    running throughout. Asserts that every survivor exits 0 only with the job completed,
    each removed trainer died of its signal, every task a removed trainer held was leased
    again, and the audit; returns the audit summary plus ``runtime_s``, ``tail_s`` (from
    the scale-down to the last survivor's exit), ``max_kill_wait_s``,
    ``max_term_wait_s`` (signal to the next start of a task the victim held) and
    ``waits``.
    """
    client.create_job(
        job,
        chunks=[{"i": i} for i in range(tasks)],
        passes=passes,
        worker_ttl=ttl_s,
        heartbeat_interval=hbi_s,
        task_timeout=None,
    )
    began = time.monotonic()
    reaper_log = log_dir / "reaper.log"
    with (
        Fleet(url, job, log_dir, step_s=step_s) as fleet,
        ReaperProc(url, interval=reaper_interval, jobs=[job], log_path=reaper_log) as reaper,
    ):
        fleet.spawn(first)
        wait_for(lambda: acked(client, job) >= up_at, timeout_s, what=f"{up_at} acks")
        fleet.spawn(peak - first)
        wait_for(lambda: acked(client, job) >= down_at, timeout_s, what=f"{down_at} acks")
        status = client.status(job, summaries=0)
        assert status.state == "running", "the job ended before the scale-down"
        # remove the newest and some of the first: keep the oldest `last`
        victims = fleet.trainers[last:]
        plan = [(t, "term" if k % 2 == 0 else "kill") for k, t in enumerate(victims)]
        removals = remove_trainers(client, job, plan)
        removed_at = time.monotonic()
        survivors = fleet.trainers[:last]
        assert fleet.join_all(timeout_s, survivors), "a surviving trainer hangs"
        tail_s = time.monotonic() - removed_at
        assert reaper.alive(), "the reaper died"
        fleet.join_all(10)
        for t in survivors:
            record = t.exit_record()
            assert t.exitcode == 0, (
                f"survivor {t.worker_id} exited {t.exitcode} "
                f"({'early' if t.exitcode == EXIT_EARLY else record})"
            )
            assert record is not None and record["state"] == "completed", record
        held = {rm["worker"]: rm["held"] for rm in removals}
        for t, how in plan:
            expected = {128 + signal.SIGTERM if how == "term" else -signal.SIGKILL}
            if how == "term" and not t.records() and not held[t.worker_id]:
                # a trainer started at the scale-up that had not begun its loop (a loaded
                # machine: the forkserver's child may not have run a line of its own yet)
                # holds nothing and has no handler: SIGTERM's default action ends it
                expected.add(-signal.SIGTERM)
            assert t.exitcode in expected, f"{t.worker_id} ({how}) exited {t.exitcode}"
        summary = audit_job(client, job, fleet.logs())
        waits = redispatch_waits(removals, fleet.records())
        # A SIGTERM may land while the trainer's ack of its task is already in flight: that
        # task was acked by the leaving trainer itself (the server's acked events say so).
        self_acked = acked_by(client, job)
    missing = [
        w
        for w in waits
        if w["wait_s"] is None
        and (w["how"] == "kill" or (w["worker"], w["pass"], w["task"]) not in self_acked)
    ]
    assert not missing, f"never leased again: {missing} (all: {waits})"
    waits = [w for w in waits if w["wait_s"] is not None]
    kill_waits = [w["wait_s"] for w in waits if w["how"] == "kill"]
    term_waits = [w["wait_s"] for w in waits if w["how"] == "term"]
    summary.update(
        runtime_s=round(time.monotonic() - began, 2),
        tail_s=round(tail_s, 2),
        max_kill_wait_s=max(kill_waits, default=None),
        max_term_wait_s=max(term_waits, default=None),
        waits=waits,
    )
    return summary


# -- the audit ------------------------------------------------------------------------------
def audit_job(
    client: taskq.Client,
    job: str,
    logs: Iterable[Path | str],
    expect_dead: Iterable[int] | None = None,
    expect_state: str | None = "completed",
) -> dict[str, Any]:
    """Assert the product's promise over a finished (or cancelled) job; return a summary.

    Checks:
      - the server's own checks (``client.audit``: counters against sets and bitmaps);
      - per pass attempt: done + dead + skipped == tasks, i.e. every live task acked
        exactly once in the records (for the current attempt of a cancelled job:
        done <= live);
      - the acked counter equals the sum of done over all pass attempts;
      - processed at least once: every (pass, task) the records count as done of a
        completed pass attempt appears in the trainers' logs;
      - dead tasks: exactly ``expect_dead`` (when given), each at a cap
        (failures >= max_failures or attempts >= max_attempts);
      - the job ended in ``expect_state`` (when given).

    Returns:
        ``{"passes", "acked", "stale", "dead", "max_lateness_ms", "processed",
        "duplicates", "audit"}``: ``processed`` counts log lines, ``duplicates`` the
        (pass, task) pairs processed more than once (at-least-once processing).
    """
    report = client.audit(job)
    status = client.status(job, summaries=0)
    failures = [f"{k} is false" for k, v in report["checks"].items() if not v]
    assert report["ok"] and not failures, f"server audit failed: {failures}: {report}"
    if expect_state is not None:
        assert report["state"] == expect_state, (
            f"job state {report['state']!r}, expected {expect_state!r}: {report}"
        )
    n = status.tasks
    summaries = report["passes"]
    done_total = 0
    for s in summaries:
        done_total += int(s["done"] or 0)
        if s["state"] == "completed":
            total = int(s["done"] or 0) + int(s["dead"] or 0) + int(s["skipped"] or 0)
            assert total == n, (
                f"pass {s['pass']} (round {s['round']}): done {s['done']} + "
                f"dead {s['dead']} + skipped {s['skipped']} != {n} tasks"
            )
        else:
            assert int(s["done"] or 0) <= n - int(s["dead"] or 0), f"pass summary {s}"
    cur = report["current"]
    last = summaries[-1] if summaries else None
    current_summarised = last is not None and last["pass"] == cur["pass"]
    if not current_summarised:
        done_total += int(cur["done"])
    assert cur["done"] <= n - cur["dead"], f"current pass: done {cur['done']} > live: {cur}"
    acked_counter = int(report["counters"]["acked"])
    assert acked_counter == done_total, (
        f"acked counter {acked_counter} != sum of done over pass attempts {done_total}: "
        f"{summaries} current {cur}"
    )
    assert report["counters"]["dead"] >= cur["dead"]

    # processed at least once according to the trainers' logs
    records = read_logs(logs)
    processed: dict[tuple[int, int], int] = defaultdict(int)
    for r in records:
        processed[(int(r["pass"]), int(r["task"]))] += 1
    dead_rows = client.tasks(job, state="dead", limit=10000)
    dead_ids = {int(d["id"]) for d in dead_rows}
    completed_passes = sorted(
        {s["pass"] for s in summaries if s["state"] == "completed" and not s["skipped"]}
    )
    missing = []
    for p in completed_passes:
        for task_id in range(n):
            if (p, task_id) not in processed and task_id not in dead_ids:
                missing.append((p, task_id))
    assert not missing, f"acked in the records but in no trainer's log: {missing[:20]}"

    cfg = status.config
    for d in dead_rows:
        assert d["failures"] >= cfg["max_failures"] or d["attempts"] >= cfg["max_attempts"], (
            f"dead task below both caps: {d} (config {cfg})"
        )
    if expect_dead is not None:
        assert dead_ids == set(expect_dead), (
            f"dead tasks {sorted(dead_ids)}, expected {sorted(set(expect_dead))}"
        )
    # every lease ended exactly one way, or is still held (a cancel revokes lazily and
    # counts nothing: for a cancelled job this is the number held at the cancel)
    c = report["counters"]
    ended = sum(
        int(c[k])
        for k in (
            "acked",
            "failed",
            "released",
            "expired_worker_lost",
            "expired_task_timeout",
            "stolen",
            "revoked",
        )
    )
    return {
        "unaccounted_leases": int(c["leased"]) - ended - int(cur["leased"]),
        "passes": len(summaries),
        "acked": acked_counter,
        "stale": int(report["counters"]["stale"]),
        "dead": sorted(dead_ids),
        "max_lateness_ms": max([int(s.get("max_lateness_ms") or 0) for s in summaries] or [0]),
        "processed": len(records),
        "duplicates": sum(1 for c in processed.values() if c > 1),
        "counters": report["counters"],
        "audit": report,
    }
