"""The longest single call of a checkpoint, a rewind, the audit and the pass summaries at
their bound, on a big job, from SLOWLOG.

One job of N tasks (1,000,000 by default, shuffled): a third of them acked, 2,000 dead,
500 leased with progress, 200 in the front; then a checkpoint (its cut copies the done and
dead bitmaps, N / 8 bytes each, and the progress hash), more acks, deaths and retries, the
passes hash filled to its bound (SUMMARIES_MAX summaries, by resets) after the cut, a
rewind (its walk goes through the cut's order, its marks through every summary written
since), and the audit. SLOWLOG records every command of ``--slower-than`` µs or more
(default 1,000: 1 ms); the table is the longest call per verb and step in ms. The issue's
bound is 10 ms: ``--check`` exits 1 when a call reached it.

Usage: .venv/bin/python bench/integrity_calls.py [--tasks N] [--slower-than US] [--check]
       [--splits]

``--splits`` runs ``split_exercise`` instead: the same verbs (and a retry) on a job with
the pass attempt's bound of splits made, ten in flight. ``exercise`` and
``split_exercise`` are also what tests/engine/test_slowlog.py runs (200,000 tasks, SLOWLOG at
10 ms).

Data flow: this script -> taskq.Client / taskq.Trainer -> Redis; SLOWLOG -> the table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import taskq
from taskq.engine.contract import MAX_BATCH, MAX_HELD, MAX_SPLITS, SUMMARIES_MAX

sys.path.insert(0, os.path.dirname(__file__))

from worst_call import durations_by_verb  # noqa: E402


def _trainer(client: taskq.Client, job: str, wid: str) -> taskq.Trainer:
    return taskq.Trainer(
        job, client=client, worker_id=wid, heartbeat=False, handle_signals=False, worker_ttl=600
    )


def _ack(t: taskq.Trainer, count: int) -> None:
    while count > 0:
        got = t.lease_many(min(MAX_BATCH, count), timeout=0)
        assert got, "the job ran out of work"
        t.ack(got)
        count -= len(got)


def exercise(client: taskq.Client, job: str, n: int, log=print) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """The steps of the module docstring on a new job of ``n`` tasks; returns the wall
    time (ms) of the checkpoint, the rewind and the audit."""
    client.create_job(
        job,
        chunks=({"i": i} for i in range(n)),
        passes=None,
        task_timeout=None,
        manual_clock=True,
        max_failures=1,
        replace=True,
    )
    a = _trainer(client, job, "a")
    _ack(a, n // 3)
    for _ in range(2000 // MAX_BATCH):
        for task in a.lease_many(MAX_BATCH, timeout=0):
            a.fail(task, "dies (max_failures=1)")
    holders = [_trainer(client, job, f"h{i}") for i in range(8)]
    for h in holders:
        got = []
        while len(got) < 62:
            got += h.lease_many(min(MAX_BATCH, 62 - len(got)), timeout=0)
        for task in got:
            h.progress(task, 7)
        h.flush_progress()
        h.release(got[:25])
    wall: dict[str, float] = {}
    log(f"job of {n} tasks: {client.status(job).done} done, {client.status(job).dead} dead")
    t0 = time.perf_counter()
    ck = client.checkpoint(job)
    wall["checkpoint"] = (time.perf_counter() - t0) * 1000
    _ack(a, 10_000)
    client.retry(job)
    for _ in range(SUMMARIES_MAX + 10):  # the passes hash at its bound, all after the cut
        client.reset_pass(job)
    assert client.redis.hlen(client.keys(job).passes) == SUMMARIES_MAX
    _ack(a, 1000)
    t0 = time.perf_counter()
    assert client.rewind(job, ck)
    wall["rewind"] = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    audit = client.audit(job)
    wall["audit"] = (time.perf_counter() - t0) * 1000
    assert audit["ok"], audit["checks"]
    for t in (a, *holders):
        t.close()
    client.delete_job(job)
    return wall


def split_exercise(client: taskq.Client, job: str, n: int, log=print) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """The same verbs with splits in flight (docs/design.md, "Tail splitting"): a job of
    ``n`` tasks of 50 samples each, all but ~1,100 acked; 17 holders start the rest and
    report their sizes; an idle trainer splits them one after the other (each split
    pending, its piece handed back at once), the holder acking the head before it knew
    the split point (the split undone, the task done) until the pass attempt's bound of
    ``MAX_SPLITS`` splits is reached, the last ten left pending in flight. Then a
    checkpoint (its cut reads every split of the attempt), the audit (it checks each),
    a rewind, a retry of a dead task and a reset. Returns the wall time (ms) of each."""
    chunk = {"format": "lines", "path": "/nonexistent", "offset": 0, "length": 1, "records": 50}
    client.create_job(
        job,
        chunks=(chunk for _ in range(n)),
        passes=None,
        task_timeout=None,
        manual_clock=True,
        max_failures=1,
        split_tails=True,
        replace=True,
    )
    a = _trainer(client, job, "a")
    holders = [_trainer(client, job, f"h{i}") for i in range(17)]
    _ack(a, n - 17 * MAX_HELD)
    dead = a.lease(timeout=0)
    assert dead is not None
    a.fail(dead, "dies (max_failures=1)")
    held: dict[int, tuple[taskq.Trainer, taskq.Task]] = {}
    for h in holders:
        while len([1 for t, _ in held.values() if t is h]) < MAX_HELD:
            got = h.lease_many(MAX_BATCH, timeout=0)
            if not got:
                break
            for task in got:
                h.progress(task, 7, None)  # it stops at the ends it is told: its size goes
                held[task.id] = (h, task)
        h.flush_progress()
    idle = _trainer(client, job, "idle")
    splits = 0
    while splits < MAX_SPLITS:
        assert idle.lease(timeout=0) is None  # a split, pending: its piece handed back
        now = client.status(job, summaries=0).counters["splits"]
        if now == splits:
            break
        splits = now
        if splits <= MAX_SPLITS - 10:
            split = client.latest_events(job, "split", 1, scan=20)
            h, task = held.pop(int(split[-1]["task"]))
            h.ack(task)  # before it knew the split point: it read the whole task
    log(f"job of {n} tasks: {splits} splits in the attempt, 10 pending")
    wall: dict[str, float] = {}
    for verb, call in (
        ("checkpoint", lambda: client.checkpoint(job)),
        ("audit", lambda: client.audit(job)),
    ):
        t0 = time.perf_counter()
        out = call()
        wall[verb] = (time.perf_counter() - t0) * 1000
        if verb == "checkpoint":
            ck = out
        else:
            assert out["ok"], out["checks"]
            assert out["splits"]["tasks"] == splits, out["splits"]
    t0 = time.perf_counter()
    assert client.rewind(job, ck)
    wall["rewind"] = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    client.retry(job)
    wall["retry"] = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    client.reset_pass(job)
    wall["reset"] = (time.perf_counter() - t0) * 1000
    for t in (a, idle, *holders):
        t.close()
    client.delete_job(job)
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1_000_000)
    ap.add_argument("--slower-than", type=int, default=1000, help="SLOWLOG threshold, µs")
    ap.add_argument("--check", action="store_true", help="exit 1 if a call took 10 ms")
    ap.add_argument(
        "--splits",
        action="store_true",
        help="the verbs with MAX_SPLITS splits in the pass attempt, 10 in flight (split_exercise)",
    )
    args = ap.parse_args()
    from taskq.devserver import RedisServer

    with RedisServer(
        extra=[
            "--slowlog-log-slower-than",
            str(args.slower_than),
            "--slowlog-max-len",
            "100000",
        ]
    ) as server:
        client = taskq.connect(server.url)
        client.redis.slowlog_reset()
        wall = (split_exercise if args.splits else exercise)(client, "integrity", args.tasks)
        worst = durations_by_verb(client.redis.slowlog_get(100_000))
    print(f"\nwhole calls (wall, ms): {', '.join(f'{k} {v:.0f}' for k, v in wall.items())}")
    print(f"single calls of {args.slower_than / 1000:g} ms or more (longest, count):")
    for name, ms in sorted(worst.items(), key=lambda kv: -max(kv[1])):
        print(f"  {name:24s} {max(ms):8.2f} ms  {len(ms):6d}")
    slow = {k: max(v) for k, v in worst.items() if max(v) >= 10}
    if args.check and slow:
        print(f"over 10 ms: {slow}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
