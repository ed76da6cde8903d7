"""The Prometheus exporter against a real redis-server: every metric agrees with
``client.status()``, a job that cannot be read does not break the scrape, the exporter
never writes, and ``serve`` stops on SIGTERM / SIGINT.

``run_scenario`` is shared with tests/ops/test_prometheus_live.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from metric_names import METRIC_TYPES
from prometheus_client.parser import text_string_to_metric_families
from support import RedisServer, free_port, wait_until

import taskq
from taskq.admin.stats import LEASE_AGE_BOUNDS_S
from taskq.ops import exporter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TTL_MS = 5000
TASK_TIMEOUT_S = 30


@dataclass
class Scenario:
    """What ``run_scenario`` left running: trainers holding leases in pass 1."""

    job: str
    trainers: list[taskq.Trainer] = field(default_factory=list)
    loops: list[Iterator[taskq.Task]] = field(default_factory=list)

    def close(self) -> None:
        for trainer in self.trainers:
            try:
                trainer.close()
            except taskq.TaskqError:
                pass


def _trainer(client: taskq.Client, job: str, worker_id: str, **kw: Any) -> taskq.Trainer:
    return taskq.Trainer(
        job, client=client, worker_id=worker_id, heartbeat=False, handle_signals=False, **kw
    )


def _heartbeat_through(
    client: taskq.Client, job: str, trainers: list[taskq.Trainer], total_ms: int
) -> None:
    """Advance the job's clock by ``total_ms`` while ``trainers`` stay alive."""
    step = TTL_MS // 2
    for _ in range(0, total_ms, step):
        client.advance_clock(job, step)
        for trainer in trainers:
            trainer.heartbeat()


def run_scenario(
    client: taskq.Client, job: str, after_create: Callable[[], None] | None = None
) -> Scenario:
    """A job that produces every metric: acks with durations, a release, a stale ack
    after a revoke, a dead task (fail at max_failures=1), a task timeout, a lost worker
    (manual clock advanced past its ttl, then reaped), pass 0 completed, and in pass 1
    started leases of known age plus a reserved (prefetched) task.

    ``after_create`` runs once the job exists, before anything happens to it (the live
    Prometheus test waits there for a first scrape, so every counter's rate is > 0).
    """
    client.create_job(
        job,
        [{"chunk": i} for i in range(8)],
        passes=2,
        max_failures=1,
        worker_ttl=TTL_MS / 1000,
        task_timeout=TASK_TIMEOUT_S,
        manual_clock=True,
    )
    if after_create is not None:
        after_create()
    sc = Scenario(job)
    a = _trainer(client, job, "trainer-a")
    sc.trainers.append(a)
    for _ in range(3):  # acks, each lease 1.5 s long on the job's clock
        task = a.lease(timeout=1)
        assert task is not None
        client.advance_clock(job, 1500)
        a.heartbeat()  # (heartbeats renew a worker, its leases and acks do not)
        a.ack(task)
    task = a.lease(timeout=1)
    assert task is not None
    a.release(task)
    task = a.lease(timeout=1)  # a stale ack: the lease was revoked under the trainer
    assert task is not None
    assert client.revoke(job, task.id)
    with pytest.raises(taskq.LeaseLost):
        a.ack(task)
    task = a.lease(timeout=1)  # a dead task: one failure is the cap
    assert task is not None
    a.fail(task, error="bad chunk")
    task = a.lease(timeout=1)  # a task timeout: alive (heartbeating) but stuck
    assert task is not None
    _heartbeat_through(client, job, [a], TASK_TIMEOUT_S * 1000 + TTL_MS)
    client.reap(job)
    a.close()

    b = _trainer(client, job, "trainer-b")  # a lost worker: silent past its ttl
    sc.trainers.append(b)
    assert b.lease(timeout=1) is not None
    client.advance_clock(job, TTL_MS + 1000)
    reclaimed, _, _ = client.reap(job)
    assert reclaimed >= 1

    c = _trainer(client, job, "trainer-c")  # finish pass 0
    sc.trainers.append(c)
    while client.status(job, summaries=0).pass_no == 0:
        task = c.lease(timeout=1, expect_pass=0)
        assert task is not None, client.status(job, summaries=0)
        client.advance_clock(job, 200)
        c.ack(task)

    # Pass 1: two started leases 2 s old, a prefetching trainer holding a reserved task.
    assert c.lease(timeout=1) is not None
    assert c.lease(timeout=1) is not None
    client.advance_clock(job, 2000)
    c.heartbeat()
    d = _trainer(client, job, "trainer-d", prefetch=1)
    sc.trainers.append(d)
    loop = iter(d)  # the iterator prefetches: one started, one reserved
    sc.loops.append(loop)
    assert next(loop) is not None
    d.heartbeat()  # its loop's data wait (one next(), a step under way): the input series
    return sc


# -- scraping -----------------------------------------------------------------------
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> tuple[str, Samples]:
    """GET /metrics; the body and its samples keyed by (name, labels). (An exporter of
    every job reads each job the suite's server holds, ~1 ms a job: 1,400 jobs after
    tests/engine/test_mix.py alone, 2.8 s a scrape, and twice that under load; the
    timeout bounds a hang, not the speed.)"""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as resp:
        assert resp.status == 200
        body = resp.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return body, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def job_samples(samples: Samples, job: str) -> Samples:
    return {k: v for k, v in samples.items() if ("job_name", job) in k[1]}


@pytest.fixture
def serving(client: taskq.Client) -> Iterator[Any]:
    """Start an exporter (in this process, on a free port) for given jobs."""
    servers = []

    def start(jobs: list[str] | None = None, via: taskq.Client | None = None) -> int:
        server, _ = exporter.start(via or client, port=0, addr="127.0.0.1", jobs=jobs)
        servers.append(server)
        return int(server.server_port)

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def scenario(client: taskq.Client, job_name: str) -> Iterator[Scenario]:
    sc = run_scenario(client, job_name)
    yield sc
    sc.close()


def assert_agrees_with_status(samples: Samples, st: taskq.JobStatus) -> None:
    """Every per-job metric equals what ``client.status()`` says."""
    job = st.job
    for state in ("todo", "leased", "reserved", "done", "dead"):
        assert value(samples, "taskq_tasks", job_name=job, state=state) == getattr(st, state)
    assert value(samples, "taskq_pass", job_name=job) == st.pass_no
    assert value(samples, "taskq_passes", job_name=job) == (-1 if st.passes is None else st.passes)
    for state in ("running", "waiting", "completed", "cancelled"):
        assert value(samples, "taskq_job_state", job_name=job, state=state) == (
            1 if st.state == state else 0
        )
    assert value(samples, "taskq_workers", job_name=job) == st.workers
    assert value(samples, "taskq_backlog", job_name=job) == st.backlog == st.todo + st.leased
    assert value(samples, "taskq_appended_total", job_name=job) == st.appended
    assert value(samples, "taskq_oldest_unfinished_age_seconds", job_name=job) == pytest.approx(
        st.oldest_unfinished_age_s or 0.0
    )
    for bound in LEASE_AGE_BOUNDS_S:
        assert (
            value(samples, "taskq_leases_by_age", job_name=job, le=str(bound))
            == (st.lease_ages[str(bound)])
        )
    assert value(samples, "taskq_leases_by_age", job_name=job, le="+Inf") == (
        st.leased - st.reserved
    )
    assert value(samples, "taskq_oldest_lease_age_seconds", job_name=job) == pytest.approx(
        st.oldest_lease_age_s or 0.0
    )
    for name in ("leased", "acked", "failed", "released", "stale", "dead", "stolen", "revoked"):
        assert value(samples, f"taskq_{name}_total", job_name=job) == st.counters[name], name
    for reason in ("worker_lost", "task_timeout"):
        assert (
            value(samples, "taskq_expired_total", job_name=job, reason=reason)
            == (st.counters[f"expired_{reason}"])
        )
    for metric, key in (
        ("taskq_redispatch_lateness_seconds", "redispatch_lateness"),
        ("taskq_task_duration_seconds", "task_duration"),
    ):
        h = st.histograms[key]
        running = 0
        bounds = [*h["bounds_s"], float("inf")]
        buckets = {
            float(dict(labels)["le"]): v
            for (name, labels), v in samples.items()
            if name == f"{metric}_bucket" and ("job_name", job) in labels
        }
        assert sorted(buckets) == sorted(bounds)
        for bound, count in zip(bounds, h["counts"], strict=True):
            running += count
            assert buckets[bound] == running, (metric, bound)
        assert value(samples, f"{metric}_count", job_name=job) == h["count"] == running
        assert value(samples, f"{metric}_sum", job_name=job) == pytest.approx(h["sum_s"])
    assert value(samples, "taskq_last_pass_duration_seconds", job_name=job) == (
        pytest.approx(st.counters["last_pass_ms"] / 1000)
    )
    assert value(samples, "taskq_last_ack_timestamp_seconds", job_name=job) == (
        pytest.approx(st.counters["last_ack_ms"] / 1000)
    )
    total = st.input["total"]
    assert value(samples, "taskq_input_wait_seconds_count", job_name=job) == total["count"]
    assert value(samples, "taskq_input_wait_seconds_sum", job_name=job) == (
        pytest.approx(total["wait_s"])
    )
    assert value(samples, "taskq_input_step_seconds_total", job_name=job) == (
        pytest.approx(total["step_s"])
    )
    assert value(samples, "taskq_input_nothing_to_lease_seconds_total", job_name=job) == (
        pytest.approx(total["idle_s"])
    )
    assert value(samples, "taskq_input_bound_ratio", job_name=job) == (
        pytest.approx(st.input["recent"]["fraction"])
    )
    assert value(samples, "taskq_input_worst_trainer_ratio", job_name=job) == (
        pytest.approx(st.input["worst"][0]["fraction"])
    )


# -- tests ----------------------------------------------------------------------------
def test_every_metric_agrees_with_status_after_the_scenario(
    client: taskq.Client, scenario: Scenario, serving: Any
) -> None:
    port = serving([scenario.job])
    _, samples = scrape(port)
    st = client.status(scenario.job, summaries=0)
    assert_agrees_with_status(samples, st)
    # The scenario produced what it says (so the comparison above is not 0 == 0).
    job = scenario.job
    assert value(samples, "taskq_acked_total", job_name=job) >= 6
    assert value(samples, "taskq_stale_total", job_name=job) == 1
    assert value(samples, "taskq_revoked_total", job_name=job) == 1
    assert value(samples, "taskq_released_total", job_name=job) >= 1
    assert value(samples, "taskq_failed_total", job_name=job) >= 1
    assert value(samples, "taskq_expired_total", job_name=job, reason="worker_lost") == 1
    assert value(samples, "taskq_expired_total", job_name=job, reason="task_timeout") == 1
    assert value(samples, "taskq_tasks", job_name=job, state="dead") == 2
    assert value(samples, "taskq_dead_total", job_name=job) == 2
    assert value(samples, "taskq_pass", job_name=job) == 1
    assert value(samples, "taskq_workers", job_name=job) == 2  # c and d; a left, b lost
    assert value(samples, "taskq_tasks", job_name=job, state="reserved") == 1
    assert value(samples, "taskq_tasks", job_name=job, state="leased") == 4
    assert value(samples, "taskq_leases_by_age", job_name=job, le="1") == 2
    assert value(samples, "taskq_leases_by_age", job_name=job, le="10") == 0
    assert value(samples, "taskq_leases_by_age", job_name=job, le="+Inf") == 3
    assert value(samples, "taskq_oldest_lease_age_seconds", job_name=job) == pytest.approx(2.0)
    assert value(samples, "taskq_task_duration_seconds_bucket", job_name=job, le="2.5") >= 3
    assert value(samples, "taskq_redispatch_lateness_seconds_count", job_name=job) == 2
    assert value(samples, "taskq_last_pass_duration_seconds", job_name=job) > 0
    assert value(samples, "taskq_exporter_scrape_errors_total") == 0


def test_exposes_exactly_the_documented_metric_names_and_types(
    scenario: Scenario, serving: Any
) -> None:
    port = serving([scenario.job])
    body, samples = scrape(port)
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert {name: f.type for name, f in families.items()} == METRIC_TYPES
    for name, family in families.items():  # every family has samples after the scenario
        assert family.samples or name.startswith("taskq_mix_"), name  # (no mixed job)
    assert {n for n, _ in samples if n.endswith("_total")} == {
        f"{n}_total" for n, t in METRIC_TYPES.items() if t == "counter"
    }


def test_labels_are_bounded_never_worker_or_task_ids(scenario: Scenario, serving: Any) -> None:
    port = serving([scenario.job])
    body, samples = scrape(port)
    allowed = {"job_name", "state", "le", "reason", "policy"}  # policy: one series
    for name, labels in samples:
        assert name.startswith("taskq_"), name
        assert {k for k, _ in labels} <= allowed, (name, labels)
    assert "trainer-" not in body  # the worker ids of the scenario


def test_unknown_job_in_the_job_list_is_skipped_and_counted(
    client: taskq.Client, job_name: str, serving: Any
) -> None:
    client.create_job(job_name, range(3))
    port = serving(["no-such-job", job_name])
    for scrape_no in (1, 2):
        _, samples = scrape(port)
        assert value(samples, "taskq_tasks", job_name=job_name, state="todo") == 3
        assert value(samples, "taskq_exporter_scrape_errors_total") == scrape_no
        assert not job_samples(samples, "no-such-job")


def test_vanished_and_corrupt_jobs_do_not_break_the_scrape(
    own_redis: Any, job_name: str, serving: Any
) -> None:
    client = taskq.connect(own_redis.url)  # alone: no other test's jobs come and go
    vanished, corrupt, fine = (f"{job_name}-{s}" for s in ("gone", "bad", "ok"))
    for name in (vanished, corrupt, fine):
        client.create_job(name, range(2))
    port = serving(via=client)  # every job in the index
    _, samples = scrape(port)
    assert all(job_samples(samples, n) for n in (vanished, corrupt, fine))
    errors_before = value(samples, "taskq_exporter_scrape_errors_total")
    # Deleted behind the index's back (as if between the index read and the snapshot),
    # and a meta hash missing a field: JobNotFound and CorruptData.
    client.redis.delete(client.keys(vanished).meta)
    client.redis.hdel(client.keys(corrupt).meta, "n")
    _, samples = scrape(port)
    assert not job_samples(samples, vanished)
    assert not job_samples(samples, corrupt)
    assert value(samples, "taskq_tasks", job_name=fine, state="todo") == 2
    assert value(samples, "taskq_exporter_scrape_errors_total") == errors_before + 2


def test_unreachable_redis_does_not_break_the_scrape(serving: Any) -> None:
    down = taskq.connect(f"redis://127.0.0.1:{free_port()}/0", retries=0, socket_timeout=1)
    port = serving(via=down)
    _, samples = scrape(port)
    assert value(samples, "taskq_exporter_scrape_errors_total") == 1
    assert value(samples, "taskq_redis_up") == 0
    assert not [
        k for k in samples if k[0] not in ("taskq_exporter_scrape_errors_total", "taskq_redis_up")
    ]


def test_unreachable_redis_is_tried_once_per_scrape_and_every_job_counted(
    serving: Any,
) -> None:
    # Each command waits out its retries (backoff 0.05 + 0.1 + 0.2 + 0.4 s here): trying
    # all ten jobs would take ~7.5 s, past a Prometheus scrape timeout.
    down = taskq.connect(f"redis://127.0.0.1:{free_port()}/0", retries=4, socket_timeout=1)
    jobs = [f"job-{i}" for i in range(10)]
    port = serving(jobs, via=down)
    started = time.monotonic()
    _, samples = scrape(port)
    assert time.monotonic() - started < 4.0
    assert value(samples, "taskq_exporter_scrape_errors_total") == len(jobs)
    assert value(samples, "taskq_redis_up") == 0
    assert not [
        k for k in samples if k[0] not in ("taskq_exporter_scrape_errors_total", "taskq_redis_up")
    ]


@pytest.fixture
def debug_redis() -> Iterator[RedisServer]:
    """A redis-server of this test alone that allows DEBUG DIGEST (no other writers)."""
    server = RedisServer(extra=["--enable-debug-command", "yes"])
    yield server
    server.cleanup()


def test_scrapes_only_read(debug_redis: RedisServer, job_name: str) -> None:
    client = taskq.connect(debug_redis.url)
    sc = run_scenario(client, job_name)
    try:
        raw = redis.Redis(port=debug_redis.port)

        def writes() -> tuple[Any, int, int]:
            dirty = int(raw.info("persistence")["rdb_changes_since_last_save"])
            return raw.execute_command("DEBUG", "DIGEST"), raw.dbsize(), dirty

        before = writes()
        server, _ = exporter.start(taskq.connect(debug_redis.url), port=0, addr="127.0.0.1")
        try:
            for _ in range(5):
                _, samples = scrape(int(server.server_port))
                assert value(samples, "taskq_tasks", job_name=job_name, state="leased") == 4
        finally:
            server.shutdown()
            server.server_close()
        assert writes() == before
        client.advance_clock(job_name, 1)  # the probe does see a write
        assert writes()[0] != before[0] and writes()[2] > before[2]
    finally:
        sc.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_blocks_until_sigterm_or_sigint(
    url: str, client: taskq.Client, job_name: str, signum: int
) -> None:
    client.create_job(job_name, range(4))
    port = free_port()
    code = (
        "import taskq, taskq.ops.exporter as e; "
        f"e.serve(taskq.connect({url!r}), port={port}, addr='127.0.0.1', "
        f"jobs=[{job_name!r}])"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        scraped: list[Any] = []

        def serving() -> bool:
            assert proc.poll() is None, "exporter exited early"
            try:
                scraped.append(scrape(port)[1])
            except OSError:
                return False
            return True

        assert wait_until(serving, 20, 0.1), "exporter did not start serving"
        samples = scraped[-1]
        assert value(samples, "taskq_tasks", job_name=job_name, state="todo") == 4
        proc.send_signal(signum)
        assert proc.wait(timeout=15) == 0
        with pytest.raises(OSError):
            scrape(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_last_ack_timestamp_is_unix_seconds_and_absent_before_the_first_ack(
    client: taskq.Client, job_name: str, serving: Any
) -> None:
    client.create_job(job_name, range(2))
    port = serving([job_name])
    _, samples = scrape(port)
    assert ("taskq_last_ack_timestamp_seconds", frozenset({("job_name", job_name)})) not in (
        samples
    )
    trainer = _trainer(client, job_name, "trainer-t")
    try:
        task = trainer.lease(timeout=1)
        assert task is not None
        trainer.ack(task)
    finally:
        trainer.close()
    _, samples = scrape(port)
    acked_at = value(samples, "taskq_last_ack_timestamp_seconds", job_name=job_name)
    assert abs(acked_at - time.time()) < 60


def test_redis_up_and_memory_policy_are_exposed(
    serving: Any, client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [1])
    _, samples = scrape(serving([job_name]))
    assert value(samples, "taskq_redis_up") == 1
    assert value(samples, "taskq_redis_maxmemory_policy", policy="noeviction") == 1


def test_an_evicting_redis_shows_in_the_policy_gauge(serving: Any) -> None:
    server = RedisServer(extra=["--maxmemory-policy", "allkeys-lru"])
    try:
        _, samples = scrape(serving([], via=taskq.connect(server.url)))
        assert value(samples, "taskq_redis_maxmemory_policy", policy="allkeys-lru") == 1
        assert value(samples, "taskq_redis_up") == 1
    finally:
        server.cleanup()


def test_a_user_without_info_has_no_policy_gauge_but_is_up(
    serving: Any, client: taskq.Client, job_name: str
) -> None:
    """The exporter ACL of deploy/redis/acl.conf has no INFO: the gauge is absent (the
    eviction alert cannot fire on a guess) and the jobs are still exported."""
    client.create_job(job_name, [1])
    # the exporter line of deploy/redis/acl.conf
    client.redis.execute_command(
        "ACL",
        "SETUSER",
        "noinfo-exporter",
        "reset",
        "on",
        ">pw",
        "~*",
        "resetchannels",
        "-@all",
        "+@read",
        "+@connection",
        "+select",
        "+ping",
        "+time",
        "-@write",
        "-@dangerous",
        "-@admin",
        "+fcall_ro",
    )
    try:
        port_url = client.redis.connection_pool.connection_kwargs["port"]
        reader = taskq.connect(f"redis://noinfo-exporter:pw@127.0.0.1:{port_url}/0")
        _, samples = scrape(serving([job_name], via=reader))
        assert value(samples, "taskq_redis_up") == 1
        assert not [k for k in samples if k[0] == "taskq_redis_maxmemory_policy"]
        assert value(samples, "taskq_tasks", job_name=job_name, state="todo") == 1
    finally:
        client.redis.acl_deluser("noinfo-exporter")


def test_a_sharded_job_is_exported_as_one_with_a_shard_label(
    client: taskq.Client, serving: Any, job_name: str
) -> None:
    """Each shard's series carry the sharded job's job_name and the shard's name as
    ``shard``: ``sum by (job_name)`` is the job's figure; a plain job keeps its labels."""
    from taskq.admin import shardset

    name = job_name[:40]
    client.create_job(name, [{"i": i} for i in range(9)], shards=3, passes=2)
    client.create_job(name + "-plain", [{"i": 1}])
    sset = shardset.require(client.connection, name)
    with _trainer(client, sset.shards[1], "w1") as tr:
        for task in tr.lease_many(3, timeout=0):
            tr.ack(task)
    for port in (serving(), serving([name, name + "-plain"])):
        _, samples = scrape(port)
        mine = job_samples(samples, name)
        shards = {dict(labels).get("shard") for _, labels in mine}
        assert shards == set(sset.shards)  # every series of the job names its shard
        for shard in sset.shards:
            st = client.status(shard, summaries=0)
            assert (
                value(samples, "taskq_tasks", job_name=name, shard=shard, state="done") == st.done
            )
        done = sum(
            v for (n, lab), v in mine.items() if n == "taskq_tasks" and ("state", "done") in lab
        )
        acked = sum(v for (n, _), v in mine.items() if n == "taskq_acked_total")
        assert (done, acked) == (3, 3) == (client.job(name).status().done, 3)
        assert value(samples, "taskq_backups_total", job_name=name, shard=sset.shards[0]) == 0
        assert not any(("job_name", s) in lab for _, lab in samples for s in sset.shards)
        assert value(samples, "taskq_tasks", job_name=name + "-plain", state="todo") == 1


def test_a_mixed_job_is_exported_per_source(
    client: taskq.Client, serving: Any, job_name: str
) -> None:
    """A mixed job's weight, slots handed out, tasks acked and their samples per source,
    labelled ``source``, as ``mix_status`` says (docs/mixing.md)."""
    sources = [f"{job_name}-a", f"{job_name}-b"]
    for k, src in enumerate(sources):  # parquet chunks saying their rows: 10 a, 100 b
        rows = 10 * 10**k
        client.create_job(src, [{"format": "parquet", "path": "x", "rows": rows}] * 4)
    mix = f"{job_name}-mix"
    client.create_job(mix, mix={sources[0]: 0.5, sources[1]: 0.5})
    with _trainer(client, mix, "w1") as tr:
        for task in tr.lease_many(3, timeout=0):
            tr.ack(task)
    client.job(mix).set_weights({sources[0]: 1, sources[1]: 3})
    _, samples = scrape(serving([mix]))
    st = client.job(mix).mix_status()
    assert [r["acked"] for r in st["sources"]] == [2, 1]  # slots a, b, a
    for row, rows in zip(st["sources"], (10, 100), strict=True):
        at = {"job_name": mix, "source": row["source"]}
        assert value(samples, "taskq_mix_weight", **at) == row["weight"]
        assert value(samples, "taskq_mix_charged_tasks", **at) == row["charged"]
        assert value(samples, "taskq_mix_acked_tasks", **at) == row["acked"]
        assert value(samples, "taskq_mix_acked_samples", **at) == row["acked"] * rows
    assert value(samples, "taskq_mix_weight", job_name=mix, source=sources[1]) == 3
    assert [value(samples, "taskq_mix_debt_slots", job_name=mix, source=x) for x in sources] == [
        0,
        0,
    ]  # (fixed sources owe nothing)


def test_a_starving_stream_sources_debt_is_exported(
    client: taskq.Client, serving: Any, job_name: str
) -> None:
    """``taskq_mix_debt_slots``: the slots a stream source owes, as ``mix_status`` says.
    max_debt=1, web (4 tasks) and an open stream news (1 task) at equal weights: slot 3's
    pick of news, all taken, owes the slot (web takes it), slot 4's waits."""
    web, news, mix = f"{job_name}-web", f"{job_name}-news", f"{job_name}-mix"
    client.create_job(web, [{"path": f"w{i}"} for i in range(4)])
    client.create_job(news, [{"path": "n0"}], stream=True)
    client.create_job(mix, mix={web: 0.5, news: 0.5}, max_debt=1)
    with _trainer(client, mix, "w1") as tr:
        for task in tr.lease_many(4, timeout=0):
            tr.ack(task)
        assert tr.lease(timeout=0) is None
    _, samples = scrape(serving([mix]))
    assert [r["debt"] for r in client.job(mix).mix_status()["sources"]] == [0, 1]
    assert value(samples, "taskq_mix_debt_slots", job_name=mix, source=web) == 0
    assert value(samples, "taskq_mix_debt_slots", job_name=mix, source=news) == 1
