"""A GPU falls off the bus under a running daemon, then comes back.

The nvml source reads the test NVML library (tests/nvml) every POLL_INTERVAL_S; two
engines (TP 2 each, from vLLM's own ready bytes) run on GPUs 0-1 and 2-3 of eight H200s.
Losing GPU 2 must take out exactly what depends on it: its own series, and the headroom
of engine 1, which can no longer be computed. Nothing else changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from exporter.collectors import HandshakeReceiver, HandshakeSettings, NvmlCollector, NvmlSettings
from exporter.handshake_wire import ready_message
from exporter.serve import Exporter
from exporter.state import StateStore
from tests.conftest import GOLDEN
from tests.faults.harness import (
    POLL_INTERVAL_S,
    SLACK_S,
    running_exporter,
    scrape_until,
)
from tests.support import Scrape
from tools.handshake_data import recorded_extras
from tools.nvml.fake import GPU_IS_LOST, FakeNvml, eight_h200s

pytest_plugins = ["tests.nvml.fixtures"]

HANDSHAKE = GOLDEN / "handshake"
DEPLOYMENT = "gemma-3-27b-text-dp2-tp2"
ONE_POLL_S = POLL_INTERVAL_S + SLACK_S


def publish_engines(store: StateStore) -> None:
    """Engines 0 and 1 as the plugin reports them, on CUDA_VISIBLE_DEVICES 0,1,2,3."""
    deployment = json.loads((HANDSHAKE / f"{DEPLOYMENT}.json").read_text())
    receiver = HandshakeReceiver("ipc://gpu-lost", store, HandshakeSettings())
    for frame, engine in zip(deployment["frames"], deployment["engines"], strict=True):
        extras = recorded_extras(
            deployment,
            engine,
            bytes_per_block_per_worker=[engine["bytes_per_block_per_worker"]] * 2,
            devices=["0", "1", "2", "3"],
            pid=None,
        )
        receiver.handle(ready_message((HANDSHAKE / frame["file"]).read_bytes(), extras))
    assert not store.snapshot().errors
    assert [view.engine for view in store.snapshot().engines] == ["0", "1"]


@pytest.fixture
def daemon(fake_nvml: FakeNvml) -> Iterator[Exporter]:
    fake_nvml.write(eight_h200s())
    store = StateStore()
    source = NvmlCollector(
        NvmlSettings(poll_interval_s=POLL_INTERVAL_S, library_path=str(fake_nvml.library))
    )
    with capture_logs(), running_exporter([source], store=store) as exporter:
        publish_engines(store)
        yield exporter


def gpus(metrics: Scrape) -> set[str]:
    return {labels["gpu"] for labels in metrics.labels("kvcap_gpu_memory_free_bytes")}


def headroom(metrics: Scrape) -> dict[str, float]:
    return metrics.by_engine("kvcap_kv_cache_headroom_tokens")


def engine_gpus(metrics: Scrape) -> set[tuple[str, str, str]]:
    return {
        (labels["engine"], labels["worker"], labels["gpu"])
        for labels in metrics.labels("kvcap_engine_gpu_info")
    }


def gpu_lost_errors(metrics: Scrape) -> float:
    return metrics.value("kvcap_collector_errors_total", collector="nvml", reason="gpu_lost") or 0.0


def test_a_lost_gpu_takes_out_only_what_depends_on_it_and_comes_back(
    daemon: Exporter, fake_nvml: FakeNvml
) -> None:
    url = daemon.server.url
    before, _ = scrape_until(
        url,
        lambda m: len(headroom(m)) == 2 and len(gpus(m)) == 8,
        5.0,
        "8 GPUs and both engines' headroom",
    )
    capacity = before.by_engine("kvcap_kv_cache_capacity_tokens")
    assert engine_gpus(before) >= {("1", "0", "2"), ("1", "1", "3")}

    fake_nvml.write(eight_h200s().with_gpu(2, error=GPU_IS_LOST))
    lost, _ = scrape_until(url, lambda m: "2" not in gpus(m), ONE_POLL_S, "GPU 2 dropped")
    assert gpus(lost) == {"0", "1", "3", "4", "5", "6", "7"}
    assert gpu_lost_errors(lost) >= 1
    # Engine 1 runs on GPU 2: no headroom figure rather than a wrong one. Engine 0 keeps it.
    assert set(headroom(lost)) == {"0"}
    assert headroom(lost)["0"] == headroom(before)["0"]
    assert ("1", "0", "2") not in engine_gpus(lost)
    # The engines' capacity does not depend on NVML at all.
    assert lost.by_engine("kvcap_kv_cache_capacity_tokens") == capacity
    assert lost.value("kvcap_collector_up", collector="nvml") == 1  # seven GPUs still answer

    fake_nvml.write(eight_h200s())
    back, _ = scrape_until(
        url,
        lambda m: len(gpus(m)) == 8 and len(headroom(m)) == 2,
        ONE_POLL_S,
        "GPU 2 and engine 1's headroom back",
    )
    assert headroom(back) == headroom(before)
    assert engine_gpus(back) == engine_gpus(before)
    assert gpu_lost_errors(back) >= gpu_lost_errors(lost)
