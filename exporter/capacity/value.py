"""EngineCapacity: one engine's KV cache capacity, the one value every producer makes.

vLLM's reported numbers (the handshake, `vllm:cache_config_info`) and the capacity model's
derived ones are the same type; a producer fills the fields it knows. Field names are the
label names of `kvcap_kv_cache_info`, so a figure has one name from source to series.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from exporter.capacity.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    cdiv,
)
from exporter.errors import CapacityError
from exporter.merging import first_known


@dataclass(frozen=True, slots=True)
class GroupCapacity:
    """One KV cache group as the scheduler of worker 0 sees it."""

    kind: str
    spec_type: str
    num_layers: int
    layer_names: tuple[str, ...]
    block_size: int
    page_size_bytes: int
    blocks_per_request: int
    max_memory_usage_bytes_per_request: int
    sliding_window: int | None
    attention_chunk_size: int | None


@dataclass(frozen=True, slots=True)
class EngineCapacity:
    """KV cache capacity of one engine (one data-parallel rank); any figure may be unknown.

    An empty tuple is unknown too: no engine has zero groups or zero workers.
    """

    kv_cache_size_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    max_model_len: int | None = None
    cache_dtype: str | None = None
    groups: tuple[GroupCapacity, ...] = ()
    bytes_per_block_per_worker: tuple[int, ...] = ()
    # The capacity model approximates a family it knows only in part (None: vLLM's number).
    approximate: bool | None = None

    @property
    def blocks_per_request(self) -> int | None:
        """Blocks one max_model_len request needs, summed over the groups."""
        return sum(group.blocks_per_request for group in self.groups) if self.groups else None

    @property
    def kv_cache_bytes_per_worker(self) -> tuple[int, ...]:
        """Bytes of KV cache tensors on each worker: blocks x bytes per block there."""
        if self.num_gpu_blocks is None:
            return ()
        return tuple(self.num_gpu_blocks * size for size in self.bytes_per_block_per_worker)


NO_CAPACITY = EngineCapacity()


class Figures(NamedTuple):
    """An engine's figures with their types narrowed: every one known, as a derivation's are
    (EngineCapacity allows unknown ones, since a collector may report only some)."""

    num_gpu_blocks: int
    block_size: int
    max_model_len: int
    kv_cache_size_tokens: int
    kv_cache_max_concurrency: float


def known_figures(capacity: EngineCapacity) -> Figures:
    """The figures of a derived capacity; one that is unknown is a bug of the derivation."""
    c = capacity
    if (
        c.num_gpu_blocks is None
        or c.block_size is None
        or c.max_model_len is None
        or c.kv_cache_size_tokens is None
        or c.kv_cache_max_concurrency is None
    ):
        raise CapacityError(f"a derived capacity lacks a figure: {c}")
    return Figures(
        c.num_gpu_blocks,
        c.block_size,
        c.max_model_len,
        c.kv_cache_size_tokens,
        c.kv_cache_max_concurrency,
    )


def merge_capacities(values: Iterable[EngineCapacity | None]) -> EngineCapacity:
    """The first known value of each field, in the order given (the best producer first)."""
    known = [value for value in values if value is not None]
    return first_known(known) if known else NO_CAPACITY


def capacity_tokens(num_gpu_blocks: int, blocks_per_request: int, max_model_len: int) -> int:
    """vLLM's 'GPU KV cache size': int(max_concurrency x max_model_len), where
    max_concurrency = blocks / blocks per request (the order of vLLM's float math)."""
    return int(num_gpu_blocks / blocks_per_request * max_model_len)


def blocks_for_bytes(num_bytes: int, page_size_bytes: int) -> int:
    """Blocks needed to hold `num_bytes` of one group (its page size per block)."""
    return cdiv(num_bytes, page_size_bytes)


_SPEC_CLASSES = (
    FullAttentionSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    ChunkedLocalAttentionSpec,
    MambaSpec,
)
_KIND_OF_SPEC_TYPE = {spec.spec_type: spec.kind for spec in _SPEC_CLASSES}


def kind_of_spec_type(spec_type: str) -> str:
    """The attention kind of one of vLLM's KVCacheSpec class names (itself when unknown)."""
    return _KIND_OF_SPEC_TYPE.get(spec_type, spec_type)
