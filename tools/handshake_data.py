"""Handshake messages built from the recorded vLLM 0.33 deployments (tests and benchmarks)."""

from __future__ import annotations

from typing import Any

import msgspec

from exporter.handshake_wire import GroupExtra, ReadyExtras
from tools import GOLDEN

HANDSHAKE = GOLDEN / "handshake"


def recorded_extras(
    deployment: dict[str, Any], engine: dict[str, Any], **overrides: Any
) -> ReadyExtras:
    """The extras kvcap's plugin would send for one recorded engine."""
    fields: dict[str, Any] = {
        "groups": [
            GroupExtra(
                spec_type=g["spec_type"],
                num_layers=g["num_layers"],
                block_size=g["block_size"],
                page_size_bytes=g["page_size_bytes"],
                max_memory_usage_bytes_per_request=g["max_memory_usage_bytes_per_request"],
            )
            for g in engine["groups"]
        ],
        "bytes_per_block_per_worker": [engine["bytes_per_block_per_worker"]] * engine["world_size"],
        "model_name": deployment["served_model_name"],
        "pid": 1234,
    }
    return ReadyExtras(**(fields | overrides))


def ready_for_rank(
    rank: int, instance_id: str = "1", recording: str = "llama-3.1-8b-dp2-tp1.engine0.msgpack"
) -> bytes:
    """vLLM's ready bytes for another DP rank: decoded and re-encoded as vLLM encodes its
    dataclass (a map of every field)."""
    fields = msgspec.msgpack.decode((HANDSHAKE / recording).read_bytes())
    fields.update(data_parallel_rank=rank, instance_id=instance_id)
    return msgspec.msgpack.encode(fields)
