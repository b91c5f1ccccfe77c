"""The KV event decoder and residency under hostile input: no crash, every bad part
counted as rejected or malformed, memory bounded by the pool.

Inputs: vLLM 0.32.0's own batches (tests/fixtures/kv_events) mutated byte by byte and
value by value, the hand-built older layouts mutated, arbitrary msgpack, and batches
built to hurt: huge hash arrays, deep nesting, wrong types in every field.
"""

from __future__ import annotations

import os
import random
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.kv_events_wire import MalformedBatch, decode_batch
from exporter.prefix_cache import EngineResidency
from tests.conftest import fuzz_budget
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
    for medium in {p.medium for p in view.pools}:  # the running count the bound checks
        in_sets = sum(p.resident_blocks for p in view.pools if p.medium == medium)
        assert residency._resident.get(medium, 0) == in_sets
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


# Hostile msgpack shapes (issue 25): headers that declare far more than follows, nesting
# past the recursion limit, every container and ext type, extreme numbers, spliced into
# real batches. KVCAP_FUZZ_CASES sets the mutation loop's budget (`make test`: 2,000).
CASES = int(os.environ.get("KVCAP_FUZZ_CASES", str(fuzz_budget(2_000, 100_000))))
HEADERS = (
    b"\xdd\xff\xff\xff\xff",  # array32 of 4 G items
    b"\xdf\xff\xff\xff\xff",  # map32 of 4 G pairs
    b"\xdc\xff\xff",  # array16 of 65,535
    b"\xdb\xff\xff\xff\xff",  # str32 of 4 GiB
    b"\xc6\xff\xff\xff\xff",  # bin32 of 4 GiB
    b"\xc9\xff\xff\xff\xff\x01",  # ext32 of 4 GiB
    b"\xd4\x01\x00",  # fixext1
    b"\xd7\xff" + b"\x00" * 8,  # a timestamp ext
    b"\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00",  # +inf
    b"\xcb\xff\xef\xff\xff\xff\xff\xff\xff",  # -1.8e308
    b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff",  # 2**64 - 1
    b"\xd3\x80\x00\x00\x00\x00\x00\x00\x00",  # -2**63
    b"\xc1",  # never used
)


def hostile_shape(rng: random.Random, seeds: list[bytes]) -> bytes:
    """A real batch with a hostile shape spliced in, or a hostile shape alone."""
    kind = rng.randrange(5)
    if kind == 0:
        depth = rng.choice([10, 1_000, 5_000, 100_000])
        core = rng.choice([b"\x91", b"\x81\xa1k", b"\x92\xc0"]) * depth + b"\xc0"
    elif kind == 1:
        core = rng.choice(HEADERS) + bytes(rng.randrange(64))
    elif kind == 2:
        core = b"\xdd" + rng.randrange(2**17, 2**32).to_bytes(4, "big") + b"\xc0" * 4096
    else:
        core = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 32)))
    seed = rng.choice(seeds)
    if kind == 4 or not seed:
        return core
    at = rng.randrange(len(seed))
    cut = rng.randrange(at, min(len(seed), at + 16) + 1)
    return seed[:at] + core + seed[cut:]


def test_hostile_msgpack_shapes_are_rejected_or_bounded() -> None:
    """Every input ends as a batch applied within the bounds or one MalformedBatch:
    never another exception (RecursionError, MemoryError, OverflowError)."""
    rng = random.Random(25)
    seeds = LIVE + OLDER + [b""]
    outcomes = {"applied": 0, "malformed": 0}
    largest = 0
    for _ in range(CASES):
        payload = hostile_shape(rng, seeds)
        largest = max(largest, len(payload))
        residency = apply_or_reject(payload)
        malformed = residency.view().dropped_total.get("malformed_batch", 0)
        outcomes["malformed" if malformed else "applied"] += 1
    print(f"{CASES} hostile shapes: {outcomes}, largest input {largest} bytes")
    assert outcomes["malformed"] > 0
    assert outcomes["applied"] > 0


@settings(max_examples=300)
@given(
    st.recursive(
        st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.binary(max_size=8)),
        lambda children: st.one_of(
            st.lists(children, max_size=3),
            st.dictionaries(st.text(max_size=4), children, max_size=3),
        ),
        max_leaves=40,
    )
)
def test_arbitrary_msgpack_documents_as_events(event: Any) -> None:
    apply_or_reject(msgspec.msgpack.encode([1.0, [event, {"type": "AllBlocksCleared"}], 0]))
