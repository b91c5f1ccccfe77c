"""Per-engine state: records collectors write, the store that owns the engines, and the
snapshot scrapes read."""

from exporter.state.records import (
    EngineReport,
    GpuProcessMemory,
    GpuReport,
    KvEventsEndpoint,
    KvUsage,
    OffloadGroupBlocks,
    OffloadTier,
    PoolView,
    ResidencyView,
    SettingsMismatch,
    engine_number,
    engine_sort_key,
)
from exporter.state.snapshot import CollectorStatus, EngineGpu, EngineView, Snapshot
from exporter.state.store import StateSink, StateStore

__all__ = [
    "CollectorStatus",
    "EngineGpu",
    "EngineReport",
    "EngineView",
    "GpuProcessMemory",
    "GpuReport",
    "KvEventsEndpoint",
    "KvUsage",
    "OffloadGroupBlocks",
    "OffloadTier",
    "PoolView",
    "ResidencyView",
    "SettingsMismatch",
    "Snapshot",
    "StateSink",
    "StateStore",
    "engine_number",
    "engine_sort_key",
]
