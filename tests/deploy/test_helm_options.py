"""The chart's names, pod options, the plugin from the sidecar image, the scrape of vLLM's
own /metrics, and NOTES.txt (its release-label warning, and its curl run against a real
HTTPS server with basic auth)."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import bcrypt
import pytest
import yaml

from exporter.web import Request, Response, WebServer
from tests.deploy.conftest import CHART, K8sTools, Manifest, by_kind, container, env_of, one, run
from tests.support.certificates import certificate, new_key, write_certificate, write_key
from tests.tools import require_tool

CI_VALUES = CHART / "ci"


def pod_spec(manifests: list[Manifest]) -> Manifest:
    spec: Manifest = one(manifests, "Deployment")["spec"]["template"]["spec"]
    return spec


def names(manifests: list[Manifest]) -> dict[str, str]:
    return {m["kind"]: m["metadata"]["name"] for m in manifests if m["kind"] != "Service"} | {
        f"Service/{m['metadata'].get('labels', {}).get('app.kubernetes.io/component')}": m[
            "metadata"
        ]["name"]
        for m in by_kind(manifests, "Service")
    }


# --- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "override", "fullname"),
    [
        ("kvcap", "", "kvcap"),  # the README's `helm install kvcap`
        ("kvcap-exporter", "", "kvcap-exporter"),
        ("team-a-kvcap", "", "team-a-kvcap"),
        ("prod", "", "prod-kvcap-exporter"),
        ("prod", "llama-kvcap", "llama-kvcap"),
    ],
)
def test_names_follow_the_release_and_fullname_override(
    k8s_tools: K8sTools, release: str, override: str, fullname: str
) -> None:
    args = ["--set", "example.enabled=true", "--set", "serviceMonitor.enabled=true"]
    if override:
        args += ["--set", f"fullnameOverride={override}"]
    result = k8s_tools.helm_template(*args, release=release)
    assert result.returncode == 0, result.stderr
    manifests = [m for m in yaml.safe_load_all(result.stdout) if m]
    assert names(manifests) == {
        "Deployment": f"{fullname}-vllm",
        "PodMonitor": fullname,
        "ServiceMonitor": fullname,
        "PrometheusRule": fullname,
        "ConfigMap": f"{fullname}-dashboard",
        "Service/vllm": f"{fullname}-vllm",
        "Service/metrics": f"{fullname}-metrics",
    }
    selector = one(manifests, "PodMonitor")["spec"]["selector"]["matchLabels"]
    assert selector == {"kvcap-exporter/instance": fullname}


# --- the example pod's options ---------------------------------------------------------------


def test_pod_options_reach_the_example_pod(k8s_tools: K8sTools) -> None:
    manifests = k8s_tools.render("--values", CI_VALUES / "pod-options-values.yaml")
    values = yaml.safe_load((CI_VALUES / "pod-options-values.yaml").read_text(encoding="utf-8"))
    template = one(manifests, "Deployment")["spec"]["template"]
    spec = template["spec"]
    assert spec["imagePullSecrets"] == [{"name": "my-registry"}]
    assert spec["priorityClassName"] == "inference-high"
    assert template["metadata"]["annotations"] == values["podAnnotations"]
    assert template["metadata"]["labels"]["team"] == "inference"
    # The chart's own labels stay: the Deployment's selector and the monitors' label.
    assert template["metadata"]["labels"]["kvcap-exporter/instance"] == "inference-kvcap"
    for field in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints"):
        assert spec[field] == values["example"][field], field


def test_pod_options_are_absent_by_default(k8s_tools: K8sTools) -> None:
    spec = pod_spec(k8s_tools.render("--set", "example.enabled=true"))
    for field in ("imagePullSecrets", "priorityClassName", "topologySpreadConstraints"):
        assert field not in spec
    template = one(k8s_tools.render("--set", "example.enabled=true"), "Deployment")["spec"]
    assert "annotations" not in template["template"]["metadata"]


# --- the plugin from the sidecar image -------------------------------------------------------


def test_plugin_is_copied_from_the_sidecar_image_onto_vllms_pythonpath(
    k8s_tools: K8sTools,
) -> None:
    manifests = k8s_tools.render("--set", "example.enabled=true")
    spec = pod_spec(manifests)
    installer, sidecar = spec["initContainers"]
    assert installer["name"] == "kvcap-plugin"
    assert installer["image"] == sidecar["image"]
    assert "restartPolicy" not in installer  # runs to completion before the sidecar starts
    assert installer["command"] == ["cp", "-R", "/opt/kvcap-plugin/.", "/kvcap-plugin/"]
    assert installer["volumeMounts"] == [{"name": "kvcap-plugin", "mountPath": "/kvcap-plugin"}]
    assert installer["securityContext"] == sidecar["securityContext"]
    vllm = container(spec["containers"], "vllm")
    assert env_of(vllm)["PYTHONPATH"] == "/opt/kvcap-plugin"
    plugin_mount = {"name": "kvcap-plugin", "mountPath": "/opt/kvcap-plugin", "readOnly": True}
    assert plugin_mount in vllm["volumeMounts"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["kvcap-plugin"]["emptyDir"] == {"sizeLimit": "32Mi"}


@pytest.mark.parametrize("switch", ["plugin.enabled=false", "handshake.enabled=false"])
def test_plugin_off_leaves_vllm_alone(k8s_tools: K8sTools, switch: str) -> None:
    spec = pod_spec(k8s_tools.render("--set", "example.enabled=true", "--set", switch))
    assert [c["name"] for c in spec["initContainers"]] == ["kvcap"]
    vllm = container(spec["containers"], "vllm")
    assert "PYTHONPATH" not in env_of(vllm)
    assert "kvcap-plugin" not in {m["name"] for m in vllm["volumeMounts"]}
    assert "kvcap-plugin" not in {v["name"] for v in spec["volumes"]}


# --- vLLM's own /metrics ---------------------------------------------------------------------


def test_pod_monitor_scrapes_vllm_too(k8s_tools: K8sTools) -> None:
    manifests = k8s_tools.render("--set", "example.enabled=true")
    kvcap, vllm = one(manifests, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert kvcap["port"] == "kvcap-metrics"
    ports = {p["name"] for p in container(pod_spec(manifests)["containers"], "vllm")["ports"]}
    assert vllm["port"] in ports
    assert vllm["path"] == "/metrics"
    assert vllm["scheme"] == "http"
    # vLLM's targets are not kvcap's: KvcapExporterDown matches jobs like .*kvcap.*.
    assert vllm["relabelings"][0] == {"targetLabel": "job", "replacement": "vllm"}
    off = k8s_tools.render("--set", "scrape.vllm.enabled=false")
    assert len(one(off, "PodMonitor")["spec"]["podMetricsEndpoints"]) == 1


def test_service_monitor_scrapes_vllm_too(k8s_tools: K8sTools) -> None:
    manifests = k8s_tools.render("--values", CI_VALUES / "servicemonitor-values.yaml")
    endpoints = one(manifests, "ServiceMonitor")["spec"]["endpoints"]
    assert [e["port"] for e in endpoints] == ["kvcap-metrics", "vllm-metrics"]
    service = next(s for s in by_kind(manifests, "Service") if s["spec"].get("clusterIP") == "None")
    ports = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
    vllm_port = container(pod_spec(manifests)["containers"], "vllm")["ports"][0]["containerPort"]
    assert ports == {"kvcap-metrics": 9470, "vllm-metrics": vllm_port}
    assert endpoints[1]["relabelings"][0]["replacement"] == "vllm"


# --- NOTES.txt -------------------------------------------------------------------------------


def notes(k8s_tools: K8sTools, *args: str | Path) -> str:
    """NOTES.txt as `helm install` prints it (a client-side dry run: no cluster)."""
    result = run(
        [
            k8s_tools.helm,
            "install",
            "kvcap",
            CHART,
            "--dry-run=client",
            "--namespace",
            "inference",
            "--output",
            "json",
            *args,
        ],
        env={**os.environ, "KUBECONFIG": os.devnull},
    )
    assert result.returncode == 0, result.stderr
    text: str = json.loads(result.stdout)["info"]["notes"]
    return text


def test_notes_warn_when_monitors_lack_the_release_label(k8s_tools: K8sTools) -> None:
    text = notes(k8s_tools)
    assert "WARNING: podMonitor, prometheusRule without a `release` label" in text
    assert "--set podMonitor.labels.release=kube-prometheus-stack" in text
    labelled = notes(k8s_tools, "--values", CI_VALUES / "monitoring-all-values.yaml")
    assert "WARNING" not in labelled
    assert "ServiceMonitor kvcap scrapes them through Service kvcap-metrics." in labelled


def _certificate_for(name: str, folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for DNS name `name`, as cert-manager would issue."""
    ca_key, server_key = new_key(), new_key()
    ca = certificate("test CA", ca_key)
    server = certificate(name, server_key, (ca, ca_key), server=True, dns_names=[name])
    return (
        write_certificate(folder / "ca.crt", ca),
        write_certificate(folder / "tls.crt", server),
        write_key(folder / "tls.key", server_key),
    )


def _engines(request: Request) -> Response:
    return Response(200, b'{"engines": []}', "application/json", ())


def test_notes_curl_works_against_https_with_basic_auth(
    k8s_tools: K8sTools, tmp_path: Path
) -> None:
    """The curl line NOTES.txt prints, run as printed (the port-forward replaced by the
    server listening on 127.0.0.1 at the sidecar's port), checks the certificate."""
    password = "kvcap-example"
    (tmp_path / "issued").mkdir()
    (tmp_path / "other").mkdir()
    ca, cert, key = _certificate_for("kvcap", tmp_path / "issued")
    other_ca = _certificate_for("kvcap", tmp_path / "other")[0]
    # What the kubectl line before it writes: the TLS Secret's ca.crt.
    (tmp_path / "kvcap-ca.crt").write_bytes(ca.read_bytes())
    config = tmp_path / "web-config.yml"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    config.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
                "basic_auth_users": {"probe": hashed},
            }
        )
    )
    server = WebServer("127.0.0.1:0", {"/engines": _engines}, web_config_file=config)
    server.start()
    try:
        port = server.url.rsplit(":", 1)[1].rstrip("/")
        text = notes(
            k8s_tools,
            "--values",
            CI_VALUES / "tls-basic-auth-values.yaml",
            "--set",
            f"sidecar.port={port}",
        )
        (line,) = [line for line in text.splitlines() if line.strip().startswith("curl ")]
        assert "--cacert kvcap-ca.crt" in line
        argv = shlex.split(line.replace("<password>", password))
        assert argv[0] == "curl"
        curl = [require_tool("curl"), "--silent", "--show-error", "--fail", *argv[1:]]
        ok = run(curl, cwd=tmp_path)
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout) == {"engines": []}
        # The check is real: another CA, or no --resolve (127.0.0.1 is not in the
        # certificate), fails.
        (tmp_path / "kvcap-ca.crt").write_bytes(other_ca.read_bytes())
        other = run(curl, cwd=tmp_path)
        assert other.returncode != 0
        (tmp_path / "kvcap-ca.crt").write_bytes(ca.read_bytes())
        direct = [a for a in curl if not re.fullmatch(r"kvcap:\d+:127\.0\.0\.1", a)]
        direct = [a for a in direct if a != "--resolve"]
        direct[-1] = direct[-1].replace("https://kvcap:", "https://127.0.0.1:")
        unresolved = run(direct, cwd=tmp_path)
        assert unresolved.returncode != 0
    finally:
        server.stop()


def test_notes_curl_without_tls(k8s_tools: K8sTools) -> None:
    lines = [line.strip() for line in notes(k8s_tools).splitlines()]
    assert "curl http://127.0.0.1:9470/engines" in lines
    assert not any("--cacert" in line for line in lines)
