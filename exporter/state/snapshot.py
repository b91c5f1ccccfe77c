"""The immutable snapshot the scrape path reads, and how reports merge into engine views."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any

from exporter.capacity import NO_CAPACITY, EngineCapacity, merge_capacities
from exporter.merging import first_known
from exporter.state.records import (
    EngineReport,
    GpuReport,
    ResidencyView,
    SettingsMismatch,
)


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    """Health of one collector target (an API server URL, a handshake endpoint, NVML)."""

    collector: str
    target: str
    up: bool
    has_reported: bool  # produced data or its first error: readiness
    last_success_s: float | None
    last_duration_s: float | None
    last_error: str | None


@dataclass(frozen=True, slots=True)
class EngineView(EngineReport):
    """Everything known about one engine: the reports of every collector merged field by
    field (the best collector's known value first), with their freshness and the capacity
    exported. Values are per engine."""

    collectors: tuple[str, ...] = ()
    stale: bool = False
    updated_at_s: float = 0.0
    # The capacity exported: vLLM's reported figures first, derived ones fill the gaps.
    capacity: EngineCapacity = NO_CAPACITY
    capacity_source: str | None = None  # whose token count: "reported" | "derived" | None
    derived_kv_cache_size_tokens: int | None = None
    capacity_mismatch: bool | None = None

    @property
    def approximate(self) -> bool:
        """The exported token count is the capacity model's approximation of a family, or
        the exported block count is an estimate (DP ranks of unequal size behind one API
        server, which reports only their sum; no derivation is made from it then)."""
        if self.capacity.approximate is not True:
            return False
        return self.capacity_source == "derived" or self.derived_kv_cache_size_tokens is None

    @property
    def used_tokens(self) -> float | None:
        """Live tokens in the cache: vLLM's usage ratio times the token capacity."""
        ratio = self.usage.usage_ratio if self.usage else None
        tokens = self.capacity.kv_cache_size_tokens
        return None if ratio is None or tokens is None else ratio * tokens

    @property
    def derivation_failed(self) -> int:
        """1 when kvcap's capacity model could not derive this engine (why: derivation_error)."""
        return 1 if self.derivation_error else 0


@dataclass(frozen=True, slots=True)
class EngineGpu:
    """One worker of an engine and the GPU it runs on."""

    engine: str
    model_name: str
    worker: int
    gpu: str
    uuid: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent view of the whole exporter; replaced, never mutated."""

    version: int
    engines: tuple[EngineView, ...]
    collectors: tuple[CollectorStatus, ...]
    # Errors so far, by (collector, reason): monotonic counters.
    errors: Mapping[tuple[str, str], int]
    taken_at_s: float
    # GPUs in the order the engines' workers see them (CUDA_VISIBLE_DEVICES order).
    gpus: tuple[GpuReport, ...] = ()
    # Which GPU each engine worker uses, and the tokens its free memory would add.
    engine_gpus: tuple[EngineGpu, ...] = ()
    headroom_tokens: Mapping[str, int] = field(default_factory=dict)
    # Each engine's prefix-cache residency (kv_events), in engine order.
    residency: tuple[ResidencyView, ...] = ()
    # Restarts of each engine the state noticed (a new instance): the one count of them.
    restarts: Mapping[str, int] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return all(status.has_reported for status in self.collectors)


EMPTY = Snapshot(version=0, engines=(), collectors=(), errors={}, taken_at_s=0.0)


@dataclass(frozen=True, slots=True)
class Sighting:
    """One collector target's report of one engine, with its freshness."""

    collector: str
    report: EngineReport
    received_at_s: float
    stale: bool


_REPORT_FIELD_NAMES = tuple(f.name for f in fields(EngineReport))
_REPORT_FIELDS: Any = attrgetter(*_REPORT_FIELD_NAMES)


def merge_engine(sightings: Sequence[Sighting]) -> EngineView:
    """Merge what every collector says about one engine; `sightings` best collector first.

    Each field is the first known one (exporter/merging.py); capacity figures: reported
    figures of every collector, then derived.
    """
    reports = [sighting.report for sighting in sightings]
    reported = merge_capacities([r.reported for r in reports])
    derived = merge_capacities([r.derived for r in reports])
    capacity = merge_capacities((reported, derived))
    tokens, derived_tokens = reported.kv_cache_size_tokens, derived.kv_cache_size_tokens
    capacity_source = "reported" if tokens is not None else None
    if capacity_source is None and derived_tokens is not None:
        capacity_source = "derived"
    merged = first_known(reports)
    values = dict(zip(_REPORT_FIELD_NAMES, _REPORT_FIELDS(merged), strict=True))
    values.update(
        reported=reported,
        derived=derived,
        # An engine's workers: where no collector counts them, its per-worker block sizes.
        world_size=merged.world_size or len(capacity.bytes_per_block_per_worker) or None,
        settings_warnings=_settings_warnings(sightings),
    )
    return EngineView(
        **values,
        collectors=tuple(dict.fromkeys(s.collector for s in sightings)),
        stale=all(s.stale for s in sightings),
        updated_at_s=max(s.received_at_s for s in sightings),
        capacity=capacity,
        capacity_source=capacity_source,
        derived_kv_cache_size_tokens=derived_tokens,
        capacity_mismatch=_mismatch(tokens, derived_tokens),
    )


def _mismatch(reported_tokens: int | None, derived_tokens: int | None) -> bool | None:
    if reported_tokens is None or derived_tokens is None:
        return None
    return reported_tokens != derived_tokens


def _settings_warnings(sightings: Sequence[Sighting]) -> tuple[SettingsMismatch, ...]:
    """Each collector's own findings, and where two collectors disagree on the engine's
    workers (TP x PP): the best collector's count is what the engine shows."""
    found = [w for s in sightings for w in s.report.settings_warnings]
    best = next((s for s in sightings if s.report.world_size), None)
    for other in sightings:
        size = other.report.world_size
        if best is None or not size or other.collector == best.collector:
            continue
        if size != best.report.world_size:
            found.append(
                SettingsMismatch(
                    field="world_size",
                    told=f"{size} ({other.collector})",
                    seen=str(best.report.world_size),
                    source=best.collector,
                )
            )
    return tuple(dict.fromkeys(found))
