"""Checks of the deployment files: docker-compose.yml, the Dockerfile and deploy/.

Where it sits: nothing here runs taskq. No Docker engine or Kubernetes cluster runs in
CI, so the compose file, the image recipe, the manifests and the dashboard are parsed
and cross-checked; the tools that work offline are run for real: `promtool` on the alert
rules (and on every dashboard query), and a private `redis-server` that loads
deploy/redis/acl.conf and answers `ACL DRYRUN` for each user, including every command
the Lua scripts in taskq/lua/ call.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from metric_names import EXPOSED_NAMES

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERTS_TEST = DEPLOY / "prometheus" / "alerts_test.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "taskq-dashboard.json"
K8S = DEPLOY / "k8s"
ACL = DEPLOY / "redis" / "acl.conf"
LUA = ROOT / "taskq" / "lua"

REDIS_URL = "redis://redis:6379/0"
IMAGE = "taskq:latest"

#: What the exporter exposes, plus Prometheus' `up`.
KNOWN_METRICS = EXPOSED_NAMES | {"up"}
#: Metrics without a job_name label: a dashboard query may leave them unfiltered.
UNLABELLED_METRICS = {"taskq_exporter_scrape_errors_total", "up"}

ALERT_NAMES = {
    "TaskqPassStalled",
    "TaskqDeadTasks",
    "TaskqNoWorkers",
    "TaskqRedispatchLatenessHigh",
    "TaskqExporterDown",
}

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


def load_yaml(path: Path) -> Any:
    with path.open() as f:
        return yaml.safe_load(f)


def load_yaml_all(path: Path) -> list[Any]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


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


# --- docker-compose.yml ----------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = load_yaml(COMPOSE)
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict)
    return doc


def compose_command(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    assert isinstance(command, list), f"command must be exec form (a list), got {command!r}"
    return [str(part) for part in command]


def test_compose_has_every_service(compose: dict[str, Any]) -> None:
    wanted = {"redis", "reaper", "exporter", "prometheus", "grafana", "create-job", "trainer"}
    assert wanted <= set(compose["services"])


def test_compose_redis_has_aof_everysec_noeviction_and_a_volume(compose: dict[str, Any]) -> None:
    redis_service = compose["services"]["redis"]
    assert str(redis_service["image"]).startswith("redis:7")
    command = compose_command(redis_service)
    options = dict(zip(command[1::2], command[2::2], strict=False))
    assert options.get("--appendonly") == "yes"
    assert options.get("--appendfsync") == "everysec"
    assert options.get("--maxmemory-policy") == "noeviction"
    assert "--maxmemory" in options, "noeviction means nothing without a maxmemory"
    volumes = [str(v) for v in redis_service.get("volumes", [])]
    assert any(v.split(":")[1] == "/data" for v in volumes)
    named = volumes[0].split(":")[0]
    assert named in compose.get("volumes", {})


def test_compose_trainer_can_scale_and_stops_gracefully(compose: dict[str, Any]) -> None:
    trainer = compose["services"]["trainer"]
    assert "container_name" not in trainer
    assert "ports" not in trainer
    assert trainer.get("stop_grace_period"), "a trainer needs time to release its leases"
    command = compose_command(trainer)
    assert command[:2] == ["work", "demo"] and "--" in command


def test_compose_taskq_services_run_the_cli_with_the_redis_url(compose: dict[str, Any]) -> None:
    expected = {
        "reaper": ["reaper", "--interval", "0.5"],
        "exporter": ["exporter", "--port", "9478"],
        "create-job": ["job", "create", "demo"],
        "trainer": ["work", "demo"],
    }
    for name, prefix in expected.items():
        service = compose["services"][name]
        assert service["image"] == IMAGE, name
        assert service["environment"]["TASKQ_REDIS_URL"] == REDIS_URL, name
        assert compose_command(service)[: len(prefix)] == prefix, name
    assert compose["services"]["create-job"]["restart"] == "no"


def test_compose_create_job_uses_only_documented_options(compose: dict[str, Any]) -> None:
    """Only options `taskq job create --help` lists."""
    from taskq.cli.job import create

    command = compose_command(compose["services"]["create-job"])
    options = {part for part in command if part.startswith("--")}
    assert "--exist-ok" in options  # a second `docker compose up` keeps the job
    assert options <= {opt for param in create.params for opt in param.opts}


def test_compose_bind_mounts_exist_in_the_repo(compose: dict[str, Any]) -> None:
    seen = 0
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name}: {source} is not in the repo"
                seen += 1
    assert seen >= 3


def test_compose_build_context_has_the_dockerfile(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        build = service.get("build")
        if build is None:
            continue
        context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
        dockerfile = (
            "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        )
        assert (context / dockerfile).is_file(), name


def test_compose_prometheus_and_grafana_mount_the_deploy_files(compose: dict[str, Any]) -> None:
    prometheus_volumes = [str(v) for v in compose["services"]["prometheus"]["volumes"]]
    assert any(v.startswith("./deploy/prometheus/prometheus.yml:") for v in prometheus_volumes)
    assert any(v.startswith("./deploy/prometheus/alerts.yml:") for v in prometheus_volumes)
    grafana_volumes = [str(v) for v in compose["services"]["grafana"]["volumes"]]
    assert any(v.startswith("./deploy/grafana/provisioning:") for v in grafana_volumes)
    dashboard_mount = next(
        v for v in grafana_volumes if v.startswith("./deploy/grafana/taskq-dashboard.json:")
    )
    provider = load_yaml(DEPLOY / "grafana/provisioning/dashboards/taskq.yml")
    provider_path = provider["providers"][0]["options"]["path"]
    assert str(Path(dashboard_mount.split(":")[1]).parent) == provider_path
    datasource = load_yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


# --- Dockerfile and .dockerignore ------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_dockerfile_is_slim_non_root_with_exec_form_entrypoint() -> None:
    instructions = dockerfile_instructions()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    runs = " ".join(rest for keyword, rest in instructions if keyword == "RUN")
    assert "pip install ." in runs
    user = [rest for keyword, rest in instructions if keyword == "USER"][-1]
    assert user.split(":")[0] not in {"root", "0"}
    entrypoint = [rest for keyword, rest in instructions if keyword == "ENTRYPOINT"][-1]
    parsed = json.loads(entrypoint)  # exec form: a JSON array, no shell in between
    assert parsed[-1] == "taskq"
    assert parsed[0] not in {"sh", "/bin/sh", "bash", "/bin/bash"}


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, simplified: the last matching pattern (or parent match) wins."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(
            fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, f"**/{pattern}") for p in prefixes
        ):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_everything_the_dockerfile_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert dockerignored(".venv", patterns) and dockerignored(".git", patterns)
    copied = []
    for keyword, rest in dockerfile_instructions():
        if keyword == "COPY":
            copied.extend(part for part in rest.split()[:-1] if not part.startswith("--"))
    assert "taskq" in copied and "cli" in copied and "pyproject.toml" in copied
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not dockerignored(source, patterns), f"{source} is COPY'd but .dockerignore drops it"


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
    assert "increase(taskq_acked_total[10m]) == 0" in stall["expr"]


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
    } <= used


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


# --- Kubernetes ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def k8s_objects() -> list[dict[str, Any]]:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    objects = []
    for resource in kustomization["resources"]:
        path = K8S / resource
        assert path.is_file(), f"kustomization lists {resource}, which does not exist"
        objects.extend(load_yaml_all(path))
    return objects


def test_kustomization_lists_every_manifest_in_the_folder() -> None:
    listed = set(load_yaml(K8S / "kustomization.yaml")["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    template = obj["spec"]["template"]["spec"]
    return [*template.get("initContainers", []), *template["containers"]]


def test_k8s_objects_are_well_formed(k8s_objects: list[dict[str, Any]]) -> None:
    for obj in k8s_objects:
        assert obj.get("apiVersion") and obj.get("kind") and obj["metadata"].get("name"), obj


def test_k8s_taskq_containers_use_one_image_exec_form_and_the_secret(
    k8s_objects: list[dict[str, Any]],
) -> None:
    secret = find(k8s_objects, "Secret", "taskq-redis")
    assert secret["stringData"]["TASKQ_REDIS_URL"] == REDIS_URL
    taskq_containers = [
        c
        for o in k8s_objects
        if o["kind"] in {"Deployment", "StatefulSet", "Job"}
        for c in containers(o)
        if c["image"].startswith("taskq")
    ]
    assert len(taskq_containers) >= 4
    for container in taskq_containers:
        assert container["image"] == IMAGE
        command = container["command"]
        assert isinstance(command, list) and command[:3] == ["/usr/bin/tini", "--", "taskq"]
        assert {"secretRef": {"name": "taskq-redis"}} in container["envFrom"]


def test_k8s_trainer_job_stops_gracefully(k8s_objects: list[dict[str, Any]]) -> None:
    job = find(k8s_objects, "Job", "taskq-trainer")
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["parallelism"] >= 2
    assert "completions" not in job["spec"], "a work-queue Job: pods end when the taskq job does"
    assert pod["terminationGracePeriodSeconds"] >= 30
    (trainer,) = pod["containers"]
    command = trainer["command"]
    assert isinstance(command, list) and all(isinstance(part, str) for part in command)
    assert command[3:5] == ["work", "demo"] and "--" in command[5:]
    assert not {"sh", "/bin/sh", "bash", "/bin/bash"} & set(command[:4])
    ignored_exit_codes = [
        rule["onExitCodes"]["values"]
        for rule in job["spec"].get("podFailurePolicy", {}).get("rules", [])
        if "onExitCodes" in rule and rule["action"] == "Ignore"
    ]
    assert [143] in ignored_exit_codes, "a SIGTERMed trainer must not count as a failure"


def test_k8s_redis_is_a_statefulset_with_aof_on_a_pvc(k8s_objects: list[dict[str, Any]]) -> None:
    statefulset = find(k8s_objects, "StatefulSet", "redis")
    assert statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    mounts = {m["name"]: m["mountPath"] for m in containers(statefulset)[0]["volumeMounts"]}
    assert mounts["data"] == "/data"
    config = find(k8s_objects, "ConfigMap", "redis-config")["data"]["redis.conf"]
    lines = {line.strip() for line in config.splitlines()}
    assert {
        "appendonly yes",
        "appendfsync everysec",
        "maxmemory-policy noeviction",
        "dir /data",
    } <= lines
    service = find(k8s_objects, "Service", "redis")
    assert service["spec"]["selector"] == statefulset["spec"]["template"]["metadata"]["labels"]


def test_k8s_reaper_and_exporter(k8s_objects: list[dict[str, Any]]) -> None:
    reaper = find(k8s_objects, "Deployment", "taskq-reaper")
    assert reaper["spec"]["replicas"] == 2
    exporter = find(k8s_objects, "Deployment", "taskq-exporter")
    port_names = {p["name"] for p in containers(exporter)[0]["ports"]}
    # The Operator names the scrape job after the Service: up{job="taskq-exporter"}.
    service = find(k8s_objects, "Service", "taskq-exporter")
    assert service["spec"]["selector"] == exporter["spec"]["template"]["metadata"]["labels"]
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    monitor = find(k8s_objects, "ServiceMonitor", "taskq-exporter")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {
        p["name"] for p in service["spec"]["ports"]
    }


# --- Redis ACL -------------------------------------------------------------------------

ACL_USERS = {"default", "trainer", "reaper", "exporter", "admin"}
#: Job keys a trainer's scripts may DEL/UNLINK (per-pass state and wake-up lists).
SCRATCH_KEYS = {
    "done",
    "front",
    "owned",
    "deadlines",
    "reserved",
    "started",
    "wake",
    "bcast0",
    "bcast1",
}
#: Script verbs only the admin (the CLI) runs; any other verb but `reap` is a trainer's.
ADMIN_VERBS = {
    "create", "stage", "flip", "replace", "delete", "cancel", "advance", "next", "reset",
    "retry", "revoke", "drain", "force", "clock", "config", "audit", "repair", "purge",
}  # fmt: skip
REAPER_VERBS = {"reap", "closed"}


def acl_lines() -> list[list[str]]:
    return [line.split() for line in ACL.read_text().splitlines()]


def top_level_rules(words: list[str]) -> list[str]:
    """The rules of a user line outside any `( ... )` selector."""
    text = " ".join(words)
    return re.sub(r"\([^)]*\)", " ", text).split()


def test_acl_file_has_one_user_per_line_and_placeholder_passwords() -> None:
    names = []
    for words in acl_lines():
        assert words[0] == "user" and len(words) > 2, words  # Redis allows no comments here
        names.append(words[1])
        passwords = [w for w in words if w.startswith(">")]
        if words[1] == "default":
            assert "nopass" in words and not passwords
        else:
            assert passwords == [f">CHANGE_ME_{words[1]}"]
    assert sorted(names) == sorted(ACL_USERS)


def test_acl_trainer_cannot_delete_flush_or_rename_at_top_level() -> None:
    trainer = next(words for words in acl_lines() if words[1] == "trainer")
    rules = {rule.lower() for rule in top_level_rules(trainer)}
    assert not rules & {
        "+del",
        "+unlink",
        "+flushall",
        "+flushdb",
        "+rename",
        "+@all",
        "+@write",
        "+@keyspace",
    }
    assert "-@dangerous" in rules


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    """A private redis-server with acl.conf plus a `tester` user allowed ACL DRYRUN."""
    server = shutil.which("redis-server")
    assert server, "redis-server missing: run scripts/bootstrap.sh"
    workdir = tmp_path_factory.mktemp("acl")
    aclfile = workdir / "acl.conf"
    aclfile.write_text(ACL.read_text() + "user tester on >tester ~* &* +@all\n")
    port = free_port()
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir), "--aclfile", str(aclfile), "--logfile", str(workdir / "redis.log")],
    )  # fmt: skip
    client = redis.Redis(port=port, username="tester", password="tester", decode_responses=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                log = workdir / "redis.log"
                assert process.poll() is None, (
                    f"redis-server refused the ACL file: {log.read_text() if log.exists() else ''}"
                )
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield client
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=10)


def dryrun(client: redis.Redis, user: str, *command: str) -> bool:
    """True when `user` may run `command`; an arity error is a bug in the test."""
    reply = client.execute_command("ACL", "DRYRUN", user, *command)
    if reply == "OK":
        return True
    assert "no permissions" in str(reply), reply
    return False


def key(name: str) -> str:
    return f"taskq:{{job-1}}:{name}"


ACL_CASES = [
    ("default", ("PING",), True),
    ("default", ("GET", key("meta")), False),
    ("trainer", ("FCALL", "no_such_function", "1", key("meta")), True),
    ("trainer", ("FUNCTION", "LOAD", "#!lua name=x\nreturn 1"), False),
    ("trainer", ("EVAL", "return 1", "0"), False),
    ("trainer", ("BLPOP", key("wake"), "1"), True),
    ("trainer", ("XREAD", "BLOCK", "1", "STREAMS", key("events"), "0"), True),
    ("trainer", ("HSET", key("meta"), "f", "v"), True),
    ("trainer", ("UNLINK", key("done"), key("front"), key("owned"), key("started")), True),
    ("trainer", ("DEL", key("bcast0")), True),
    ("trainer", ("DEL", key("meta")), False),
    ("trainer", ("UNLINK", key("chunks")), False),
    ("trainer", ("UNLINK", key("done"), key("meta")), False),
    ("trainer", ("DEL", "taskq:jobs"), False),
    ("trainer", ("RENAME", key("meta"), key("x")), False),
    ("trainer", ("FLUSHALL",), False),
    ("trainer", ("FLUSHDB",), False),
    ("trainer", ("KEYS", "*"), False),
    ("trainer", ("CONFIG", "SET", "maxmemory", "0"), False),
    ("trainer", ("GET", "other:key"), False),
    ("reaper", ("SET", key("lock"), "me", "PX", "1000"), True),
    ("reaper", ("FCALL", "no_such_function", "1", key("meta")), True),
    ("reaper", ("DEL", key("meta")), False),
    ("reaper", ("FLUSHALL",), False),
    ("exporter", ("HGETALL", key("meta")), True),
    ("exporter", ("SCAN", "0", "MATCH", "taskq:*"), True),
    ("exporter", ("HSET", key("meta"), "f", "v"), False),
    ("exporter", ("FCALL_RO", "no_such_function", "1", key("meta")), True),  # the no-writes stats
    ("exporter", ("FCALL", "no_such_function", "1", key("meta")), False),
    ("exporter", ("TIME",), True),
    ("exporter", ("SET", key("clock"), "1"), False),
    ("exporter", ("XADD", key("events"), "*", "f", "v"), False),
    ("exporter", ("DEL", key("wake")), False),
    ("admin", ("UNLINK", key("meta"), key("chunks")), True),
    ("admin", ("FCALL", "no_such_function", "1", key("meta")), True),
    ("admin", ("SCAN", "0"), True),
    ("admin", ("FLUSHALL",), False),
    ("admin", ("FUNCTION", "LOAD", "#!lua name=x\nreturn 1"), True),
    ("exporter", ("FUNCTION", "LOAD", "#!lua name=x\nreturn 1"), False),
    ("reaper", ("FUNCTION", "LOAD", "#!lua name=x\nreturn 1"), False),
    ("admin", ("FUNCTION", "FLUSH"), False),
    ("admin", ("FUNCTION", "DELETE", "taskq_x"), False),
    ("admin", ("CONFIG", "GET", "maxmemory"), False),
    ("admin", ("DEL", "other:key"), False),
]


@pytest.mark.parametrize(
    ("user", "command", "allowed"),
    ACL_CASES,
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else str(v),
)
def test_acl_dryrun(
    acl_redis: redis.Redis, user: str, command: tuple[str, ...], allowed: bool
) -> None:
    assert dryrun(acl_redis, user, *command) is allowed


LUA_CALL = re.compile(r"redis\.p?call\(\s*['\"]([A-Za-z]+)['\"]")


def lua_calls(path: Path) -> list[tuple[str, list[str]]]:
    """Each `redis.call('CMD', args...)` of a script: the command and its top-level args."""
    text = path.read_text()
    calls = []
    for match in LUA_CALL.finditer(text):
        depth, index, args, current = 1, match.end(), [], ""
        while depth and index < len(text):
            char = text[index]
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 1 and char == ",":
                args.append(current.strip())
                current = ""
            elif depth:
                current += char
            index += 1
        args.append(current.strip())
        calls.append((match.group(1).upper(), [a for a in args if a]))
    return calls


def resolve_key_args(path: Path, args: list[str]) -> list[str] | None:
    """Job key names for `K_*` args (a local assigned from K_* counts); None if unknown."""
    text = path.read_text()
    keys = []
    for arg in args:
        candidates = (
            [arg]
            if arg.startswith("K_")
            else re.findall(rf"\b{re.escape(arg)}\s*=\s*(K_\w+)", text)
        )
        if not candidates:
            return None
        keys.extend(c[2:].lower() for c in candidates)
    return keys


def role_of(script: Path) -> set[str]:
    """The users that run a script: _lib is part of every writing script; a read-only
    one (`#!lua flags=no-writes`: stats, peek) is the exporter's and the CLI's."""
    verb = script.stem.rsplit("-", 1)[0]
    if verb == "_lib":
        return {"trainer", "reaper", "admin"}
    if "no-writes" in script.read_text().splitlines()[0]:
        return {"exporter", "admin"}
    if verb in REAPER_VERBS:
        return {"reaper", "admin"}
    if verb in ADMIN_VERBS:
        return {"admin"}
    return {"trainer", "admin"}


def dryrun_any_arity(client: redis.Redis, user: str, command: str, keys: list[str]) -> bool:
    """ACL DRYRUN with filler args until the arity fits (scripts' args are runtime values).

    Unresolved key args and the fillers are the job's meta key (a filler may sit in a key
    position, as RENAME's second arg does): a key outside taskq:* would be denied for a
    reason that has nothing to do with the command.
    """
    attempts = [[key(k) for k in keys]] if keys else [[], [key("meta")]]
    for head in attempts:
        for filler in range(8 if head else 1):  # a keyless command takes no filler
            try:
                reply = client.execute_command(
                    "ACL", "DRYRUN", user, command, *head, *[key("meta")] * filler
                )
            except redis.ResponseError as e:
                if "wrong number of arguments" in str(e):
                    continue
                raise
            return bool(reply == "OK")
    raise AssertionError(f"no arity fits {command}")


def test_acl_allows_every_command_the_lua_scripts_call(acl_redis: redis.Redis) -> None:
    """Scripts run with the caller's ACL: a command a role's script needs and the role
    lacks would stop that script half-way with NOPERM."""
    scripts = sorted(LUA.glob("*.lua"))
    assert scripts, "taskq/lua/ has no scripts"
    checked = 0
    for script in scripts:
        for command, args in lua_calls(script):
            users = role_of(script)
            if command in {"DEL", "UNLINK"}:
                keys = resolve_key_args(script, args)
                if keys is None:
                    # Any key under taskq:* is the admin's to delete (a staging hash...).
                    assert users == {"admin"}, (
                        f"{script.name}: which keys does {command} {args} delete?"
                    )
                    keys = ["meta"]
            else:
                keys = (resolve_key_args(script, args[:1]) if args else None) or []
            for user in users:
                if command in {"DEL", "UNLINK"} and user != "admin":
                    outside = set(keys) - SCRATCH_KEYS
                    assert not outside, (
                        f"{script.name} ({user}) deletes {outside}: the {user} ACL denies it. "
                        f"If {script.name} is an admin script add its verb to ADMIN_VERBS."
                    )
                assert dryrun_any_arity(acl_redis, user, command, keys), (
                    f"{script.name} calls {command} {keys}, which the {user} ACL denies "
                    "(scripts run with the caller's ACL): update deploy/redis/acl.conf"
                )
                checked += 1
    assert checked > 0
