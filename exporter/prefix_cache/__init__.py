"""Prefix-cache residency: what each engine's KV cache holds, from its KV events."""

from exporter.prefix_cache.residency import (
    DEFAULT_MAX_BLOCKS,
    LIFETIME_BUCKETS_S,
    EngineResidency,
)

__all__ = [
    "DEFAULT_MAX_BLOCKS",
    "LIFETIME_BUCKETS_S",
    "EngineResidency",
]
