"""Model families: each turns a config.json into the model's cache-holding layers."""

from exporter.capacity.families import attention, hybrid
from exporter.capacity.families.attention import generic
from exporter.capacity.families.layout import (
    AttentionLayer,
    BuildContext,
    CacheLayer,
    MambaLayer,
    ModelLayout,
)
from exporter.capacity.families.registry import Family, lookup, supported_families

__all__ = [
    "AttentionLayer",
    "BuildContext",
    "CacheLayer",
    "Family",
    "MambaLayer",
    "ModelLayout",
    "attention",
    "generic",
    "hybrid",
    "lookup",
    "supported_families",
]
