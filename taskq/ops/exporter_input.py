"""The exporter's families of the training loops' data wait (``JobStatus.input``,
inputwait_view.py): labelled by ``job_name`` only, so bounded however many trainers
run; the worst trainers' names stay in ``taskq job status``.

Data flow: exporter.py (one status per job) -> exporter_input.py -> Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from taskq.models import JobStatus

WAIT_DOC = (
    "Time the training loops waited for data: for their next batch or task (next() of a "
    "taskq.torch.DataLoader or of a trainer), per next() call, less the time their trainer "
    "had nothing to lease (taskq_input_nothing_to_lease_seconds_total); the sum also counts "
    "a wait still under way at a heartbeat."
)
NOTHING_DOC = (
    "Time the training loops waited while their trainer had nothing to lease and nothing "
    "held: an open stream waiting for appends (the producer's pace), or a pass's last tasks "
    "held by other trainers. Not input-bound: more loader workers do not shorten it."
)
STEP_DOC = (
    "Time the training loops spent between two next() calls (the step), summed over "
    "their trainers. Input-bound fraction: rate(taskq_input_wait_seconds_sum) / "
    "(rate(taskq_input_wait_seconds_sum) + rate(taskq_input_step_seconds_total))."
)
RATIO_DOC = (
    "Share of the training loops' time spent waiting for data over the last 1 to 2 "
    "minutes (the job's own windows; absent when no loop reported)."
)
WORST_DOC = (
    "The same share for the trainer that waited most over its last minute (its name: "
    "taskq job status; absent when no loop reported)."
)


def input_families(statuses: Sequence[JobStatus]) -> Iterator[Metric]:
    """The data-wait families, one sample set per status that has ``input``.

    Args:
        statuses: the scrape's job statuses.

    Returns:
        ``taskq_input_wait_seconds`` (histogram), ``taskq_input_step_seconds`` and
        ``taskq_input_nothing_to_lease_seconds`` (counters), ``taskq_input_bound_ratio`` and ``taskq_input_worst_trainer_ratio`` (gauges).
    """
    wait = HistogramMetricFamily("taskq_input_wait_seconds", WAIT_DOC, labels=["job_name"])
    step = CounterMetricFamily("taskq_input_step_seconds", STEP_DOC, labels=["job_name"])
    nothing = CounterMetricFamily(
        "taskq_input_nothing_to_lease_seconds", NOTHING_DOC, labels=["job_name"]
    )
    ratio = GaugeMetricFamily("taskq_input_bound_ratio", RATIO_DOC, labels=["job_name"])
    worst = GaugeMetricFamily("taskq_input_worst_trainer_ratio", WORST_DOC, labels=["job_name"])
    for st in statuses:
        data = st.input
        if not data:
            continue
        total = data["total"]
        buckets: list[tuple[str, float]] = []
        cumulative = 0
        for bound, count in zip([*data["bounds_s"], float("inf")], total["counts"], strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        wait.add_metric([st.job], buckets, sum_value=total["wait_s"])
        step.add_metric([st.job], total["step_s"])
        nothing.add_metric([st.job], total["idle_s"])
        if data["recent"]["fraction"] is not None:
            ratio.add_metric([st.job], data["recent"]["fraction"])
        if data["worst"]:
            worst.add_metric([st.job], data["worst"][0]["fraction"])
    yield from (wait, step, nothing, ratio, worst)
