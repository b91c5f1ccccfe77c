"""Engines mapped to GPUs by vLLM's rule, GPU series, and KV headroom."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families

from exporter.exposition import build_exposition
from exporter.state import GpuProcessMemory, GpuReport, StateStore
from tests.state.helpers import deployment, reports

GIB = 2**30


def gpu(index: int, free_gib: float = 10.0, total_gib: float = 141.0) -> GpuReport:
    free = int(free_gib * GIB)
    total = int(total_gib * GIB)
    return GpuReport(
        index=str(index),
        uuid=f"GPU-{index:04d}",
        name="NVIDIA H200",
        pci_bus_id=f"00000000:{index:02x}:00.0",
        driver_version="570.86.15",
        memory_total_bytes=total,
        memory_used_bytes=total - free,
        memory_free_bytes=free,
        memory_reserved_bytes=512 * 2**20,
        processes=(GpuProcessMemory(pid=100 + index, used_bytes=total - free),),
    )


def gemma_store(gpus: list[GpuReport]) -> StateStore:
    """Gemma-3-27B, DP 2 x TP 2: engine 0 on GPUs 0-1, engine 1 on GPUs 2-3."""
    store = StateStore()
    store.publish(
        "vllm_http",
        "http://a",
        [replace(r, world_size=2, local_rank=int(r.engine)) for r in reports()],
    )
    store.publish_gpus("nvml", "local", gpus)
    return store


def test_workers_map_to_consecutive_gpus_per_engine() -> None:
    snapshot = gemma_store([gpu(i) for i in range(4)]).snapshot()
    assert [(e.engine, e.worker, e.gpu) for e in snapshot.engine_gpus] == [
        ("0", 0, "0"),
        ("0", 1, "1"),
        ("1", 0, "2"),
        ("1", 1, "3"),
    ]


def test_known_devices_name_the_gpus_by_uuid() -> None:
    store = StateStore()
    engine = replace(
        reports()[1],
        world_size=2,
        local_rank=1,
        devices=("GPU-0003", "GPU-0002", "GPU-0001", "GPU-0000"),
    )
    store.publish("handshake", "ipc://x", [engine])
    store.publish_gpus("nvml", "local", [gpu(i) for i in range(4)])
    assert [(e.worker, e.gpu) for e in store.snapshot().engine_gpus] == [(0, "1"), (1, "0")]


def test_a_huge_worker_count_walks_only_the_known_gpus() -> None:
    # A source that let 2**40 workers through must not loop 2**40 times under the lock.
    store = StateStore()
    engine = replace(reports()[0], world_size=2**40, local_rank=0)
    store.publish("vllm_http", "http://a", [engine])
    store.publish_gpus("nvml", "local", [gpu(i) for i in range(4)])
    assert [(e.worker, e.gpu) for e in store.snapshot().engine_gpus] == [
        (0, "0"),
        (1, "1"),
        (2, "2"),
        (3, "3"),
    ]


def test_headroom_uses_the_most_constrained_gpu() -> None:
    # Engine 0's GPUs have 10 and 2 GiB free; a block is 655,360 B per worker.
    snapshot = gemma_store([gpu(0, 10), gpu(1, 2), gpu(2, 50), gpu(3, 50)]).snapshot()
    engine = deployment("gemma-3-27b-text-dp2-tp2")["engines"][0]
    per_request = sum(
        -(-g["max_memory_usage_bytes_per_request"] // g["page_size_bytes"])
        for g in engine["groups"]
    )
    blocks, length = engine["num_gpu_blocks"], engine["max_model_len"]
    extra = 2 * GIB // engine["bytes_per_block_per_worker"]
    expected = int((blocks + extra) / per_request * length) - int(blocks / per_request * length)
    assert snapshot.headroom_tokens["0"] == expected
    assert snapshot.headroom_tokens["1"] > snapshot.headroom_tokens["0"]


def test_gpu_series_are_exported_and_join_with_engines() -> None:
    body = build_exposition(gemma_store([gpu(i) for i in range(4)]).snapshot).body().content
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert len(families["kvcap_gpu_memory_total_bytes"].samples) == 4
    assert families["kvcap_gpu_info"].samples[0].labels["name"] == "NVIDIA H200"
    kv = families["kvcap_kv_cache_bytes"].samples
    assert {(s.labels["engine"], s.labels["worker"], s.labels["gpu"]) for s in kv} == {
        ("0", "0", "0"),
        ("0", "1", "1"),
        ("1", "0", "2"),
        ("1", "1", "3"),
    }
    assert len(families["kvcap_engine_gpu_info"].samples) == 4
    assert len(families["kvcap_kv_cache_headroom_tokens"].samples) == 2
    assert families["kvcap_gpu_process_memory_bytes"].samples[0].labels["pid"] == "100"


def test_a_lost_gpu_drops_its_series_and_its_engines_headroom() -> None:
    visible = [replace(gpu(i), visible_index=i) for i in range(4)]
    store = gemma_store(visible)
    store.publish_gpus("nvml", "local", [visible[0], visible[2], visible[3]])
    snapshot = store.snapshot()
    assert "GPU-0001" not in {g.uuid for g in snapshot.gpus}
    # Engine 1 keeps GPUs 2 and 3; engine 0 lost worker 1's GPU: no headroom figure for it.
    assert [(e.engine, e.worker, e.gpu) for e in snapshot.engine_gpus] == [
        ("0", 0, "0"),
        ("1", 0, "2"),
        ("1", 1, "3"),
    ]
    assert "0" not in snapshot.headroom_tokens
    assert "1" in snapshot.headroom_tokens
