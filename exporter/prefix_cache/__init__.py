"""Prefix-cache residency: what each engine's KV cache holds, from its KV events."""

from exporter.prefix_cache.residency import (
    DEFAULT_MAX_BLOCKS,
    DEFAULT_MAX_GROUPS,
    LIFETIME_BUCKETS_S,
    EngineResidency,
)

__all__ = [
    "DEFAULT_MAX_BLOCKS",
    "DEFAULT_MAX_GROUPS",
    "LIFETIME_BUCKETS_S",
    "EngineResidency",
]
