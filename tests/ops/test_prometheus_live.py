"""A real Prometheus scrapes a running exporter while a job runs the scenario of
tests/ops/test_exporter.py; then the alert rules are checked with promtool and loaded live,
and every query of the Grafana dashboard is evaluated through Prometheus' HTTP API.

Prometheus is the Debian package (`make test` installs it); the test fails without it.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from metric_names import ALERT_NAMES
from support import RedisServer, free_port, stop_process, wait_until
from test_exporter import run_scenario

import taskq
from taskq.ops import exporter

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERTS_TEST = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "taskq-dashboard.json"
SCRAPE_JOB = "taskq-exporter"  # the scrape job name deploy/prometheus/prometheus.yml uses
WAIT_S = 30.0
RATE_INTERVAL = "1m"


def _binary(name: str) -> str:
    path = shutil.which(name) or f"/usr/bin/{name}"
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name} not found: run `make test` (it installs the prometheus package)")
    return path


class Prometheus:
    """A prometheus server of this test: its own config, storage and port."""

    def __init__(self, directory: Path, target_port: int) -> None:
        self.port = free_port()
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                {
                    "job_name": SCRAPE_JOB,
                    "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}],
                }
            ],
        }
        config_file = directory / "prometheus.yml"
        config_file.write_text(json.dumps(config))  # JSON is YAML
        self.log = (directory / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                _binary("prometheus"),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read()) if "/api/" in path else resp.read()

    def query(self, expr: str) -> dict[str, Any]:
        """``/api/v1/query`` at now; a 4xx (bad expression) comes back as its JSON body."""
        try:
            reply: dict[str, Any] = self.get("/api/v1/query", query=expr)
        except urllib.error.HTTPError as e:
            reply = json.loads(e.read())
        return reply

    def wait_ready(self, timeout: float = WAIT_S) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, f"prometheus exited; see {self.log.name}"
            try:
                self.get("/-/ready")
            except OSError:
                return False
            return True

        assert wait_until(ready, timeout, 0.1), "prometheus did not become ready"

    def stop(self) -> None:
        stop_process(self.proc, 15)
        self.log.close()


def poll(what: str, check: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    """``check()`` until it returns something truthy, bounded."""
    got: list[Any] = []
    assert wait_until(lambda: got.append(check()) or got[-1], timeout, 0.25), (
        f"timed out waiting for {what}"
    )
    return got[-1]


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel, rows' panels included."""
    board = json.loads(DASHBOARD.read_text())

    def walk(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in panels:
            yield panel
            yield from walk(panel.get("panels", []))

    return [
        (p.get("title", "?"), t["expr"])
        for p in walk(board.get("panels", []))
        for t in p.get("targets", [])
        if t.get("expr")
    ]


def substitute(expr: str, job: str) -> str:
    """Grafana's variables as Grafana would fill them for one job and a 5 m view."""
    values = {
        "job_name": job,
        "__rate_interval": RATE_INTERVAL,
        "__interval": "5s",
        "__interval_ms": "5000",
        "__range": "5m",
        "__range_s": "300",
        "__range_ms": "300000",
    }
    pattern = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")

    def fill(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        assert name in values, f"unknown dashboard variable ${name} in {expr!r}"
        return values[name]

    return pattern.sub(fill, expr)


@pytest.fixture(scope="module")
def exported_server() -> Iterator[RedisServer]:
    """A server of this module alone: the exporter reads every job of its server at each
    1 s scrape (about 1.4 ms a job), and the suite's shared server holds the jobs of every
    test before (600 jobs: 0.8-0.9 s a scrape, at Prometheus' 1 s timeout here)."""
    server = RedisServer()
    yield server
    server.cleanup()


@pytest.fixture
def url(exported_server: RedisServer) -> str:
    return exported_server.url


@pytest.fixture
def client(url: str) -> taskq.Client:
    return taskq.connect(url)


@pytest.fixture
def prometheus(client: taskq.Client, tmp_path: Path) -> Iterator[Prometheus]:
    """An exporter of every job (in this process) and a Prometheus scraping it each 1 s."""
    assert ALERTS.exists(), f"{ALERTS} is missing (deploy/ ships the alert rules)"
    server, _ = exporter.start(client, port=0, addr="127.0.0.1")
    prom = Prometheus(tmp_path, int(server.server_port))
    try:
        prom.wait_ready()
        yield prom
    finally:
        prom.stop()
        server.shutdown()
        server.server_close()


def test_prometheus_scrapes_the_scenario_and_every_dashboard_query_returns_data(
    client: taskq.Client, job_name: str, prometheus: Prometheus
) -> None:
    started = time.monotonic()

    def scraped_once() -> None:
        poll(
            "a first scrape of the new job",
            lambda: prometheus.query(f'taskq_tasks{{job_name="{job_name}"}}')["data"]["result"],
        )

    scenario = run_scenario(client, job_name, after_create=scraped_once)
    try:
        # Prometheus saw the scenario's end state (a scrape after it finished).
        def caught_up() -> bool:
            r = prometheus.query(f'taskq_pass{{job_name="{job_name}"}} == 1')["data"]["result"]
            return bool(r)

        poll("a scrape of the scenario's end", caught_up)
        up = prometheus.query(f'up{{job="{SCRAPE_JOB}"}}')["data"]["result"]
        assert [float(r["value"][1]) for r in up] == [1.0]

        # The dashboard's job variable lists the job (label_values(taskq_tasks, job_name)).
        names = prometheus.get("/api/v1/label/job_name/values", **{"match[]": "taskq_tasks"})
        assert job_name in names["data"]

        # The mixed jobs' panels are asked of a mixed job (a plain job has no such series):
        # sources whose tasks say their size (parquet rows), some tasks acked.
        mix = f"{job_name}-mix"
        sources = [f"{job_name}-web", f"{job_name}-code"]
        for src in sources:
            client.create_job(src, [{"format": "parquet", "path": "x", "rows": 10}] * 3)
        client.create_job(mix, mix={sources[0]: 2, sources[1]: 1})
        with taskq.Trainer(mix, client=client) as trainer:
            for task in trainer.lease_many(3, timeout=0):
                trainer.ack(task)

        exprs = dashboard_exprs()
        assert len(exprs) >= 10, exprs
        failures: dict[str, Any] = {}

        def all_return_data() -> bool:
            failures.clear()
            for title, expr in exprs:
                query = substitute(expr, mix if "taskq_mix_" in expr else job_name)
                reply = prometheus.query(query)
                if reply.get("status") != "success":
                    failures[query] = (title, reply.get("error"))
                    continue
                result = reply["data"]["result"]
                values = (
                    [float(r["value"][1]) for r in result]
                    if isinstance(result, list)
                    else [float(result[1])]
                )
                if not values or not all(math.isfinite(v) for v in values):
                    failures[query] = (title, values)
            return not failures

        assert poll_quietly(all_return_data), json.dumps(failures, indent=1)

        # The scenario's numbers made it through: a few spot checks on what was stored.
        def one(expr: str) -> float:
            result = prometheus.query(expr)["data"]["result"]
            assert len(result) == 1, (expr, result)
            return float(result[0]["value"][1])

        sel = f'{{job_name="{job_name}"}}'
        assert one(f"taskq_stale_total{sel}") == 1
        assert one(f'taskq_expired_total{{job_name="{job_name}",reason="worker_lost"}}') == 1
        assert one(f'taskq_tasks{{job_name="{job_name}",state="dead"}}') == 2
        assert one(f"taskq_redispatch_lateness_seconds_count{sel}") == 2
        assert one(f"increase(taskq_acked_total{sel}[{RATE_INTERVAL}])") > 0
        assert one("taskq_exporter_scrape_errors_total") >= 0
        at = f'job_name="{mix}",source="{sources[0]}"'
        assert one(f"taskq_mix_acked_samples{{{at}}}") == 20  # slots web, code, web
    finally:
        scenario.close()
    assert time.monotonic() - started < 60


def _sleepy_reader(pause_s: float, chunks: list[dict[str, Any]], start: int) -> Iterator[Any]:
    """A task's samples, ``pause_s`` of (simulated) reading each."""
    for k in range(start, sum(int(c["n"]) for c in chunks)):
        if pause_s:
            time.sleep(pause_s)  # the reading time being measured
        yield {"x": k}


def _training_loop(url: str, job: str, read_s: float, step_s: float, stop: Any) -> None:
    """A taskq.torch loop over ``job`` (in-process reading) until ``stop`` or its end."""
    from taskq.torch import DataLoader, TaskDataset

    dataset = TaskDataset(
        job, reader=functools.partial(_sleepy_reader, read_s), url=url, shuffle=False
    )
    with DataLoader(dataset, batch_size=4, num_workers=0) as loader:
        for _batch in loader:
            if step_s:
                time.sleep(step_s)  # the step time being measured
            if stop.is_set():
                break


def test_a_slow_reader_is_input_bound_and_a_slow_step_is_not(
    client: taskq.Client, url: str, job_name: str, prometheus: Prometheus
) -> None:
    """Through the loader's meter, the heartbeats, the exporter and Prometheus: a reader
    sleeping 5 ms per sample under a step of nothing waits most of the loop's time, a
    step of 20 ms over a reader of nothing hardly at all."""
    reader_bound, step_bound = f"{job_name}-reader", f"{job_name}-step"
    for job in (reader_bound, step_bound):
        client.create_job(
            # 300 tasks: ~60 s of reading for either loop, longer than the check may take
            # on a loaded machine (seen: no two scrapes of the rate within 30 s under a
            # load of 5); the loops stop as soon as it holds
            job,
            [{"n": 40} for _ in range(300)],
            worker_ttl=2.0,
            heartbeat_interval=0.2,
        )
    stop = threading.Event()
    loops = [
        threading.Thread(target=_training_loop, args=(url, reader_bound, 0.005, 0.0, stop)),
        threading.Thread(target=_training_loop, args=(url, step_bound, 0.0, 0.02, stop)),
    ]
    for loop in loops:
        loop.start()
    window = RATE_INTERVAL

    def fraction(job: str) -> str:
        sel = f'{{job_name="{job}"}}'
        wait = f"sum(rate(taskq_input_wait_seconds_sum{sel}[{window}]))"
        step = f"sum(rate(taskq_input_step_seconds_total{sel}[{window}]))"
        return f"{wait} / ({wait} + {step})"

    def values(expr: str) -> list[float]:
        return [float(r["value"][1]) for r in prometheus.query(expr)["data"]["result"]]

    seen: dict[str, Any] = {}

    def separated() -> bool:
        # the alert's expression (over the test's window) and the job's own gauge agree
        seen["rate"] = {job: values(fraction(job)) for job in (reader_bound, step_bound)}
        seen["gauge"] = {
            job: values(f'taskq_input_bound_ratio{{job_name="{job}"}}')
            for job in (reader_bound, step_bound)
        }
        seen["p95"] = values(
            "histogram_quantile(0.95, sum by (le) (rate(taskq_input_wait_seconds_bucket"
            f'{{job_name="{reader_bound}"}}[{window}])))'
        )
        return all(
            len(got[reader_bound]) == 1
            and len(got[step_bound]) == 1
            and got[reader_bound][0] > 0.7
            and got[step_bound][0] < 0.3
            for got in (seen["rate"], seen["gauge"])
        ) and bool(seen["p95"] and seen["p95"][0] >= 0.01)

    started = time.monotonic()
    try:
        assert poll_quietly(separated, timeout=60), seen
    finally:
        stop.set()
        for loop in loops:
            loop.join(timeout=15)
    assert not any(loop.is_alive() for loop in loops)
    for job, bound in ((reader_bound, "input-bound"), (step_bound, "step-bound")):
        status = client.status(job, summaries=0)
        assert status.input["worst"], (bound, status.input)
    assert time.monotonic() - started < 30


def poll_quietly(check: Callable[[], bool], timeout: float = WAIT_S) -> bool:
    """Like ``poll`` but returns False at the bound (the caller reports the details)."""
    return wait_until(check, timeout, 0.5)


def test_alert_rules_check_test_and_load_into_a_live_prometheus(
    client: taskq.Client, job_name: str, prometheus: Prometheus
) -> None:
    promtool = _binary("promtool")
    assert ALERTS_TEST.exists(), f"{ALERTS_TEST} is missing (the stall alert's unit test)"
    check = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [promtool, "test", "rules", ALERTS_TEST.name],
        cwd=ALERTS_TEST.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr

    # Live: the rules load and evaluate cleanly, and a dead task fires TaskqDeadTasks.
    scenario = run_scenario(client, job_name)
    try:

        def dead_alert() -> list[dict[str, Any]]:
            alerts = prometheus.get("/api/v1/alerts")["data"]["alerts"]
            return [
                a
                for a in alerts
                if a["labels"].get("alertname") == "TaskqDeadTasks"
                and a["labels"].get("job_name") == job_name
                and a["state"] == "firing"
            ]

        poll("TaskqDeadTasks to fire for the job", dead_alert)
        groups = prometheus.get("/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert {r["name"] for r in rules} >= ALERT_NAMES
        assert all(r["health"] == "ok" for r in rules), [
            (r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"
        ]
    finally:
        scenario.close()
