"""Residency rebuilt from a live engine's recorded KV events, and its bounds."""

from __future__ import annotations

import msgspec

from exporter.kv_events_wire import decode_batch
from exporter.prefix_cache import LIFETIME_BUCKETS_S, EngineResidency
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
        (99.0, {"type": "BlockRemoved", "block_hashes": [3]}),  # a clock step backwards
    ]:
        residency.apply(decode_batch(msgspec.msgpack.encode([ts, [event]])))
    (pool,) = residency.view().pools
    counts = dict(zip((*LIFETIME_BUCKETS_S, "inf"), pool.lifetime_counts, strict=True))
    assert counts[1.0] == 1  # 0 s
    assert counts[5.0] == 1  # 3 s
    assert counts[120.0] == 1  # 100 s
    assert pool.lifetime_sum_s == 103.0


def test_media_are_bounded() -> None:
    residency = EngineResidency("0")
    events = [{"type": "BlockStored", "block_hashes": [1], "medium": f"M{i}"} for i in range(10)]
    residency.apply(decode_batch(msgspec.msgpack.encode([1.0, events])))
    view = residency.view()
    assert len({p.medium for p in view.pools}) == 4
    assert view.dropped_total == {"too_many_media": 6}
