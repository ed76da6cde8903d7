"""Checks of docker-compose.yml, the Dockerfile and .dockerignore.

Where it sits: nothing here runs taskq and no Docker engine runs in CI, so the compose
file is validated against the Compose Specification's JSON schema (check-jsonschema's
bundled ``vendor.compose-spec``, offline) and cross-checked with the repo; the image
recipe is parsed.
"""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, load_yaml

COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DEPLOY = ROOT / "deploy"
REDIS_URL = "redis://redis:6379/0"
IMAGE = "taskq:latest"


def test_compose_file_validates_against_the_compose_spec_schema() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(COMPOSE),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


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
