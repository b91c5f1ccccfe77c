"""The total tensor bytes a safetensors checkpoint index declares, read without its map."""

from __future__ import annotations

import msgspec

# A checkpoint index maps every tensor to its shard: ~9 MiB for the largest checkpoints
# (tens of thousands of tensors); only its total is read.
MAX_INDEX_BYTES = 32 * 2**20


class _Metadata(msgspec.Struct):
    total_size: int | None = None


class _Index(msgspec.Struct):
    metadata: _Metadata | None = None


def total_size(data: bytes) -> int | None:
    """`metadata.total_size` of a safetensors index, decoded alone: the tensor map beside
    it is skipped, never built, so its size costs no memory past the bytes read. None when
    the document is not JSON, not this shape, or has no positive total."""
    try:
        metadata = msgspec.json.decode(data, type=_Index).metadata
    except (msgspec.DecodeError, RecursionError):  # not JSON or not this shape; too deep
        return None
    total = metadata.total_size if metadata is not None else None
    return total if total is not None and total > 0 else None
