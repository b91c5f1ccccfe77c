"""A derivation's figures with their types narrowed: a derivation knows every one."""

from __future__ import annotations

from typing import NamedTuple

from exporter.capacity import CapacityResult


class Known(NamedTuple):
    """A derivation's figures, every one known (the capacity type allows unknown ones)."""

    kv_cache_size_tokens: int
    kv_cache_max_concurrency: float
    num_gpu_blocks: int
    max_model_len: int


def known(result: CapacityResult) -> Known:
    c = result.capacity
    assert c.kv_cache_size_tokens is not None
    assert c.kv_cache_max_concurrency is not None
    assert c.num_gpu_blocks is not None
    assert c.max_model_len is not None
    return Known(
        c.kv_cache_size_tokens, c.kv_cache_max_concurrency, c.num_gpu_blocks, c.max_model_len
    )
