"""Residency rebuilt from a live engine's recorded KV events, and its bounds."""

from __future__ import annotations

import msgspec
import pytest

from exporter.kv_events_wire import MalformedBatch, decode_batch
from exporter.prefix_cache import LIFETIME_BUCKETS_S, EngineResidency
from exporter.prefix_cache.residency import MAX_POOL_BLOCKS
from tests.kv_events_data import (
    EVICTIONS,
    LIVE_BLOCK_SIZE,
    LIVE_POOL_BLOCKS,
    SHARED_PREFIX,
    distinct_full_blocks,
    frames,
    load,
)


def apply_all(residency: EngineResidency, names: list[str]) -> list[tuple[int, int, int]]:
    """(resident, stored, removed) after every batch."""
    seen = []
    for name in names:
        for _, _, payload in frames(name):
            residency.apply(decode_batch(payload))
            (pool,) = residency.view().pools
            seen.append((pool.resident_blocks, pool.stored_total, pool.removed_total))
    return seen


def test_resident_blocks_are_the_distinct_full_blocks_of_the_prompts() -> None:
    residency = EngineResidency("0")
    apply_all(residency, [SHARED_PREFIX])
    (pool,) = residency.view().pools
    expected = distinct_full_blocks(load(SHARED_PREFIX)["prompts"], LIVE_BLOCK_SIZE)
    assert expected == 26  # 4 blocks for the first prompt, 2 more for each of 11 others
    assert pool.resident_blocks == expected
    assert (pool.group, pool.medium, pool.kind) == (0, "GPU", "full_attention")
    assert pool.block_size == LIVE_BLOCK_SIZE
    assert pool.removed_total == 0
    assert not residency.view().approximate


def test_under_eviction_stored_minus_removed_is_resident_after_every_batch() -> None:
    residency = EngineResidency("0")
    residency.pool_blocks = LIVE_POOL_BLOCKS
    seen = apply_all(residency, [SHARED_PREFIX, EVICTIONS])
    assert all(resident == stored - removed for resident, stored, removed in seen)
    assert (
        max(resident for resident, _, _ in seen) <= LIVE_POOL_BLOCKS - 1
    )  # block 0 is vLLM's null block
    (pool,) = residency.view().pools
    assert pool.removed_total > 0
    # Every removal of a block stored in the stream is a lifetime.
    assert sum(pool.lifetime_counts) == pool.removed_total
    assert pool.lifetime_sum_s > 0
    assert residency.view().dropped_total == {}
    assert not residency.view().approximate


def test_joining_mid_stream_removes_blocks_it_never_saw_stored() -> None:
    residency = EngineResidency("0")
    apply_all(residency, [EVICTIONS])
    view = residency.view()
    assert view.dropped_total["unknown_block"] > 0


def test_a_pool_never_holds_more_than_the_engine_has_blocks() -> None:
    residency = EngineResidency("0")
    residency.pool_blocks = 100
    payload = msgspec.msgpack.encode(
        [5.0, [{"type": "BlockStored", "block_hashes": list(range(10_000)), "block_size": 16}]]
    )
    residency.apply(decode_batch(payload))
    (pool,) = residency.view().pools
    assert pool.resident_blocks == 100
    assert pool.stored_total - pool.removed_total == 100
    assert residency.view().approximate
    # The newest are kept: the pruned ones are the oldest of the stream.
    assert set(residency.pools[(0, "GPU")].blocks) == set(range(9_900, 10_000))


def test_clear_and_restart_empty_every_group_and_clear_approximation() -> None:
    residency = EngineResidency("0")
    stored = {"type": "BlockStored", "block_hashes": [1, 2], "block_size": 16}
    residency.apply(
        decode_batch(
            msgspec.msgpack.encode(
                [1.0, [stored, {**stored, "group_idx": 1}, {**stored, "medium": "CPU"}]]
            )
        )
    )
    residency.mark_approximate("test")
    residency.apply(decode_batch(msgspec.msgpack.encode([2.0, [{"type": "AllBlocksCleared"}]])))
    view = residency.view()
    assert [p.resident_blocks for p in view.pools] == [0, 0, 0]
    assert [p.removed_total for p in view.pools] == [2, 2, 2]
    assert view.cleared_total == 1
    assert not view.approximate
    residency.apply(decode_batch(msgspec.msgpack.encode([3.0, [stored]])))
    residency.reset("restarted mid-stream")
    assert residency.view().cleared_total == 2
    assert residency.view().approximate_reason == "restarted mid-stream"


def test_lifetimes_fall_in_their_buckets() -> None:
    residency = EngineResidency("0")
    for ts, event in [
        (100.0, {"type": "BlockStored", "block_hashes": [1, 2, 3]}),
        (103.0, {"type": "BlockRemoved", "block_hashes": [1]}),
        (200.0, {"type": "BlockRemoved", "block_hashes": [2]}),
        # A clock step backwards: the batch counts at the latest engine time seen (200 s).
        (99.0, {"type": "BlockRemoved", "block_hashes": [3]}),
        (300.0, {"type": "BlockStored", "block_hashes": [4]}),
        (300.0, {"type": "BlockRemoved", "block_hashes": [4]}),
    ]:
        residency.apply(decode_batch(msgspec.msgpack.encode([ts, [event]])))
    (pool,) = residency.view().pools
    counts = dict(zip((*LIFETIME_BUCKETS_S, "inf"), pool.lifetime_counts, strict=True))
    assert counts[1.0] == 1  # 0 s
    assert counts[5.0] == 1  # 3 s
    assert counts[120.0] == 2  # 100 s, twice
    assert pool.lifetime_sum_s == 203.0


def test_timestamps_must_be_finite_times() -> None:
    """-1e308 then 1e308 made the lifetime sum +Inf for good; they are malformed now."""
    for ts in (-1e308, 1e308, float("inf"), float("nan"), -1.0, 2.0**41):
        with pytest.raises(MalformedBatch, match=r"\$\[0\]"):
            decode_batch(msgspec.msgpack.encode([ts, [{"type": "AllBlocksCleared"}]]))


def stored(hashes: list[int], group: int = 0, medium: str = "GPU") -> dict[str, object]:
    return {"type": "BlockStored", "block_hashes": hashes, "group_idx": group, "medium": medium}


def resident(residency: EngineResidency) -> int:
    return sum(p.resident_blocks for p in residency.view().pools)


def test_the_groups_of_a_medium_share_the_pool() -> None:
    """64 groups x 4 media x 30 k blocks held 256 x the pool; now the groups of a medium
    hold the pool together, the newest blocks kept (oldest pruned across groups)."""
    residency = EngineResidency("0", max_groups=64)
    residency.set_pool_blocks(1_000, {"cpu": 3_000})
    for group in range(64):
        for medium in ("GPU", "CPU", "STORAGE", "DISK"):
            first = (group * 4 + len(medium)) * 10_000
            batch = [float(group), [stored(list(range(first, first + 300)), group, medium)]]
            residency.apply(decode_batch(msgspec.msgpack.encode(batch)))
    by_medium: dict[str, int] = {}
    for pool in residency.view().pools:
        by_medium[pool.medium] = by_medium.get(pool.medium, 0) + pool.resident_blocks
        assert pool.stored_total - pool.removed_total == pool.resident_blocks
    assert by_medium == {"GPU": 1_000, "CPU": 3_000, "STORAGE": 1_000, "DISK": 1_000}
    assert residency.view().approximate
    # The newest are kept: the GPU blocks left are those of the last groups to store.
    gpu = {g for (g, m), p in residency.pools.items() if m == "GPU" and p.blocks}
    assert min(gpu) >= 60
    assert residency.take_bound_hits()["pool_overflow"] > 0


def test_while_the_pool_is_unknown_the_engine_holds_max_blocks_in_all() -> None:
    residency = EngineResidency("0", max_blocks=500)
    for group in range(8):
        batch = [1.0, [stored(list(range(group * 1000, group * 1000 + 400)), group)]]
        residency.apply(decode_batch(msgspec.msgpack.encode(batch)))
    assert resident(residency) == 500
    residency.set_pool_blocks(2_000)  # the handshake told the pool: the bound moves to it
    batch = [2.0, [stored(list(range(10_000, 12_000)), 0, "CPU")]]
    residency.apply(decode_batch(msgspec.msgpack.encode(batch)))
    assert resident(residency) == 2_500


def test_groups_are_bounded() -> None:
    residency = EngineResidency("0", max_groups=4)
    events = [stored([i], group=i) for i in range(10)]
    residency.apply(decode_batch(msgspec.msgpack.encode([1.0, events])))
    view = residency.view()
    assert len({p.group for p in view.pools}) == 4
    assert view.dropped_total == {"too_many_groups": 6}
    assert residency.take_bound_hits() == {"too_many_groups": 6}
    assert residency.take_bound_hits() == {}


def test_media_are_bounded() -> None:
    residency = EngineResidency("0")
    events = [{"type": "BlockStored", "block_hashes": [1], "medium": f"M{i}"} for i in range(10)]
    residency.apply(decode_batch(msgspec.msgpack.encode([1.0, events])))
    view = residency.view()
    assert len({p.medium for p in view.pools}) == 4
    assert view.dropped_total == {"too_many_media": 6}


def test_a_removal_after_a_clear_before_any_store_is_counted_not_raised() -> None:
    """A clear (or a restart) empties the per-medium counts; a removal of that medium that
    comes before its next store (a CPU-tier eviction after a GPU reset) was a KeyError
    that left the batch half applied."""
    residency = EngineResidency("0")
    batch = [1.0, [stored([1, 2], 0, "CPU")]]
    residency.apply(decode_batch(msgspec.msgpack.encode(batch)))
    residency.apply(decode_batch(msgspec.msgpack.encode([2.0, [{"type": "AllBlocksCleared"}]])))
    removed = {"type": "BlockRemoved", "block_hashes": [1, 2], "medium": "CPU"}
    residency.apply(decode_batch(msgspec.msgpack.encode([3.0, [removed]])))
    assert resident(residency) == 0
    assert residency.view().dropped_total == {"unknown_block": 2}


def test_an_announced_pool_past_the_ceiling_bounds_at_the_ceiling() -> None:
    """The pool is what a handshake peer says (up to 2**48 blocks): the residency of a
    medium never passes MAX_POOL_BLOCKS, whatever is announced."""
    residency = EngineResidency("0")
    residency.set_pool_blocks(2**48, {"cpu": 2**50})
    assert residency.medium_bound("GPU") == MAX_POOL_BLOCKS
    assert residency.medium_bound("CPU") == MAX_POOL_BLOCKS
    residency.set_pool_blocks(1_000, {"cpu": 3_000})
    assert (residency.medium_bound("GPU"), residency.medium_bound("CPU")) == (1_000, 3_000)
