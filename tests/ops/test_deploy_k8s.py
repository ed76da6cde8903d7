"""Checks of the Kubernetes manifests in deploy/k8s.

Where it sits: nothing here runs taskq and no cluster runs in CI. Every object of a kind
Kubernetes ships is validated, strictly (unknown fields are errors), against the
OpenAPI schemas of several Kubernetes versions that kubernetes-validate bundles
(offline); the manifests are then cross-checked with each other and the image. The
CRD objects (ServiceMonitor, PrometheusRule) and the Kustomization have no schema there:
their structure is checked here by hand, and the PrometheusRule's rules by promtool
(tests/ops/test_deploy_prometheus.py).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from support import ROOT, load_yaml, load_yaml_all

K8S = ROOT / "deploy" / "k8s"
REDIS_URL = "redis://redis:6379/0"
IMAGE = "taskq:latest"
#: docs/kubernetes.md: the trainer Job's podFailurePolicy needs 1.26+.
K8S_VERSIONS = ("1.26", "1.28", "1.30", "1.31", "1.34", kubernetes_validate.latest_version())
#: Kinds no bundled schema covers (CRDs of the Prometheus operator; kustomize's own).
NO_SCHEMA_KINDS = {"ServiceMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def k8s_objects() -> list[dict[str, Any]]:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    objects = []
    for resource in kustomization["resources"]:
        path = K8S / resource
        assert path.is_file(), f"kustomization lists {resource}, which does not exist"
        objects.extend(load_yaml_all(path))
    return objects


def schema_errors(obj: dict[str, Any], version: str) -> list[str]:
    """What kubernetes-validate --strict says of ``obj`` for Kubernetes ``version``."""
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = ".".join(str(part) for part in e.absolute_path)
        return [f"{obj['kind']}/{obj['metadata']['name']}: {where}: {e.message}"]
    return []


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_objects_validate_strictly_against_the_kubernetes_schemas(
    k8s_objects: list[dict[str, Any]], version: str
) -> None:
    checked = [o for o in k8s_objects if o["kind"] not in NO_SCHEMA_KINDS]
    errors = [e for obj in checked for e in schema_errors(obj, version)]
    assert not errors, "\n".join(errors)
    assert {o["kind"] for o in checked} == {
        "ConfigMap",
        "Deployment",
        "Job",
        "Namespace",
        "Secret",
        "Service",
        "StatefulSet",
    }


def test_the_schema_check_catches_a_pod_condition_without_status(
    k8s_objects: list[dict[str, Any]],
) -> None:
    job = copy.deepcopy(find(k8s_objects, "Job", "taskq-trainer"))
    del job["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["status"]
    errors = schema_errors(job, "1.31")
    assert errors and "'status' is a required property" in errors[0], errors


def test_crds_and_the_kustomization_have_no_bundled_schema(
    k8s_objects: list[dict[str, Any]],
) -> None:
    """What the schema check leaves out, kept honest: if a schema ever ships for these,
    this fails and they move into the check above."""
    crds = [o for o in k8s_objects if o["kind"] in NO_SCHEMA_KINDS]
    assert {o["kind"] for o in crds} == NO_SCHEMA_KINDS
    for obj in [*crds, load_yaml(K8S / "kustomization.yaml")]:
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)


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


# -- autoscaling on a stream's backlog (deploy/k8s/autoscaling, KEDA) ----------------------
AUTOSCALING = K8S / "autoscaling"


def kustomized(folder: Path) -> list[dict[str, Any]]:
    """The objects of a kustomization: its files, and its folders' kustomizations (a base);
    every manifest of its folder listed."""
    listed = load_yaml(folder / "kustomization.yaml")["resources"]
    files = {r for r in listed if (folder / r).is_file()}
    assert files == {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"}
    objects = []
    for resource in listed:
        path = (folder / resource).resolve()
        assert path.exists(), f"{folder}: {resource} does not exist"
        objects += kustomized(path) if path.is_dir() else load_yaml_all(path)
    return objects


@pytest.fixture(scope="module")
def autoscaling_objects() -> list[dict[str, Any]]:
    return kustomized(AUTOSCALING)


@pytest.fixture(scope="module")
def hpa_objects() -> list[dict[str, Any]]:
    return kustomized(AUTOSCALING / "hpa")


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_stream_trainers_validate_strictly(
    autoscaling_objects: list[dict[str, Any]], version: str
) -> None:
    deployment = find(autoscaling_objects, "Deployment", "taskq-stream-trainer")
    assert not schema_errors(deployment, version)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):  # a CRD: checked below
        kubernetes_validate.validate(
            find(autoscaling_objects, "ScaledObject", "taskq-stream-trainer"), version, strict=True
        )


def test_keda_scales_the_stream_trainers_on_the_exported_backlog(
    autoscaling_objects: list[dict[str, Any]],
) -> None:
    from metric_names import EXPOSED_NAMES
    from test_deploy_prometheus import promql_metric_names

    deployment = find(autoscaling_objects, "Deployment", "taskq-stream-trainer")
    scaled = find(autoscaling_objects, "ScaledObject", "taskq-stream-trainer")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert 0 <= scaled["spec"]["minReplicaCount"] < scaled["spec"]["maxReplicaCount"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    meta = trigger["metadata"]
    assert promql_metric_names(meta["query"]) == {"taskq_backlog"} <= EXPOSED_NAMES
    assert float(meta["threshold"]) > 0 and meta["serverAddress"].startswith("http")
    # the trainers work on the stream the query names, which their init container creates
    job = meta["query"].split('job_name="')[1].split('"')[0]
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"][3:7] == ["job", "create", job, "--stream"]
    assert "--exist-ok" in init["command"]
    (trainer,) = pod["containers"]
    assert trainer["command"][:5] == ["/usr/bin/tini", "--", "taskq", "work", job]
    for container in (init, trainer):
        assert container["image"] == IMAGE
        assert {"secretRef": {"name": "taskq-redis"}} in container["envFrom"]
    assert pod["terminationGracePeriodSeconds"] >= 30


def test_stream_trainers_wait_once_the_stream_is_done(
    autoscaling_objects: list[dict[str, Any]],
) -> None:
    """A Deployment restarts an exited container: `taskq work` exiting 0 on a completed
    stream would restart in a loop; `--on-complete wait` keeps it up until scaled away."""
    deployment = find(autoscaling_objects, "Deployment", "taskq-stream-trainer")
    (trainer,) = deployment["spec"]["template"]["spec"]["containers"]
    command = trainer["command"]
    at = command.index("--on-complete")
    assert command[at + 1] == "wait" and at < command.index("--", 2)  # before CMD


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_hpa_and_its_trainers_validate_strictly(
    hpa_objects: list[dict[str, Any]], version: str
) -> None:
    errors = [e for obj in hpa_objects for e in schema_errors(obj, version)]
    assert not errors, "\n".join(errors)
    assert sorted(o["kind"] for o in hpa_objects) == ["Deployment", "HorizontalPodAutoscaler"]


def test_hpa_scales_the_same_trainers_on_the_exported_backlog(
    hpa_objects: list[dict[str, Any]], autoscaling_objects: list[dict[str, Any]]
) -> None:
    from metric_names import EXPOSED_NAMES

    deployment = find(hpa_objects, "Deployment", "taskq-stream-trainer")
    assert deployment == find(autoscaling_objects, "Deployment", "taskq-stream-trainer")
    hpa = find(hpa_objects, "HorizontalPodAutoscaler", "taskq-stream-trainer")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] in EXPOSED_NAMES
    job = metric["external"]["metric"]["selector"]["matchLabels"]["job_name"]
    (trainer,) = deployment["spec"]["template"]["spec"]["containers"]
    assert trainer["command"][3:5] == ["work", job]
    assert float(metric["external"]["target"]["averageValue"]) > 0
