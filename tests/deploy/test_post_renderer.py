"""The Helm post-renderer (deploy/helm-post-renderer): a chart shaped like vLLM
production-stack's (tests/fixtures/production-stack-shape) rendered through it, as Helm 4's
postrenderer plugin and as the Helm 3 executable; every object validated."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES
from tests.deploy.conftest import (
    DEPLOY,
    K8sTools,
    Manifest,
    by_kind,
    container,
    env_of,
    load_manifests,
    run,
)

POST_RENDERER = DEPLOY / "helm-post-renderer"
SCRIPT = POST_RENDERER / "kvcap-kustomize.sh"
STACK = FIXTURES / "production-stack-shape"
ENGINES = {"stack-llama3-deployment-vllm", "stack-qwen-deployment-vllm"}


def deployments(manifests: list[Manifest]) -> dict[str, Manifest]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in by_kind(manifests, "Deployment")
    }


@pytest.fixture
def helm_home(tmp_path: Path, k8s_tools: K8sTools) -> dict[str, str]:
    """Helm's folders in tmp_path, kvcap's plugin installed there, kubectl on PATH."""
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_DATA_HOME": str(tmp_path / "data"),
        "KUBECONFIG": os.devnull,
        "PATH": f"{k8s_tools.kubectl.parent}{os.pathsep}{os.environ['PATH']}",
    }
    env.pop("HELM_PLUGINS", None)
    installed = run([k8s_tools.helm, "plugin", "install", POST_RENDERER], env=env)
    assert installed.returncode == 0, installed.stderr
    listed = run([k8s_tools.helm, "plugin", "list"], env=env)
    assert "kvcap-kustomize" in listed.stdout
    assert "postrenderer/v1" in listed.stdout
    return env


def render(k8s_tools: K8sTools, env: dict[str, str], *args: str) -> list[Manifest]:
    result = run(
        [k8s_tools.helm, "template", "stack", STACK, "--namespace", "inference", *args], env=env
    )
    assert result.returncode == 0, result.stderr
    return load_manifests(result.stdout)


def test_helm4_plugin_adds_the_sidecar_to_the_engines_only(
    k8s_tools: K8sTools, helm_home: dict[str, str], assert_valid: Any
) -> None:
    plain = render(k8s_tools, helm_home)
    manifests = render(
        k8s_tools,
        helm_home,
        "--post-renderer",
        "kvcap-kustomize",
        "--post-renderer-args=--selector=model",
    )
    assert_valid(manifests)
    before, after = deployments(plain), deployments(manifests)
    assert set(after) == set(before) == ENGINES | {"stack-deployment-router"}
    assert after["stack-deployment-router"] == before["stack-deployment-router"]
    for name in ENGINES:
        spec = after[name]
        assert [c["name"] for c in spec["initContainers"]] == ["kvcap-plugin", "kvcap"]
        assert spec["initContainers"][1]["restartPolicy"] == "Always"
        # The engine container is production-stack's first, "vllm"; the LoRA sidecar of
        # the qwen model is left as it was.
        assert [c["name"] for c in spec["containers"]] == [
            c["name"] for c in before[name]["containers"]
        ]
        vllm = container(spec["containers"], "vllm")
        assert env_of(vllm)["PYTHONPATH"] == "/opt/kvcap-plugin"
        assert env_of(vllm)["KVCAP_HANDSHAKE_ENDPOINT"] == "ipc:///run/kvcap/handshake.sock"
        assert env_of(vllm)["HF_HOME"] == "/tmp"  # the chart's own env stays
        assert spec["shareProcessNamespace"] is True  # `vllm serve` args from /proc
    lora = container(after["stack-qwen-deployment-vllm"]["containers"], "sidecar")
    assert lora == container(before["stack-qwen-deployment-vllm"]["containers"], "sidecar")
    # The component's PodMonitor selects the patched pods.
    (monitor,) = by_kind(manifests, "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    for deployment in by_kind(manifests, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        patched = deployment["metadata"]["name"] in ENGINES
        assert (selector.items() <= labels.items()) is patched


def test_helm3_executable_gives_the_same_output(
    k8s_tools: K8sTools, helm_home: dict[str, str]
) -> None:
    """Helm 3 runs the script by path; the output is the plugin's, byte for byte."""
    plain = run(
        [k8s_tools.helm, "template", "stack", STACK, "--namespace", "inference"], env=helm_home
    )
    assert plain.returncode == 0, plain.stderr
    direct = run(["sh", SCRIPT, "--selector=model"], env=helm_home, input=plain.stdout)
    assert direct.returncode == 0, direct.stderr
    plugin = run(
        [
            *(k8s_tools.helm, "template", "stack", STACK, "--namespace", "inference"),
            *("--post-renderer", "kvcap-kustomize", "--post-renderer-args=--selector=model"),
        ],
        env=helm_home,
    )
    assert plugin.returncode == 0, plugin.stderr
    assert load_manifests(direct.stdout) == load_manifests(plugin.stdout)


def test_vllms_container_by_name(
    k8s_tools: K8sTools, helm_home: dict[str, str], assert_valid: Any
) -> None:
    """--container=NAME patches that container and leaves the first one alone."""
    manifests = render(
        k8s_tools,
        helm_home,
        "--post-renderer",
        "kvcap-kustomize",
        "--post-renderer-args=--selector=model=qwen",
        "--post-renderer-args=--container=sidecar",
    )
    assert_valid(manifests)
    spec = deployments(manifests)["stack-qwen-deployment-vllm"]
    first, named = spec["containers"]
    assert "PYTHONPATH" not in env_of(first)
    assert env_of(named)["PYTHONPATH"] == "/opt/kvcap-plugin"
    assert {"name": "kvcap-run", "mountPath": "/run/kvcap"} in named["volumeMounts"]
    assert "initContainers" not in deployments(manifests)["stack-llama3-deployment-vllm"]


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("--container=Bad_Name", "not a container name"),
        ("--component=/nonexistent", "no kustomize component"),
        ("--frobnicate", "unknown argument"),
    ],
)
def test_bad_arguments_are_refused(helm_home: dict[str, str], argument: str, message: str) -> None:
    result = run(["sh", SCRIPT, argument], env=helm_home, input="")
    assert result.returncode == 2
    assert message in result.stderr
