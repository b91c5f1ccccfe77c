"""vLLM's KV event wire format (ZMQ PUB, msgpack), decoded into block events kvcap applies.

A message has three frames: topic, an 8-byte big-endian sequence number, and the msgpack
of `EventBatch` = `[ts, [event, ...], data_parallel_rank]` (the rank omitted when unset).
Events come in two shapes, and both are read:

- arrays with the tag first (`["BlockStored", block_hashes, parent_block_hash, ...]`), the
  shape of releases whose `KVCacheEvent` is `array_like`: decoded by position, with the
  field layout of `FIELD_HISTORY` (each release appended fields, so an older release's
  event is a prefix of a newer one; unknown trailing fields are ignored);
- maps tagged by `"type"` (`{"type": "BlockStored", "block_hashes": ...}`), the shape
  vLLM 0.32.0 writes (checked live): decoded by name, unknown keys ignored.

Only what kvcap uses is decoded: token ids, parent hashes and extra keys stay raw bytes
(`msgspec.Raw`), so a field nobody reads cannot fail a read and costs nothing to skip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final

import msgspec

# Bounds a real engine never reaches; they keep a hostile batch from minting label values
# (group, medium) or from making kvcap hold absurd numbers.
MAX_GROUPS: Final = 64
MAX_BLOCK_SIZE: Final = 2**20
MAX_MEDIUM_LENGTH: Final = 32
SEQUENCE_BYTES: Final = 8

# A block hash: a 64-bit int since 0.11 (#23673; msgpack holds no wider int, and vLLM's
# run past 2**63, so no bound is set); bytes (a digest) before.
BlockHash = int | Annotated[bytes, msgspec.Meta(max_length=64)]
GroupIndex = Annotated[int, msgspec.Meta(ge=0, lt=MAX_GROUPS)]
BlockSize = Annotated[int, msgspec.Meta(ge=1, le=MAX_BLOCK_SIZE)]
Medium = Annotated[str, msgspec.Meta(max_length=MAX_MEDIUM_LENGTH)]
_NIL: Final = msgspec.Raw(b"\xc0")

# Which release added which field, in wire order (vllm-capacity-history.md, "KV events").
FIELD_HISTORY: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "BlockStored": (
        ("block_hashes", "0.10.0"),
        ("parent_block_hash", "0.10.0"),
        ("token_ids", "0.10.0"),
        ("block_size", "0.10.0"),
        ("lora_id", "0.10.0"),
        ("medium", "0.10.2"),
        ("lora_name", "0.14.0"),
        ("extra_keys", "0.17.0"),
        ("group_idx", "0.20.0"),
        ("kv_cache_spec_kind", "0.22.0"),
        ("kv_cache_spec_sliding_window", "0.22.0"),
        ("locality", "0.26.0"),
    ),
    "BlockRemoved": (
        ("block_hashes", "0.10.0"),
        ("medium", "0.10.2"),
        ("group_idx", "0.20.0"),
        ("locality", "0.26.0"),
    ),
    "AllBlocksCleared": (),
}


class _StoredByPosition(msgspec.Struct, array_like=True, tag="BlockStored", gc=False):
    block_hashes: list[BlockHash]
    parent_block_hash: msgspec.Raw = _NIL
    token_ids: msgspec.Raw = _NIL
    block_size: BlockSize | None = None
    lora_id: msgspec.Raw = _NIL
    medium: Medium | None = None
    lora_name: msgspec.Raw = _NIL
    extra_keys: msgspec.Raw = _NIL
    group_idx: GroupIndex | None = None
    kv_cache_spec_kind: Medium | None = None


class _RemovedByPosition(msgspec.Struct, array_like=True, tag="BlockRemoved", gc=False):
    block_hashes: list[BlockHash]
    medium: Medium | None = None
    group_idx: GroupIndex | None = None


class _ClearedByPosition(msgspec.Struct, array_like=True, tag="AllBlocksCleared", gc=False):
    pass


class _StoredByName(msgspec.Struct, tag="BlockStored", gc=False):
    block_hashes: list[BlockHash]
    block_size: BlockSize | None = None
    medium: Medium | None = None
    group_idx: GroupIndex | None = None
    kv_cache_spec_kind: Medium | None = None


class _RemovedByName(msgspec.Struct, tag="BlockRemoved", gc=False):
    block_hashes: list[BlockHash]
    medium: Medium | None = None
    group_idx: GroupIndex | None = None


class _ClearedByName(msgspec.Struct, tag="AllBlocksCleared", gc=False):
    pass


_ByPosition = _StoredByPosition | _RemovedByPosition | _ClearedByPosition
_ByName = _StoredByName | _RemovedByName | _ClearedByName
WireEvent = _ByPosition | _ByName
Rank = Annotated[int, msgspec.Meta(ge=0, lt=2**16)]


class _BatchByPosition(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_ByPosition]
    data_parallel_rank: Rank | None = None


class _BatchByName(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_ByName]
    data_parallel_rank: Rank | None = None


class _BatchRaw(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: Rank | None = None


_batch_decoders = (
    msgspec.msgpack.Decoder(_BatchByName),
    msgspec.msgpack.Decoder(_BatchByPosition),
)
_raw_batch_decoder = msgspec.msgpack.Decoder(_BatchRaw)
_position_decoder = msgspec.msgpack.Decoder(_ByPosition)
_name_decoder = msgspec.msgpack.Decoder(_ByName)


class MalformedBatch(ValueError):
    """A batch that is not an EventBatch at all (its events cannot even be told apart)."""


@dataclass(slots=True)  # not frozen: one is built per batch, and frozen __init__ is slower
class DecodedBatch:
    """One batch: its engine time, rank, the events kvcap could read and how many it could
    not (an unknown event type, a wrong field type: rejected one by one, the rest kept)."""

    ts: float
    data_parallel_rank: int | None
    events: Sequence[WireEvent]
    rejected: int = 0


StoredEvent = _StoredByPosition | _StoredByName
RemovedEvent = _RemovedByPosition | _RemovedByName
STORED_TYPES: Final = (_StoredByPosition, _StoredByName)
REMOVED_TYPES: Final = (_RemovedByPosition, _RemovedByName)


class BatchDecoder:
    """Decodes batches of one stream. A stream keeps one event shape, so the shape that
    decoded the last batch is tried first (a failed try costs an exception)."""

    __slots__ = ("_decoders",)

    def __init__(self) -> None:
        self._decoders: list[msgspec.msgpack.Decoder[Any]] = list(_batch_decoders)

    def decode(self, payload: bytes) -> DecodedBatch:
        """Decode one batch; raises MalformedBatch when it is not a batch at all."""
        decoders = self._decoders
        for index, decoder in enumerate(decoders):
            try:
                batch = decoder.decode(payload)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            if index:
                decoders.insert(0, decoders.pop(index))
            return DecodedBatch(batch.ts, batch.data_parallel_rank, batch.events)
        return _decode_event_by_event(payload)


def decode_batch(payload: bytes) -> DecodedBatch:
    """Decode one batch of any stream; raises MalformedBatch when it is not a batch."""
    return BatchDecoder().decode(payload)


def _decode_event_by_event(payload: bytes) -> DecodedBatch:
    """The slow path: some event did not decode; keep the ones that do."""
    try:
        batch = _raw_batch_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise MalformedBatch(str(error)) from None
    events: list[WireEvent] = []
    rejected = 0
    for raw in batch.events:
        # msgpack arrays start 0x90-0x9f, 0xdc, 0xdd; maps 0x80-0x8f, 0xde, 0xdf.
        first = bytes(raw)[:1]
        is_map = bool(first) and (0x80 <= first[0] <= 0x8F or first[0] in (0xDE, 0xDF))
        try:
            events.append((_name_decoder if is_map else _position_decoder).decode(raw))
        except (msgspec.DecodeError, msgspec.ValidationError):
            rejected += 1
    return DecodedBatch(batch.ts, batch.data_parallel_rank, events, rejected)


def parse_sequence(frame: bytes) -> int:
    """The publisher's sequence number (8 bytes, big-endian; -1 ends a replay)."""
    if len(frame) != SEQUENCE_BYTES:
        raise MalformedBatch(f"a sequence frame has {SEQUENCE_BYTES} bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def sequence_frame(sequence: int) -> bytes:
    return sequence.to_bytes(SEQUENCE_BYTES, "big", signed=True)
