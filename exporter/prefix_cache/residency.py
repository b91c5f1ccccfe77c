"""What each engine's prefix cache holds, rebuilt from its KV events (no I/O, no locks).

Per engine, KV cache group and medium: the resident block hashes, each with the engine
time it was stored, so a removal yields the block's lifetime. The groups of one medium
share its blocks (vLLM's groups share one pool), so together they never hold more than
the medium has: the GPU's `num_gpu_blocks`, an offload tier's blocks where vLLM reports
them, else again `num_gpu_blocks`; while the pool is unknown, all of the engine's sets
together hold at most `max_blocks`. Beyond that the oldest are pruned and the residency
is marked approximate, so a wrong stream cannot grow memory without bound. Groups and
media per engine are capped too: each (group, medium) is ~20 series.
The sets are mutable and belong to the kv_events collector's thread alone; what others
see is the immutable `ResidencyView` that `view()` returns and the collector publishes.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Final

from exporter.kv_events_wire import (
    REMOVED_TYPES,
    STORED_TYPES,
    DecodedBatch,
    RemovedEvent,
    StoredEvent,
)
from exporter.state import PoolView, ResidencyView

DEFAULT_MEDIUM: Final = "GPU"  # releases before 0.10.2 name no medium: their blocks are GPU blocks
# Media per engine kvcap tracks; vLLM has three (GPU, CPU, STORAGE). A stream naming more
# is not a real engine, and each medium is a label value.
MAX_MEDIA: Final = 4
# Blocks one medium of an engine may hold, whatever pool it announces: a real pool is far
# smaller (an H200 full of a small model's 16-token blocks: ~520 k), and a handshake peer may
# announce up to 2**48.
MAX_POOL_BLOCKS: Final = 2**21
# Blocks of one engine, over all its groups and media, while its pool size is not known:
# ~33 MiB at ~132 B a block (docs/reliability.md).
DEFAULT_MAX_BLOCKS: Final = 2**18
# KV cache groups per engine kvcap tracks: vLLM's hybrid models have a handful (Gemma 3:
# 6, a 7:1 hybrid: 8); 16 groups x 4 media keeps an engine's residency within ~1,400 series.
DEFAULT_MAX_GROUPS: Final = 16
# Store-to-removal seconds: a prefix evicted within seconds is thrashing; one that lives
# for hours is a system prompt.
LIFETIME_BUCKETS_S: Final = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    21600.0,
    86400.0,
)


@dataclass(slots=True)
class Lifetimes:
    """A histogram of block lifetimes: counts per bucket of LIFETIME_BUCKETS_S, then +Inf."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LIFETIME_BUCKETS_S) + 1))
    sum_s: float = 0.0


_COMPACT_ABOVE: Final = 4_096  # blocks; below, a set's table is too small to matter


@dataclass(slots=True)
class BlockPool:
    """The resident blocks of one group and medium, and what ever entered and left it."""

    blocks: dict[int | bytes, float] = field(default_factory=dict)  # hash -> stored at (s)
    block_size: int | None = None
    kind: str | None = None  # kv_cache_spec_kind, where the release sends it
    stored_total: int = 0
    removed_total: int = 0  # left by removal, clear, prune or restart: stored - removed = resident
    # The most blocks the set held since it was last compacted: a dict never shrinks its
    # table, so sets pruned far below their peak are copied (the memory goes back).
    peak: int = 0
    lifetimes: Lifetimes = field(default_factory=Lifetimes)


def _by_store_time(index: int, pool: BlockPool) -> Iterator[tuple[float, int, int, int | bytes]]:
    """A set's blocks, oldest first, as merge keys (store time, set, position, hash)."""
    for position, (block_hash, ts) in enumerate(pool.blocks.items()):
        yield ts, index, position, block_hash


class EngineResidency:
    """The residency of one engine, changed by its KV event batches. `changed`: something
    moved since the last `view()`."""

    def __init__(
        self,
        engine: str,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        max_groups: int = DEFAULT_MAX_GROUPS,
    ) -> None:
        self.engine = engine
        self.max_blocks = max_blocks
        self.max_groups = max_groups
        self.pool_blocks: int | None = None
        self.tier_blocks: dict[str, int] = {}  # offload medium ("CPU") -> its blocks
        # The latest engine time applied: a batch stamped earlier counts at this time, so
        # lifetimes never go negative and their sum only grows by finite steps.
        self.last_ts = 0.0
        # Bounds hit since the collector last took them: {reason: count}.
        self.bound_hits: dict[str, int] = {}
        self._resident: dict[str, int] = {}  # blocks per medium, all its groups together
        self.pools: dict[tuple[int, str], BlockPool] = {}
        self.approximate_reason: str | None = None
        self.cleared_total = 0
        self.events_received_total = 0
        self.dropped_total: dict[str, int] = {}
        self.gaps_total = 0
        self._up = False
        self.changed = True

    @property
    def up(self) -> bool:
        """Connected to the engine's publisher."""
        return self._up

    @up.setter
    def up(self, connected: bool) -> None:
        self.changed = self.changed or connected != self._up
        self._up = connected

    def set_pool_blocks(self, blocks: int | None, tiers: Mapping[str, int] | None = None) -> None:
        """The engine's pool size (num_gpu_blocks) and its offload tiers' blocks by medium,
        where the engine state knows them."""
        if blocks != self.pool_blocks:
            self.pool_blocks = blocks
            self.changed = True
        self.tier_blocks = {medium.upper(): n for medium, n in (tiers or {}).items() if n > 0}

    def medium_bound(self, medium: str) -> int | None:
        """Blocks the groups of `medium` may hold together; None while the pool is
        unknown (then `max_blocks` bounds the engine's sets all together)."""
        if not self.pool_blocks:
            return None
        if medium == DEFAULT_MEDIUM:
            bound = self.pool_blocks
        else:
            bound = self.tier_blocks.get(medium, self.pool_blocks)
        # The pool is what the engine (or a peer posing as it) says: never past the ceiling.
        return min(bound, MAX_POOL_BLOCKS)

    def take_bound_hits(self) -> dict[str, int]:
        hits, self.bound_hits = self.bound_hits, {}
        return hits

    def _hit(self, reason: str, count: int = 1) -> None:
        self.bound_hits[reason] = self.bound_hits.get(reason, 0) + count

    def apply(self, batch: DecodedBatch) -> None:
        """Apply one decoded batch (the caller has checked its sequence number)."""
        ts = self.last_ts = max(batch.ts, self.last_ts)
        self.changed = True
        self.events_received_total += len(batch.events) + batch.rejected
        if batch.rejected:
            self.drop("rejected", batch.rejected)
        for event in batch.events:
            # The hot loop (one event per evicted block): dispatch on the exact type.
            if type(event) in REMOVED_TYPES:
                self._remove(event, ts)  # type: ignore[arg-type]
            elif type(event) in STORED_TYPES:
                self._store(event, ts)  # type: ignore[arg-type]
            else:
                self._clear()
                self.cleared_total += 1
                # A clear empties the engine's cache: from here on the sets are exact.
                self.approximate_reason = None

    def _pool(self, group: int | None, medium: str | None) -> BlockPool | str:
        """The set of one group and medium, or why there is none (a bound)."""
        key = (group or 0, medium or DEFAULT_MEDIUM)
        pool = self.pools.get(key)
        if pool is None:
            if len({m for _, m in self.pools} | {key[1]}) > MAX_MEDIA:
                return "too_many_media"
            if len({g for g, _ in self.pools} | {key[0]}) > self.max_groups:
                return "too_many_groups"
            pool = self.pools[key] = BlockPool()
        return pool

    def _store(self, event: StoredEvent, ts: float) -> None:
        pool = self._pool(event.group_idx, event.medium)
        if isinstance(pool, str):
            self.drop(pool)
            self._hit(pool)
            return
        if event.block_size is not None:
            pool.block_size = event.block_size
        if event.kv_cache_spec_kind is not None:
            pool.kind = event.kv_cache_spec_kind
        medium = event.medium or DEFAULT_MEDIUM
        limit = self.medium_bound(medium)
        per_medium = limit is not None
        limit = self.max_blocks if limit is None else limit
        hashes = event.block_hashes
        if len(hashes) > limit:  # only the newest `limit` could stay: skip the others
            hashes = hashes[len(hashes) - limit :]
            self._overflowed()
        blocks = pool.blocks
        before = len(blocks)
        for block_hash in hashes:
            # A hash already resident keeps its first store time.
            if block_hash not in blocks:
                blocks[block_hash] = ts
        added = len(blocks) - before
        pool.stored_total += added
        pool.peak = max(pool.peak, len(blocks))
        resident = self._resident
        resident[medium] = resident.get(medium, 0) + added
        used = resident[medium] if per_medium else sum(resident.values())
        if used > limit:
            sharing = [(m, p) for (_, m), p in self.pools.items() if m == medium or not per_medium]
            self._prune_oldest(sharing, used - limit)
            self._overflowed()

    def _overflowed(self) -> None:
        self._hit("pool_overflow")
        self.mark_approximate("more blocks than the pool holds: removals were missed")

    def _prune_oldest(self, sharing: list[tuple[str, BlockPool]], count: int) -> None:
        """Drop the `count` oldest blocks of the sets sharing a bound (removals were
        missed). A set is in store-time order (times never go back), so the oldest are
        a merge of the sets' fronts; each block is pruned at most once after its store."""
        fronts = [_by_store_time(index, p) for index, (_, p) in enumerate(sharing)]
        for _, index, _, block_hash in list(islice(heapq.merge(*fronts), count)):
            medium, pool = sharing[index]
            del pool.blocks[block_hash]
            pool.removed_total += 1
            self._resident[medium] -= 1
        for _, pool in sharing:
            if pool.peak > _COMPACT_ABOVE and len(pool.blocks) * 4 < pool.peak:
                pool.blocks = dict(pool.blocks)
                pool.peak = len(pool.blocks)

    def _remove(self, event: RemovedEvent, ts: float) -> None:
        medium = event.medium or DEFAULT_MEDIUM
        pool = self.pools.get((event.group_idx or 0, medium))
        hashes = event.block_hashes
        if pool is None:
            self.drop("unknown_block", len(hashes))
            return
        pop, lifetimes = pool.blocks.pop, pool.lifetimes
        counts, unknown, total_s = lifetimes.counts, 0, 0.0
        for block_hash in hashes:
            stored = pop(block_hash, None)
            if stored is None:
                unknown += 1
                continue
            # Observed here, not by a method: this runs once per evicted block. A removal
            # stamped before its store (the engine's clock stepped) counts as 0 s.
            seconds = ts - stored if ts > stored else 0.0
            counts[bisect_left(LIFETIME_BUCKETS_S, seconds)] += 1
            total_s += seconds
        lifetimes.sum_s += total_s
        pool.removed_total += len(hashes) - unknown
        # get: a clear or a restart empties the counts, and a removal may come first.
        self._resident[medium] = self._resident.get(medium, 0) - (len(hashes) - unknown)
        if unknown:
            self.drop("unknown_block", unknown)

    def drop(self, reason: str, count: int = 1) -> None:
        self.dropped_total[reason] = self.dropped_total.get(reason, 0) + count
        self.changed = True

    def gap(self) -> None:
        """A sequence gap in the publisher's stream."""
        self.gaps_total += 1
        self.changed = True

    def mark_approximate(self, reason: str) -> None:
        if self.approximate_reason is None:
            self.approximate_reason = reason
            self.changed = True

    def _clear(self) -> None:
        self._resident.clear()
        for pool in self.pools.values():
            pool.removed_total += len(pool.blocks)
            pool.blocks.clear()  # frees the table too
            pool.peak = 0

    def reset(self, reason: str | None = None) -> None:
        """The engine restarted (new instance, sequence from zero): nothing it cached
        survives. `reason`: why what follows is approximate, None when it is exact."""
        self._clear()
        self.last_ts = 0.0
        self.cleared_total += 1
        self.approximate_reason = reason
        self.changed = True

    def view(self) -> ResidencyView:
        """An immutable copy of what the residency holds now."""
        self.changed = False
        pools = tuple(
            PoolView(
                group=group,
                medium=medium,
                resident_blocks=len(pool.blocks),
                block_size=pool.block_size,
                kind=pool.kind,
                stored_total=pool.stored_total,
                removed_total=pool.removed_total,
                lifetime_counts=tuple(pool.lifetimes.counts),
                lifetime_sum_s=pool.lifetimes.sum_s,
            )
            for (group, medium), pool in sorted(self.pools.items())
        )
        return ResidencyView(
            engine=self.engine,
            pools=pools,
            pool_blocks=self.pool_blocks,
            approximate=self.approximate_reason is not None,
            approximate_reason=self.approximate_reason,
            cleared_total=self.cleared_total,
            events_received_total=self.events_received_total,
            dropped_total=dict(self.dropped_total),
            gaps_total=self.gaps_total,
            up=self._up,
        )
