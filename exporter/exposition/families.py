"""Build the exporter's metric families from one snapshot (the metric contract, in code).

docs/metrics.md documents every family built here; a test keeps the two in step.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter import __version__
from exporter.state import EngineGpu, EngineView, Snapshot

ENGINE_LABELS = ("engine", "model_name")
CAPACITY_MODEL = "vllm-0.33"


@dataclass(frozen=True, slots=True)
class _EngineGauge:
    name: str
    help: str
    value: Callable[[EngineView], float | None]


_ENGINE_GAUGES = (
    _EngineGauge(
        "kvcap_kv_cache_capacity_tokens",
        "KV cache capacity of the engine in tokens: int(max_concurrency x "
        "max_model_len), vLLM's 'GPU KV cache size'. Reported by vLLM where it "
        "reports it, else derived.",
        lambda v: v.capacity.kv_cache_size_tokens,
    ),
    _EngineGauge(
        "kvcap_kv_cache_max_concurrency",
        "Requests of max_model_len tokens the engine's KV cache holds at once.",
        lambda v: v.capacity.kv_cache_max_concurrency,
    ),
    _EngineGauge(
        "kvcap_kv_cache_blocks",
        "Blocks in the engine's shared KV cache pool.",
        lambda v: v.capacity.num_gpu_blocks,
    ),
    _EngineGauge(
        "kvcap_kv_cache_block_size_tokens",
        "Tokens per block (smallest block size of the prefix-cacheable groups).",
        lambda v: v.capacity.block_size,
    ),
    _EngineGauge(
        "kvcap_max_model_len_tokens",
        "The engine's max_model_len.",
        lambda v: v.capacity.max_model_len,
    ),
    _EngineGauge(
        "kvcap_kv_cache_used_tokens",
        "Tokens in use now: vllm:kv_cache_usage_perc x capacity tokens.",
        lambda v: v.used_tokens,
    ),
    _EngineGauge(
        "kvcap_kv_cache_derived_capacity_tokens",
        "Capacity in tokens as kvcap's capacity model derives it from config.json "
        "and the engine settings.",
        lambda v: v.derived_kv_cache_size_tokens,
    ),
    _EngineGauge(
        "kvcap_kv_cache_derivation_failed",
        "1 when kvcap's capacity model could not derive the engine's capacity (the reason "
        "is logged and in /engines as derivation_error), else 0.",
        lambda v: v.derivation_failed,
    ),
)


def _label(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def engine_families(
    engines: tuple[EngineView, ...], engine_gpus: tuple[EngineGpu, ...] = ()
) -> Iterator[Metric]:
    info = GaugeMetricFamily(
        "kvcap_engine_info",
        "Identity of a vLLM engine (one data-parallel rank); always 1.",
        labels=[*ENGINE_LABELS, "vllm_version", "instance_id", "collectors"],
    )
    capacity_info = GaugeMetricFamily(
        "kvcap_kv_cache_info",
        "The engine's KV cache capacity as labels, like vllm:cache_config_info but per "
        "engine and group-aware; always 1.",
        labels=[
            *ENGINE_LABELS,
            "kv_cache_size_tokens",
            "kv_cache_max_concurrency",
            "num_gpu_blocks",
            "block_size",
            "max_model_len",
            "cache_dtype",
            "capacity_source",
            "approximate",
        ],
    )
    gauges = {
        g.name: GaugeMetricFamily(g.name, g.help, labels=list(ENGINE_LABELS))
        for g in _ENGINE_GAUGES
    }
    blocks_per_request = GaugeMetricFamily(
        "kvcap_kv_cache_blocks_per_request",
        "Blocks one request of max_model_len tokens needs, summed over KV cache groups.",
        labels=list(ENGINE_LABELS),
    )
    mismatch = GaugeMetricFamily(
        "kvcap_kv_cache_capacity_mismatch",
        "1 when the capacity vLLM reports differs from the derived one, 0 when they agree.",
        labels=list(ENGINE_LABELS),
    )
    stale = GaugeMetricFamily(
        "kvcap_engine_stale",
        "1 when no collector has fresh data of this engine: reads failed or heartbeats "
        "stopped (last good data shown).",
        labels=list(ENGINE_LABELS),
    )
    updated = GaugeMetricFamily(
        "kvcap_engine_last_update_timestamp_seconds",
        "When a collector last read this engine successfully (Unix time).",
        labels=list(ENGINE_LABELS),
    )
    kv_bytes = GaugeMetricFamily(
        "kvcap_kv_cache_bytes",
        "Bytes of KV cache tensors on each worker (TP x PP rank) of the engine, with the "
        "worker's GPU where known.",
        labels=[*ENGINE_LABELS, "worker", "gpu", "uuid"],
    )
    group_info = GaugeMetricFamily(
        "kvcap_kv_cache_group_info",
        "A KV cache group of the engine (layers that allocate blocks together); always 1.",
        labels=[
            *ENGINE_LABELS,
            "group",
            "kind",
            "spec_type",
            "block_size",
            "sliding_window",
            "attention_chunk_size",
        ],
    )
    group_gauges = (
        (
            "kvcap_kv_cache_group_layers",
            "Layers in the group on the first pipeline stage.",
            "num_layers",
        ),
        (
            "kvcap_kv_cache_group_blocks_per_request",
            "Blocks one max_model_len request needs in this group.",
            "blocks_per_request",
        ),
        (
            "kvcap_kv_cache_group_page_bytes",
            "Bytes of one block of this group per layer.",
            "page_size_bytes",
        ),
    )
    group_families = {
        name: GaugeMetricFamily(name, text, labels=[*ENGINE_LABELS, "group"])
        for name, text, _ in group_gauges
    }

    gpu_of = {(g.engine, g.worker): g for g in engine_gpus}
    for view in engines:
        ids = [view.engine, view.model_name]
        info.add_metric(
            [*ids, _label(view.vllm_version), _label(view.instance_id), ",".join(view.collectors)],
            1,
        )
        stale.add_metric(ids, 1 if view.stale else 0)
        updated.add_metric(ids, view.updated_at_s)
        capacity = view.capacity
        if capacity.kv_cache_size_tokens is not None:
            capacity_info.add_metric(
                [
                    *ids,
                    _label(capacity.kv_cache_size_tokens),
                    _label(capacity.kv_cache_max_concurrency),
                    _label(capacity.num_gpu_blocks),
                    _label(capacity.block_size),
                    _label(capacity.max_model_len),
                    _label(capacity.cache_dtype),
                    _label(view.capacity_source),
                    _label(view.approximate),
                ],
                1,
            )
        for gauge in _ENGINE_GAUGES:
            value = gauge.value(view)
            if value is not None:
                gauges[gauge.name].add_metric(ids, value)
        if capacity.blocks_per_request is not None:
            blocks_per_request.add_metric(ids, capacity.blocks_per_request)
        if view.capacity_mismatch is not None:
            mismatch.add_metric(ids, 1 if view.capacity_mismatch else 0)
        for worker, size in enumerate(capacity.kv_cache_bytes_per_worker):
            gpu = gpu_of.get((view.engine, worker))
            kv_bytes.add_metric(
                [*ids, str(worker), gpu.gpu if gpu else "", gpu.uuid if gpu else ""], size
            )
        for index, group in enumerate(capacity.groups):
            group_ids = [*ids, str(index)]
            group_info.add_metric(
                [
                    *group_ids,
                    group.kind,
                    group.spec_type,
                    str(group.block_size),
                    _label(group.sliding_window),
                    _label(group.attention_chunk_size),
                ],
                1,
            )
            for name, _, attribute in group_gauges:
                group_families[name].add_metric(group_ids, getattr(group, attribute))

    yield info
    yield capacity_info
    yield from gauges.values()
    yield blocks_per_request
    yield mismatch
    yield stale
    yield updated
    yield kv_bytes
    yield group_info
    yield from group_families.values()


def gpu_families(snapshot: Snapshot) -> Iterator[Metric]:
    """GPUs as NVML reports them, which GPU each engine worker uses, and KV headroom."""
    gpu_labels = ["gpu", "uuid"]
    info = GaugeMetricFamily(
        "kvcap_gpu_info",
        "A GPU (or MIG instance) NVML reports; always 1.",
        labels=[*gpu_labels, "name", "pci_bus_id", "driver_version", "mig_mode"],
    )
    memory = {
        name: GaugeMetricFamily(f"kvcap_gpu_memory_{name}_bytes", text, labels=gpu_labels)
        for name, text in (
            ("total", "Memory of the GPU."),
            ("used", "Memory in use on the GPU."),
            ("free", "Free memory on the GPU."),
            ("reserved", "Memory the driver reserves on the GPU (NVML v2 memory struct)."),
        )
    }
    processes = GaugeMetricFamily(
        "kvcap_gpu_process_memory_bytes",
        "GPU memory used by a process the sidecar can see.",
        labels=[*gpu_labels, "pid"],
    )
    for gpu in snapshot.gpus:
        ids = [gpu.index, gpu.uuid]
        info.add_metric(
            [*ids, gpu.name, gpu.pci_bus_id, gpu.driver_version, _label(gpu.mig_mode)], 1
        )
        memory["total"].add_metric(ids, gpu.memory_total_bytes)
        memory["used"].add_metric(ids, gpu.memory_used_bytes)
        memory["free"].add_metric(ids, gpu.memory_free_bytes)
        if gpu.memory_reserved_bytes is not None:
            memory["reserved"].add_metric(ids, gpu.memory_reserved_bytes)
        for process in gpu.processes:
            processes.add_metric([*ids, str(process.pid)], process.used_bytes)
    engine_gpu = GaugeMetricFamily(
        "kvcap_engine_gpu_info",
        "The GPU each worker of an engine runs on; always 1.",
        labels=[*ENGINE_LABELS, "worker", *gpu_labels],
    )
    for entry in snapshot.engine_gpus:
        engine_gpu.add_metric(
            [entry.engine, entry.model_name, str(entry.worker), entry.gpu, entry.uuid], 1
        )
    headroom = GaugeMetricFamily(
        "kvcap_kv_cache_headroom_tokens",
        "Tokens the engine would gain if the free memory of its most constrained GPU "
        "became KV cache.",
        labels=list(ENGINE_LABELS),
    )
    models = {view.engine: view.model_name for view in snapshot.engines}
    for engine, tokens in sorted(snapshot.headroom_tokens.items()):
        headroom.add_metric([engine, models.get(engine, "")], tokens)
    yield info
    yield from memory.values()
    yield processes
    yield engine_gpu
    yield headroom


def self_families(snapshot: Snapshot) -> Iterator[Metric]:
    """The exporter's own health, node_exporter style."""
    build = GaugeMetricFamily(
        "kvcap_build_info",
        "kvcap's version and the vLLM capacity model it follows; always 1.",
        labels=["version", "python_version", "capacity_model"],
    )
    build.add_metric([__version__, sys.version.split()[0], CAPACITY_MODEL], 1)
    yield build

    up = GaugeMetricFamily(
        "kvcap_collector_up",
        "1 when the collector's last read of the target succeeded.",
        labels=["collector", "target"],
    )
    last_success = GaugeMetricFamily(
        "kvcap_collector_last_success_timestamp_seconds",
        "When the collector last read the target successfully (Unix time).",
        labels=["collector", "target"],
    )
    success = GaugeMetricFamily(
        "kvcap_scrape_collector_success",
        "1 when every target of the collector succeeded on its last read.",
        labels=["collector"],
    )
    duration = GaugeMetricFamily(
        "kvcap_collector_read_duration_seconds",
        "How long the collector's last read of the target took.",
        labels=["collector", "target"],
    )
    ups: dict[str, list[bool]] = {}
    for status in snapshot.collectors:
        ids = [status.collector, status.target]
        up.add_metric(ids, 1 if status.up else 0)
        if status.last_success_s is not None:
            last_success.add_metric(ids, status.last_success_s)
        if status.last_duration_s is not None:
            duration.add_metric(ids, status.last_duration_s)
        ups.setdefault(status.collector, []).append(status.up)
    for collector, found in ups.items():
        success.add_metric([collector], 1 if all(found) else 0)
    errors = CounterMetricFamily(
        "kvcap_collector_errors",
        "Failed reads and rejected inputs, by collector and reason.",
        labels=["collector", "reason"],
    )
    for (collector, reason), count in sorted(snapshot.errors.items()):
        errors.add_metric([collector, reason], count)
    yield from (up, last_success, success, duration, errors)
