"""The kustomize manifests under deploy/: each build validated, the sidecar component on a
Deployment of one's own, the ServiceMonitor variant, the copies of the chart's rules and
dashboard, and agreement with what the Helm chart renders."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import (
    CHART,
    DEPLOY,
    K8sTools,
    Manifest,
    by_kind,
    container,
    env_of,
    one,
    run,
)

MONITORING = DEPLOY / "monitoring"
BUILDS = {
    "base": (
        DEPLOY / "base",
        {"Deployment", "Service", "ConfigMap", "PodMonitor", "PrometheusRule"},
    ),
    "servicemonitor": (
        DEPLOY / "servicemonitor",
        {"Deployment", "Service", "ConfigMap", "ServiceMonitor", "PrometheusRule"},
    ),
    "add-sidecar": (DEPLOY / "examples" / "add-sidecar", {"Deployment", "PodMonitor"}),
    "monitoring": (MONITORING, {"ConfigMap", "PrometheusRule"}),
}


def build(k8s_tools: K8sTools, name: str) -> list[Manifest]:
    return k8s_tools.kustomize(BUILDS[name][0])


def pod_spec(deployment: Manifest) -> Manifest:
    spec: Manifest = deployment["spec"]["template"]["spec"]
    return spec


def sidecar_of(deployment: Manifest) -> Manifest:
    return container(pod_spec(deployment)["initContainers"], "kvcap")


def vllm_of(deployment: Manifest) -> Manifest:
    return container(pod_spec(deployment)["containers"], "vllm")


@pytest.mark.parametrize("name", BUILDS)
def test_kustomize_build_is_valid(k8s_tools: K8sTools, assert_valid: Any, name: str) -> None:
    manifests = build(k8s_tools, name)
    assert {m["kind"] for m in manifests} == BUILDS[name][1]
    assert_valid(manifests)


# --- deploy/base --------------------------------------------------------------------------


def test_base_runs_the_sidecar_as_a_native_sidecar(k8s_tools: K8sTools) -> None:
    deployment = one(build(k8s_tools, "base"), "Deployment")
    spec = pod_spec(deployment)
    sidecar, vllm = sidecar_of(deployment), vllm_of(deployment)
    assert sidecar["restartPolicy"] == "Always"
    assert [c["name"] for c in spec["containers"]] == ["vllm"]
    assert spec["automountServiceAccountToken"] is False
    assert "--vllm.url=http://127.0.0.1:8000" in sidecar["args"]
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in vllm["ports"]
    # The handshake: the plugin in vLLM connects where the sidecar binds, in a shared
    # in-memory emptyDir.
    endpoint = "ipc:///run/kvcap/handshake.sock"
    assert env_of(sidecar)["KVCAP_HANDSHAKE_LISTEN"] == endpoint
    assert env_of(vllm)["KVCAP_HANDSHAKE_ENDPOINT"] == endpoint
    socket_mount = {"name": "kvcap-run", "mountPath": "/run/kvcap"}
    assert socket_mount in sidecar["volumeMounts"]
    assert socket_mount in vllm["volumeMounts"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["kvcap-run"] == {
        "name": "kvcap-run",
        "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"},
    }
    # The model directory, read-only for the sidecar at vLLM's path.
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in sidecar["volumeMounts"]
    assert {"name": "models", "mountPath": "/models"} in vllm["volumeMounts"]
    assert "models" in volumes


def fake_vllm(tmp_path: Path) -> dict[str, str]:
    """An environment whose `vllm` prints its arguments as JSON."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "vllm"
    script.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.parametrize(
    "vllm_args",
    [
        None,  # the ConfigMap's own value
        "/models/m --served-model-name 'my model' --override-generation-config "
        '\'{"temperature": 0.6}\' --chat-template "it\'s" -tp 2',
    ],
    ids=["base-value", "quoted-arguments"],
)
def test_both_containers_get_the_same_vllm_arguments(
    k8s_tools: K8sTools, tmp_path: Path, vllm_args: str | None
) -> None:
    """The one string in the vllm-args ConfigMap: vLLM's shell command splits it exactly as
    the sidecar's shlex does."""
    manifests = build(k8s_tools, "base")
    deployment = one(manifests, "Deployment")
    sidecar, vllm = sidecar_of(deployment), vllm_of(deployment)
    configmap = next(m for m in by_kind(manifests, "ConfigMap") if "VLLM_ARGS" in m["data"])
    reference = {"name": configmap["metadata"]["name"], "key": "VLLM_ARGS"}
    assert env_of(vllm)["VLLM_ARGS"] == {"configMapKeyRef": reference}
    assert env_of(sidecar)["KVCAP_VLLM_ARGS"] == {
        "configMapKeyRef": {**reference, "optional": True}
    }
    value = configmap["data"]["VLLM_ARGS"] if vllm_args is None else vllm_args
    assert vllm["command"][:2] == ["/bin/sh", "-c"]
    started = subprocess.run(
        vllm["command"],
        env={**fake_vllm(tmp_path), "VLLM_ARGS": value},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert json.loads(started.stdout) == ["serve", *shlex.split(value)]


def test_pod_monitor_scrapes_the_sidecar_port(k8s_tools: K8sTools) -> None:
    manifests = build(k8s_tools, "base")
    deployment, monitor = one(manifests, "Deployment"), one(manifests, "PodMonitor")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] in {p["name"] for p in sidecar_of(deployment)["ports"]}
    assert "kvcap" in monitor["metadata"]["name"]  # the job name the rules match


def test_the_kustomize_sidecar_matches_the_helm_one(k8s_tools: K8sTools) -> None:
    ours = sidecar_of(one(build(k8s_tools, "base"), "Deployment"))
    helm = sidecar_of(one(k8s_tools.render("--set", "example.enabled=true"), "Deployment"))
    for field in ("name", "image", "restartPolicy", "ports", "resources", "securityContext"):
        assert ours[field] == helm[field], field
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        # Helm spells out the default scheme.
        assert ours[probe]["httpGet"] == {
            k: v for k, v in helm[probe]["httpGet"].items() if k != "scheme"
        }
        assert {k: v for k, v in ours[probe].items() if k != "httpGet"} == {
            k: v for k, v in helm[probe].items() if k != "httpGet"
        }
    for arg in ("--web.listen-address=:9470", "--vllm.url=http://127.0.0.1:8000"):
        assert arg in ours["args"]
        assert arg in helm["args"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert ours["image"].endswith(f":{chart['appVersion']}")


# --- the component on a Deployment of one's own --------------------------------------------


def test_component_adds_the_sidecar_to_an_existing_deployment(k8s_tools: K8sTools) -> None:
    manifests = build(k8s_tools, "add-sidecar")
    deployment = one(manifests, "Deployment")
    spec = pod_spec(deployment)
    vllm = vllm_of(deployment)
    assert [c["name"] for c in spec["containers"]] == ["vllm"]
    assert vllm["args"][:3] == ["/models/Llama-3.1-8B-Instruct", "--served-model-name", "llama"]
    assert sidecar_of(deployment)["restartPolicy"] == "Always"
    assert spec["shareProcessNamespace"] is True  # --vllm.args from /proc
    assert env_of(vllm)["KVCAP_HANDSHAKE_ENDPOINT"] == "ipc:///run/kvcap/handshake.sock"
    selector = one(manifests, "PodMonitor")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_component_patches_only_labelled_deployments(k8s_tools: K8sTools, tmp_path: Path) -> None:
    def deployment(name: str, labels: dict[str, str]) -> Manifest:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
                },
            },
        }

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "deployments.yaml").write_text(
        yaml.safe_dump_all(
            [
                deployment("served", {"kvcap-exporter/inject": "true"}),
                deployment("router", {}),
            ]
        )
    )
    component = os.path.relpath(DEPLOY / "components" / "kvcap-sidecar", overlay)
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["deployments.yaml"], "components": [component]})
    )
    deployments = {
        d["metadata"]["name"]: d for d in by_kind(k8s_tools.kustomize(overlay), "Deployment")
    }
    assert "initContainers" in pod_spec(deployments["served"])
    assert "initContainers" not in pod_spec(deployments["router"])
    assert "env" not in pod_spec(deployments["router"])["containers"][0]


def _one_deployment_overlay(tmp_path: Path, containers: list[Manifest], **meta: Any) -> Path:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "served", "labels": {"kvcap-exporter/inject": "true"}, **meta},
        "spec": {
            "selector": {"matchLabels": {"app": "served"}},
            "template": {
                "metadata": {"labels": {"app": "served"}},
                "spec": {"containers": containers},
            },
        },
    }
    (overlay / "deployment.yaml").write_text(yaml.safe_dump(deployment))
    component = os.path.relpath(DEPLOY / "components" / "kvcap-sidecar", overlay)
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["deployment.yaml"], "components": [component]})
    )
    return overlay


def test_component_patches_the_first_container_whatever_its_name(
    k8s_tools: K8sTools, assert_valid: Any, tmp_path: Path
) -> None:
    """vLLM's container need not be called vllm: the first one gets the plugin and the
    handshake, no second, empty container appears, and what it had is kept."""
    overlay = _one_deployment_overlay(
        tmp_path,
        [
            {
                "name": "server",
                "image": "vllm/vllm-openai",
                "env": [{"name": "HF_HOME", "value": "/data"}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            },
            {"name": "proxy", "image": "envoyproxy/envoy"},
        ],
    )
    manifests = k8s_tools.kustomize(overlay)
    assert_valid(manifests)
    spec = pod_spec(one(manifests, "Deployment"))
    assert [c["name"] for c in spec["containers"]] == ["server", "proxy"]
    server, proxy = spec["containers"]
    assert env_of(server) == {
        "HF_HOME": "/data",
        "KVCAP_HANDSHAKE_ENDPOINT": "ipc:///run/kvcap/handshake.sock",
        "PYTHONPATH": "/opt/kvcap-plugin",
    }
    assert server["volumeMounts"] == [
        {"name": "data", "mountPath": "/data"},
        {"name": "kvcap-run", "mountPath": "/run/kvcap"},
        {"name": "kvcap-plugin", "mountPath": "/opt/kvcap-plugin", "readOnly": True},
    ]
    assert proxy == {"name": "proxy", "image": "envoyproxy/envoy"}
    assert [c["name"] for c in spec["initContainers"]] == ["kvcap-plugin", "kvcap"]
    volumes = {v["name"] for v in spec["volumes"]}
    assert {"kvcap-run", "kvcap-plugin"} <= volumes


def test_component_leaves_the_first_container_alone_when_vllms_is_named(
    k8s_tools: K8sTools, tmp_path: Path
) -> None:
    """With kvcap-exporter/container the first container is not patched (the named one
    is, by the replacements the post-renderer writes: tests/deploy/test_post_renderer.py)."""
    overlay = _one_deployment_overlay(
        tmp_path,
        [{"name": "proxy", "image": "envoyproxy/envoy"}, {"name": "engine", "image": "vllm"}],
        annotations={"kvcap-exporter/container": "engine"},
    )
    spec = pod_spec(one(k8s_tools.kustomize(overlay), "Deployment"))
    assert spec["containers"] == [
        {"name": "proxy", "image": "envoyproxy/envoy"},
        {"name": "engine", "image": "vllm"},
    ]
    assert [c["name"] for c in spec["initContainers"]] == ["kvcap-plugin", "kvcap"]


def test_one_label_scheme_for_helm_and_kustomize(k8s_tools: K8sTools) -> None:
    """The chart's monitors of `helm install kvcap` select the pods the component patched,
    and the component's monitor selects the chart's example pods."""
    kustomized = one(build(k8s_tools, "base"), "Deployment")["spec"]["template"]["metadata"]
    helm = k8s_tools.render("--set", "example.enabled=true")
    helm_pods = one(helm, "Deployment")["spec"]["template"]["metadata"]["labels"]
    helm_selector = one(helm, "PodMonitor")["spec"]["selector"]["matchLabels"]
    ours = one(build(k8s_tools, "base"), "PodMonitor")["spec"]["selector"]["matchLabels"]
    assert helm_selector == ours == {"kvcap-exporter/instance": "kvcap"}
    assert helm_selector.items() <= kustomized["labels"].items()
    assert ours.items() <= helm_pods.items()


def test_component_pod_monitor_scrapes_vllm_too(k8s_tools: K8sTools) -> None:
    manifests = build(k8s_tools, "base")
    endpoints = one(manifests, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in endpoints] == ["kvcap-metrics", "http"]
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in vllm_of(
        one(manifests, "Deployment")
    )["ports"]
    assert endpoints[1]["relabelings"] == [{"targetLabel": "job", "replacement": "vllm"}]
    helm = one(k8s_tools.render(), "PodMonitor")["spec"]["podMetricsEndpoints"][1]
    assert {k: v for k, v in helm.items() if k != "scheme"} == endpoints[1]


# --- the ServiceMonitor variant ----------------------------------------------------------


def test_servicemonitor_variant_replaces_the_pod_monitor(k8s_tools: K8sTools) -> None:
    manifests = build(k8s_tools, "servicemonitor")
    assert not by_kind(manifests, "PodMonitor")
    deployment, monitor = one(manifests, "Deployment"), one(manifests, "ServiceMonitor")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selected = [
        s
        for s in by_kind(manifests, "Service")
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert len(selected) == 1
    service = selected[0]
    assert "kvcap" in service["metadata"]["name"]  # Prometheus Operator's job name
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    port = service["spec"]["ports"][0]
    assert port["name"] == monitor["spec"]["endpoints"][0]["port"]
    assert port["targetPort"] == sidecar_of(deployment)["ports"][0]["containerPort"]


# --- the rules and dashboard, copied from the chart -----------------------------------------


def test_dashboard_copy_is_identical_to_the_chart_file() -> None:
    copy = (MONITORING / "kvcap-dashboard.json").read_bytes()
    assert copy == (CHART / "files" / "kvcap-dashboard.json").read_bytes(), (
        "run deploy/monitoring/sync.sh"
    )


def test_generated_files_are_what_sync_writes(k8s_tools: K8sTools, tmp_path: Path) -> None:
    """deploy/prometheus/kvcap-rules.yaml and deploy/monitoring/prometheusrule.yaml are the
    chart's rules rendered with its defaults, byte for byte as sync.sh writes them."""
    env = {**os.environ, "HELM": str(k8s_tools.helm)}
    result = run(["sh", MONITORING / "sync.sh", tmp_path], env=env)
    assert result.returncode == 0, result.stderr
    for committed in (
        MONITORING / "prometheusrule.yaml",
        MONITORING / "kvcap-dashboard.json",
        DEPLOY / "prometheus" / "kvcap-rules.yaml",
    ):
        assert committed.read_bytes() == (tmp_path / committed.name).read_bytes(), (
            f"{committed.relative_to(DEPLOY)} is out of date: run deploy/monitoring/sync.sh"
        )
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text(encoding="utf-8"))
    rules = yaml.safe_load((DEPLOY / "prometheus" / "kvcap-rules.yaml").read_text("utf-8"))
    assert rule["spec"] == rules == one(k8s_tools.render(), "PrometheusRule")["spec"]


def test_monitoring_objects(k8s_tools: K8sTools) -> None:
    manifests = build(k8s_tools, "monitoring")
    dashboard = one(manifests, "ConfigMap")
    assert dashboard["metadata"]["name"] == "kvcap-dashboard"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    expected = (CHART / "files" / "kvcap-dashboard.json").read_text(encoding="utf-8")
    assert dashboard["data"] == {"kvcap-dashboard.json": expected}
    rule = one(manifests, "PrometheusRule")
    helm_rule = one(k8s_tools.render(), "PrometheusRule")
    assert rule["spec"] == helm_rule["spec"]
