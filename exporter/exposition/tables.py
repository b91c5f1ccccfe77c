"""The metric contract as tables: one per entity, each column a family (name, help, labels, value).

docs/metrics.md documents every family here; a test keeps the two in step. The renderer
(render.py) walks these tables; so does the test that renders the same families through
prometheus_client and compares the bytes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

from exporter import __version__
from exporter.capacity import GroupCapacity
from exporter.exposition.columns import Column, Table, label, live_gauge
from exporter.exposition.residency import RESIDENCY_TABLES
from exporter.state import (
    CollectorStatus,
    EngineGpu,
    EngineView,
    GpuProcessMemory,
    GpuReport,
    OffloadGroupBlocks,
    OffloadTier,
    ResidencyView,
    Snapshot,
)

ENGINE_LABELS = ("engine", "model_name")
CAPACITY_MODEL = "vllm-0.33"


# The view's fields only live columns read (used tokens, staleness, last update): they
# change with every poll, and the kept bytes must not depend on them.
LIVE_VIEW_FIELDS = ("usage", "stale", "updated_at_s")
_STATIC_FIELDS = attrgetter(*(f.name for f in fields(EngineView) if f.name not in LIVE_VIEW_FIELDS))


@dataclass(frozen=True, slots=True)
class EngineRow:
    """One engine with what the snapshot knows about it beyond its view."""

    view: EngineView
    gpus: tuple[EngineGpu, ...]  # the GPU of each worker, where known
    headroom_tokens: int | None

    @property
    def static_key(self) -> tuple[object, ...]:
        """What every non-live engine family reads: equal keys render equal bytes. Every
        field of the view but those only live columns read, so a new field is in the key
        (and its families re-rendered when it changes) without a word here."""
        return (_STATIC_FIELDS(self.view), self.gpus)


@dataclass(frozen=True, slots=True)
class WorkerRow:
    engine: EngineRow
    worker: int
    kv_cache_bytes: int
    gpu: EngineGpu | None


@dataclass(frozen=True, slots=True)
class GroupRow:
    engine: EngineRow
    index: int
    group: GroupCapacity


@dataclass(frozen=True, slots=True)
class OffloadRow:
    """One KV offload tier of an engine."""

    engine: EngineRow
    tier: OffloadTier


def offload_rows(row: EngineRow) -> list[OffloadRow]:
    return [OffloadRow(row, tier) for tier in row.view.offload]


@dataclass(frozen=True, slots=True)
class OffloadGroupRow:
    """One KV cache group's share of an engine's offload tier."""

    engine: EngineRow
    medium: str
    group: OffloadGroupBlocks


def offload_group_rows(row: EngineRow) -> list[OffloadGroupRow]:
    return [
        OffloadGroupRow(row, tier.medium, group)
        for tier in row.view.offload
        for group in tier.groups
    ]


@dataclass(frozen=True, slots=True)
class SettingsRow:
    """One engine setting kvcap was told that the engine contradicts."""

    engine: EngineRow
    field: str


def settings_rows(row: EngineRow) -> list[SettingsRow]:
    fields = dict.fromkeys(mismatch.field for mismatch in row.view.settings_warnings)
    return [SettingsRow(row, field) for field in fields]


def _engine_ids(row: EngineRow) -> tuple[str, ...]:
    return (row.view.engine, row.view.model_name)


def _capacity_labels(row: EngineRow) -> tuple[str, ...]:
    c, v = row.view.capacity, row.view
    return (
        label(c.kv_cache_size_tokens),
        label(c.kv_cache_max_concurrency),
        label(c.num_gpu_blocks),
        label(c.block_size),
        label(c.max_model_len),
        label(c.cache_dtype),
        label(v.capacity_source),
        label(v.approximate),
    )


def _flag(value: bool | None) -> float | None:
    return None if value is None else (1 if value else 0)


ENGINE: Table[EngineRow] = Table(
    ENGINE_LABELS,
    _engine_ids,
    (
        Column(
            "kvcap_engine_info",
            "Identity of a vLLM engine (one data-parallel rank); always 1.",
            extra_labels=("vllm_version", "instance_id", "collectors"),
            extra=lambda r: (
                label(r.view.vllm_version),
                label(r.view.instance_id),
                ",".join(r.view.collectors),
            ),
        ),
        Column(
            "kvcap_kv_cache_info",
            "The engine's KV cache capacity as labels, like vllm:cache_config_info but per "
            "engine and group-aware; always 1.",
            value=lambda r: None if r.view.capacity.kv_cache_size_tokens is None else 1,
            extra_labels=(
                "kv_cache_size_tokens",
                "kv_cache_max_concurrency",
                "num_gpu_blocks",
                "block_size",
                "max_model_len",
                "cache_dtype",
                "capacity_source",
                "approximate",
            ),
            extra=_capacity_labels,
        ),
        Column(
            "kvcap_kv_cache_capacity_tokens",
            "KV cache capacity of the engine in tokens: int(max_concurrency x "
            "max_model_len), vLLM's 'GPU KV cache size'. Reported by vLLM where it "
            "reports it, else derived.",
            lambda r: r.view.capacity.kv_cache_size_tokens,
        ),
        Column(
            "kvcap_kv_cache_max_concurrency",
            "Requests of max_model_len tokens the engine's KV cache holds at once.",
            lambda r: r.view.capacity.kv_cache_max_concurrency,
        ),
        Column(
            "kvcap_kv_cache_blocks",
            "Blocks in the engine's shared KV cache pool.",
            lambda r: r.view.capacity.num_gpu_blocks,
        ),
        Column(
            "kvcap_kv_cache_block_size_tokens",
            "Tokens per block (smallest block size of the prefix-cacheable groups).",
            lambda r: r.view.capacity.block_size,
        ),
        Column(
            "kvcap_max_model_len_tokens",
            "The engine's max_model_len.",
            lambda r: r.view.capacity.max_model_len,
        ),
        live_gauge(
            "kvcap_kv_cache_used_tokens",
            "Tokens in use now: vllm:kv_cache_usage_perc x capacity tokens.",
            lambda r: r.view.used_tokens,
        ),
        Column(
            "kvcap_kv_cache_derived_capacity_tokens",
            "Capacity in tokens as kvcap's capacity model derives it from config.json "
            "and the engine settings.",
            lambda r: r.view.derived_kv_cache_size_tokens,
        ),
        Column(
            "kvcap_kv_cache_derivation_failed",
            "1 when kvcap's capacity model could not derive the engine's capacity (the reason "
            "is logged and in /engines as derivation_error), else 0.",
            lambda r: r.view.derivation_failed,
        ),
        Column(
            "kvcap_kv_cache_blocks_per_request",
            "Blocks one request of max_model_len tokens needs, summed over KV cache groups.",
            lambda r: r.view.capacity.blocks_per_request,
        ),
        Column(
            "kvcap_kv_cache_capacity_mismatch",
            "1 when the capacity vLLM reports differs from the derived one, 0 when they agree.",
            lambda r: _flag(r.view.capacity_mismatch),
        ),
        live_gauge(
            "kvcap_engine_stale",
            "1 when no collector has fresh data of this engine: reads failed or heartbeats "
            "stopped (last good data shown).",
            lambda r: 1 if r.view.stale else 0,
        ),
        live_gauge(
            "kvcap_engine_last_update_timestamp_seconds",
            "When a collector last read this engine successfully (Unix time).",
            lambda r: r.view.updated_at_s,
        ),
        live_gauge(
            "kvcap_kv_cache_headroom_tokens",
            "Tokens the engine would gain if the free memory of its most constrained GPU "
            "became KV cache.",
            lambda r: r.headroom_tokens,
        ),
    ),
)

# The labels of a worker's series: the KV cache bytes and the GPU info join on them.
WORKER_LABELS = (*ENGINE_LABELS, "worker", "gpu", "uuid")

WORKER: Table[WorkerRow] = Table(
    WORKER_LABELS,
    lambda r: (
        r.engine.view.engine,
        r.engine.view.model_name,
        str(r.worker),
        r.gpu.gpu if r.gpu else "",
        r.gpu.uuid if r.gpu else "",
    ),
    (
        Column(
            "kvcap_kv_cache_bytes",
            "Bytes of KV cache tensors on each worker (TP x PP rank) of the engine, with the "
            "worker's GPU where known.",
            lambda r: r.kv_cache_bytes,
        ),
    ),
)

ENGINE_GPU: Table[EngineGpu] = Table(
    WORKER_LABELS,
    lambda g: (g.engine, g.model_name, str(g.worker), g.gpu, g.uuid),
    (Column("kvcap_engine_gpu_info", "The GPU each worker of an engine runs on; always 1."),),
)

GROUP: Table[GroupRow] = Table(
    (*ENGINE_LABELS, "group"),
    lambda r: (r.engine.view.engine, r.engine.view.model_name, str(r.index)),
    (
        Column(
            "kvcap_kv_cache_group_info",
            "A KV cache group of the engine (layers that allocate blocks together); always 1.",
            extra_labels=(
                "kind",
                "spec_type",
                "block_size",
                "sliding_window",
                "attention_chunk_size",
            ),
            extra=lambda r: (
                r.group.kind,
                r.group.spec_type,
                str(r.group.block_size),
                label(r.group.sliding_window),
                label(r.group.attention_chunk_size),
            ),
        ),
        Column(
            "kvcap_kv_cache_group_layers",
            "Layers in the group on the first pipeline stage.",
            lambda r: r.group.num_layers,
        ),
        Column(
            "kvcap_kv_cache_group_blocks_per_request",
            "Blocks one max_model_len request needs in this group.",
            lambda r: r.group.blocks_per_request,
        ),
        Column(
            "kvcap_kv_cache_group_page_bytes",
            "Bytes of one block of this group per layer.",
            lambda r: r.group.page_size_bytes,
        ),
    ),
)

GPU: Table[GpuReport] = Table(
    ("gpu", "uuid"),
    lambda g: (g.index, g.uuid),
    (
        Column(
            "kvcap_gpu_info",
            "A GPU (or MIG instance) NVML reports; always 1.",
            extra_labels=("name", "pci_bus_id", "driver_version", "mig_mode"),
            extra=lambda g: (g.name, g.pci_bus_id, g.driver_version, label(g.mig_mode)),
        ),
        live_gauge(
            "kvcap_gpu_memory_total_bytes",
            "Memory of the GPU.",
            lambda g: g.memory_total_bytes,
        ),
        live_gauge(
            "kvcap_gpu_memory_used_bytes",
            "Memory in use on the GPU.",
            lambda g: g.memory_used_bytes,
        ),
        live_gauge(
            "kvcap_gpu_memory_free_bytes",
            "Free memory on the GPU.",
            lambda g: g.memory_free_bytes,
        ),
        live_gauge(
            "kvcap_gpu_memory_reserved_bytes",
            "Memory the driver reserves on the GPU (NVML v2 memory struct).",
            lambda g: g.memory_reserved_bytes,
        ),
    ),
)

GPU_PROCESS: Table[tuple[GpuReport, GpuProcessMemory]] = Table(
    ("gpu", "uuid", "pid"),
    lambda r: (r[0].index, r[0].uuid, str(r[1].pid)),
    (
        live_gauge(
            "kvcap_gpu_process_memory_bytes",
            "GPU memory used by a process the sidecar can see.",
            lambda r: r[1].used_bytes,
        ),
    ),
)

BUILD: Table[None] = Table(
    ("version", "python_version", "capacity_model"),
    lambda _: (__version__, sys.version.split()[0], CAPACITY_MODEL),
    (
        Column(
            "kvcap_build_info", "kvcap's version and the vLLM capacity model it follows; always 1."
        ),
    ),
)

COLLECTOR_TARGET: Table[CollectorStatus] = Table(
    ("collector", "target"),
    lambda s: (s.collector, s.target),
    (
        live_gauge(
            "kvcap_collector_up",
            "1 when the collector's last read of the target succeeded.",
            lambda s: 1 if s.up else 0,
        ),
        live_gauge(
            "kvcap_collector_last_success_timestamp_seconds",
            "When the collector last read the target successfully (Unix time).",
            lambda s: s.last_success_s,
        ),
        live_gauge(
            "kvcap_collector_read_duration_seconds",
            "How long the collector's last read of the target took.",
            lambda s: s.last_duration_s,
        ),
    ),
)

COLLECTOR: Table[tuple[str, bool]] = Table(
    ("collector",),
    lambda c: (c[0],),
    (
        live_gauge(
            "kvcap_collector_all_targets_up",
            "1 when every target of the collector succeeded on its last read.",
            lambda c: 1 if c[1] else 0,
        ),
    ),
)

ERRORS: Table[tuple[tuple[str, str], int]] = Table(
    ("collector", "reason"),
    lambda e: e[0],
    (
        Column(
            "kvcap_collector_errors",
            "Failed reads and rejected inputs, by collector and reason.",
            lambda e: e[1],
            kind="counter",
            live=True,
        ),
    ),
)


RESTARTS: Table[tuple[EngineView, int]] = Table(
    ENGINE_LABELS,
    lambda r: (r[0].engine, r[0].model_name),
    (
        Column(
            "kvcap_engine_restarts",
            "Restarts of the engine kvcap noticed since it started (a new instance_id; where "
            "none is known, a new block count).",
            lambda r: r[1],
            kind="counter",
        ),
    ),
)


def restart_rows(snapshot: Snapshot) -> list[tuple[EngineView, int]]:
    """The engines shown that restarted: the series follow the engines, not every index
    a peer ever named."""
    return [
        (v, snapshot.restarts[v.engine]) for v in snapshot.engines if v.engine in snapshot.restarts
    ]


def worker_rows(row: EngineRow) -> Iterable[WorkerRow]:
    gpu_of = {gpu.worker: gpu for gpu in row.gpus}
    for worker, size in enumerate(row.view.capacity.kv_cache_bytes_per_worker):
        yield WorkerRow(row, worker, size, gpu_of.get(worker))


def group_rows(row: EngineRow) -> Iterable[GroupRow]:
    for index, group in enumerate(row.view.capacity.groups):
        yield GroupRow(row, index, group)


def collector_rows(statuses: Sequence[CollectorStatus]) -> list[tuple[str, bool]]:
    """Each collector, and whether every one of its targets is up."""
    ups: dict[str, bool] = {}
    for status in statuses:
        ups[status.collector] = ups.get(status.collector, True) and status.up
    return list(ups.items())


def gpu_process_rows(snapshot: Snapshot) -> list[tuple[GpuReport, GpuProcessMemory]]:
    return [(gpu, process) for gpu in snapshot.gpus for process in gpu.processes]


def engine_rows(snapshot: Snapshot) -> list[EngineRow]:
    """The snapshot's engines in order, each with its workers' GPUs and its headroom."""
    gpus: dict[str, list[EngineGpu]] = {}
    for gpu in snapshot.engine_gpus:
        gpus.setdefault(gpu.engine, []).append(gpu)
    return [
        EngineRow(view, tuple(gpus.get(view.engine, ())), snapshot.headroom_tokens.get(view.engine))
        for view in snapshot.engines
    ]


SETTINGS: Table[SettingsRow] = Table(
    (*ENGINE_LABELS, "field"),
    lambda r: (r.engine.view.engine, r.engine.view.model_name, r.field),
    (
        Column(
            "kvcap_engine_settings_mismatch",
            "1 for each engine setting kvcap was told (--vllm.args, or another collector) "
            "that the engine contradicts (field: the setting); the derivation used the told "
            "value. Details in /engines settings_warnings.",
        ),
    ),
)

OFFLOAD: Table[OffloadRow] = Table(
    (*ENGINE_LABELS, "medium"),
    lambda r: (r.engine.view.engine, r.engine.view.model_name, r.tier.medium),
    (
        Column(
            "kvcap_kv_offload_capacity_tokens",
            "KV tokens the engine's offload tier (medium: cpu) holds when full of "
            "max_model_len prefixes: vLLM's bound (vllm:kv_offload_config_info), else kvcap's "
            "model of the release's offloading code (every group's chunks a hit needs).",
            lambda r: r.tier.capacity_tokens,
        ),
        Column(
            "kvcap_kv_offload_capacity_blocks",
            "Size of the engine's offload tier in GPU KV cache blocks: chunks x blocks per "
            "chunk (vllm:kv_offload_config_info).",
            lambda r: r.tier.capacity_blocks,
        ),
        Column(
            "kvcap_kv_offload_capacity_bytes",
            "Size of the engine's offload tier in bytes: chunks x page-aligned chunk bytes, "
            "else (released vLLM) the --kv-offloading-size it is cut from.",
            lambda r: r.tier.capacity_bytes,
        ),
    ),
)


OFFLOAD_GROUP: Table[OffloadGroupRow] = Table(
    (*ENGINE_LABELS, "medium", "group"),
    lambda r: (
        r.engine.view.engine,
        r.engine.view.model_name,
        r.medium,
        str(r.group.group),
    ),
    (
        Column(
            "kvcap_kv_offload_blocks",
            "GPU KV cache blocks of one KV cache group (group: its index) in the engine's "
            "offload tier when it is full of max_model_len prefixes: all of a full-attention "
            "group's chunks, a sliding-window or Mamba group's window only (kvcap's model).",
            lambda r: r.group.blocks,
        ),
    ),
)


# The exposition's layout: tables in output order, each with its rows. First the tables
# of one engine (rows of one engine; the renderer keeps their bytes per engine) ...
ENGINE_TABLES: tuple[tuple[Table[Any], Callable[[EngineRow], Iterable[Any]]], ...] = (
    (ENGINE, lambda row: (row,)),
    (WORKER, worker_rows),
    (ENGINE_GPU, lambda row: row.gpus),
    (GROUP, group_rows),
    (SETTINGS, settings_rows),
    (OFFLOAD, offload_rows),
    (OFFLOAD_GROUP, offload_group_rows),
)
# ... then the tables of the whole snapshot.
SNAPSHOT_TABLES: tuple[tuple[Table[Any], Callable[[Snapshot], Iterable[Any]]], ...] = (
    (GPU, lambda snapshot: snapshot.gpus),
    (GPU_PROCESS, gpu_process_rows),
    (BUILD, lambda snapshot: (None,)),
    (COLLECTOR_TARGET, lambda snapshot: snapshot.collectors),
    (COLLECTOR, lambda snapshot: collector_rows(snapshot.collectors)),
    (RESTARTS, restart_rows),
    (ERRORS, lambda snapshot: sorted(snapshot.errors.items())),
)


@dataclass(frozen=True, slots=True)
class Placed:
    """One family as the exposition shows it: its table, its column and where its rows
    come from (one engine's, or the whole snapshot's)."""

    table: Table[Any]
    column: Column[Any]
    per_engine: Callable[[EngineRow], Iterable[Any]] | None = None
    per_snapshot: Callable[[Snapshot], Iterable[Any]] | None = None
    # Rows of one engine's residency record (the renderer keeps each record's bytes).
    per_residency: Callable[[ResidencyView], Iterable[Any]] | None = None

    def rows(self, snapshot: Snapshot, engines: Sequence[EngineRow]) -> Iterable[Any]:
        if self.per_engine is not None:
            return [row for engine in engines for row in self.per_engine(engine)]
        if self.per_residency is not None:
            return [row for record in snapshot.residency for row in self.per_residency(record)]
        assert self.per_snapshot is not None
        return self.per_snapshot(snapshot)


def _layout() -> tuple[Placed, ...]:
    placed = (
        [
            Placed(table, column, per_engine=rows)
            for table, rows in ENGINE_TABLES
            for column in table.columns
        ]
        + [
            Placed(table, column, per_snapshot=rows)
            for table, rows in SNAPSHOT_TABLES
            for column in table.columns
        ]
        + [
            Placed(table, column, per_residency=record_rows)
            for table, record_rows in RESIDENCY_TABLES
            for column in table.columns
        ]
    )
    return tuple(sorted(placed, key=lambda p: p.column.live))


# Every family in output order: first those that change only with an engine's capacity,
# identity or GPUs, then the live ones, so a poll leaves the first part's bytes (and
# their gzip) whole.
LAYOUT = _layout()
