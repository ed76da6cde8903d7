"""Checks of the Prometheus config, alert rules and the Grafana dashboard.

Where it sits: nothing here runs taskq. `promtool` (from the prometheus package the test
command installs) checks the config and the rules, runs the rule unit tests and parses
every dashboard query; the metric names are checked against what the exporter exposes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from metric_names import ALERT_NAMES, EXPOSED_NAMES
from support import ROOT, load_yaml, load_yaml_all

DEPLOY = ROOT / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERTS_TEST = DEPLOY / "prometheus" / "alerts_test.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "taskq-dashboard.json"
K8S = DEPLOY / "k8s"

#: What the exporter exposes, plus Prometheus' `up`.
KNOWN_METRICS = EXPOSED_NAMES | {"up"}
#: Metrics without a job_name label: a dashboard query may leave them unfiltered.
UNLABELLED_METRICS = {"taskq_exporter_scrape_errors_total", "up"}

PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
PROMQL_MODIFIER = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
PROMQL_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions and labels left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = PROMQL_MODIFIER.sub(" ", text)
    names = set()
    for match in PROMQL_IDENT.finditer(text):
        word = match.group(0)
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation
        if word.lower() in PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names


def test_promql_metric_names_ignores_functions_labels_and_ranges() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (job_name, le) (rate(x_bucket{job_name="$j"}'
        '[$__rate_interval]))) > 10 and on(job_name) y{state="leased"} > 0 or time() - z'
    )
    assert promql_metric_names(expr) == {"x_bucket", "y", "z"}


def promtool() -> str:
    """The promtool binary; a missing one fails the test (never a skip)."""
    found = shutil.which("promtool") or (
        "/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None
    )
    assert found, (
        "promtool missing: install it (scripts/bootstrap.sh --with-prometheus, or apt-get install prometheus)"
    )
    return found


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


# --- Prometheus ------------------------------------------------------------------------


def test_promtool_accepts_the_config_and_the_rules() -> None:
    for args in (("check", "config", str(PROMETHEUS_CONFIG)), ("check", "rules", str(ALERTS))):
        result = run_promtool(*args)
        assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rule_tests_pass() -> None:
    result = run_promtool("test", "rules", str(ALERTS_TEST))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rule_tests_cover_the_stall_firing_and_not_firing() -> None:
    cases = [
        case
        for test in load_yaml(ALERTS_TEST)["tests"]
        for case in test.get("alert_rule_test", [])
        if case["alertname"] == "TaskqPassStalled"
    ]
    assert any(case["exp_alerts"] for case in cases)
    assert any(not case["exp_alerts"] for case in cases)


def test_prometheus_scrapes_the_exporter_and_loads_the_rules() -> None:
    config = load_yaml(PROMETHEUS_CONFIG)
    assert config["rule_files"] == ["alerts.yml"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["taskq-exporter"]["static_configs"][0]["targets"] == ["exporter:9478"]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def test_alerts_are_all_there_and_use_known_metrics() -> None:
    rules = alert_rules()
    assert {rule["alert"] for rule in rules} == ALERT_NAMES
    for rule in rules:
        unknown = promql_metric_names(rule["expr"]) - KNOWN_METRICS
        assert not unknown, f"{rule['alert']}: unknown metrics {unknown}"
    stall = next(rule for rule in rules if rule["alert"] == "TaskqPassStalled")
    assert stall["for"] == "10m"
    # summed by job_name: a sharded job's shards (a shard label each) stall as one job
    assert "sum by (job_name) (increase(taskq_acked_total[10m])) == 0" in stall["expr"]


def test_prometheusrule_carries_the_same_groups_as_alerts_yml() -> None:
    (rule,) = load_yaml_all(K8S / "prometheusrule.yaml")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == load_yaml(ALERTS)["groups"]


# --- Grafana ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    with DASHBOARD.open() as f:
        return json.load(f)


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for panel in dashboard["panels"]:
        for child in [panel, *panel.get("panels", [])]:
            for target in child.get("targets", []):
                out.append((child["title"], target["expr"]))
    return out


def test_dashboard_has_the_job_name_variable(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    job_name = variables["job_name"]
    query = job_name["query"]
    query_text = query["query"] if isinstance(query, dict) else query
    assert query_text == "label_values(taskq_tasks, job_name)"


def test_dashboard_queries_use_only_known_metrics_and_variables(dashboard: dict[str, Any]) -> None:
    exprs = dashboard_exprs(dashboard)
    assert len(exprs) >= 10
    for title, expr in exprs:
        unknown = promql_metric_names(expr) - KNOWN_METRICS
        assert not unknown, f"panel {title!r}: unknown metrics {unknown}"
        variables = set(re.findall(r"\$\{?(\w+)", expr))
        assert variables <= {"job_name", "__rate_interval"}, f"panel {title!r}: {variables}"
        for window in re.findall(r"\[([^\]]*)\]", expr):
            assert window == "$__rate_interval", f"panel {title!r}: range [{window}]"


def test_dashboard_queries_filter_on_the_selected_job(dashboard: dict[str, Any]) -> None:
    for title, expr in dashboard_exprs(dashboard):
        for match in re.finditer(r"\b(taskq_\w+|up)\b(\{[^}]*\})?", expr):
            name, matchers = match.group(1), match.group(2) or ""
            if name in UNLABELLED_METRICS:
                continue
            assert 'job_name="$job_name"' in matchers, f"panel {title!r}: {name} unfiltered"


def test_dashboard_covers_the_operational_questions(dashboard: dict[str, Any]) -> None:
    used = set()
    for _, expr in dashboard_exprs(dashboard):
        used |= promql_metric_names(expr)
    assert {
        "taskq_tasks",
        "taskq_acked_total",
        "taskq_workers",
        "taskq_redispatch_lateness_seconds_bucket",
        "taskq_stale_total",
        "taskq_expired_total",
        "taskq_task_duration_seconds_bucket",
        "taskq_leases_by_age",
        "taskq_mix_weight",
        "taskq_mix_charged_tasks",
        "taskq_mix_acked_tasks",
        "taskq_mix_acked_samples",
        "taskq_mix_debt_slots",
    } <= used


def test_dashboard_shows_a_mixed_jobs_sources_one_series_each(dashboard: dict[str, Any]) -> None:
    """The mixed jobs' row: weight, slots handed out, tasks and samples acked, debt, each a
    series per source (docs/mixing.md)."""
    panels = [
        child
        for panel in dashboard["panels"]
        for child in [panel, *panel.get("panels", [])]
        if any("taskq_mix_" in t["expr"] for t in child.get("targets", []))
    ]
    assert len(panels) == 5
    for panel in panels:
        for target in panel["targets"]:
            assert target["expr"].startswith("sum by (source) ("), panel["title"]
            assert target["legendFormat"] == "{{source}}", panel["title"]


def test_dashboard_queries_are_valid_promql(dashboard: dict[str, Any], tmp_path: Path) -> None:
    rules = [
        {
            "record": f"dashboard:query:{index}",
            "expr": expr.replace("$job_name", "demo").replace("$__rate_interval", "1m"),
        }
        for index, (_, expr) in enumerate(dashboard_exprs(dashboard))
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
