"""taskq big-job and memory rows: creating 1M tasks, status/scrape cost by size, bytes per task.

Where it sits: called by `taskq_rows.run`. On one private redis-server it creates jobs of
10k, 100k and 1M one-chunk tasks (`{"i": n}`), timing each create end to end (JSON
encoding, pipelined staging, the O(1) flip), then times `client.status()` and the
exporter's `TaskqCollector.collect()` on each (median of 5). Memory per task is INFO
`used_memory` after minus before the create, minus the bytes of the tasks' JSON, over the
task count; `MEMORY USAGE` of the job's keys splits it. One job is then run through a full
pass (batches of 500, two processes) and measured again (done bitmap and the lease hash's
ended-lease records). Finally the trainer's resident memory: a fresh interpreter that
imports redis vs one that imports taskq and starts a Trainer (heartbeat thread running).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import common
import redis
from taskq_util import CTX, Children, empty_chunks, url_of

import taskq
from taskq.admin.client import encode_tasks
from taskq.ops.exporter import TaskqCollector

SECTION = "taskq"
MB = 1024 * 1024


def run(recorder: common.Recorder, quick: bool, factory) -> None:
    """Rows: create 1M, status/collect at 10k/100k/1M, bytes per task, trainer RSS."""
    port, stop = factory()
    try:
        _rows(recorder, quick, port)
    finally:
        stop()


def _rows(recorder: common.Recorder, quick: bool, port: int) -> None:
    url = url_of(port)
    client = taskq.connect(url)
    admin = redis.Redis(host=common.LOOPBACK, port=port)
    for n in (10_000, 100_000, 1_000_000):
        job = f"big-{n}"
        chunks = empty_chunks(n)
        json_bytes = sum(len(t) for t in encode_tasks(chunks, 1)[0])
        before = int(admin.info("memory")["used_memory"])
        started = time.monotonic()
        client.create_job(job, chunks)
        create_s = time.monotonic() - started
        per_task = (int(admin.info("memory")["used_memory"]) - before - json_bytes) / n
        del chunks
        if n == 1_000_000:
            recorder.add(
                SECTION,
                "create a 1,000,000-task job",
                create_s,
                "s",
                "goal ≤ 10 s; JSON encoding + pipelined staging (2,000 per HSET) + "
                "one O(1) flip, all-or-nothing",
            )
        status_s = _median_time(lambda job=job: client.status(job, summaries=0))
        collector = TaskqCollector(client, jobs=[job])
        collect_s = _median_time(lambda c=collector: list(c.collect()))
        recorder.add(
            SECTION,
            f"status() + exporter collect, {n:,} tasks",
            (status_s + collect_s) * 1000,
            "ms",
            f"median of 5: status {status_s * 1000:.2f} ms, collect "
            f"{collect_s * 1000:.2f} ms (should be flat in the task count)",
        )
        recorder.add(
            SECTION,
            f"Redis memory per task beyond its JSON, {n:,} tasks",
            per_task,
            "bytes",
            f"goal ≤ 200; task JSON {json_bytes / n:.1f} B avg; "
            f"{_breakdown(admin, client, job, n)}",
        )
    n = 100_000 if quick else 1_000_000
    pass_job = f"big-{n}"
    before = int(admin.info("memory")["used_memory"])
    drained_s = _drain(url, pass_job, n)
    after = int(admin.info("memory")["used_memory"])
    events = admin.memory_usage(client.keys(pass_job).events, samples=0) or 0
    recorder.add(
        SECTION,
        f"Redis memory per task added by one full pass, {n:,} tasks",
        (after - before) / n,
        "bytes",
        f"{(after - before - events) / n:.0f} B/task without the events stream; "
        f"drained in {drained_s:.1f} s (2 trainers, batches of 500); "
        f"{_breakdown(admin, client, pass_job, n)}",
    )
    admin.close()
    _rss_row(recorder, url)


def _median_time(fn) -> float:
    times = []
    for _ in range(5):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _breakdown(admin: redis.Redis, client: taskq.Client, job: str, n: int) -> str:
    keys = client.keys(job)
    parts = []
    for name in ("chunks", "leases", "done", "events"):
        size = admin.memory_usage(getattr(keys, name), samples=0) or 0
        if size:
            parts.append(
                f"{name} {size / n:.1f} B/task"
                if name != "events"
                else f"events stream {size / MB:.1f} MB (capped per job)"
            )
    return "MEMORY USAGE: " + ", ".join(parts)


def _drain(url: str, job: str, n: int) -> float:
    results = CTX.Queue()
    started = time.monotonic()
    with Children() as children:
        for _ in range(2):
            children.start(_drain_child, url, job, results)
        for _ in range(2):
            results.get(timeout=600)
        children.stop(grace_s=5)
    elapsed = time.monotonic() - started
    status = taskq.connect(url).status(job, summaries=0)
    if status.counters["acked"] != n:
        raise RuntimeError(f"{job}: {status.counters['acked']} acked of {n}")
    return elapsed


def _drain_child(url, job, results) -> None:
    trainer = taskq.Trainer(job, url=url, handle_signals=False)
    count = 0
    for batch in trainer.batches(taskq.engine.contract.MAX_BATCH):  # the largest batch accepted
        count += len(batch)
    trainer.close()
    results.put(count)


_RSS = "int(open('/proc/self/statm').read().split()[1]) * __import__('os').sysconf('SC_PAGE_SIZE')"


def _rss_row(recorder: common.Recorder, url: str) -> None:
    bare = _rss_of("import redis", url)
    trainer = _rss_of(
        "import taskq; t = taskq.Trainer('big-10000', url=URL, handle_signals=False); "
        "import time; time.sleep(0.3)",
        url,
    )
    recorder.add(
        SECTION,
        "trainer client memory over bare `import redis`",
        (trainer - bare) / MB,
        "MB",
        f"goal ≤ 25; RSS {bare / MB:.1f} MB importing redis vs {trainer / MB:.1f} MB "
        "importing taskq with a registered Trainer and its heartbeat thread "
        "(fresh interpreters)",
    )


def _rss_of(code: str, url: str) -> int:
    script = f"URL = {url!r}\n{code}\nprint({_RSS})"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])
