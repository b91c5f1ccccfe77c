"""The Helm chart: `helm lint --strict` and `helm template` with several value sets, every
rendered object validated, the values schema, and the promises the chart makes (native
sidecar, secure defaults, one vllm.args, TLS and basic auth, rules and dashboard files)."""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import tomllib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter import __version__
from exporter.collectors.parsing import parse_vllm_serve_args
from exporter.web import parse_web_config
from tests.deploy.conftest import (
    CHART,
    ROOT,
    K8sTools,
    Manifest,
    by_kind,
    container,
    env_of,
    manifest_errors,
    one,
    run,
)

CI_VALUES = CHART / "ci"
# Each value set is a file under the chart's ci/ folder (chart-testing's convention), or the
# chart's defaults.
VALUE_SETS = {
    "defaults": None,
    **{path.name.removesuffix("-values.yaml"): path for path in sorted(CI_VALUES.glob("*.yaml"))},
}
EXPECTED_KINDS = {
    "defaults": {"PodMonitor", "PrometheusRule", "ConfigMap"},
    "example": {"Deployment", "Service", "PodMonitor", "PrometheusRule", "ConfigMap"},
    "monitoring-all": {
        "Deployment",
        "Service",
        "PodMonitor",
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
    },
    "tls-basic-auth": {
        "Deployment",
        "Service",
        "Secret",
        "PodMonitor",
        "PrometheusRule",
        "ConfigMap",
    },
    "servicemonitor": {"Deployment", "Service", "ServiceMonitor", "PrometheusRule", "ConfigMap"},
    "pod-options": {"Deployment", "Service", "PodMonitor", "PrometheusRule", "ConfigMap"},
    "autoscaling": {
        "Deployment",
        "Service",
        "PodMonitor",
        "PrometheusRule",
        "ConfigMap",
        "ScaledObject",
        "HorizontalPodAutoscaler",
    },
    "sidecar-options": {"Deployment", "Service", "PodMonitor", "PrometheusRule", "ConfigMap"},
}
# The chart's rules rendered with its default values (deploy/monitoring/sync.sh).
RULES_FILE = ROOT / "deploy" / "prometheus" / "kvcap-rules.yaml"
DASHBOARD_FILE = CHART / "files" / "kvcap-dashboard.json"


def value_args(value_set: str) -> list[str | Path]:
    path = VALUE_SETS[value_set]
    return [] if path is None else ["--values", path]


@pytest.fixture(scope="session")
def rendered(k8s_tools: K8sTools) -> Callable[[str], list[Manifest]]:
    """The manifests of a value set, rendered once per session (copies: tests may edit)."""

    @cache
    def render(value_set: str) -> list[Manifest]:
        return k8s_tools.render(*value_args(value_set))

    return lambda value_set: copy.deepcopy(render(value_set))


def pod_spec(manifests: list[Manifest]) -> Manifest:
    spec: Manifest = one(manifests, "Deployment")["spec"]["template"]["spec"]
    return spec


def sidecar_of(manifests: list[Manifest]) -> Manifest:
    return container(pod_spec(manifests)["initContainers"], "kvcap")


def vllm_of(manifests: list[Manifest]) -> Manifest:
    return container(pod_spec(manifests)["containers"], "vllm")


def web_config_of(manifests: list[Manifest]) -> str:
    secret = one(manifests, "Secret")
    text: str = secret["stringData"]["web-config.yml"]
    return text


# --- lint and validation of every value set ----------------------------------------------


def test_every_value_set_is_listed() -> None:
    assert set(VALUE_SETS) == set(EXPECTED_KINDS)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_helm_lint_strict(k8s_tools: K8sTools, value_set: str) -> None:
    result = k8s_tools.helm_lint(*value_args(value_set))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout
    assert "[WARNING]" not in result.stdout
    assert "[ERROR]" not in result.stdout


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_rendered_objects_are_valid(
    rendered: Callable[[str], list[Manifest]], assert_valid: Any, value_set: str
) -> None:
    manifests = rendered(value_set)
    assert {m["kind"] for m in manifests} == EXPECTED_KINDS[value_set]
    assert all(m["metadata"]["namespace"] in {"inference", "monitoring"} for m in manifests)
    assert_valid(manifests)


def test_chart_refuses_kubernetes_without_native_sidecars(k8s_tools: K8sTools) -> None:
    result = run([k8s_tools.helm, "template", "kvcap", CHART, "--kube-version", "1.28.0"])
    assert result.returncode != 0
    assert "kubeVersion" in result.stderr


# --- the validation itself catches mistakes ----------------------------------------------


def _containers(manifest: Manifest) -> list[Manifest]:
    spec = manifest["spec"]["template"]["spec"]
    return [*spec["initContainers"], *spec["containers"]]


INJECTIONS: dict[str, tuple[str, Callable[[Manifest], None], str]] = {
    "deployment-unknown-field": (
        "Deployment",
        lambda m: _containers(m)[0]["securityContext"].update(readOnlyRootFilesytem=True),
        "readOnlyRootFilesytem",
    ),
    "deployment-wrong-type": (
        "Deployment",
        lambda m: next(c for c in _containers(m) if "ports" in c)["ports"][0].update(
            containerPort="9470"
        ),
        "containerPort",
    ),
    "service-unknown-field": (
        "Service",
        lambda m: m["spec"].update(selectors={"a": "b"}),
        "selectors",
    ),
    "configmap-unknown-field": (
        "ConfigMap",
        lambda m: m.update(dat={"a": "b"}),
        "dat",
    ),
    "podmonitor-unknown-field": (
        "PodMonitor",
        lambda m: m["spec"]["podMetricsEndpoints"][0].update(intervall="30s"),
        "intervall",
    ),
    "podmonitor-bad-enum": (
        "PodMonitor",
        lambda m: m["spec"]["podMetricsEndpoints"][0].update(scheme="gopher"),
        "gopher",
    ),
    "servicemonitor-unknown-field": (
        "ServiceMonitor",
        lambda m: m["spec"]["endpoints"][0].update(honorLabel=True),
        "honorLabel",
    ),
    "prometheusrule-unknown-field": (
        "PrometheusRule",
        lambda m: m["spec"]["groups"][0]["rules"][0].update(exp="up"),
        "exp",
    ),
    "prometheusrule-metadata": (
        "PrometheusRule",
        lambda m: m["metadata"].update(label={"a": "b"}),
        "metadata.label",
    ),
}


@pytest.mark.parametrize("case", INJECTIONS)
def test_validation_catches_an_injected_mistake(
    rendered: Callable[[str], list[Manifest]], tmp_path: Path, case: str
) -> None:
    kind, inject, needle = INJECTIONS[case]
    target = by_kind(rendered("monitoring-all"), kind)[0]
    assert not manifest_errors([target], tmp_path)
    inject(target)
    errors = manifest_errors([target], tmp_path)
    assert any(needle in error for error in errors), errors


# --- values.schema.json and the chart's own checks ------------------------------------------

BAD_VALUES = {
    "unknown-key": (["--set", "podMonitor.enabledd=true"], "enabledd"),
    "unknown-top-level-key": (["--set", "sidecars.port=1"], "sidecars"),
    "pull-policy": (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
    "args-as-string": (["--set-string", "vllm.args=Qwen/Qwen3-0.6B -tp 2"], "args"),
    "port-range": (["--set", "sidecar.port=70000"], "port"),
    "handshake-on-pod-ip": (["--set", "handshake.endpoint=tcp://0.0.0.0:9471"], "endpoint"),
    "plain-password": (["--set", "web.basicAuth.users.prometheus=secret"], "prometheus"),
    "log-level": (["--set", "sidecar.logLevel=trace"], "logLevel"),
    "probe-timeout": (["--set", "sidecar.probes.liveness.timeoutSeconds=0"], "timeoutSeconds"),
    "resources-key": (["--set", "sidecar.resources.request.cpu=1"], "request"),
}


@pytest.mark.parametrize("case", BAD_VALUES)
def test_values_schema_rejects(k8s_tools: K8sTools, case: str) -> None:
    args, needle = BAD_VALUES[case]
    template = k8s_tools.helm_template(*args)
    assert template.returncode != 0
    assert "schema" in template.stderr, template.stderr
    assert needle in template.stderr, template.stderr
    assert k8s_tools.helm_lint(*args).returncode != 0


def test_values_schema_is_strict() -> None:
    """Every object the chart defines refuses unknown keys; only Kubernetes pass-throughs
    (validated by kubernetes-validate once rendered) and label maps are open."""
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    open_objects = []

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, path
            for name, child in node["properties"].items():
                walk(child, f"{path}.{name}")
        elif node.get("type") == "object":
            open_objects.append(path)

    walk(schema, "")
    alert_labels = {
        p for p in open_objects if re.fullmatch(r"\.prometheusRule\.alerts\.\w+\.labels", p)
    }
    assert len(alert_labels) == len(
        schema["properties"]["prometheusRule"]["properties"]["alerts"]["properties"]
    )
    assert set(open_objects) - alert_labels <= {
        ".global",
        ".podAnnotations",
        ".podLabels",
        ".plugin.resources.requests",
        ".plugin.resources.limits",
        ".sidecar.collectors",
        ".sidecar.resources.requests",
        ".sidecar.resources.limits",
        ".sidecar.securityContext",
        ".web.basicAuth.users",
        ".scrape.podSelector",
        ".scrape.tlsConfig",
        ".podMonitor.labels",
        ".podMonitor.namespaceSelector",
        ".serviceMonitor.labels",
        ".prometheusRule.labels",
        ".prometheusRule.alertLabels",
        ".dashboard.labels",
        ".dashboard.annotations",
        ".example.resources",
        ".example.securityContext",
        ".example.modelVolume",
        ".example.nodeSelector",
        ".example.affinity",
        ".autoscaling.hpa.behavior",
    }


def test_values_yaml_matches_its_schema_and_every_key_is_documented() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    assert set(values) == set(schema["properties"]) - {"global"}


CHECKS = {
    "tls-without-secret": (["--set", "web.tls.enabled=true"], "web.tls.secretName"),
    "basic-auth-without-users": (["--set", "web.basicAuth.enabled=true"], "web.basicAuth.users"),
    "basic-auth-without-scrape-secret": (
        [
            "--set",
            "web.basicAuth.enabled=true",
            "--set",
            "web.basicAuth.users.p=$2b$10$iW5edYnMvU6lrJMWKoGIOegVXVphHPfXfzMEX3nwhSn4PcygoFaYy",
        ],
        "scrape.basicAuthSecret.name",
    ),
}


@pytest.mark.parametrize("case", CHECKS)
def test_chart_refuses_incomplete_security_settings(k8s_tools: K8sTools, case: str) -> None:
    args, needle = CHECKS[case]
    result = k8s_tools.helm_template(*args)
    assert result.returncode != 0
    assert needle in result.stderr, result.stderr


# --- the sidecar --------------------------------------------------------------------------


def test_sidecar_is_a_native_sidecar_with_secure_defaults(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    manifests = rendered("example")
    spec = pod_spec(manifests)
    sidecar = sidecar_of(manifests)
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == f"ghcr.io/kvcap/kvcap-exporter:{__version__}"
    assert sidecar["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert sidecar["resources"] == {
        "requests": {"cpu": "10m", "memory": "48Mi"},
        "limits": {"memory": "128Mi"},
    }
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sidecar["ports"] == [{"name": "kvcap-metrics", "containerPort": 9470, "protocol": "TCP"}]
    assert "--web.listen-address=:9470" in sidecar["args"]
    assert "--vllm.url=http://127.0.0.1:8000" in sidecar["args"]
    timing = ("periodSeconds", "timeoutSeconds", "failureThreshold")
    for probe, path, expected_timing in (
        ("startupProbe", "/healthz", (1, 2, 30)),
        ("livenessProbe", "/healthz", (20, 3, 3)),
        ("readinessProbe", "/readyz", (10, 3, 3)),
    ):
        action = sidecar[probe]["httpGet"]
        assert action == {"path": path, "port": "kvcap-metrics", "scheme": "HTTP"}
        assert tuple(sidecar[probe][t] for t in timing) == expected_timing
    # The sidecar mounts the model read-only where vLLM has it.
    model_mount = {"name": "models", "mountPath": "/models", "readOnly": True}
    assert model_mount in sidecar["volumeMounts"]
    assert {"name": "models", "mountPath": "/models"} in vllm_of(manifests)["volumeMounts"]


@pytest.mark.parametrize("value_set", ["example", "sidecar-options"])
def test_one_vllm_args_value_for_both_containers(
    rendered: Callable[[str], list[Manifest]], value_set: str
) -> None:
    manifests = rendered(value_set)
    path = VALUE_SETS[value_set]
    assert path is not None
    given = yaml.safe_load(path.read_text(encoding="utf-8")).get("vllm", {}).get("args")
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    expected = [str(a) for a in (given or defaults["vllm"]["args"])]
    assert vllm_of(manifests)["command"] == ["vllm", "serve"]
    assert vllm_of(manifests)["args"] == expected
    as_string = env_of(sidecar_of(manifests))["KVCAP_VLLM_ARGS"]
    assert shlex.split(as_string) == expected
    assert parse_vllm_serve_args(as_string).model == expected[0]


def test_vllm_args_quoting_round_trips(k8s_tools: K8sTools, tmp_path: Path) -> None:
    awkward = [
        "/models/m",
        "--chat-template",
        "{% if x %}'it's'{% endif %}",
        "--override-generation-config",
        '{"temperature": 0.6}',
        "",
        "a b\tc\nd",
        "$HOME `id` \\ ! *",
        "--max-model-len=32k",
    ]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"example": {"enabled": True}, "vllm": {"args": awkward}}))
    manifests = k8s_tools.render("--values", values)
    assert vllm_of(manifests)["args"] == awkward
    assert shlex.split(env_of(sidecar_of(manifests))["KVCAP_VLLM_ARGS"]) == awkward


@pytest.mark.parametrize("value_set", ["example", "sidecar-options"])
def test_handshake_is_wired_between_the_containers(
    rendered: Callable[[str], list[Manifest]], value_set: str
) -> None:
    manifests = rendered(value_set)
    spec = pod_spec(manifests)
    sidecar, vllm = sidecar_of(manifests), vllm_of(manifests)
    endpoint = env_of(sidecar)["KVCAP_HANDSHAKE_LISTEN"]
    assert env_of(vllm)["KVCAP_HANDSHAKE_ENDPOINT"] == endpoint
    volumes = {v["name"]: v for v in spec["volumes"]}
    if endpoint.startswith("ipc://"):
        socket_dir = str(Path(endpoint.removeprefix("ipc://")).parent)
        assert socket_dir == "/run/kvcap"
        mount = {"name": "kvcap-run", "mountPath": socket_dir}
        assert mount in sidecar["volumeMounts"]
        assert mount in vllm["volumeMounts"]
        assert volumes["kvcap-run"]["emptyDir"]["medium"] == "Memory"
    else:
        assert endpoint == "tcp://127.0.0.1:9471"
        assert "kvcap-run" not in volumes


def test_sidecar_options(rendered: Callable[[str], list[Manifest]]) -> None:
    manifests = rendered("sidecar-options")
    sidecar = sidecar_of(manifests)
    assert sidecar["image"].startswith("ghcr.io/kvcap/kvcap-exporter@sha256:")
    assert sidecar["args"] == [
        "--web.listen-address=:9470",
        "--log.level=debug",
        "--log.format=json",
        "--collector.vllm_http",
        "--vllm.url=http://127.0.0.1:8080",
        "--model.config=/models/llama/config.json",
        "--nvml.visible-devices=GPU-8932f937,GPU-1b2c3d4e",
        "--vllm.poll-interval=2",
    ]
    env = env_of(sidecar)
    assert env["TZ"] == "UTC"
    # NVML without a GPU request (docs/nvml.md).
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "resources" not in sidecar or "nvidia.com/gpu" not in str(sidecar["resources"])
    assert pod_spec(manifests)["runtimeClassName"] == "nvidia"
    assert "volumeMounts" not in sidecar  # TCP handshake, no model volume
    assert one(manifests, "PodMonitor")["spec"]["selector"]["matchLabels"] == {"app": "llama"}
    assert one(manifests, "PodMonitor")["metadata"]["name"] == "llama-kvcap"


def test_collectors_handshake_and_args_switched_off(k8s_tools: K8sTools, assert_valid: Any) -> None:
    manifests = k8s_tools.render(
        "--set",
        "example.enabled=true",
        "--set",
        "handshake.enabled=false",
        "--set",
        "sidecar.collectors.nvml=false",
        "--set-json",
        "vllm.args=[]",
    )
    assert_valid(manifests)
    sidecar, vllm = sidecar_of(manifests), vllm_of(manifests)
    # No arguments: vLLM runs the image's defaults, the sidecar reads /proc if it can.
    assert "args" not in vllm
    assert "KVCAP_VLLM_ARGS" not in env_of(sidecar)
    assert "--no-collector.handshake" in sidecar["args"]
    assert "--no-collector.nvml" in sidecar["args"]
    assert "KVCAP_HANDSHAKE_LISTEN" not in env_of(sidecar)
    assert "KVCAP_HANDSHAKE_ENDPOINT" not in env_of(vllm)
    assert "kvcap-run" not in {v["name"] for v in pod_spec(manifests)["volumes"]}


# --- TLS and basic auth ------------------------------------------------------------------


def test_tls_and_basic_auth_are_wired_through_a_secret(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    manifests = rendered("tls-basic-auth")
    config = parse_web_config(web_config_of(manifests), base_dir=Path("/etc/kvcap/web"))
    assert config.tls is not None
    assert config.tls.cert_file == Path("/etc/kvcap/tls/tls.crt")
    assert config.tls.client_ca_file == Path("/etc/kvcap/tls/ca.crt")
    assert config.tls.client_auth_type == "VerifyClientCertIfGiven"
    assert config.tls.min_version == "TLS13"
    assert set(config.basic_auth_users) == {"prometheus", "probe"}

    spec, sidecar = pod_spec(manifests), sidecar_of(manifests)
    secret_name = one(manifests, "Secret")["metadata"]["name"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["kvcap-web-config"]["secret"]["secretName"] == secret_name
    assert volumes["kvcap-tls"]["secret"]["secretName"] == "kvcap-tls"
    assert "--web.config.file=/etc/kvcap/web/web-config.yml" in sidecar["args"]
    mounts = {m["mountPath"]: m for m in sidecar["volumeMounts"]}
    assert mounts["/etc/kvcap/web"]["readOnly"]
    assert mounts["/etc/kvcap/tls"]["readOnly"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        action = sidecar[probe]["httpGet"]
        assert action["scheme"] == "HTTPS"
        assert action["httpHeaders"][0]["name"] == "Authorization"
    # A changed web config rolls the pods.
    annotations = one(manifests, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/web-config"])

    endpoint = one(manifests, "PodMonitor")["spec"]["podMetricsEndpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "kvcap-tls", "key": "ca.crt"}},
        "serverName": "kvcap",
    }
    assert endpoint["basicAuth"] == {
        "username": {"name": "kvcap-scrape-auth", "key": "username"},
        "password": {"name": "kvcap-scrape-auth", "key": "password"},
    }


@pytest.mark.parametrize(
    "settings",
    [
        ["--set-json", "sidecar.probes.httpHeaders=[]"],
        ["--set", "web.tls.clientAuthType=RequireAndVerifyClientCert"],
    ],
    ids=["basic-auth-without-probe-headers", "client-certificate-required"],
)
def test_probes_fall_back_to_tcp_when_kubelet_cannot_authenticate(
    k8s_tools: K8sTools, assert_valid: Any, settings: list[str]
) -> None:
    manifests = k8s_tools.render("--values", CI_VALUES / "tls-basic-auth-values.yaml", *settings)
    assert_valid(manifests)
    sidecar = sidecar_of(manifests)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert sidecar[probe]["tcpSocket"] == {"port": "kvcap-metrics"}
        assert "httpGet" not in sidecar[probe]


def test_existing_web_config_secret(k8s_tools: K8sTools, assert_valid: Any) -> None:
    manifests = k8s_tools.render(
        "--set",
        "example.enabled=true",
        "--set",
        "web.existingSecret=my-web-config",
        "--set",
        "web.tls.enabled=true",
        "--set",
        "scrape.tlsConfig.insecureSkipVerify=true",
    )
    assert_valid(manifests)
    assert not by_kind(manifests, "Secret")
    volumes = {v["name"]: v for v in pod_spec(manifests)["volumes"]}
    assert volumes["kvcap-web-config"]["secret"]["secretName"] == "my-web-config"
    assert "kvcap-tls" not in volumes
    endpoint = one(manifests, "PodMonitor")["spec"]["podMetricsEndpoints"][0]
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}


# --- monitors, rules, dashboard -----------------------------------------------------------


@pytest.mark.parametrize("value_set", ["example", "monitoring-all", "servicemonitor"])
def test_monitors_select_the_pods_with_the_sidecar(
    rendered: Callable[[str], list[Manifest]], value_set: str
) -> None:
    manifests = rendered(value_set)
    pod_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    for monitor in by_kind(manifests, "PodMonitor"):
        assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "kvcap-metrics"
        # Prometheus Operator names the job after the PodMonitor; the rules' exporter-down
        # alert matches jobs like .*kvcap.*.
        assert "kvcap" in monitor["metadata"]["name"]
    for monitor in by_kind(manifests, "ServiceMonitor"):
        services = [
            s
            for s in by_kind(manifests, "Service")
            if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        ]
        assert len(services) == 1
        service = services[0]
        assert "kvcap" in service["metadata"]["name"]
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert service["spec"]["ports"][0]["name"] == monitor["spec"]["endpoints"][0]["port"]
        assert service["spec"]["ports"][0]["targetPort"] == 9470


def test_prometheus_rule_is_the_rules_file(rendered: Callable[[str], list[Manifest]]) -> None:
    rule = one(rendered("defaults"), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
    labelled = one(rendered("monitoring-all"), "PrometheusRule")
    assert labelled["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_dashboard_configmap_is_the_dashboard_file(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    configmap = one(rendered("defaults"), "ConfigMap")
    assert configmap["data"] == {"kvcap-dashboard.json": DASHBOARD_FILE.read_text(encoding="utf-8")}
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    elsewhere = one(rendered("monitoring-all"), "ConfigMap")
    assert elsewhere["metadata"]["namespace"] == "monitoring"
    assert elsewhere["metadata"]["annotations"] == {"grafana_folder": "kvcap"}


def test_monitoring_toggles_off(k8s_tools: K8sTools) -> None:
    off = ["podMonitor", "serviceMonitor", "prometheusRule", "dashboard"]
    result = k8s_tools.helm_template(*[a for t in off for a in ("--set", f"{t}.enabled=false")])
    assert result.returncode == 0, result.stderr
    assert not yaml.safe_load(result.stdout or "null")


# --- versions -----------------------------------------------------------------------------


def test_chart_image_and_package_versions_agree() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert chart["appVersion"] == values["image"]["tag"] == project["version"] == __version__
    assert chart["kubeVersion"] == ">=1.29.0-0"


# --- the named template, from another chart -----------------------------------------------

PARENT_TEMPLATE = """\
{{- $kvcap := dict "values" (index .Values "kvcap-exporter") "root" $ }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: my-vllm
spec:
  selector:
    matchLabels:
      app: my-vllm
  template:
    metadata:
      labels:
        app: my-vllm
        {{- include "kvcap-exporter.podLabels" $kvcap | nindent 8 }}
    spec:
      automountServiceAccountToken: false
      initContainers:
        {{- include "kvcap-exporter.sidecar" $kvcap | nindent 8 }}
      containers:
        - name: vllm
          image: my-registry/vllm-openai:kvcap
          args: {{ toJson (index .Values "kvcap-exporter").vllm.args }}
          env:
            {{- include "kvcap-exporter.vllmEnv" $kvcap | nindent 12 }}
          volumeMounts:
            - name: models
              mountPath: /models
            {{- include "kvcap-exporter.vllmVolumeMounts" $kvcap | nindent 12 }}
      volumes:
        - name: models
          persistentVolumeClaim:
            claimName: models
        {{- include "kvcap-exporter.volumes" $kvcap | nindent 8 }}
"""


def test_another_chart_includes_the_sidecar(
    k8s_tools: K8sTools,
    rendered: Callable[[str], list[Manifest]],
    assert_valid: Any,
    tmp_path: Path,
) -> None:
    parent = tmp_path / "my-inference"
    (parent / "templates").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: my-inference\nversion: 1.0.0\n"
        "dependencies:\n  - name: kvcap-exporter\n    version: 0.1.0\n"
    )
    (parent / "values.yaml").write_text(
        yaml.safe_dump({"kvcap-exporter": {"vllm": {"args": ["/models/m", "-tp", "2"]}}})
    )
    (parent / "templates" / "vllm.yaml").write_text(PARENT_TEMPLATE)
    shutil.copytree(CHART, parent / "charts" / "kvcap-exporter")

    manifests = k8s_tools.render(chart=parent)
    assert_valid(manifests)
    # The pod the parent built carries the same sidecar as the chart's own example, and
    # the chart's PodMonitor (rendered as the subchart) selects it.
    mine, theirs = sidecar_of(rendered("example")), sidecar_of(manifests)
    assert env_of(theirs)["KVCAP_VLLM_ARGS"] == "/models/m -tp 2"  # the parent's vllm.args
    del mine["env"], theirs["env"]
    assert theirs == mine
    pod_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    selector = one(manifests, "PodMonitor")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
