"""The KV event decoder on recorded vLLM 0.32.0 batches (maps) and hand-built older
layouts (arrays by position), including a field from a later release."""

from __future__ import annotations

import msgspec
import pytest

from exporter.collectors import Step, classify, missing_from
from exporter.kv_events_wire import (
    FIELD_HISTORY,
    REMOVED_TYPES,
    STORED_TYPES,
    MalformedBatch,
    decode_batch,
    parse_sequence,
    sequence_frame,
)
from tests.kv_events_data import LIVE_BLOCK_SIZE, SHARED_PREFIX, frames, load


def test_a_recorded_live_batch_decodes_by_name() -> None:
    topic, sequence, payload = frames(SHARED_PREFIX)[0]
    assert topic == b""
    assert parse_sequence(sequence) == 0
    batch = decode_batch(payload)
    assert batch.data_parallel_rank == 0
    assert batch.rejected == 0
    (stored,) = batch.events
    assert isinstance(stored, STORED_TYPES)
    assert len(stored.block_hashes) == 4  # 132 prompt tokens: 4 full blocks of 32
    assert stored.block_size == LIVE_BLOCK_SIZE
    assert stored.medium == "GPU"
    assert stored.group_idx == 0
    assert stored.kv_cache_spec_kind == "full_attention"
    # vLLM's hashes are unsigned 64-bit: some are past 2**63.
    every = [
        h
        for f in frames(SHARED_PREFIX)
        for e in decode_batch(f[2]).events
        for h in getattr(e, "block_hashes", [])
    ]
    assert any(h >= 2**63 for h in every)


@pytest.mark.parametrize(
    "batch", load("older-layout-kv-events.msgpack")["batches"], ids=lambda b: b["layout"]
)
def test_every_older_layout_decodes_by_position(batch: dict[str, object]) -> None:
    layout = batch["layout"]
    decoded = decode_batch(batch["payload"])  # type: ignore[arg-type]
    assert decoded.rejected == 0
    stored, removed = decoded.events
    assert isinstance(stored, STORED_TYPES)
    assert isinstance(removed, REMOVED_TYPES)
    assert len(stored.block_hashes) == 3
    assert stored.block_size == 16
    has = {
        name
        for name, since in FIELD_HISTORY["BlockStored"]
        if layout == "future"
        or tuple(map(int, since.split("."))) <= tuple(map(int, str(layout).split(".")))
    }
    assert stored.medium == ("GPU" if "medium" in has else None)
    assert stored.group_idx == (1 if "group_idx" in has else None)
    assert removed.group_idx == stored.group_idx
    assert stored.kv_cache_spec_kind == ("sliding_window" if "kv_cache_spec_kind" in has else None)
    if layout == "0.10.0":
        assert stored.block_hashes[0] == b"\x01" * 32


def test_an_unknown_event_is_rejected_and_the_rest_kept() -> None:
    payload = msgspec.msgpack.encode(
        [
            1.0,
            [
                ["BlockStored", [1, 2], None, [], 16],
                ["BlockReused", [1]],
                {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"},
                ["BlockRemoved", "not a list"],
            ],
            3,
        ]
    )
    batch = decode_batch(payload)
    assert batch.rejected == 2
    assert [type(e).__name__ for e in batch.events] == ["_StoredByPosition", "_RemovedByName"]
    assert batch.data_parallel_rank == 3


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        msgspec.msgpack.encode({"ts": 1}),
        msgspec.msgpack.encode([1.0, "x"]),
        msgspec.msgpack.encode(["now", []]),
    ],
)
def test_something_that_is_not_a_batch_is_malformed(payload: bytes) -> None:
    with pytest.raises(MalformedBatch):
        decode_batch(payload)


def test_sequence_frames() -> None:
    assert parse_sequence(sequence_frame(41)) == 41
    assert parse_sequence(b"\xff" * 8) == -1  # vLLM's end of replay
    with pytest.raises(MalformedBatch):
        parse_sequence(b"\x00")


@pytest.mark.parametrize(
    ("last", "sequence", "step", "first_missing"),
    [
        (None, 0, Step.START, None),
        (None, 12, Step.JOINED, 0),
        (4, 5, Step.NEXT, None),
        (4, 9, Step.GAP, 5),
        (40, 0, Step.RESTART, None),
        (40, 3, Step.RESTART, 0),
        (40, 40, Step.RESTART, 0),
    ],
)
def test_sequence_steps(
    last: int | None, sequence: int, step: Step, first_missing: int | None
) -> None:
    assert classify(last, sequence) is step
    assert missing_from(last, sequence) == first_missing
