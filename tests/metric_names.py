"""The exporter's metric families and the alerts on them, as docs/operations.md
documents them (tests only).

Used by test_exporter.py (what a scrape exposes), test_deploy_prometheus.py (what the
dashboard and the alert rules may query, which alerts the rules define) and
test_prometheus_live.py (which alerts a real Prometheus loads).
"""

from __future__ import annotations

#: The documented metrics (docs/operations.md) and their types.
METRIC_TYPES = {
    **dict.fromkeys(
        [
            "taskq_tasks",
            "taskq_pass",
            "taskq_passes",
            "taskq_job_state",
            "taskq_workers",
            "taskq_leases_by_age",
            "taskq_oldest_lease_age_seconds",
            "taskq_last_pass_duration_seconds",
            "taskq_last_ack_timestamp_seconds",
            "taskq_redis_up",
            "taskq_redis_maxmemory_policy",
            "taskq_input_bound_ratio",
            "taskq_input_worst_trainer_ratio",
            "taskq_backlog",
            "taskq_oldest_unfinished_age_seconds",
            "taskq_mix_weight",
            "taskq_mix_charged_tasks",
            "taskq_mix_acked_tasks",
            "taskq_mix_acked_samples",
            "taskq_mix_debt_slots",
        ],
        "gauge",
    ),
    **dict.fromkeys(
        [
            f"taskq_{c}"
            for c in (
                "leased",
                "acked",
                "failed",
                "released",
                "stale",
                "dead",
                "stolen",
                "revoked",
                "forged",
                "backups",
                "splits",
                "appended",
                "expired",
                "exporter_scrape_errors",
                "input_step_seconds",
                "input_nothing_to_lease_seconds",
            )
        ],
        "counter",
    ),
    "taskq_redispatch_lateness_seconds": "histogram",
    "taskq_task_duration_seconds": "histogram",
    "taskq_input_wait_seconds": "histogram",
}

_SUFFIXES = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
#: The series names a scrape carries.
EXPOSED_NAMES = {name + suffix for name, kind in METRIC_TYPES.items() for suffix in _SUFFIXES[kind]}

#: The alerts of deploy/prometheus (each has a section in docs/operations.md).
ALERT_NAMES = {
    "TaskqPassStalled",
    "TaskqDeadTasks",
    "TaskqNoWorkers",
    "TaskqRedispatchLatenessHigh",
    "TaskqExporterDown",
    "TaskqRedisUnreachable",
    "TaskqExporterScrapeErrors",
    "TaskqRedisEvictionPolicy",
    "TaskqInputBound",
    "TaskqBacklogGrowing",
}
