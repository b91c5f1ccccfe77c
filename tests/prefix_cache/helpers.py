"""Residency built from the recorded live streams, for exposition and /engines tests."""

from __future__ import annotations

from exporter.kv_events_wire import decode_batch
from exporter.prefix_cache import EngineResidency
from exporter.state import ResidencyView
from tests.kv_events_data import EVICTIONS, LIVE_POOL_BLOCKS, SHARED_PREFIX, frames

HYBRID = "gemma3-0.32.0-sliding-window.msgpack"


def recorded_views() -> list[ResidencyView]:
    """Engine 0: the Llama stream with evictions; engine 1: the Gemma 3 hybrid, joined
    late and with a dropped event (so every family and reason has samples)."""
    llama = EngineResidency("0")
    llama.pool_blocks = LIVE_POOL_BLOCKS
    llama.up = True
    for name in (SHARED_PREFIX, EVICTIONS):
        for _, _, payload in frames(name):
            llama.apply(decode_batch(payload))
    gemma = EngineResidency("1")
    gemma.pool_blocks = 80
    for _, _, payload in frames(HYBRID):
        gemma.apply(decode_batch(payload))
    gemma.drop("missed", 3)
    gemma.gaps_total = 1
    gemma.mark_approximate("batches were lost (sequence gap)")
    return [llama.view(), gemma.view()]
