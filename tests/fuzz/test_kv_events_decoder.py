"""The KV event decoder and residency under hostile input: no crash, every bad part
counted as rejected or malformed, memory bounded by the pool.

Inputs: vLLM 0.32.0's own batches (tests/fixtures/kv_events) mutated byte by byte and
value by value, the hand-built older layouts mutated, arbitrary msgpack, and batches
built to hurt: huge hash arrays, deep nesting, wrong types in every field.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.kv_events_wire import MalformedBatch, decode_batch
from exporter.prefix_cache import EngineResidency
from tests.fuzz.mutations import HOSTILE_NUMBERS, garbage, mutated, mutated_bytes
from tests.kv_events_data import EVICTIONS, SHARED_PREFIX, frames, load

LIVE = [payload for name in (SHARED_PREFIX, EVICTIONS) for _, _, payload in frames(name)]
OLDER = [b["payload"] for b in load("older-layout-kv-events.msgpack")["batches"]]
FIELDS = (
    "type",
    "block_hashes",
    "block_size",
    "medium",
    "group_idx",
    "kv_cache_spec_kind",
    "token_ids",
    "parent_block_hash",
)
POOL = 50


def apply_or_reject(payload: bytes) -> EngineResidency:
    """What the collector does with one payload; anything but MalformedBatch is a bug."""
    residency = EngineResidency("0")
    residency.pool_blocks = POOL
    try:
        batch = decode_batch(payload)
    except MalformedBatch:
        residency.drop("malformed_batch")
        return residency
    residency.apply(batch)
    view = residency.view()
    for pool in view.pools:
        assert 0 <= pool.resident_blocks <= POOL
        assert pool.stored_total - pool.removed_total == pool.resident_blocks
    assert len({p.medium for p in view.pools}) <= 4
    assert all(0 <= p.group < 64 for p in view.pools)
    received = len(batch.events) + batch.rejected
    assert view.events_received_total == received
    return residency


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_live_and_older_batches_bytes(data: st.DataObject) -> None:
    payload = data.draw(st.sampled_from(LIVE + OLDER))
    apply_or_reject(data.draw(mutated_bytes(payload)))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_live_and_older_batches_values(data: st.DataObject) -> None:
    document = msgspec.msgpack.decode(data.draw(st.sampled_from(LIVE + OLDER)))
    broken = data.draw(
        mutated(document, keys=FIELDS, values=garbage | st.sampled_from(HOSTILE_NUMBERS))
    )
    try:
        payload = msgspec.msgpack.encode(broken)
    except (OverflowError, TypeError):
        return  # not encodable as msgpack (an int past 64 bits): cannot reach the wire
    apply_or_reject(payload)


@settings(max_examples=300)
@given(st.binary(max_size=256))
def test_arbitrary_bytes(payload: bytes) -> None:
    apply_or_reject(payload)


@settings(max_examples=200)
@given(st.lists(garbage, max_size=6), st.sampled_from(HOSTILE_NUMBERS))
def test_batches_of_garbage_events(events: list[Any], ts: Any) -> None:
    try:
        payload = msgspec.msgpack.encode([ts, events, 0])
    except (OverflowError, TypeError):
        return  # not encodable as msgpack: cannot reach the wire
    apply_or_reject(payload)


def hostile_events() -> list[tuple[str, Any]]:
    many = list(range(60_000))  # within the 65,536 hashes one event may name
    return [
        ("huge hash array", {"type": "BlockStored", "block_hashes": many, "block_size": 16}),
        ("huge removal", {"type": "BlockRemoved", "block_hashes": many}),
        ("hashes past the event's bound", {"type": "BlockRemoved", "block_hashes": [1] * 70_000}),
        ("hash of the wrong type", {"type": "BlockStored", "block_hashes": ["x", 1.5]}),
        ("a 1 KiB digest", {"type": "BlockStored", "block_hashes": [b"\x00" * 1024]}),
        ("negative group", {"type": "BlockStored", "block_hashes": [1], "group_idx": -1}),
        ("group past the bound", {"type": "BlockStored", "block_hashes": [1], "group_idx": 10**6}),
        ("zero block size", {"type": "BlockStored", "block_hashes": [1], "block_size": 0}),
        ("block size past 2**64", ["BlockStored", [1], None, [], 2**64 - 1]),
        ("a 1 MiB medium", {"type": "BlockStored", "block_hashes": [1], "medium": "G" * 2**20}),
        ("medium of the wrong type", ["BlockRemoved", [1], 7]),
        ("deep nesting in token ids", ["BlockStored", [1], None, [[[[[[[[[[]]]]]]]]]], 16]),
        ("no tag", [[1, 2], None]),
        ("a map without hashes", {"type": "BlockStored"}),
        ("an unknown type", {"type": "BlockEvicted", "block_hashes": [1]}),
    ]


@pytest.mark.parametrize(("what", "event"), hostile_events(), ids=[w for w, _ in hostile_events()])
def test_hostile_events_are_rejected_or_bounded(what: str, event: Any) -> None:
    good = {"type": "BlockStored", "block_hashes": [7], "block_size": 16}
    residency = apply_or_reject(msgspec.msgpack.encode([1.0, [event, good]]))
    view = residency.view()
    resident = sum(p.resident_blocks for p in view.pools)
    if what == "huge hash array":
        assert resident == POOL  # pruned to the pool, newest kept: the good block among them
        assert view.approximate
    elif what == "huge removal":
        assert resident == 1
        assert view.dropped_total["unknown_block"] == 60_000
    elif what == "deep nesting in token ids":
        # Token ids are never decoded (kvcap does not use them): the event is fine.
        assert view.dropped_total == {}
        assert resident == 2
    else:
        assert view.dropped_total == {"rejected": 1}  # the bad one, counted
        assert resident == 1  # the good one, applied


def test_a_deeply_nested_payload_is_malformed_not_a_crash() -> None:
    payload = b"\x91" * 100_000 + b"\xc0"  # 100,000 nested arrays
    residency = apply_or_reject(payload)
    assert residency.view().dropped_total == {"malformed_batch": 1}
