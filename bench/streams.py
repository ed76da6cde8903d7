"""Appending to a stream job: descriptors appended per second, and the time from an
append to a waiting trainer's lease.

Usage: .venv/bin/python bench/streams.py [--chunks 100000] [--latency-samples 300]
       .venv/bin/python bench/streams.py --bounded 1000000 [--backlog 10000]

Where it sits: a diagnostic beside `secret_cost.py` (not a section of run.py), against a
private redis-server it starts and stops (loopback, no persistence). Two measurements:

- throughput: `job.append` of `--chunks` descriptors of a Parquet file each
  (`{"path", "row_group", "rows"}`, ~70 bytes of JSON) into a stream job, in its pages
  of 500 (one FCALL each), without ids and with one id per chunk (the duplicate check:
  one HEXISTS and one HSET field per chunk); then the same append again with the ids
  (every chunk skipped). Descriptors per second, end to end (JSON encoding included).
- latency: one trainer process blocks in `lease()` on a drained stream; the driver
  appends one chunk carrying `time.monotonic()` (CLOCK_MONOTONIC, system-wide) once the
  trainer is in the waiting set, the trainer notes the clock when `lease()` returns it
  and acks. p50 / p99 / max over `--latency-samples` appends.

`--bounded N` instead streams N chunks through one stream job (one-pass, ids on every
chunk, `max_backlog` `--backlog`): a producer thread appends pages, a trainer process
leases and acks in batches of 32, and the driver runs the reaper's trim step (as
`taskq reaper` does each tick) and samples Redis's `used_memory` every 5 % of the way.
It prints the memory at the first sample, at the end and its highest, and the SLOWLOG
entries at 10 ms (`slowlog-log-slower-than 10000`), which should be none; `--no-trim`
runs the same without the trim, for the memory it would take.

`--week` is a simulated week through `taskq job follow`: a producer thread writes
`--files` JSONL files of `--records-per-file` fixed-width records each into a temp
folder, `--files-per-batch` at a time (each under a hidden name, then renamed into place;
at most two batches ahead of the appends), so the folder grows to `--files` files. The
follower (`--format jsonl --records-per-chunk 1 --settle 0 --horizon H`: one task per
record) is SIGKILLed and SIGTERMed in turn every `--follower-restart` s and started
again; `--trainers` plain `taskq.Trainer` processes ack `batches(--batch)`, and one of
them is SIGTERMed and replaced every `--trainer-restart` s; the driver runs the reaper's
trim step every tick. It reports `used_memory` sampled every `--sample-every` s (peak
against the steady value, the median from 10 % done on: at most 2x), the SLOWLOG at
10 ms (none), the follower's CPU over `--idle-window` s with nothing new at the start
(after the first batch) and at the end (every file appended), and every record's count
in the trainers' acks (each trainer writes the record ids of each batch it acked):
0 missing, 0 twice. Exits 1 when a bound fails. Beside the SLOWLOG it reports what can
stretch a call past its work: the server's latency monitor (events over 5 ms: command,
fast-command, fork, aof-*, expire-cycle, eviction...), its persistence, forks, expiries
and evictions, its main thread as the kernel saw it every 0.25 s (run-queue wait,
involuntary switches, page faults; steal, irq and softirq of its core) around each
entry, and a stall probe: a process at the server's SCHED_FIFO priority sleeping 1 ms
at a time, noting each wake-up over 4 ms late and the steal counted over it (a stall no
process of the guest causes). `--probe-core C` pins the server's main thread and the
probe (one priority above it) to core C, so the probe's stalls are the server's core's.

       .venv/bin/python bench/streams.py --week [--files 100000] [--records-per-file 100]
           [--trainers 2] [--follower-restart 60] [--trainer-restart 45] [--nice -10]
           [--fifo 10 [--probe-core 1]]

`--nice N` runs the server at priority N (root, N < 0): on a machine shared with other
jobs, a server at the same priority as theirs is descheduled in the middle of calls, and
SLOWLOG (wall time) counts the wait; at -10 it rarely is at moderate load. `--fifo P`
runs it under SCHED_FIFO at priority P (root): no process of the ordinary class
preempts it, so what SLOWLOG keeps is the calls' own cost even at a load of many times
the cores (the kernel's real-time throttling still leaves the others 5 % of its core).
"""

from __future__ import annotations

import argparse
import array
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import common

import taskq

TASKQ = os.path.join(os.path.dirname(sys.executable), "taskq")


def descriptors(n: int, base: int = 0) -> list[dict[str, object]]:
    return [
        {
            "path": f"s3://bucket/events/part-{(base + i) // 8:06d}.parquet",
            "row_group": i % 8,
            "rows": 4096,
        }
        for i in range(n)
    ]


def throughput(url: str, n: int) -> dict[str, float]:
    """Descriptors per second of each shape, and the server's µs per append call (one
    page of 500; INFO commandstats)."""
    client = taskq.Client(url)
    out = {}
    for label, with_ids in (("no ids", False), ("ids", True)):
        job = f"tput-{label.replace(' ', '-')}"
        client.create_job(job, [], stream=True)
        chunks = descriptors(n)
        ids = [f"c{i}" for i in range(n)] if with_ids else None
        client.redis.config_resetstat()
        t0 = time.perf_counter()
        r = client.job(job).append(chunks, ids=ids)
        out[label] = n / (time.perf_counter() - t0)
        assert r.tasks == n, r
        stat = client.redis.info("commandstats")["cmdstat_fcall"]
        out[f"{label}: server µs per page (mean)"] = stat["usec_per_call"]
        if with_ids:
            t0 = time.perf_counter()
            r = client.job(job).append(chunks, ids=ids)
            out["ids, all skipped"] = n / (time.perf_counter() - t0)
            assert (r.tasks, r.skipped) == (0, n), r
    return out


def waiter(url: str, job: str, samples: int, out: mp.Queue) -> None:
    with taskq.Trainer(job, url=url, worker_id="waiter") as trainer:
        for _ in range(samples):
            task = trainer.lease(timeout=30)
            got = time.monotonic()
            assert task is not None
            out.put(got - task.chunks[0]["sent"])
            trainer.ack(task)


def latency(url: str, samples: int) -> list[float]:
    client = taskq.Client(url)
    job = "latency"
    client.create_job(job, [], stream=True)
    out: mp.Queue = mp.get_context("fork").Queue()
    proc = mp.get_context("fork").Process(target=waiter, args=(url, job, samples, out))
    proc.start()
    waiting = client.keys(job).waiting
    lat = []
    try:
        for _ in range(samples):
            deadline = time.monotonic() + 30
            while client.redis.zcard(waiting) == 0:  # (the driver's own wait, not measured)
                if time.monotonic() > deadline:
                    raise RuntimeError("the trainer never waited")
                time.sleep(0.001)
            client.job(job).append([{"sent": time.monotonic()}])
            lat.append(out.get(timeout=30))
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    return lat


def consumer(url: str, job: str) -> None:
    """Lease and ack in batches of 32 until the sealed stream completes."""
    with taskq.Trainer(job, url=url, worker_id="consumer") as trainer:
        for batch in trainer.batches(32):
            trainer.ack(batch)


def bounded(url: str, n: int, backlog: int, trim: bool = True) -> dict[str, object]:
    """Stream ``n`` chunks through a one-pass stream job; memory samples and SLOWLOG."""
    client = taskq.Client(url)
    client.redis.config_set("slowlog-log-slower-than", 10_000)
    client.redis.slowlog_reset()
    job = "bounded"
    client.create_job(job, [], stream=True, passes=1, max_backlog=backlog)
    handle = client.job(job)
    page = 5000

    def produce() -> None:
        for base in range(0, n, page):
            k = min(page, n - base)
            handle.append(descriptors(k, base), ids=[f"id-{base + i:09d}" for i in range(k)])
        handle.seal()

    producer = threading.Thread(target=produce)
    proc = mp.get_context("spawn").Process(target=consumer, args=(url, job))
    proc.start()
    t0 = time.perf_counter()
    producer.start()
    samples: list[tuple[int, int]] = []
    step = max(1, n // 20)
    next_at = step
    try:
        while True:
            while trim and handle.trim():
                pass
            st = client.status(job, summaries=0)
            if st.done >= next_at or st.state == "completed":
                samples.append((st.done, int(client.redis.info("memory")["used_memory"])))
                next_at += step
            if st.state == "completed":
                break
            time.sleep(0.05)
    finally:
        producer.join(timeout=60)
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    elapsed = time.perf_counter() - t0
    st = client.status(job, summaries=0)
    mem = [m for _, m in samples]
    return {
        "chunks": n,
        "seconds": elapsed,
        "acked": st.counters["acked"],
        "trimmed": st.trimmed,
        "first_mib": mem[0] / 2**20,
        "last_mib": mem[-1] / 2**20,
        "max_mib": max(mem) / 2**20,
        "samples": samples,
        "slowlog": client.redis.slowlog_get(128),
    }


# -- a simulated week through `taskq job follow` -------------------------------------------

#: One record line of a week's file: fixed width, so a chunk's byte offset tells its line.
_LINE = 24


def _record_line(rid: int) -> bytes:
    line = b'{"r": "%014d"}\n' % rid
    assert len(line) == _LINE
    return line


def _record_of(chunk: dict[str, object], per_file: int) -> int:
    """The record id of a one-record jsonl chunk: its file's number and its line."""
    name = str(chunk["path"]).rsplit("/", 1)[-1]
    return int(name[5:12]) * per_file + int(chunk["offset"]) // _LINE  # type: ignore[call-overload]


def week_trainer(url: str, job: str, out_path: str, k: int, per_file: int) -> None:
    """A plain Trainer loop: ``batches(k)``, each batch acked, then its record ids
    appended to ``out_path``. SIGTERM leaves at once as the Trainer's own handler does
    (the ``with`` releases what is held), except between a batch's lease and the write
    of its acked ids, where it waits for the write (so the ack file is the acks)."""
    stop = threading.Event()
    held = [False]  # a batch acked and not yet written: the signal waits for it

    def on_term(signum: int, frame: object) -> None:
        stop.set()
        if not held[0]:
            raise SystemExit(128 + signum)  # as the Trainer's own handler does

    signal.signal(signal.SIGTERM, on_term)
    with (
        taskq.Trainer(job, url=url, handle_signals=False) as trainer,
        open(out_path, "ab") as out,
    ):
        for batch in trainer.batches(k):
            held[0] = True
            ids = array.array("Q", (_record_of(t.chunks[0], per_file) for t in batch))
            trainer.ack(batch)
            out.write(ids.tobytes())
            out.flush()
            held[0] = False
            if stop.is_set():
                break


def _produce(
    folder: Path,
    files: int,
    per_file: int,
    batch: int,
    gate: Callable[[int], bool],
    stop: threading.Event,
    written: list[int],
) -> None:
    """Writes ``files`` files of ``per_file`` records in batches, each under a hidden name
    renamed into place; batch i+1 once ``gate(i)`` says the follower is close behind."""
    for lo in range(0, files, batch):
        while not gate(lo) and not stop.is_set():
            time.sleep(0.05)
        if stop.is_set():
            return
        for f in range(lo, min(files, lo + batch)):
            tmp = folder / f".part-{f:07d}.tmp"
            base = f * per_file
            tmp.write_bytes(b"".join(_record_line(base + i) for i in range(per_file)))
            os.rename(tmp, folder / f"part-{f:07d}.jsonl")
            written[0] = f + 1


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_sched(pid: int) -> tuple[int, ...]:
    """The server's main thread (it runs every command) as the kernel saw it: ns on a
    core, ns runnable but waiting for one, involuntary switches (preempted), minor page
    faults, the core it is on; then each core's jiffies of steal (the hypervisor ran
    another vCPU), irq and softirq (run on top of any process)."""
    run_ns, wait_ns, _ = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    preempted = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cores = []
    for line in Path("/proc/stat").read_text().splitlines()[1:]:
        if not line.startswith("cpu"):
            break
        cpu = line.split()
        cores += [int(cpu[8]), int(cpu[6]), int(cpu[7])]
    return (int(run_ns), int(wait_ns), preempted, int(fields[7]), int(fields[36]), *cores)


SCHED_FIELDS = ("run ms", "wait ms", "preempted", "page faults", "steal", "irq", "softirq")
#: The server's thread is sampled this often (s), for what happened around a SLOWLOG entry.
SCHED_EVERY = 0.25


def _sched_delta(a: tuple[int, ...], b: tuple[int, ...]) -> dict[str, float]:
    """What changed from sample ``a`` to ``b``; steal, irq and softirq of the core the
    server was on at ``b``."""
    core = 5 + 3 * b[4]
    d = [b[i] - a[i] for i in (0, 1, 2, 3, core, core + 1, core + 2)]
    return dict(zip(SCHED_FIELDS, [d[0] / 1e6, d[1] / 1e6, *d[2:]], strict=True))


#: The stall probe sleeps this long (s) at a time; a wake-up later than PROBE_GAP counts.
PROBE_SLEEP = 0.001
PROBE_GAP = 0.004


def stall_probe(fifo: int, out_path: str, core: int | None = None) -> None:
    """A process at the server's SCHED_FIFO priority that sleeps ``PROBE_SLEEP`` at a
    time until SIGTERM and writes each wake-up later than ``PROBE_GAP`` (epoch s, ms,
    each core's steal jiffies counted over it) to ``out_path``: a stall no process of the
    guest could cause at that priority (the hypervisor running another vCPU, counted as
    steal; an interrupt storm; a higher real-time thread), seen apart from Redis."""
    if core is not None:  # beside the server on its core, one priority above it
        os.sched_setaffinity(0, {core})
        fifo += 1
    if fifo:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(fifo))
    cores = os.cpu_count() or 1

    def steal() -> list[int]:
        with open("/proc/stat") as f:
            f.readline()
            return [int(f.readline().split()[8]) for _ in range(cores)]

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    wakeups = 0
    with open(out_path, "w", buffering=1) as out:
        last, stolen = time.monotonic(), steal()
        while not stop.is_set():
            time.sleep(PROBE_SLEEP)
            now, now_stolen = time.monotonic(), steal()
            wakeups += 1
            if now - last > PROBE_GAP:
                d = [b - a for a, b in zip(stolen, now_stolen, strict=True)]
                out.write(f"{time.time() - (now - last):.3f} {(now - last) * 1000:.2f} {d}\n")
            last, stolen = now, now_stolen
        out.write(f"wakeups {wakeups}\n")


def probe_report(path: Path) -> tuple[int, list[tuple[float, float, bool]]]:
    """(wake-ups, [(when the gap began, its ms, whether steal was counted over it)])."""
    gaps, wakeups = [], 0
    for line in path.read_text().splitlines():
        if line.startswith("wakeups "):
            wakeups = int(line.split()[1])
            continue
        at, ms, rest = line.split(" ", 2)
        gaps.append((float(at), float(ms), any(int(x) for x in rest.strip("[]").split(","))))
    return wakeups, gaps


def server_diagnostics(client: taskq.Client) -> dict[str, object]:
    """What the server says of its slow moments beside the SLOWLOG: the latency
    monitor's events (`latency-monitor-threshold` 5 ms, set at the start: a command, a
    fork, an AOF write or fsync, the expire cycle, an eviction...), its persistence
    (RDB saves and AOF rewrites fork, and writes after a fork pay copy-on-write) and
    the counters of what runs outside commands."""
    r = client.redis
    events = {}
    for name, _at, latest, peak in r.latency_latest():
        name = name.decode() if isinstance(name, bytes) else str(name)
        history = r.latency_history(name)
        events[name] = {
            "latest ms": latest,
            "max ms": peak,
            "times (epoch s, ms)": [(int(t), int(ms)) for t, ms in history],
        }
    persistence = r.info("persistence")
    stats = r.info("stats")
    keep = ("rdb_saves", "rdb_bgsave_in_progress", "aof_enabled", "aof_rewrites")
    return {
        "latency events": events,
        "persistence": {k: persistence.get(k) for k in keep},
        "config": {k: v for k, v in r.config_get("save").items()}
        | r.config_get("appendonly")
        | r.config_get("hz")
        | r.config_get("activedefrag"),
        "stats": {
            k: stats.get(k)
            for k in ("total_forks", "latest_fork_usec", "expired_keys", "evicted_keys")
        },
    }


class _Week:
    """The driver of `week`: the follower and trainer processes it starts, restarts and
    stops (by their pids), and what it samples."""

    def __init__(self, url: str, job: str, folder: Path, work: Path, a: argparse.Namespace):
        self.url, self.job, self.folder, self.work, self.a = url, job, folder, work, a
        self.follower: subprocess.Popen[bytes] | None = None
        self.follower_log = open(work / "follower.log", "ab")  # noqa: SIM115 (closed in stop)
        self.trainers: list[mp.process.BaseProcess] = []
        self.incarnations = 0
        self.restarts = {"follower SIGTERM": 0, "follower SIGKILL": 0, "trainer SIGTERM": 0}

    def start_follower(self) -> None:
        self.follower = subprocess.Popen(
            [
                TASKQ,
                "--url",
                self.url,
                "job",
                "follow",
                self.job,
                "--files",
                str(self.folder / "*.jsonl"),
                "--format",
                "jsonl",
                "--records-per-chunk",
                "1",
                "--every",
                f"{self.a.every}s",
                "--settle",
                "0",
                "--horizon",
                f"{self.a.horizon}s",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.follower_log,
        )

    def restart_follower(self, sig: int) -> None:
        assert self.follower is not None
        self.follower.send_signal(sig)
        self.follower.wait(timeout=60)
        name = "SIGKILL" if sig == signal.SIGKILL else "SIGTERM"
        self.restarts[f"follower {name}"] += 1
        self.start_follower()

    def start_trainer(self, slot: int | None = None) -> None:
        self.incarnations += 1
        out = str(self.work / f"acks-{self.incarnations:05d}.bin")
        proc = mp.get_context("spawn").Process(
            target=week_trainer,
            args=(self.url, self.job, out, self.a.batch, self.a.records_per_file),
        )
        proc.start()
        if slot is None:
            self.trainers.append(proc)
        else:
            self.trainers[slot] = proc

    def restart_trainer(self, slot: int) -> None:
        proc = self.trainers[slot]
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGTERM)
        proc.join(timeout=60)
        self.restarts["trainer SIGTERM"] += 1
        self.start_trainer(slot)

    def idle_cpu(self, window: float) -> float:
        """The follower's CPU (% of a core) over ``window`` seconds."""
        assert self.follower is not None
        pid = self.follower.pid
        c0, t0 = _cpu_seconds(pid), time.monotonic()
        time.sleep(window)
        return 100 * (_cpu_seconds(pid) - c0) / (time.monotonic() - t0)

    def stop(self) -> None:
        if self.follower is not None and self.follower.poll() is None:
            self.follower.terminate()
            try:
                self.follower.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.follower.kill()
                self.follower.wait()
        for proc in self.trainers:  # done at the stream's end; else stopped as by a restart
            if proc.is_alive():
                proc.terminate()
        for proc in self.trainers:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.follower_log.close()


def week(url: str, a: argparse.Namespace) -> dict[str, object]:
    """Streams ``a.files`` x ``a.records_per_file`` records through `taskq job follow`
    (see the module docstring); returns what it measured."""
    import numpy as np

    client = taskq.Client(url)
    client.redis.config_set("slowlog-log-slower-than", 10_000)
    client.redis.config_set("slowlog-max-len", 100_000)  # every entry counted
    client.redis.slowlog_reset()
    client.redis.config_set("latency-monitor-threshold", 5)
    client.redis.latency_reset()
    job = "week"
    client.create_job(job, [], stream=True, passes=1, max_backlog=a.backlog)
    handle = client.job(job)
    total = a.files * a.records_per_file
    work = Path(tempfile.mkdtemp(prefix="taskq-week-"))
    folder = work / "files"
    folder.mkdir()
    run = _Week(url, job, folder, work, a)
    stop = threading.Event()
    written = [0]
    released = threading.Event()  # the producer passes its first batch only once set
    batch_records = a.files_per_batch * a.records_per_file

    def gate(lo: int) -> bool:
        if lo == 0:
            return True
        if not released.is_set():
            return False
        # at most two batches ahead of what the follower appended
        return (
            client.status(job, summaries=0).appended
            >= (lo - a.files_per_batch) * a.records_per_file
        )

    producer = threading.Thread(
        target=_produce,
        args=(folder, a.files, a.records_per_file, a.files_per_batch, gate, stop, written),
        daemon=True,
    )
    mem: list[tuple[float, int, int]] = []  # (seconds, done, used_memory)
    out: dict[str, object] = {"files": a.files, "records": total}
    t0 = time.monotonic()
    out["started"] = time.time()  # (epoch s: when each SLOWLOG entry came, from the start)
    deadline = t0 + a.max_seconds

    loads: list[float] = []

    pid = a.server_pid
    sched = [(time.time(), _server_sched(pid))]  # the server's main thread, every SCHED_EVERY

    def sample_sched() -> None:
        while not stop.wait(SCHED_EVERY):
            sched.append((time.time(), _server_sched(pid)))

    threading.Thread(target=sample_sched, daemon=True).start()
    probe_path = work / "stalls.txt"
    if a.probe_core is not None:  # the server's main thread and the probe on one core
        os.sched_setaffinity(pid, {a.probe_core})
    probe = mp.get_context("spawn").Process(
        target=stall_probe, args=(a.fifo, str(probe_path), a.probe_core)
    )
    probe.start()

    def sample() -> None:
        loads.append(os.getloadavg()[0])
        st = client.status(job, summaries=0)
        mem.append(
            (time.monotonic() - t0, st.done, int(client.redis.info("memory")["used_memory"]))
        )

    def check() -> None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the week did not finish in {a.max_seconds:g} s")
        if not producer.is_alive() and written[0] < a.files:
            raise RuntimeError(f"the producer stopped after {written[0]} files")
        for proc in run.trainers:
            if proc.exitcode is not None:
                raise RuntimeError(f"a trainer exited ({proc.exitcode})")
        if run.follower is not None and run.follower.poll() is not None:
            raise RuntimeError(f"the follower exited ({run.follower.returncode})")

    def wait_appended(n: int) -> None:
        while client.status(job, summaries=0).appended < n:
            check()
            handle.trim()
            time.sleep(0.2)

    try:
        run.start_follower()
        for _ in range(a.trainers):
            run.start_trainer()
        producer.start()
        wait_appended(min(total, batch_records))
        out["files at the first idle window"] = written[0]
        out["idle CPU at the start %"] = run.idle_cpu(a.idle_window)
        released.set()
        next_follower = time.monotonic() + a.follower_restart
        next_trainer = time.monotonic() + a.trainer_restart
        next_sample = 0.0
        kills = 0
        slot = 0
        while True:
            now = time.monotonic()
            check()
            while handle.trim():  # the reaper's step, each tick
                pass
            if now >= next_sample:
                sample()
                next_sample = now + a.sample_every
            st = client.status(job, summaries=0)
            if st.appended >= total:
                break
            if a.follower_restart and now >= next_follower:
                kills += 1
                run.restart_follower(signal.SIGKILL if kills % 2 else signal.SIGTERM)
                next_follower = now + a.follower_restart
            if a.trainer_restart and now >= next_trainer:
                run.restart_trainer(slot % a.trainers)
                slot += 1
                next_trainer = now + a.trainer_restart
            time.sleep(0.2)
        out["append seconds"] = time.monotonic() - t0
        # every file appended: the follower idles over the whole folder
        time.sleep(2 * a.every)
        out["files at the last idle window"] = len(os.listdir(folder))
        out["idle CPU at the end %"] = run.idle_cpu(a.idle_window)
        out["follow record fields"] = client.redis.hlen(client.keys(job).follow)
        handle.seal()
        while client.status(job, summaries=0).state != "completed":
            if time.monotonic() > deadline:
                raise RuntimeError("the sealed stream did not complete in time")
            while handle.trim():
                pass
            if time.monotonic() >= next_sample:
                sample()
                next_sample = time.monotonic() + a.sample_every
            time.sleep(0.2)
        while handle.trim():
            pass
        sample()
        out["seconds"] = time.monotonic() - t0
    except RuntimeError as e:  # cut short: what was measured so far is still reported
        out["cut short"] = f"{e} (after {time.monotonic() - t0:.0f} s)"
        sample()
    finally:
        stop.set()
        run.stop()
        producer.join(timeout=30)
        probe.terminate()
        probe.join(timeout=30)
    st = client.status(job, summaries=0)
    acks = [np.fromfile(p, dtype=np.uint64) for p in sorted(work.glob("acks-*.bin"))]
    ids = np.concatenate(acks) if acks else np.zeros(0, dtype=np.uint64)
    counts = np.bincount(ids.astype(np.int64), minlength=total)
    out["acked"] = st.counters.get("acked")
    out["trimmed"] = st.trimmed
    out["acks read"] = int(ids.size)
    out["missing"] = int((counts[:total] == 0).sum())
    out["twice or more"] = int((counts[:total] > 1).sum())
    out["unknown ids"] = int(counts[total:].sum())
    out["restarts"] = dict(run.restarts)
    out["mem"] = mem
    out["load average (1 min) at the samples"] = f"{min(loads):.1f} - {max(loads):.1f}"
    out["slowlog"] = client.redis.slowlog_get(100_000)
    out["slowlog len"] = client.redis.slowlog_len()
    out["server"] = client.redis.info("server")["redis_version"]
    out["diagnostics"] = server_diagnostics(client)
    out["probe"] = probe_report(probe_path)
    out["sched"] = sched
    shutil.rmtree(work)
    return out


def print_week(a: argparse.Namespace, r: dict[str, object]) -> int:
    """Prints a week's measures; 0 when every bound held, 1 otherwise."""
    mem: list[tuple[float, int, int]] = r.pop("mem")  # type: ignore[assignment]
    slow: list[dict[str, object]] = r.pop("slowlog")  # type: ignore[assignment]
    diagnostics: dict[str, dict[str, object]] = r.pop("diagnostics")  # type: ignore[assignment]
    wakeups, gaps = r.pop("probe")  # type: ignore[misc]
    sched: list[tuple[float, tuple[int, ...]]] = r.pop("sched")  # type: ignore[assignment]
    total = int(r["records"])  # type: ignore[call-overload]
    steady_samples = [m for _, done, m in mem if done >= total // 10] or [m for *_, m in mem]
    steady = sorted(steady_samples)[len(steady_samples) // 2]
    peak = max(m for *_, m in mem)
    for key, value in r.items():
        print(f"{key}: {value:,.1f}" if isinstance(value, float) else f"{key}: {value}")
    print(
        f"used_memory: {len(mem)} samples every {a.sample_every:g} s; first "
        f"{mem[0][2] / 2**20:.1f} MiB, steady (median from 10 % done) {steady / 2**20:.1f} "
        f"MiB, peak {peak / 2**20:.1f} MiB (x{peak / steady:.2f}), last {mem[-1][2] / 2**20:.1f} MiB"
    )
    step = max(1, len(mem) // 20)
    for t, done, m in mem[::step]:
        print(f"  {t:7.0f} s  done {done:>11,}: {m / 2**20:7.1f} MiB")
    print(f"SLOWLOG at 10 ms: {r['slowlog len']} entries")
    by: dict[str, list[int]] = {}
    for entry in slow:  # by command (a script's calls by function), count and longest
        words = bytes(entry["command"]).split()  # type: ignore[call-overload]
        head = b" ".join(words[:2] if words[0].upper().startswith(b"FCALL") else words[:1])
        by.setdefault(head.decode(errors="replace"), []).append(int(entry["duration"]))  # type: ignore[call-overload]
    for cmd, us in sorted(by.items(), key=lambda kv: -len(kv[1])):
        median = sorted(us)[len(us) // 2] / 1000
        print(f"  {cmd}: {len(us)}, median {median:.1f} ms, max {max(us) / 1000:.1f} ms")
    started = float(r["started"])  # type: ignore[arg-type]
    intervals = [
        (t0, t1, _sched_delta(x0, x1)) for (t0, x0), (t1, x1) in zip(sched, sched[1:], strict=False)
    ]

    def around(at: float) -> str:
        # the entry started within its second [at, at + 1): the samples spanning it
        spans = [(t0, t1) for t0, t1, _ in intervals if t1 >= at and t0 <= at + 1.1]
        if not spans:
            return "no sample"
        lo = next(i for i, (t, _) in enumerate(sched) if t >= spans[0][0])
        hi = next(i for i, (t, _) in enumerate(sched) if t >= spans[-1][1])
        d = _sched_delta(sched[lo][1], sched[hi][1])
        return f"{sched[hi][0] - sched[lo][0]:.2f} s: " + ", ".join(
            f"{k} {v:,.1f}" for k, v in d.items()
        )

    def stalls(at: int) -> str:
        near = [
            f"{ms:.1f} ms{' (steal)' if st else ''}" for t, ms, st in gaps if at - 1 <= t <= at + 2
        ]
        return ", ".join(near) or "none"

    for entry in sorted(slow, key=lambda e: int(e["start_time"]))[:50]:  # type: ignore[call-overload]
        words = bytes(entry["command"]).split()  # type: ignore[call-overload]
        at = int(entry["start_time"])  # type: ignore[call-overload]
        print(
            f"    at {at - started:7.0f} s: "
            f"{int(entry['duration']) / 1000:.1f} ms {b' '.join(words[:2]).decode(errors='replace')}"  # type: ignore[call-overload]
            f"  [around it, {around(at)}; probe stalls {stalls(at)}]"
        )
    stolen = sum(1 for *_, st in gaps if st)
    print(
        f"stall probe (SCHED_FIFO {a.fifo + (a.probe_core is not None)}, core {a.probe_core}, {PROBE_SLEEP * 1000:g} ms sleeps, {wakeups:,} wake-ups): "
        f"{len(gaps)} wake-ups late by over {PROBE_GAP * 1000:g} ms"
        + (
            f", max {max(ms for _, ms, _ in gaps):.1f} ms, {stolen} with steal counted over them"
            if gaps
            else ""
        )
    )
    near = [
        e
        for e in slow
        if any(int(e["start_time"]) - 1 <= at <= int(e["start_time"]) + 2 for at, _, _ in gaps)  # type: ignore[call-overload]
    ]
    print(
        f"  SLOWLOG entries with a probe stall within their second (+-1 s): {len(near)} of {len(slow)}"
    )
    events = diagnostics["latency events"]
    print(f"latency monitor at 5 ms: {len(events)} events")
    for name, ev in events.items():
        times = ev["times (epoch s, ms)"]
        print(f"  {name}: latest {ev['latest ms']} ms, max {ev['max ms']} ms, {len(times)} kept")  # type: ignore[arg-type]
        for at, ms in times[:40]:  # type: ignore[index]
            print(f"    at {at - started:7.0f} s: {ms} ms; probe stalls {stalls(at)}")
    for key in ("persistence", "stats", "config"):
        print(f"{key}: {diagnostics[key]}")
    if intervals:
        whole = _sched_delta(sched[0][1], sched[-1][1])
        print(
            "the server's main thread over the run: "
            + ", ".join(f"{k} {v:,.1f}" for k, v in whole.items())
            + f" (steal, irq, softirq: host jiffies of {os.sysconf('SC_CLK_TCK')} Hz, the core it was on at the end)"
        )
        per_s = sorted(d["wait ms"] / (t1 - t0) for t0, t1, d in intervals)
        stolen = sorted(d["steal"] / (t1 - t0) for t0, t1, d in intervals)
        print(
            f"  per {SCHED_EVERY:g} s sample, as a rate per second: run-queue wait median "
            f"{per_s[len(per_s) // 2]:.2f} ms/s, p99 {per_s[int(len(per_s) * 0.99)]:.2f} ms/s; "
            f"steal on its core median {stolen[len(stolen) // 2]:.1f}, "
            f"p99 {stolen[int(len(stolen) * 0.99)]:.1f} jiffies/s"
        )
    ok = (
        "cut short" not in r
        and r["missing"] == 0
        and r["twice or more"] == 0
        and r["unknown ids"] == 0
        and peak <= 2 * steady
        and r["slowlog len"] == 0
    )
    print("bounds held" if ok else "BOUNDS FAILED")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--latency-samples", type=int, default=300)
    ap.add_argument("--bounded", type=int, default=0, metavar="N")
    ap.add_argument("--backlog", type=int, default=10_000)
    ap.add_argument("--no-trim", action="store_true", help="--bounded without the trim")
    ap.add_argument("--week", action="store_true", help="a simulated week through job follow")
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--records-per-file", type=int, default=100)
    ap.add_argument("--files-per-batch", type=int, default=1000)
    ap.add_argument("--trainers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="--week: the trainers' batches(k)")
    ap.add_argument("--every", type=float, default=1.0, help="--week: follow --every (s)")
    ap.add_argument("--horizon", type=float, default=60.0, help="--week: follow --horizon (s)")
    ap.add_argument("--follower-restart", type=float, default=60.0, metavar="S")
    ap.add_argument("--trainer-restart", type=float, default=45.0, metavar="S")
    ap.add_argument("--idle-window", type=float, default=30.0, metavar="S")
    ap.add_argument("--sample-every", type=float, default=2.0, metavar="S")
    ap.add_argument("--max-seconds", type=float, default=3600.0)
    ap.add_argument("--nice", type=int, default=0, help="the server's priority (root: < 0)")
    ap.add_argument(
        "--fifo",
        type=int,
        default=0,
        metavar="P",
        help="run the server under SCHED_FIFO at priority P (root): never descheduled for a neighbour",
    )
    ap.add_argument(
        "--probe-core",
        type=int,
        default=None,
        metavar="C",
        help="--week: pin the server's main thread and the stall probe (one priority above "
        "it) to core C, so the probe's stalls are the server's core's",
    )
    a = ap.parse_args()
    common.install_signal_handlers()
    with common.start_redis() as server:
        try:
            common.prioritise(server, nice=a.nice, fifo=a.fifo)
        except PermissionError:
            print(
                "streams.py: --nice below 0 and --fifo need root (or CAP_SYS_NICE)", file=sys.stderr
            )
            return 2
        url = f"redis://{common.LOOPBACK}:{server.port}/0"
        a.server_pid = server.process.pid
        if a.week:
            return print_week(a, week(url, a))
        if a.bounded:
            r = bounded(url, a.bounded, a.backlog, trim=not a.no_trim)
            print(
                f"streamed {r['chunks']:,} chunks (ids, backlog {a.backlog:,}) in "
                f"{r['seconds']:.0f} s: acked {r['acked']:,}, trimmed {r['trimmed']:,}; "
                f"used_memory first {r['first_mib']:.1f} MiB, last {r['last_mib']:.1f} MiB, "
                f"max {r['max_mib']:.1f} MiB"
            )
            for done, mem in r["samples"]:  # type: ignore[attr-defined]
                print(f"  done {done:>10,}: {mem / 2**20:6.1f} MiB")
            slow = r["slowlog"]
            print(f"SLOWLOG at 10 ms: {len(slow)} entries")  # type: ignore[arg-type]
            for entry in slow:  # type: ignore[attr-defined]
                print(f"  {entry['duration']} us: {entry['command'][:80]!r}")
            return 0
        for label, rate in throughput(url, a.chunks).items():
            unit = "" if "µs" in label else " /s"
            print(f"append {a.chunks:,} descriptors, {label}: {rate:,.0f}{unit}")
        lat = [x * 1000 for x in latency(url, a.latency_samples)]
        print(
            f"append -> waiting trainer's lease, {len(lat)} samples: p50 "
            f"{common.percentile(lat, 50):.2f} ms, p99 {common.percentile(lat, 99):.2f} ms, "
            f"max {max(lat):.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
