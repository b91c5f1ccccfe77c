"""The immutable snapshot the scrape path reads, and how reports merge into engine views."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.capacity import GroupCapacity
from exporter.state.records import EngineReport, GpuReport, engine_sort_key

# When two sources describe one engine, the more exact one wins: the handshake carries
# vLLM's own numbers per engine; the HTTP source reads them from labels.
SOURCE_PRIORITY = ("handshake", "vllm_http")


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """Health of one source target (an API server URL, a handshake endpoint, NVML)."""

    source: str
    target: str
    up: bool
    has_reported: bool  # produced data or its first error: readiness
    last_success_s: float | None
    last_duration_s: float | None
    last_error: str | None


@dataclass(frozen=True, slots=True)
class EngineView:
    """Everything known about one engine, merged over sources. Values are per engine."""

    engine: str
    model_name: str
    instance_id: str | None
    vllm_version: str | None
    sources: tuple[str, ...]
    stale: bool
    updated_at_s: float
    # The capacity exported: vLLM's reported numbers where present, else derived ones.
    capacity_source: str | None  # "reported" | "derived" | None
    kv_cache_size_tokens: int | None
    max_concurrency: float | None
    num_gpu_blocks: int | None
    block_size: int | None
    max_model_len: int | None
    cache_dtype: str | None
    derived_kv_cache_size_tokens: int | None
    derivation_error: str | None
    capacity_mismatch: bool | None
    approximate: bool
    groups: tuple[GroupCapacity, ...]
    kv_cache_bytes_per_worker: tuple[int, ...]
    usage_ratio: float | None
    requests_running: float | None
    requests_waiting: float | None
    world_size: int | None = None
    local_rank: int | None = None
    devices: tuple[str, ...] = ()

    @property
    def used_tokens(self) -> float | None:
        """Live tokens in the cache: vLLM's usage ratio times the token capacity."""
        if self.usage_ratio is None or self.kv_cache_size_tokens is None:
            return None
        return self.usage_ratio * self.kv_cache_size_tokens

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
    sources: tuple[SourceStatus, ...]
    # Errors so far, by (source, reason): monotonic counters.
    errors: Mapping[tuple[str, str], int]
    taken_at_s: float
    # GPUs in the order the engines' workers see them (CUDA_VISIBLE_DEVICES order).
    gpus: tuple[GpuReport, ...] = ()
    # Which GPU each engine worker uses, and the tokens its free memory would add.
    engine_gpus: tuple[EngineGpu, ...] = ()
    headroom_tokens: Mapping[str, int] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return all(status.has_reported for status in self.sources)


EMPTY = Snapshot(version=0, engines=(), sources=(), errors={}, taken_at_s=0.0)


@dataclass(frozen=True, slots=True)
class SourceReports:
    """The last good reports of one (source, target), with their freshness."""

    source: str
    target: str
    reports: tuple[EngineReport, ...]
    received_at_s: float
    stale: bool


def _priority(source: str) -> int:
    return SOURCE_PRIORITY.index(source) if source in SOURCE_PRIORITY else len(SOURCE_PRIORITY)


def merge_engine(entries: Sequence[tuple[SourceReports, EngineReport]]) -> EngineView:
    """Merge what every source says about one engine; the best source first."""
    ordered = sorted(entries, key=lambda entry: _priority(entry[0].source))
    reports = [report for _, report in ordered]
    reported = next((r.reported for r in reports if r.reported is not None), None)
    derived = next((r.derived for r in reports if r.derived is not None), None)
    usage = next((r.usage for r in reports if r.usage is not None), None)
    best = reports[0]

    tokens = reported.kv_cache_size_tokens if reported else None
    capacity_source = "reported" if tokens is not None else None
    if tokens is None and derived is not None:
        tokens, capacity_source = derived.kv_cache_size_tokens, "derived"

    def pick(reported_value: int | float | None, derived_value: int | float | None) -> float | None:
        return reported_value if reported_value is not None else derived_value

    num_blocks = _int(
        pick(
            reported.num_gpu_blocks if reported else None,
            derived.num_gpu_blocks if derived else None,
        )
    )
    bytes_per_block = (reported.bytes_per_block_per_worker if reported else ()) or (
        derived.bytes_per_block_per_worker if derived else ()
    )
    mismatch = None
    if reported is not None and derived is not None and reported.kv_cache_size_tokens is not None:
        mismatch = reported.kv_cache_size_tokens != derived.kv_cache_size_tokens
    return EngineView(
        engine=best.engine,
        model_name=next((r.model_name for r in reports if r.model_name), ""),
        instance_id=next((r.instance_id for r in reports if r.instance_id), None),
        vllm_version=next((r.vllm_version for r in reports if r.vllm_version), None),
        sources=tuple(dict.fromkeys(entry.source for entry, _ in ordered)),
        stale=all(entry.stale for entry, _ in ordered),
        updated_at_s=max(entry.received_at_s for entry, _ in ordered),
        capacity_source=capacity_source,
        kv_cache_size_tokens=tokens,
        max_concurrency=pick(
            reported.max_concurrency if reported else None,
            derived.max_concurrency if derived else None,
        ),
        num_gpu_blocks=num_blocks,
        block_size=_int(
            pick(reported.block_size if reported else None, derived.block_size if derived else None)
        ),
        max_model_len=_int(
            pick(
                reported.max_model_len if reported else None,
                derived.max_model_len if derived else None,
            )
        ),
        cache_dtype=(reported.cache_dtype if reported else None)
        or (derived.kv_cache_dtype if derived else None),
        derived_kv_cache_size_tokens=derived.kv_cache_size_tokens if derived else None,
        derivation_error=next((r.derivation_error for r in reports if r.derivation_error), None),
        capacity_mismatch=mismatch,
        approximate=bool(derived and derived.approximate and capacity_source == "derived"),
        groups=(reported.groups if reported else ()) or (derived.groups if derived else ()),
        kv_cache_bytes_per_worker=tuple(b * num_blocks for b in bytes_per_block)
        if num_blocks is not None
        else (),
        usage_ratio=usage.usage_ratio if usage else None,
        requests_running=usage.requests_running if usage else None,
        requests_waiting=usage.requests_waiting if usage else None,
        world_size=next((r.world_size for r in reports if r.world_size), None)
        or (len(bytes_per_block) or None),
        local_rank=next((r.local_rank for r in reports if r.local_rank is not None), None),
        devices=next((r.devices for r in reports if r.devices), ()),
    )


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def build_engine_views(entries: Sequence[SourceReports]) -> tuple[EngineView, ...]:
    """One view per engine index, sorted numerically as vLLM numbers engines."""
    by_engine: dict[str, list[tuple[SourceReports, EngineReport]]] = {}
    for entry in entries:
        for report in entry.reports:
            by_engine.setdefault(report.engine, []).append((entry, report))
    views = [merge_engine(found) for found in by_engine.values()]
    return tuple(sorted(views, key=lambda v: engine_sort_key(v.engine)))
