"""Autoscaling on free KV tokens per replica: the chart's KEDA ScaledObject and HPA (off by
default) and deploy/examples/autoscaling, validated (KEDA's CRD schema made strict and its
cloudcoil models; kubernetes-validate for the HPA), agreeing with each other, and their
query answered by Prometheus: promtool for replicas, double scrapes and other models, and a
real Prometheus scraping the exporter of the simulated deployment."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.demo import DEMO_SERVED_NAME, demo_running
from tests.deploy.conftest import DEPLOY, K8sTools, Manifest, by_kind, manifest_errors, one
from tests.integration.prometheus import Prometheus, promtool_eval

EXAMPLES = DEPLOY / "examples" / "autoscaling"
ADAPTER_VALUES = EXAMPLES / "prometheus-adapter-values.yaml"
KEDA_ON = ["--set", "autoscaling.keda.enabled=true", "--set", "autoscaling.deployment=vllm"]
ON = [*KEDA_ON, "--set", "autoscaling.hpa.enabled=true"]
TARGET_FREE = 50000


def keda_query(manifests: list[Manifest]) -> str:
    trigger = one(manifests, "ScaledObject")["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    query: str = trigger["metadata"]["query"]
    return query


def adapter_query(matchers: str) -> str:
    values = yaml.safe_load(ADAPTER_VALUES.read_text(encoding="utf-8"))
    (rule,) = values["rules"]["external"]
    assert rule["name"]["as"] == "kvcap_kv_cache_replicas_needed"
    query: str = rule["metricsQuery"]
    return query.replace("<<.LabelMatchers>>", matchers)


# --- the objects ---------------------------------------------------------------------------


def test_off_by_default(k8s_tools: K8sTools) -> None:
    kinds = {m["kind"] for m in k8s_tools.render("--set", "example.enabled=true")}
    assert not kinds & {"ScaledObject", "HorizontalPodAutoscaler"}


def test_chart_objects_are_valid(k8s_tools: K8sTools, assert_valid: Any) -> None:
    manifests = k8s_tools.render(*ON, "--set", "autoscaling.modelName=qwen3")
    assert_valid(manifests)
    scaled = one(manifests, "ScaledObject")["spec"]
    assert scaled["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "vllm",
    }
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (1, 4)
    trigger = scaled["triggers"][0]
    assert trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "1"
    hpa = one(manifests, "HorizontalPodAutoscaler")["spec"]
    (metric,) = hpa["metrics"]
    assert metric["external"]["metric"] == {
        "name": "kvcap_kv_cache_replicas_needed",
        "selector": {"matchLabels": {"model_name": "qwen3"}},
    }
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}


def test_the_example_deployment_is_the_default_target(k8s_tools: K8sTools) -> None:
    manifests = k8s_tools.render("--set", "example.enabled=true", *KEDA_ON[:2])
    name = one(manifests, "Deployment")["metadata"]["name"]
    assert one(manifests, "ScaledObject")["spec"]["scaleTargetRef"]["name"] == name
    assert f'pod=~"{name}-.+"' in keda_query(manifests)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "autoscaling.keda.enabled=true"], "autoscaling.deployment"),
        (
            ["--set", "autoscaling.hpa.enabled=true", "--set", "autoscaling.deployment=vllm"],
            "autoscaling.modelName",
        ),
        (["--set", "autoscaling.modelName=Qwen/Qwen3-0.6B"], "modelName"),
    ],
    ids=["no-target", "hpa-without-model", "model-name-not-a-label-value"],
)
def test_incomplete_settings_are_refused(
    k8s_tools: K8sTools, args: list[str], message: str
) -> None:
    result = k8s_tools.helm_template(*args)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_validation_catches_a_misspelled_scaled_object_field(
    k8s_tools: K8sTools, tmp_path: Path
) -> None:
    scaled = one(k8s_tools.render(*KEDA_ON), "ScaledObject")
    assert not manifest_errors([scaled], tmp_path)
    for path, field, value in (
        ("spec", "minReplicas", 1),
        ("spec.triggers.0", "metadatas", {}),
        ("spec", "maxReplicaCount", "four"),
    ):
        broken = copy.deepcopy(scaled)
        node: Any = broken
        for key in path.split("."):
            node = node[int(key)] if key.isdigit() else node[key]
        node[field] = value
        needle = value if isinstance(value, str) else field
        errors = manifest_errors([broken], tmp_path)
        assert any(needle in e for e in errors), errors


@pytest.mark.parametrize("name", ["keda", "hpa"])
def test_examples_are_valid_and_match_the_chart(
    k8s_tools: K8sTools, assert_valid: Any, name: str
) -> None:
    manifests = k8s_tools.kustomize(EXAMPLES / name)
    assert_valid(manifests)
    chart = k8s_tools.render(
        *ON, "--set", "autoscaling.modelName=qwen3", "--namespace", "inference"
    )
    kind = {"keda": "ScaledObject", "hpa": "HorizontalPodAutoscaler"}[name]
    ours, theirs = one(manifests, kind)["spec"], one(chart, kind)["spec"]
    if name == "keda":
        ours["triggers"][0]["metadata"]["query"] = ours["triggers"][0]["metadata"]["query"].strip()
    assert ours == theirs
    # The model is served under the name the query selects.
    args = next(c for c in by_kind(manifests, "ConfigMap") if "VLLM_ARGS" in c["data"])
    assert "--served-model-name qwen3" in args["data"]["VLLM_ARGS"]


def test_adapter_rule_is_the_charts_query(k8s_tools: K8sTools) -> None:
    chart = keda_query(k8s_tools.render(*ON, "--set", "autoscaling.modelName=qwen3"))
    matchers = 'namespace="inference", model_name="qwen3"'
    assert adapter_query(matchers).strip() == chart.replace(
        'namespace="default", model_name="qwen3"', matchers
    )


# --- the query, on Prometheus ------------------------------------------------------------

SERIES_LABELS = 'job="{job}",instance="{ip}:9470",namespace="{ns}",pod="{pod}",engine="{engine}",model_name="{model}"'  # noqa: E501


def _series(metric: str, value: float, **labels: str) -> dict[str, str]:
    return {"series": f"{metric}{{{SERIES_LABELS.format(**labels)}}}", "values": f"{value}x10"}


def test_replicas_needed_with_promtool(k8s_tools: K8sTools, tmp_path: Path) -> None:
    """Two replicas of qwen3 (one with two data-parallel engines, scraped by two jobs), a
    headless engine without usage, another model and another namespace: the replicas needed
    are used / (capacity per replica - target) = 150000 / (150000 - 50000) = 1.5."""
    engines = [
        # (job, ip, namespace, pod, engine, model, capacity, used)
        ("pm", "10.0.0.1", "inference", "vllm-a", "0", "qwen3", 100000, 60000),
        ("pm", "10.0.0.1", "inference", "vllm-a", "1", "qwen3", 100000, 40000),
        ("sm", "10.0.0.1", "inference", "vllm-a", "0", "qwen3", 100000, 60000),
        ("sm", "10.0.0.1", "inference", "vllm-a", "1", "qwen3", 100000, 40000),
        ("pm", "10.0.0.2", "inference", "vllm-b", "0", "qwen3", 100000, 50000),
        ("pm", "10.0.0.3", "inference", "vllm-c", "2", "qwen3", 100000, None),
        ("pm", "10.0.0.4", "inference", "llama-a", "0", "llama", 10000, 9000),
        ("pm", "10.0.1.1", "other", "vllm-a", "0", "qwen3", 10, 9),
    ]
    series = []
    for job, ip, ns, pod, engine, model, capacity, used in engines:
        labels = {"job": job, "ip": ip, "ns": ns, "pod": pod, "engine": engine, "model": model}
        series.append(_series("kvcap_kv_cache_capacity_tokens", capacity, **labels))
        if used is not None:
            series.append(_series("kvcap_kv_cache_used_tokens", used, **labels))
    by_model = keda_query(
        k8s_tools.render(*ON, "--set", "autoscaling.modelName=qwen3", "--namespace", "inference")
    )
    by_pods = keda_query(k8s_tools.render(*KEDA_ON, "--namespace", "inference"))
    assert 'pod=~"vllm-.+"' in by_pods
    adapter = adapter_query('namespace="inference",model_name="qwen3"')
    tight = keda_query(
        k8s_tools.render(
            *ON,
            "--set",
            "autoscaling.modelName=qwen3",
            "--set",
            "autoscaling.targetFreeTokensPerReplica=150000",
            "--namespace",
            "inference",
        )
    )
    cases = [
        {"expr": query, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 1.5}]}
        for query in (by_model, by_pods, adapter)
    ]
    # A target the replicas cannot reach (capacity per replica minus target <= 0): the
    # denominator is clamped to 1 token, so the answer is the used tokens: the maximum.
    cases.append(
        {"expr": tight, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 150000}]}
    )
    promtool_eval(tmp_path, series, cases)


class DemoPrometheus(Prometheus):
    """A real Prometheus scraping the demo exporter as a PodMonitor would label it."""

    def __init__(self, workdir: Path, target: str) -> None:
        super().__init__(workdir, [target])
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": "inference/kvcap",
                    "static_configs": [
                        {"targets": [target], "labels": {"namespace": "inference", "pod": "vllm-0"}}
                    ],
                }
            ],
        }
        self.config.write_text(yaml.safe_dump(config), encoding="utf-8")

    def scalar(self, promql: str) -> float:
        (sample,) = self.query(promql)
        return float(sample["value"][1])


@pytest.fixture
def live(tmp_path: Path) -> Iterator[DemoPrometheus]:
    with demo_running(tmp_path / "models", poll_interval_s=0.2) as (_, exporter):
        server = DemoPrometheus(tmp_path, exporter.server.url.removeprefix("http://"))
        with server:
            yield server


def test_queries_on_a_real_prometheus(k8s_tools: K8sTools, live: DemoPrometheus) -> None:
    """The chart's query and the adapter's, on the exporter's own series (one pod, two
    data-parallel engines), give used / (capacity - target) of that pod."""
    matchers = f'namespace="inference", model_name="{DEMO_SERVED_NAME}"'
    chart = keda_query(
        k8s_tools.render(*KEDA_ON, "--set-json", f"autoscaling.matchers={json.dumps(matchers)}")
    )
    live.wait_until(lambda: live.query("kvcap_kv_cache_used_tokens"), "used tokens", 30)
    live.wait_until(lambda: live.query(chart), "the chart's query", 30)
    used = live.scalar("sum(kvcap_kv_cache_used_tokens)")
    capacity = live.scalar("sum(kvcap_kv_cache_capacity_tokens)")
    assert 0 < used < capacity
    assert live.scalar(chart) == pytest.approx(used / (capacity - TARGET_FREE), rel=0.05)
    assert live.scalar(adapter_query(matchers)) == pytest.approx(live.scalar(chart), rel=0.05)
    # Free KV tokens per replica, the documented figure the autoscaler keeps up.
    free = live.scalar(
        "(sum(kvcap_kv_cache_capacity_tokens) - sum(kvcap_kv_cache_used_tokens))"
        " / count(count by (namespace, pod) (kvcap_kv_cache_used_tokens))"
    )
    assert free == pytest.approx(capacity - used, rel=0.05)
