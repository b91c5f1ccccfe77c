"""Prefix-cache residency as metric tables, from the snapshot's residency records.

The kv_events collector publishes each engine's residency into the state once per tick;
these tables render it like every other family. Labels are bounded: engine, KV cache
group index, medium (at most four per engine), a drop reason from a fixed list; never a
hash, token or request id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from exporter.exposition.columns import Column, Table, live_gauge
from exporter.prefix_cache import LIFETIME_BUCKETS_S
from exporter.state import PoolView, ResidencyView

PoolRow = tuple[ResidencyView, PoolView]
Row = TypeVar("Row")
DroppedRow = tuple[ResidencyView, str, int]


def counter(name: str, help_text: str, value: Callable[[Row], float | None]) -> Column[Row]:
    """A counter of the residency: live, as every residency family (a tick moves it)."""
    return Column(name, help_text, value, kind="counter", live=True)


def _tokens(row: PoolRow) -> float | None:
    pool = row[1]
    return pool.resident_blocks * pool.block_size if pool.block_size else None


def _ratio(row: PoolRow) -> float | None:
    view, pool = row
    return pool.resident_blocks / view.pool_blocks if view.pool_blocks else None


POOL: Table[PoolRow] = Table(
    ("engine", "group", "medium"),
    lambda r: (r[0].engine, str(r[1].group), r[1].medium),
    (
        live_gauge(
            "kvcap_prefix_cache_resident_blocks",
            "Blocks of this KV cache group and medium the engine's prefix cache holds now "
            "(stored and not yet removed, from vLLM's KV events).",
            lambda r: r[1].resident_blocks,
        ),
        live_gauge(
            "kvcap_prefix_cache_resident_tokens",
            "Tokens in the resident blocks: resident blocks x the group's block size.",
            _tokens,
        ),
        live_gauge(
            "kvcap_prefix_cache_resident_ratio",
            "Resident blocks / blocks in the engine's pool (num_gpu_blocks).",
            _ratio,
        ),
        counter(
            "kvcap_prefix_cache_stored_blocks",
            "Blocks that entered the resident set (BlockStored of a block not resident).",
            lambda r: r[1].stored_total,
        ),
        counter(
            "kvcap_prefix_cache_removed_blocks",
            "Blocks that left the resident set: removed, cleared, pruned or lost to a "
            "restart. stored - removed = resident.",
            lambda r: r[1].removed_total,
        ),
        Column(
            "kvcap_prefix_cache_block_lifetime_seconds",
            "Seconds from a block's BlockStored to its BlockRemoved (engine time): how long "
            "a cached prefix survives.",
            kind="histogram",
            bounds=LIFETIME_BUCKETS_S,
            observations=lambda r: (r[1].lifetime_counts, r[1].lifetime_sum_s),
            live=True,
        ),
    ),
)

ENGINE: Table[ResidencyView] = Table(
    ("engine",),
    lambda view: (view.engine,),
    (
        live_gauge(
            "kvcap_kv_events_up",
            "1 while kvcap is connected to the engine's KV event publisher.",
            lambda view: 1 if view.up else 0,
        ),
        live_gauge(
            "kvcap_prefix_cache_approximate",
            "1 when the residency may be incomplete (events were lost or kvcap joined the "
            "stream late) until an AllBlocksCleared or an engine restart; 0 when exact.",
            lambda view: 1 if view.approximate else 0,
        ),
        counter(
            "kvcap_prefix_cache_cleared",
            "Times the residency was emptied: AllBlocksCleared events and engine restarts.",
            lambda view: view.cleared_total,
        ),
        counter(
            "kvcap_kv_events_received",
            "KV events received (BlockStored, BlockRemoved, AllBlocksCleared), read or not.",
            lambda view: view.events_received_total,
        ),
        counter(
            "kvcap_kv_events_gaps",
            "Sequence gaps in the publisher's stream (batches that did not arrive).",
            lambda view: view.gaps_total,
        ),
    ),
)

DROPPED: Table[DroppedRow] = Table(
    ("engine", "reason"),
    lambda r: (r[0].engine, r[1]),
    (
        counter(
            "kvcap_kv_events_dropped",
            "KV events or blocks kvcap could not apply, by reason: rejected (an event that "
            "does not decode), malformed_batch, missed (batches lost to a gap), "
            "unknown_block (a removal of a block not resident), too_many_media, "
            "too_many_groups (past --kv-events.max-groups).",
            lambda r: r[2],
        ),
    ),
)


def pool_rows(view: ResidencyView) -> list[PoolRow]:
    return [(view, pool) for pool in view.pools]


def dropped_rows(view: ResidencyView) -> list[DroppedRow]:
    return [(view, reason, count) for reason, count in sorted(view.dropped_total.items())]


# The tables of one engine's residency record, in output order; the renderer keeps each
# record's bytes while the collector has not replaced it.
RESIDENCY_TABLES: tuple[tuple[Table[Any], Callable[[ResidencyView], Iterable[Any]]], ...] = (
    (POOL, pool_rows),
    (ENGINE, lambda view: (view,)),
    (DROPPED, dropped_rows),
)


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
        "dropped_total": dict(view.dropped_total),
        "groups": [
            {
                "group": pool.group,
                "medium": pool.medium,
                "kind": pool.kind,
                "block_size": pool.block_size,
                "resident_blocks": pool.resident_blocks,
                "resident_tokens": _tokens((view, pool)),
                "resident_ratio": _ratio((view, pool)),
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
