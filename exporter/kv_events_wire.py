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

What a batch may cost is bounded before it is decoded (`BatchLimits`): msgspec checks an
array's length against its type's `max_length` at the array's header, before it allocates
the items, so a 60 MiB batch of 63 M nil events is refused at its first bytes; a batch
bigger than `FAST_PATH_BYTES` is decoded event by event, its block hashes counted as they
come; nesting deeper than msgspec's recursion limit is a MalformedBatch, never a
RecursionError; a timestamp must be a finite time (0 .. 2**40 s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Final

import msgspec

# Bounds a real engine never reaches; they keep a hostile batch from minting label values
# (group, medium) or from making kvcap hold absurd numbers.
MAX_GROUPS: Final = 64
MAX_BLOCK_SIZE: Final = 2**20
MAX_MEDIUM_LENGTH: Final = 32
SEQUENCE_BYTES: Final = 8
# One BlockStored names the blocks one request filled in one step, one BlockRemoved the
# blocks evicted: 65,536 blocks is a million tokens at block size 16, in one step.
MAX_HASHES_PER_EVENT: Final = 2**16
# The defaults of BatchLimits (flags of the kv_events collector).
DEFAULT_MAX_EVENTS: Final = 2**16
DEFAULT_MAX_HASHES: Final = 2**19
# vLLM's biggest batches (a step of a million tokens: ~5 MiB of token ids) fit; the buffer
# libzmq reads a batch into counts against the daemon's RSS whole, before any check.
DEFAULT_MAX_BATCH_BYTES: Final = 16 * 2**20
# A batch up to this size is decoded in one call: whatever its shape, what it allocates
# stays under ~10 MiB (1 MiB of one-byte hashes is 8 MiB of list slots). A bigger one is
# decoded event by event, so its block hashes can be counted against the batch's bound.
FAST_PATH_BYTES: Final = 2**20
# Engine time is time.time() on the engine: a finite number of seconds since 1970. Past
# 2**40 s (year 36,812) it is not a clock, and a lifetime from it would overflow the sum.
MAX_TIMESTAMP_S: Final = float(2**40)

# A block hash: a 64-bit int since 0.11 (#23673; msgpack holds no wider int, and vLLM's
# run past 2**63, so no bound is set); bytes (a digest) before.
BlockHash = int | Annotated[bytes, msgspec.Meta(max_length=64)]
BlockHashes = Annotated[list[BlockHash], msgspec.Meta(max_length=MAX_HASHES_PER_EVENT)]
Timestamp = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TIMESTAMP_S)]
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
    block_hashes: BlockHashes
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
    block_hashes: BlockHashes
    medium: Medium | None = None
    group_idx: GroupIndex | None = None


class _ClearedByPosition(msgspec.Struct, array_like=True, tag="AllBlocksCleared", gc=False):
    pass


class _StoredByName(msgspec.Struct, tag="BlockStored", gc=False):
    block_hashes: BlockHashes
    block_size: BlockSize | None = None
    medium: Medium | None = None
    group_idx: GroupIndex | None = None
    kv_cache_spec_kind: Medium | None = None


class _RemovedByName(msgspec.Struct, tag="BlockRemoved", gc=False):
    block_hashes: BlockHashes
    medium: Medium | None = None
    group_idx: GroupIndex | None = None


class _ClearedByName(msgspec.Struct, tag="AllBlocksCleared", gc=False):
    pass


_ByPosition = _StoredByPosition | _RemovedByPosition | _ClearedByPosition
_ByName = _StoredByName | _RemovedByName | _ClearedByName
WireEvent = _ByPosition | _ByName
Rank = Annotated[int, msgspec.Meta(ge=0, lt=2**16)]


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """What one batch may hold; past any of these it is a MalformedBatch, refused before
    (bytes, events) or while (block hashes) it is decoded."""

    max_bytes: int = DEFAULT_MAX_BATCH_BYTES
    max_events: int = DEFAULT_MAX_EVENTS
    max_hashes: int = DEFAULT_MAX_HASHES  # block hashes in all the batch's events


@dataclass(frozen=True, slots=True)
class _Decoders:
    by_shape: tuple[msgspec.msgpack.Decoder[Any], ...]  # by name, by position
    raw: msgspec.msgpack.Decoder[Any]  # events left undecoded


@lru_cache(maxsize=8)
def _decoders(max_events: int) -> _Decoders:
    """Batch decoders whose event arrays are refused at their header past `max_events`
    (one set per bound: the bound is part of the type msgspec checks)."""

    # Built with defstruct: class bodies here would read their annotations as strings
    # (from __future__ import annotations), which msgspec resolves in the module only.
    def batch_type(name: str, event: Any) -> Any:
        events = Annotated[list[event], msgspec.Meta(max_length=max_events)]
        return msgspec.defstruct(
            name,
            [("ts", Timestamp), ("events", events), ("data_parallel_rank", Rank | None, None)],
            array_like=True,
            gc=False,
        )

    return _Decoders(
        (
            msgspec.msgpack.Decoder(batch_type("BatchByName", _ByName)),
            msgspec.msgpack.Decoder(batch_type("BatchByPosition", _ByPosition)),
        ),
        msgspec.msgpack.Decoder(batch_type("BatchRaw", msgspec.Raw)),
    )


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
    """Decodes batches of one stream within its limits. A stream keeps one event shape,
    so the shape that decoded the last batch is tried first (a failed try costs an
    exception)."""

    __slots__ = ("_decoders", "_raw", "limits")

    def __init__(self, limits: BatchLimits = BatchLimits()) -> None:
        self.limits = limits
        decoders = _decoders(limits.max_events)
        self._decoders: list[msgspec.msgpack.Decoder[Any]] = list(decoders.by_shape)
        self._raw = decoders.raw

    def decode(self, payload: bytes | memoryview) -> DecodedBatch:
        """Decode one batch; raises MalformedBatch when it is not a batch at all, or is
        past a limit."""
        limits = self.limits
        size = payload.nbytes if isinstance(payload, memoryview) else len(payload)
        if size > limits.max_bytes:
            raise MalformedBatch(f"a batch of {size} bytes, over {limits.max_bytes}")
        if size <= FAST_PATH_BYTES:
            decoders = self._decoders
            for index, decoder in enumerate(decoders):
                try:
                    batch = decoder.decode(payload)
                except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                    continue
                if index:
                    decoders.insert(0, decoders.pop(index))
                # A hash takes a byte at least: a batch this small cannot hold too many.
                if size > limits.max_hashes:
                    hashes = sum(len(getattr(e, "block_hashes", ())) for e in batch.events)
                    if hashes > limits.max_hashes:
                        raise _too_many_hashes(limits)
                return DecodedBatch(batch.ts, batch.data_parallel_rank, batch.events)
        return self._decode_event_by_event(payload)

    def _decode_event_by_event(self, payload: bytes | memoryview) -> DecodedBatch:
        """The slow path (a big batch, or some event did not decode): keep the events
        that decode, within the batch's bound on block hashes."""
        try:
            batch = self._raw.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            raise MalformedBatch(str(error)) from None
        except RecursionError:
            raise MalformedBatch("nested deeper than the decoder's recursion limit") from None
        events: list[WireEvent] = []
        rejected = 0
        hashes = 0
        for raw in batch.events:
            # msgpack arrays start 0x90-0x9f, 0xdc, 0xdd; maps 0x80-0x8f, 0xde, 0xdf.
            first = memoryview(raw)[:1].tobytes()  # not bytes(raw): that copies the event
            is_map = bool(first) and (0x80 <= first[0] <= 0x8F or first[0] in (0xDE, 0xDF))
            try:
                event = (_name_decoder if is_map else _position_decoder).decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                rejected += 1
                continue
            hashes += len(getattr(event, "block_hashes", ()))
            if hashes > self.limits.max_hashes:
                raise _too_many_hashes(self.limits)
            events.append(event)
        return DecodedBatch(batch.ts, batch.data_parallel_rank, events, rejected)


def _too_many_hashes(limits: BatchLimits) -> MalformedBatch:
    return MalformedBatch(f"a batch of more than {limits.max_hashes} block hashes")


def decode_batch(payload: bytes | memoryview, limits: BatchLimits = BatchLimits()) -> DecodedBatch:
    """Decode one batch of any stream; raises MalformedBatch when it is not a batch."""
    return BatchDecoder(limits).decode(payload)


def parse_sequence(frame: bytes) -> int:
    """The publisher's sequence number (8 bytes, big-endian; -1 ends a replay)."""
    if len(frame) != SEQUENCE_BYTES:
        raise MalformedBatch(f"a sequence frame has {SEQUENCE_BYTES} bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def sequence_frame(sequence: int) -> bytes:
    return sequence.to_bytes(SEQUENCE_BYTES, "big", signed=True)
