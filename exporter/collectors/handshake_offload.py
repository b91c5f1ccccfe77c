"""An engine's offload tier from the plugin's view of its config (the handshake's settings).

The plugin (exporter/vllm_plugin.py) sends the cache config's `kv_offloading_size` and
`kv_offloading_backend`, and the connector name and `cpu_bytes_to_use`, `block_size`,
`blocks_per_chunk` of the `kv_transfer_config` vLLM's post-init resolved them into. They
are read as `vllm serve`'s flags are (exporter/capacity/offload_settings.py) and the tier
is cut from vLLM's own GPU plan of the engine (its groups, blocks and bytes per block,
from the ready message) by the same `cut_tier` the vllm_http collector uses.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from exporter.capacity import EngineCapacity
from exporter.capacity.offload import OffloadSettings
from exporter.capacity.offload_settings import (
    LMCACHE_CONNECTORS,
    NATIVE_CONNECTORS,
    offload_settings,
    offload_size_bytes,
)
from exporter.collectors.offload_derivation import cut_tier
from exporter.errors import KvcapError, UsageError
from exporter.handshake_wire import MAX_PARALLEL, MAX_TEXT_CHARS, ExtrasSettings, ReceivedExtras
from exporter.state import EngineReport, OffloadTier

# kvcap_collector_errors_total{collector="handshake", reason=...} of a bad offload setting.
BAD_OFFLOAD_SETTINGS: Final = "bad_offload_settings"


def plugin_offload_settings(values: ExtrasSettings) -> OffloadSettings | None:
    """The native tier the engine's settings give it; None when they give none (no
    offloading, LMCache's tier, which LMCache sizes, or a connector that is no tier).
    Raises UsageError on a value vLLM could not have started with, or an offloading
    connector kvcap does not model."""
    size = values.kv_offloading_size
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int | float):
            raise UsageError(f"kv_offloading_size: not a number of GiB: {_shown(size)}")
        offload_size_bytes(float(size), flag="kv_offloading_size")  # finite, positive, bounded
    backend = _text(values.kv_offloading_backend, "kv_offloading_backend")
    connector = _text(values.kv_connector, "kv_connector")
    if connector is None:
        return offload_settings(size_gib=size, backend=backend, transfer_config=None)
    if size is None and connector not in NATIVE_CONNECTORS | LMCACHE_CONNECTORS:
        # A connector that moves KV blocks elsewhere (disaggregated prefill's NixlConnector,
        # ...) with no offloading size: no tier, and nothing wrong. With a size, the engine
        # offloads through a connector kvcap does not model (SimpleCPUOffloadConnector):
        # refused below, and counted.
        return None
    extra = {
        key: value
        for key, value in (
            ("cpu_bytes_to_use", values.kv_connector_cpu_bytes_to_use),
            ("block_size", values.kv_connector_block_size),
            ("blocks_per_chunk", values.kv_connector_blocks_per_chunk),
        )
        if value is not None
    }
    # vLLM's post-init wrote the size into the connector's config (or chose LMCache's
    # connector): the connector is what the engine runs, so it decides.
    return offload_settings(
        size_gib=None,
        backend=backend,
        transfer_config={"kv_connector": connector, "kv_connector_extra_config": extra},
    )


def with_offload(
    report: EngineReport, extras: ReceivedExtras | None
) -> tuple[EngineReport, tuple[str, str] | None]:
    """The report with the offload tier the plugin's settings give the engine, cut from
    vLLM's own plan in the report; a bad setting leaves it without one, and is returned as
    (reason, message) for the counters."""
    if extras is None or report.reported is None:
        return report, None
    try:
        settings = plugin_offload_settings(extras.settings)
    except UsageError as error:
        return report, (BAD_OFFLOAD_SETTINGS, str(error)[:200])
    if settings is None:
        return replace(report, offload=()), None
    tier = _cut(report, report.reported, settings, extras.settings.tensor_parallel_size)
    return replace(report, offload=(tier,)), None


def _cut(
    report: EngineReport, capacity: EngineCapacity, settings: OffloadSettings, tp: Any
) -> OffloadTier:
    """The engine's tier cut from vLLM's plan; its configured bytes only where the plan
    cannot cut it (no bytes per block: a pipeline-parallel engine)."""
    workers = report.world_size or 1
    try:
        return cut_tier(
            capacity,
            settings,
            world_size=workers,
            tensor_parallel_size=tp if _parallel_size(tp) else workers,
            # Only an MLA model's copies depend on it: vLLM's platform is CUDA unless
            # the plugin says otherwise.
            platform=report.platform or "cuda",
            version=report.vllm_version,
        )
    except KvcapError:
        return OffloadTier(settings.medium, capacity_bytes=settings.cpu_bytes, source="plugin")


def _text(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
        raise UsageError(f"{name}: not a string of at most {MAX_TEXT_CHARS}: {_shown(value)}")
    return value


def _parallel_size(value: Any) -> bool:
    return type(value) is int and 1 <= value <= MAX_PARALLEL


def _shown(value: Any) -> str:
    """A bad value as a log may show it: short, whatever it is."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
