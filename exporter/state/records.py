"""What collectors tell the state about engines and GPUs: typed, immutable records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.capacity import EngineCapacity


def engine_number(engine: str) -> int | None:
    """vLLM's engine index (the global DP rank) as a number; None for a label that is not
    one (ASCII digits only: `int()` refuses other Unicode digits)."""
    return int(engine) if engine.isascii() and engine.isdigit() else None


def engine_sort_key(engine: str) -> tuple[int, int, str]:
    """Engines in numeric order, any odd labels after them."""
    number = engine_number(engine)
    return (0, number, "") if number is not None else (1, 0, engine)


@dataclass(frozen=True, slots=True)
class KvUsage:
    """Live load of one engine, from vLLM's own gauges."""

    usage_ratio: float | None = None  # vllm:kv_cache_usage_perc (0..1)
    requests_running: float | None = None
    requests_waiting: float | None = None


@dataclass(frozen=True, slots=True)
class KvEventsEndpoint:
    """Where one engine publishes its KV events, as a subscriber connects to it.
    `engine` None: the engine is the DP rank the batches carry."""

    endpoint: str
    replay_endpoint: str | None = None
    engine: str | None = None


@dataclass(frozen=True, slots=True)
class OffloadGroupBlocks:
    """One KV cache group's share of an offload tier, in GPU blocks, when the tier is full
    of max_model_len prefixes (exporter/capacity/offload.py)."""

    group: int
    kind: str
    blocks: int


@dataclass(frozen=True, slots=True)
class OffloadTier:
    """The capacity of one engine's KV offload tier (a medium KV blocks are copied out to),
    as vLLM reports it; None where the source does not say."""

    medium: str  # "cpu": the tier's label prefix in vllm:kv_offload_config_info
    capacity_tokens: int | None = None
    capacity_blocks: int | None = None  # in GPU KV cache blocks (chunks x blocks per chunk)
    capacity_bytes: int | None = None
    # Where the figures come from: "kv_offload_config_info" (exact), "cache_config_info"
    # (released vLLM: the configured --kv-offloading-size the tier is cut from), or
    # "derived" (that size cut into chunks by kvcap's model of vLLM's offloading code), or
    # "plugin" (the size the plugin's settings give, where the engine's plan cannot cut it).
    source: str = "kv_offload_config_info"
    groups: tuple[OffloadGroupBlocks, ...] = ()


@dataclass(frozen=True, slots=True)
class SettingsMismatch:
    """An engine setting kvcap was told (`--vllm.args`, or another collector) that what the
    engine shows contradicts: a derivation from the told settings would be wrong."""

    field: str  # the setting, as `vllm serve` names it without dashes: "max_model_len"
    told: str
    seen: str
    source: str  # where the seen value comes from: "/v1/models", "/metrics", a collector

    @property
    def message(self) -> str:
        return f"{self.field}: told {self.told}, but {self.source} shows {self.seen}"


@dataclass(frozen=True, slots=True)
class EngineReport:
    """One collector's view of one engine (one data-parallel rank)."""

    engine: str  # vLLM's engine index = global DP rank, as vLLM spells it in labels
    model_name: str
    instance_id: str | None = None
    vllm_version: str | None = None
    # The vLLM platform the engine runs on ("cuda", "cpu"), when a collector knows it.
    platform: str | None = None
    # The start-up line(s) the engine's release prints, by the capacity model, and why
    # their token figure differs from the capacity where it does (old releases).
    log_lines: tuple[str, ...] = ()
    log_note: str | None = None
    # vLLM's own figures, and the capacity model's (both the one capacity type).
    reported: EngineCapacity | None = None
    derived: EngineCapacity | None = None
    # Why the capacity model could not derive this engine, when it could not.
    derivation_error: str | None = None
    usage: KvUsage | None = None
    # Where the engine's workers run: TP x PP workers, the engine's index among the
    # engines of its node, and its CUDA_VISIBLE_DEVICES entries when a collector knows them.
    world_size: int | None = None
    local_rank: int | None = None
    devices: tuple[str, ...] = ()
    kv_events: KvEventsEndpoint | None = None  # the engine's KV event publisher, if on
    # Settings the collector was told that the engine contradicts.
    settings_warnings: tuple[SettingsMismatch, ...] = ()
    offload: tuple[OffloadTier, ...] = ()  # the engine's KV offload tiers, if any


@dataclass(frozen=True, slots=True)
class GpuProcessMemory:
    pid: int
    used_bytes: int


@dataclass(frozen=True, slots=True)
class GpuReport:
    """One GPU (or MIG instance) as NVML reports it."""

    index: str  # NVML device index, as a label value ("0"; "0/1" for a MIG instance)
    uuid: str
    name: str
    pci_bus_id: str
    driver_version: str
    memory_total_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    memory_reserved_bytes: int | None = None  # the v2 memory struct only
    mig_mode: bool = False
    processes: tuple[GpuProcessMemory, ...] = ()
    # Position in the engines' CUDA_VISIBLE_DEVICES order (vLLM's logical device index);
    # None: the GPU's position in the published list.
    visible_index: int | None = None


@dataclass(frozen=True, slots=True)
class PoolView:
    """What one KV cache group and medium of an engine's prefix cache holds (KV events)."""

    group: int
    medium: str
    resident_blocks: int
    block_size: int | None
    kind: str | None
    stored_total: int
    removed_total: int
    lifetime_counts: tuple[int, ...]  # per bucket of LIFETIME_BUCKETS_S, then +Inf
    lifetime_sum_s: float


@dataclass(frozen=True, slots=True)
class ResidencyView:
    """One engine's prefix-cache residency as the kv_events collector last published it:
    whole batches only, replaced (never changed) when the engine's stream moves."""

    engine: str
    pools: tuple[PoolView, ...]
    pool_blocks: int | None
    approximate: bool
    approximate_reason: str | None
    cleared_total: int
    events_received_total: int
    dropped_total: Mapping[str, int]
    gaps_total: int
    up: bool
