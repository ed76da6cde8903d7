"""The worst single Redis call per taskq verb on a big job, from SLOWLOG.

Every trainer and admin operation runs on one job of N tasks (1,000,000 by default) with
the largest requests the API accepts: batches of MAX_BATCH, prefetch MAX_PREFETCH, a
worker holding MAX_HELD leases (heartbeats, a leave, a lost worker reaped with a huge
budget), failing and releasing whole batches, dead tasks retried, listings of every state
with a limit of 100,000 (paged), status, workers, events, audit, revoke, drain, pause,
resume, reset, a forced next pass, cancel and delete. SLOWLOG records every command of
0.1 ms or more (Redis 7 logs the commands a script runs too, and logging all of them
would add its own cost to the scripts measured); the table is the longest call per verb
(FCALL by function, peek by state, other commands by name), in ms, with the number of
calls over 0.1 ms and over 1 ms. One private redis-server (``--save ''``), bounded in time.

Usage: .venv/bin/python bench/worst_call.py [--tasks N]

``exercise`` is also what tests/engine/test_slowlog.py runs (200,000 tasks, SLOWLOG at 10 ms).

Data flow: this script -> taskq.Client / taskq.Trainer -> Redis; SLOWLOG -> the table.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable

import taskq
from taskq.engine.contract import (
    APPEND_BYTES,
    APPEND_MAX,
    MAX_BATCH,
    MAX_HELD,
    MAX_PREFETCH,
    TRIM_MAX,
)
from taskq.engine.library import LIBRARY

_FN = re.compile(rf"^{LIBRARY}_([a-z_]+)$")


def _trainer(client: taskq.Client, job: str, wid: str, **kw: object) -> taskq.Trainer:
    return taskq.Trainer(
        job,
        client=client,
        worker_id=wid,
        heartbeat=False,  # type: ignore[arg-type]
        handle_signals=False,
        **kw,
    )


#: Records (one chunk, one task each) of one file of a follower's stream.
FOLLOWED_FILE = 100
#: Tasks of the stream whose trim `exercise` runs (whole files, at least TRIM_MAX): one
#: step at TRIM_MAX (each more step is one more call a loaded machine can stretch past
#: 10 ms; bench/trim_history.py follows a step's cost over a long history).
FOLLOWED_TASKS = -(-TRIM_MAX // FOLLOWED_FILE) * FOLLOWED_FILE


def followed_stream(client: taskq.Client, stream: str, tasks: int) -> None:
    """A one-pass stream of ``tasks`` done tasks (a multiple of FOLLOWED_FILE) as
    `taskq job follow` appends them: files of FOLLOWED_FILE one-record chunks, each chunk
    with the follower's id (the file's key, ``path|size|mtime``, and its index: about 80
    bytes) and each file a source with its record in the follow hash; every task leased
    and acked, none trimmed yet."""
    client.create_job(stream, [], stream=True, manual_clock=True, task_timeout=None)
    handle = client.job(stream)
    for f in range(tasks // FOLLOWED_FILE):
        path = f"/data/streams/events/2026-12-06/part-{f:07d}.jsonl"
        key = f"{path}|{24 * FOLLOWED_FILE}|1796532000.123456"
        chunks = [{"path": path, "offset": 24 * i, "length": 24} for i in range(FOLLOWED_FILE)]
        handle.append(chunks, ids=[f"{key}#{i}" for i in range(FOLLOWED_FILE)], source=key)
        handle.file_appended(key, FOLLOWED_FILE)
    st = _trainer(client, stream, "stream")
    while batch := st.lease_many(MAX_BATCH, timeout=0):
        st.ack(batch)
    st.close()


def _hold(t: taskq.Trainer, n: int) -> list[taskq.Task]:
    got = []
    for _ in range(n):
        task = t.lease(timeout=0)
        assert task is not None, "the job ran out of work"
        got.append(task)
    return got


def exercise(
    client: taskq.Client,
    job: str,
    n: int,
    list_limit: int = 100_000,
    mark: Callable[[str], None] = lambda step: None,
) -> None:
    """Every trainer and admin operation on a new job of ``n`` tasks, at the largest sizes
    the API accepts (see the module docstring). Listings read up to ``list_limit`` rows
    (page by page: every page is one call of at most PAGE_MAX rows). ``mark(step)`` is
    called before each step."""
    mark("create")
    client.create_job(
        job,
        chunks=({"i": i} for i in range(n)),
        passes=None,
        task_timeout=None,
        manual_clock=True,
        max_failures=1,
        replace=True,
    )
    mark("iterate, prefetch")
    it = _trainer(client, job, "iter", prefetch=MAX_PREFETCH)
    for k, _task in enumerate(it):
        if k == 3 * MAX_PREFETCH:
            break
    mark("batches")
    bt = _trainer(client, job, "batch")
    for k, _batch in enumerate(bt.batches(MAX_BATCH)):
        if k == 5:
            break
    mark("hold, heartbeat, release, fail")
    h = _trainer(client, job, "holder")
    held = _hold(h, MAX_HELD)
    for _ in range(3):
        h.heartbeat()
    h.release(held[:MAX_BATCH])
    h.fail(held[MAX_BATCH : 2 * MAX_BATCH], "a failing batch goes back uncharged")
    _hold(h, MAX_HELD)
    h.heartbeat()
    mark("leave")
    h.close()
    mark("dead, retry")
    d = _trainer(client, job, "dead")
    for _ in range(2 * MAX_BATCH):
        task = d.lease(timeout=0)
        assert task is not None
        d.fail(task, "dies at once (max_failures=1)")
    d.close()
    assert client.status(job).dead == 2 * MAX_BATCH
    mark("listings")
    for state in ("todo", "leased", "done", "dead"):
        client.tasks(job, state=state, limit=list_limit)
    client.retry(job)
    mark("admin")
    client.status(job)
    client.workers(job)
    client.events(job, count=1000)
    client.audit(job)
    leased = client.tasks(job, state="leased", limit=1)
    if leased:
        client.revoke(job, leased[0]["id"])
    client.drain(job, "batch")
    client.pause_job(job)
    client.resume_job(job)
    mark("append")
    # a page at both bounds (APPEND_MAX chunks of APPEND_BYTES in all, each with an id),
    # then the same page again: every chunk a duplicate
    pad = "x" * (APPEND_BYTES // APPEND_MAX - 40)
    chunks = [{"i": i, "pad": pad} for i in range(APPEND_MAX)]
    ids = [f"appended-{i}" for i in range(APPEND_MAX)]
    for _ in range(2):
        client.job(job).append(chunks, ids=ids)
    mark("trim")
    # a follower's stream of FOLLOWED_TASKS done tasks: one trim step passes TRIM_MAX
    stream = f"{job}-stream"
    followed_stream(client, stream, FOLLOWED_TASKS)
    assert client.job(stream).trim(steps=1) == TRIM_MAX
    client.delete_job(stream)
    mark("lost worker, reap")
    lost = _trainer(client, job, "lost")
    _hold(lost, MAX_HELD)
    client.advance_clock(job, 60_000)  # every worker is past its ttl
    while client.reap(job, budget=10**9)[1]:
        pass
    mark("reset, next, cancel, delete")
    client.reset_pass(job)
    client.next_pass(job, force=True)
    for t in (it, bt, lost):
        t.close()
    client.cancel_job(job)
    client.delete_job(job)


def durations_by_verb(entries: list[dict]) -> dict[str, list[float]]:
    """SLOWLOG entries -> {verb (peek: per state) or command: [ms of each call]}."""
    out: dict[str, list[float]] = {}
    for e in entries:
        cmd = e["command"]
        if isinstance(cmd, bytes):
            cmd = cmd.decode(errors="replace")
        words = cmd.split()
        name = words[0].upper() if words else "?"
        if name in ("FCALL", "FCALL_RO") and len(words) > 2:
            m = _FN.match(words[1])
            name = m.group(1) if m else words[1]
            first_arg = 3 + int(words[2]) if words[2].isdigit() else len(words)
            if name == "peek" and first_arg < len(words):
                name = f"peek {words[first_arg]}"  # per state listed
        elif name in ("SLOWLOG", "CONFIG"):
            continue
        out.setdefault(name, []).append(e["duration"] / 1000.0)
    return out


def worst_by_verb(entries: list[dict]) -> dict[str, tuple[float, int]]:
    """SLOWLOG entries -> {verb or command: (longest ms, calls)}."""
    return {name: (max(ms), len(ms)) for name, ms in durations_by_verb(entries).items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1_000_000)
    a = ap.parse_args()
    sys.path.insert(0, __file__.rpartition("/")[0])
    import common

    with common.start_redis(
        ["--slowlog-log-slower-than", "100", "--slowlog-max-len", "1000000"]
    ) as server:
        client = taskq.connect(f"redis://127.0.0.1:{server.port}/0")
        started = time.monotonic()
        client.redis.slowlog_reset()
        exercise(
            client,
            "worst",
            a.tasks,
            mark=lambda step: print(f"{time.monotonic() - started:7.1f}s  {step}", file=sys.stderr),
        )
        entries = client.redis.slowlog_get(1_000_000)
    load = os.getloadavg()[0]
    by_verb = durations_by_verb(entries)
    print(
        f"worst single call per verb, {a.tasks:,} tasks (SLOWLOG wall time, ms; "
        f"{os.cpu_count()} CPUs, load average {load:.1f} at the end)\n"
    )
    print("| verb (FCALL) or command | worst ms | calls > 0.1 ms | calls > 1 ms |")
    print("|---|---:|---:|---:|")
    fcalls = [n for n in by_verb if n.islower()]
    for name in sorted(fcalls, key=lambda n: -max(by_verb[n])) + sorted(
        (n for n in by_verb if not n.islower()), key=lambda n: -max(by_verb[n])
    ):
        ms = by_verb[name]
        print(f"| {name} | {max(ms):.2f} | {len(ms):,} | {sum(m > 1.0 for m in ms):,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
