"""Prefix-cache residency families, built from the kv_events collector's views per scrape.

Residency changes with every batch of KV events, so these families are not part of the
snapshot rendered once per state change: they are rendered each scrape, beside the
process_* series. Labels are bounded: engine, KV cache group index, medium (at most four
per engine), a drop reason from a fixed list; never a hash, token or request id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from exporter.exposition.text import header_text, samples_text
from exporter.prefix_cache import LIFETIME_BUCKETS_S, PoolView, ResidencyView

POOL_LABELS = ("engine", "group", "medium")
ENGINE_LABEL = ("engine",)


@dataclass(frozen=True, slots=True)
class _PoolFamily:
    name: str
    help: str
    counter: bool
    value: Callable[[ResidencyView, PoolView], float | None]


def _tokens(view: ResidencyView, pool: PoolView) -> float | None:
    return pool.resident_blocks * pool.block_size if pool.block_size else None


def _ratio(view: ResidencyView, pool: PoolView) -> float | None:
    return pool.resident_blocks / view.pool_blocks if view.pool_blocks else None


_POOL_FAMILIES = (
    _PoolFamily(
        "kvcap_prefix_cache_resident_blocks",
        "Blocks of this KV cache group and medium the engine's prefix cache holds now "
        "(stored and not yet removed, from vLLM's KV events).",
        False,
        lambda view, pool: pool.resident_blocks,
    ),
    _PoolFamily(
        "kvcap_prefix_cache_resident_tokens",
        "Tokens in the resident blocks: resident blocks x the group's block size.",
        False,
        _tokens,
    ),
    _PoolFamily(
        "kvcap_prefix_cache_resident_ratio",
        "Resident blocks / blocks in the engine's pool (num_gpu_blocks).",
        False,
        _ratio,
    ),
    _PoolFamily(
        "kvcap_prefix_cache_stored_blocks",
        "Blocks that entered the resident set (BlockStored of a block not resident).",
        True,
        lambda view, pool: pool.stored_total,
    ),
    _PoolFamily(
        "kvcap_prefix_cache_removed_blocks",
        "Blocks that left the resident set: removed, cleared, pruned or lost to a restart. "
        "stored - removed = resident.",
        True,
        lambda view, pool: pool.removed_total,
    ),
)


@dataclass(frozen=True, slots=True)
class _EngineFamily:
    name: str
    help: str
    counter: bool
    value: Callable[[ResidencyView], float]


_ENGINE_FAMILIES = (
    _EngineFamily(
        "kvcap_kv_events_up",
        "1 while kvcap is connected to the engine's KV event publisher.",
        False,
        lambda view: 1 if view.up else 0,
    ),
    _EngineFamily(
        "kvcap_prefix_cache_approximate",
        "1 when the residency may be incomplete (events were lost or kvcap joined the "
        "stream late) until an AllBlocksCleared or an engine restart; 0 when exact.",
        False,
        lambda view: 1 if view.approximate else 0,
    ),
    _EngineFamily(
        "kvcap_prefix_cache_cleared",
        "Times the residency was emptied: AllBlocksCleared events and engine restarts.",
        True,
        lambda view: view.cleared_total,
    ),
    _EngineFamily(
        "kvcap_kv_events_received",
        "KV events received (BlockStored, BlockRemoved, AllBlocksCleared), read or not.",
        True,
        lambda view: view.events_received_total,
    ),
    _EngineFamily(
        "kvcap_kv_events_gaps",
        "Sequence gaps in the publisher's stream (batches that did not arrive).",
        True,
        lambda view: view.gaps_total,
    ),
)


class PrefixCacheCollector:
    """The residency families of the kv_events collector's views, as text per scrape.

    An engine whose view is the one of the last scrape keeps its sample lines: an idle
    engine costs a comparison, not its ~90 lines (64 engines x 4 groups are ~5,800 lines,
    tens of milliseconds through prometheus_client)."""

    def __init__(self, views: Callable[[], Iterable[ResidencyView]]) -> None:
        self._views = views
        # engine -> (its view, its sample lines per family in prefix_cache_families' order)
        self._engines: dict[str, tuple[ResidencyView, tuple[str, ...]]] = {}
        self._headers = {
            om: tuple(
                header_text(f.name, f.documentation, f.type, openmetrics=om)
                for f in prefix_cache_families(())
            )
            for om in (False, True)
        }

    def text(self, openmetrics: bool) -> str:
        kept = self._engines
        engines = {}
        lines = []
        for view in self._views():
            found = kept.get(view.engine)
            if found is None or found[0] != view:
                found = (view, tuple(samples_text(f) for f in prefix_cache_families([view])))
            engines[view.engine] = found
            lines.append(found[1])
        self._engines = engines  # a whole new dict: scrapes on other threads may read
        return "".join(
            header + "".join(engine[position] for engine in lines)
            for position, header in enumerate(self._headers[openmetrics])
        )


def prefix_cache_families(views: Iterable[ResidencyView]) -> Iterator[Metric]:
    views = list(views)
    pool_families = {
        f.name: (CounterMetricFamily if f.counter else GaugeMetricFamily)(
            f.name, f.help, labels=list(POOL_LABELS)
        )
        for f in _POOL_FAMILIES
    }
    engine_families = {
        f.name: (CounterMetricFamily if f.counter else GaugeMetricFamily)(
            f.name, f.help, labels=list(ENGINE_LABEL)
        )
        for f in _ENGINE_FAMILIES
    }
    lifetimes = HistogramMetricFamily(
        "kvcap_prefix_cache_block_lifetime_seconds",
        "Seconds from a block's BlockStored to its BlockRemoved (engine time): how long "
        "a cached prefix survives.",
        labels=list(POOL_LABELS),
    )
    dropped = CounterMetricFamily(
        "kvcap_kv_events_dropped",
        "KV events or blocks kvcap could not apply, by reason: rejected (an event that "
        "does not decode), malformed_batch, missed (batches lost to a gap), unknown_block "
        "(a removal of a block not resident), too_many_media.",
        labels=[*ENGINE_LABEL, "reason"],
    )
    for view in views:
        for pool in view.pools:
            labels = [view.engine, str(pool.group), pool.medium]
            for family in _POOL_FAMILIES:
                value = family.value(view, pool)
                if value is not None:
                    pool_families[family.name].add_metric(labels, value)
            lifetimes.add_metric(labels, _buckets(pool), pool.lifetime_sum_s)
        for engine_family in _ENGINE_FAMILIES:
            engine_families[engine_family.name].add_metric([view.engine], engine_family.value(view))
        for reason, count in sorted(view.dropped_total.items()):
            dropped.add_metric([view.engine, reason], count)
    yield from pool_families.values()
    yield lifetimes
    yield from engine_families.values()
    yield dropped


def residency_document(view: ResidencyView) -> dict[str, Any]:
    """/engines: the residency of one engine, per group and medium."""
    return {
        "up": view.up,
        "approximate": view.approximate,
        "approximate_reason": view.approximate_reason,
        "pool_blocks": view.pool_blocks,
        "cleared_total": view.cleared_total,
        "events_received_total": view.events_received_total,
        "gaps_total": view.gaps_total,
        "dropped_total": view.dropped_total,
        "groups": [
            {
                "group": pool.group,
                "medium": pool.medium,
                "kind": pool.kind,
                "block_size": pool.block_size,
                "resident_blocks": pool.resident_blocks,
                "resident_tokens": _tokens(view, pool),
                "resident_ratio": _ratio(view, pool),
                "stored_blocks_total": pool.stored_total,
                "removed_blocks_total": pool.removed_total,
                "removals_observed": sum(pool.lifetime_counts),
                "mean_lifetime_s": pool.lifetime_sum_s / sum(pool.lifetime_counts)
                if sum(pool.lifetime_counts)
                else None,
            }
            for pool in view.pools
        ],
    }


def _buckets(pool: PoolView) -> list[tuple[str, float]]:
    buckets, running = [], 0
    for bound, count in zip((*LIFETIME_BUCKETS_S, float("inf")), pool.lifetime_counts, strict=True):
        running += count
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
    return buckets
