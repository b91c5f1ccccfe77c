"""A real Prometheus scrapes a real exporter that watches a simulated vLLM deployment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.demo import demo_running
from exporter.demo.simulated_vllm import SimulatedVllm
from exporter.serve import Exporter
from tests.integration.prometheus import Prometheus


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[SimulatedVllm, Exporter]]:
    with demo_running(tmp_path / "models", poll_interval_s=0.2) as running:
        yield running


def test_prometheus_sums_engines_and_forgets_removed_ones(
    tmp_path: Path, deployment: tuple[SimulatedVllm, Exporter]
) -> None:
    simulation, exporter = deployment
    target = exporter.server.url.removeprefix("http://")
    with Prometheus(tmp_path, [target]) as prometheus:
        prometheus.wait_until(
            lambda: len(prometheus.query("kvcap_kv_cache_capacity_tokens")) == 2,
            "two engines in Prometheus",
        )
        per_engine = prometheus.query("kvcap_kv_cache_capacity_tokens")
        total = prometheus.query("sum by (model_name) (kvcap_kv_cache_capacity_tokens)")
        assert len(total) == 1
        assert total[0]["metric"] == {"model_name": "google/gemma-3-27b-it"}
        assert float(total[0]["value"][1]) == sum(float(s["value"][1]) for s in per_engine)
        assert float(total[0]["value"][1]) == 2 * simulation.plan.figures.kv_cache_size_tokens
        assert {s["metric"]["engine"] for s in per_engine} == {"0", "1"}

        simulation.remove_engine(1)
        prometheus.wait_until(
            lambda: (
                {s["metric"]["engine"] for s in prometheus.query("kvcap_kv_cache_capacity_tokens")}
                == {"0"}
            ),
            "engine 1 to disappear from Prometheus",
        )
        total = prometheus.query("sum by (model_name) (kvcap_kv_cache_capacity_tokens)")
        assert float(total[0]["value"][1]) == simulation.plan.capacity.kv_cache_size_tokens
