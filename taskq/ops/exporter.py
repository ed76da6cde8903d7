"""The Prometheus exporter: one read-only snapshot per job per scrape, as metrics.

Every number comes from the counters and histograms the Lua scripts keep in Redis, so
the exporter holds no state of its own (besides its scrape-error counter): several may
run, and a restart loses nothing. Metrics are labelled by ``job_name`` only, never by a
worker or task id, so their number stays bounded however many trainers come and go. A
shard of a sharded job (docs/sharding.md) is exported under its sharded job's
``job_name`` with a ``shard`` label (the shard's own job name): ``sum by (job_name)``
is the job's figure, and the shard label gives the detail.

Data flow: Prometheus -> exporter.py -> client.job(name).parts() (a sharded job's shards),
client.status() -> stats.py -> Redis (reads only).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import start_http_server
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from taskq import errors
from taskq.admin import shardset
from taskq.admin.stats import LEASE_AGE_BOUNDS_S
from taskq.engine.connection import REDIS_ERRORS
from taskq.models import STATES, JobStatus
from taskq.ops.exporter_input import input_families
from taskq.ops.stopping import StopOnSignals

if TYPE_CHECKING:
    from taskq.admin.client import Client

log = logging.getLogger("taskq.exporter")

DEFAULT_PORT = 9478
TASK_STATES = ("todo", "leased", "reserved", "done", "dead")
EXPIRY_REASONS = {"worker_lost": "expired_worker_lost", "task_timeout": "expired_task_timeout"}
#: metric name (CounterMetricFamily adds ``_total``) -> (JobStatus.counters key, help)
COUNTERS = {
    "taskq_leased": ("leased", "Leases granted (reserved or started)."),
    "taskq_acked": ("acked", "Tasks acked by the current holder of their lease."),
    "taskq_failed": ("failed", "Tasks reported failed by their trainer."),
    "taskq_released": ("released", "Leases given back unfinished by their trainer."),
    "taskq_stale": (
        "stale",
        "Writes (ack, fail, release) from a worker that no longer held "
        "the lease: fenced, they changed nothing.",
    ),
    "taskq_dead": ("dead", "Tasks that became dead (max failures or max attempts)."),
    "taskq_stolen": (
        "stolen",
        "Reserved (prefetched, not started) tasks taken by an idle trainer.",
    ),
    "taskq_revoked": (
        "revoked",
        "Leases revoked by an operator or by a heartbeat that did not list them.",
    ),
    "taskq_forged": (
        "forged",
        "Writes naming a lease's token (or a worker) without its lease secret: "
        "refused, they changed nothing.",
    ),
    "taskq_backups": (
        "backups",
        "Backup leases granted: a second lease of a straggling task (backup_leases), "
        "whose first ack counts.",
    ),
    "taskq_splits": (
        "splits",
        "Tasks split at a pass's tail: an idle trainer took the unread end of a started "
        "task (split_tails); each sample is still read once.",
    ),
}
_SKIPPED = (errors.TaskqError, *REDIS_ERRORS)


class TaskqCollector:
    """A prometheus_client collector: one ``client.job(job).status(summaries=0)`` per job.

    A job that cannot be read (deleted, replaced, corrupt, Redis unreachable) is left
    out of that scrape and counted in ``taskq_exporter_scrape_errors_total``; the scrape
    itself always succeeds.

    Args:
        client: the taskq client to read through.
        jobs: the job names to export; every job in the index when None.
    """

    def __init__(self, client: Client, jobs: Sequence[str] | None = None) -> None:
        self.client = client
        self.jobs = list(jobs) if jobs else None
        self._errors = 0
        self._last_error: dict[str, str] = {}
        self._lock = threading.Lock()
        #: the mixed jobs' task sizes, read once (``Job.mix_status``'s cache)
        self._mix_sizes: dict[str, Any] = {}

    def _error(self, what: str, exc: BaseException, count: int = 1) -> None:
        message = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._errors += count
            repeated = self._last_error.get(what) == message
            self._last_error[what] = message
        # Every scrape meets a deleted job or a down Redis again: say it once, not per scrape.
        (log.debug if repeated else log.warning)("cannot read %s: %s", what, message)

    def _read(self, what: str) -> None:
        if what in self._last_error:
            with self._lock:
                self._last_error.pop(what, None)
            log.info("%s readable again", what)

    def snapshots(self) -> list[JobStatus]:
        """The status of every exported job that could be read (errors counted).

        Once Redis proves unreachable, the scrape's remaining jobs are not tried (each
        try would wait out the client's retries) and count as errors.

        Returns:
            One ``JobStatus`` per readable job, in the order of ``jobs`` (or of the index).
        """
        return self._scrape()[0]

    def _shards(self) -> dict[str, str]:
        """Shard job name -> its sharded job's name, for every sharded job."""
        out: dict[str, str] = {}
        try:
            for name in shardset.list_sets(self.client.connection):
                job = self.client.job(name)
                if job.sharded:
                    out.update(dict.fromkeys(job.parts(), name))
        except _SKIPPED as e:
            self._error("the shard sets", e)  # shards go out as jobs of their own
            return out
        self._read("the shard sets")
        return out

    def _expand(self, names: Sequence[str]) -> list[str]:
        """``names`` with every sharded job replaced by its shards."""
        out: list[str] = []
        for name in names:
            try:
                out.extend(self.client.job(name).parts())  # a plain job's: [name]
            except _SKIPPED:
                out.append(name)  # read as a job: its status says what is wrong
        return out

    def _scrape(self) -> tuple[list[JobStatus], bool, str | None]:
        """(readable jobs' statuses, Redis answered, its maxmemory-policy or None)."""
        try:
            policy = self.client.memory_policy()
        except errors.ConnectionLost as e:
            self._error("Redis", e, count=len(self.jobs) if self.jobs else 1)
            return [], False, None
        except _SKIPPED as e:
            self._error("Redis's maxmemory-policy", e)
            policy = None
        names = self.jobs
        if names is None:
            try:
                names = self.client.list_jobs()
            except errors.ConnectionLost as e:
                self._error("Redis", e)
                return [], False, policy
            except _SKIPPED as e:
                self._error("the job index", e)
                return [], True, policy
            self._read("the job index")
        else:
            names = self._expand(names)
        out = []
        for i, name in enumerate(names):
            what = f"job {name!r}"
            try:
                out.append(self.client.job(name).status(summaries=0))
            except errors.ConnectionLost as e:
                self._error("Redis", e, count=len(names) - i)
                return out, False, policy
            except _SKIPPED as e:
                self._error(what, e)
            else:
                self._read(what)
        self._read("Redis")
        return out, True, policy

    def _mixes(self, statuses: Sequence[JobStatus]) -> list[dict[str, Any]]:
        """``mix_status`` of every mixed job among ``statuses`` that could be read."""
        out = []
        for st in statuses:
            if st.config.get("mix"):
                try:
                    out.append(self.client.job(st.job).mix_status(cache=self._mix_sizes))
                except _SKIPPED as e:
                    self._error(f"mixed job {st.job!r}", e)
        return out

    def describe(self) -> Iterable[Metric]:
        """The metric families without samples (so registering reads nothing)."""
        return [*_families(()), *mix_families(()), *_exporter_families(0, None, None)]

    def collect(self) -> Iterable[Metric]:
        """The metric families of one scrape."""
        statuses, up, policy = self._scrape()
        parent_of = self._shards() if up and statuses else {}
        for family in _families(statuses):
            if parent_of:
                family.samples = [_as_one(sample, parent_of) for sample in family.samples]
            yield family
        yield from mix_families(self._mixes(statuses))
        with self._lock:
            errors_total = self._errors
        yield from _exporter_families(errors_total, up, policy)


def _as_one(sample: Any, parent_of: dict[str, str]) -> Any:
    """A shard's sample under its sharded job's name, with the shard as ``shard``."""
    job = sample.labels.get("job_name")
    if job not in parent_of:
        return sample
    return sample._replace(labels={**sample.labels, "job_name": parent_of[job], "shard": job})


def mix_families(mixes: Iterable[dict[str, Any]]) -> Iterator[Metric]:
    """A mixed job's figures per source (docs/mixing.md), labelled ``job_name`` and
    ``source``: bounded by the sources (at most ``taskq.mix.MAX_SOURCES`` a job)."""
    labels = ["job_name", "source"]
    weight = GaugeMetricFamily("taskq_mix_weight", "A source's weight now.", labels=labels)
    charged = GaugeMetricFamily(
        "taskq_mix_charged_tasks", "A source's slots handed out this pass.", labels=labels
    )
    acked = GaugeMetricFamily(
        "taskq_mix_acked_tasks", "A source's tasks acked this pass.", labels=labels
    )
    samples = GaugeMetricFamily(
        "taskq_mix_acked_samples",
        "The samples of a source's tasks acked this pass (absent when a task does not "
        "say its size).",
        labels=labels,
    )
    debt = GaugeMetricFamily(
        "taskq_mix_debt_slots",
        "The slots a stream source owes (deferred while it had nothing, repaid first when "
        "its feed grows), as of the slots the schedule charged; 0 for a fixed source.",
        labels=labels,
    )
    for mix in mixes:
        for row in mix["sources"]:
            at = [mix["job"], row["source"]]
            weight.add_metric(at, row["weight"])
            charged.add_metric(at, row["charged"])
            acked.add_metric(at, row["acked"])
            if row["samples"] is not None:
                samples.add_metric(at, row["samples"])
            debt.add_metric(at, row["debt"])
    yield from (weight, charged, acked, samples, debt)


def _exporter_families(errors_total: int, up: bool | None, policy: str | None) -> Iterator[Metric]:
    """The exporter's own families: scrape errors, Redis up, Redis's memory policy."""
    yield CounterMetricFamily(
        "taskq_exporter_scrape_errors",
        "Job snapshots (or job index reads) this exporter process failed to read since "
        "it started: job deleted or replaced mid-scrape, unreadable data, Redis "
        "unreachable. The failing job is left out of that scrape.",
        value=errors_total,
    )
    redis_up = GaugeMetricFamily(
        "taskq_redis_up",
        "1 if Redis answered this scrape, 0 if it was unreachable (then every per-job "
        "series is absent: the alert TaskqRedisUnreachable fires on this, not on them).",
    )
    if up is not None:
        redis_up.add_metric([], 1 if up else 0)
    yield redis_up
    policy_info = GaugeMetricFamily(
        "taskq_redis_maxmemory_policy",
        "Always 1, labelled with Redis's maxmemory-policy (anything but noeviction may "
        "silently drop a job's keys); absent when Redis is down or the exporter's user "
        "may not run INFO.",
        labels=["policy"],
    )
    if policy is not None:
        policy_info.add_metric([policy], 1)
    yield policy_info


def _histogram(name: str, doc: str, statuses: Iterable[JobStatus], key: str) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=["job_name"])
    for st in statuses:
        h = st.histograms[key]
        buckets: list[tuple[str, float]] = []
        cumulative = 0
        for bound, count in zip([*h["bounds_s"], float("inf")], h["counts"], strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        family.add_metric([st.job], buckets, sum_value=h["sum_s"])
    return family


def _families(statuses: Sequence[JobStatus]) -> Iterator[Metric]:
    """Every per-job metric family, with one sample set per status."""
    tasks = GaugeMetricFamily(
        "taskq_tasks",
        "Tasks of the current pass by state: todo, leased (every lease held, reserved or "
        "started), reserved (the part of leased prefetched and not yet started), done; "
        "dead is job-wide. todo + leased + done = live tasks of the pass.",
        labels=["job_name", "state"],
    )
    pass_no = GaugeMetricFamily("taskq_pass", "Current pass, numbered from 0.", labels=["job_name"])
    passes = GaugeMetricFamily(
        "taskq_passes", "Configured passes (-1: until cancelled).", labels=["job_name"]
    )
    job_state = GaugeMetricFamily(
        "taskq_job_state",
        "1 for the job's current state, 0 for the others.",
        labels=["job_name", "state"],
    )
    workers = GaugeMetricFamily(
        "taskq_workers", "Trainers alive (heartbeat within their ttl).", labels=["job_name"]
    )
    by_age = GaugeMetricFamily(
        "taskq_leases_by_age",
        "Started leases at least `le` seconds old on the job's clock (NOT a histogram: "
        "each le counts the leases older than it, so the counts fall as le grows); "
        'le="+Inf" counts every started lease whatever its age.',
        labels=["job_name", "le"],
    )
    oldest = GaugeMetricFamily(
        "taskq_oldest_lease_age_seconds",
        "Age of the oldest started lease on the job's clock (0 when none is held).",
        labels=["job_name"],
    )
    backlog = GaugeMetricFamily(
        "taskq_backlog",
        "Live tasks of the current pass not done yet (todo + leased): what the trainers have "
        "left; for a stream job, what was appended and not trained on. Scale trainers on it.",
        labels=["job_name"],
    )
    oldest_unfinished = GaugeMetricFamily(
        "taskq_oldest_unfinished_age_seconds",
        "How long the oldest task not done has waited, since it was appended or its pass "
        "started (0 when every task is done).",
        labels=["job_name"],
    )
    appended = CounterMetricFamily(
        "taskq_appended", "Tasks appended to the job after its create.", labels=["job_name"]
    )
    counters = {
        name: CounterMetricFamily(name, doc, labels=["job_name"])
        for name, (_, doc) in COUNTERS.items()
    }
    expired = CounterMetricFamily(
        "taskq_expired",
        "Leases the server ended: reason worker_lost (its trainer went silent for its ttl) "
        "or task_timeout (a lease ran longer than the task timeout).",
        labels=["job_name", "reason"],
    )
    lateness_doc = (
        "Re-dispatch lateness: how long after its deadline (worker liveness or "
        "task timeout) an expired lease was reclaimed."
    )
    duration_doc = "Task duration, from a lease's start to its ack."
    last_pass = GaugeMetricFamily(
        "taskq_last_pass_duration_seconds",
        "Duration of the last completed pass (absent until one completes).",
        labels=["job_name"],
    )
    last_ack = GaugeMetricFamily(
        "taskq_last_ack_timestamp_seconds",
        "Time of the last ack on the job's clock, Unix seconds (absent until the first ack).",
        labels=["job_name"],
    )

    for st in statuses:
        job = st.job
        counts = {
            "todo": st.todo,
            "leased": st.leased,
            "reserved": st.reserved,
            "done": st.done,
            "dead": st.dead,
        }
        for state in TASK_STATES:
            tasks.add_metric([job, state], counts[state])
        pass_no.add_metric([job], st.pass_no)
        passes.add_metric([job], -1 if st.passes is None else st.passes)
        for state in STATES:
            job_state.add_metric([job, state], 1 if st.state == state else 0)
        workers.add_metric([job], st.workers)
        started = max(0, st.leased - st.reserved)
        for bound in LEASE_AGE_BOUNDS_S:
            by_age.add_metric([job, str(bound)], st.lease_ages.get(str(bound), 0))
        by_age.add_metric([job, "+Inf"], started)
        oldest.add_metric([job], max(0.0, st.oldest_lease_age_s or 0.0))
        backlog.add_metric([job], st.backlog)
        oldest_unfinished.add_metric([job], max(0.0, st.oldest_unfinished_age_s or 0.0))
        appended.add_metric([job], st.appended)
        for name, (key, _) in COUNTERS.items():
            counters[name].add_metric([job], st.counters.get(key, 0))
        for reason, key in EXPIRY_REASONS.items():
            expired.add_metric([job, reason], st.counters.get(key, 0))
        if st.pass_no > 0 or st.state == "completed":
            last_pass.add_metric([job], st.counters.get("last_pass_ms", 0) / 1000.0)
        if st.counters.get("acked", 0) > 0:
            last_ack.add_metric([job], st.counters.get("last_ack_ms", 0) / 1000.0)

    yield from (tasks, pass_no, passes, job_state, workers, by_age, oldest)
    yield from (backlog, oldest_unfinished, appended)
    yield from counters.values()
    yield expired
    if statuses:
        yield _histogram(
            "taskq_redispatch_lateness_seconds", lateness_doc, statuses, "redispatch_lateness"
        )
        yield _histogram("taskq_task_duration_seconds", duration_doc, statuses, "task_duration")
    else:
        yield HistogramMetricFamily(
            "taskq_redispatch_lateness_seconds", lateness_doc, labels=["job_name"]
        )
        yield HistogramMetricFamily(
            "taskq_task_duration_seconds", duration_doc, labels=["job_name"]
        )
    yield from (last_pass, last_ack)
    yield from input_families(statuses)


def start(
    client: Client,
    port: int = DEFAULT_PORT,
    addr: str = "0.0.0.0",
    jobs: Sequence[str] | None = None,
) -> tuple[Any, threading.Thread]:
    """Serve ``/metrics`` in a background thread (returns at once).

    Args:
        client: the taskq client to read through.
        port: TCP port (0 for any free one: read it from ``server.server_port``).
        addr: address to bind.
        jobs: the jobs to export; every job in the index when None.

    Returns:
        (the HTTP server, its thread); stop with ``server.shutdown()``.

    Raises:
        OSError: the address cannot be bound.
    """
    registry = CollectorRegistry()
    registry.register(TaskqCollector(client, jobs))
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return server, thread


def serve(
    client: Client,
    port: int = DEFAULT_PORT,
    addr: str = "0.0.0.0",
    jobs: Sequence[str] | None = None,
) -> None:
    """Serve ``/metrics`` until SIGTERM or SIGINT (``taskq exporter``).

    Args:
        client: the taskq client to read through.
        port: TCP port.
        addr: address to bind.
        jobs: the jobs to export; every job in the index when None.

    Raises:
        OSError: the address cannot be bound.
    """
    server, thread = start(client, port=port, addr=addr, jobs=jobs)
    stop = threading.Event()
    log.info(
        "exporter: serving /metrics on %s:%d for %s",
        addr,
        server.server_port,
        ", ".join(jobs) if jobs else "every job",
    )
    try:
        with StopOnSignals(stop):
            stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
