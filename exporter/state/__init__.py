"""Per-engine state: records sources write, the store, and the snapshot scrapes read."""

from exporter.state.records import (
    EngineReport,
    GpuProcessMemory,
    GpuReport,
    KvUsage,
    ReportedCapacity,
)
from exporter.state.snapshot import EngineView, Snapshot, SourceStatus
from exporter.state.store import StateSink, StateStore

__all__ = [
    "EngineReport",
    "EngineView",
    "GpuProcessMemory",
    "GpuReport",
    "KvUsage",
    "ReportedCapacity",
    "Snapshot",
    "SourceStatus",
    "StateSink",
    "StateStore",
]
