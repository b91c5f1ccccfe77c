"""Prefix-cache residency: what each engine's KV cache holds, from its KV events."""

from exporter.prefix_cache.residency import EngineResidency, PoolView, ResidencyView

__all__ = ["EngineResidency", "PoolView", "ResidencyView"]
