"""The capacity model: pure functions that re-derive vLLM's group-aware KV cache capacity.

    derive_capacity(config_json, EngineSettings(...), available_kv_bytes_per_worker=...)

No I/O happens here; callers load config.json and pass a dict.
"""

from exporter.capacity.derive import CapacityResult, LayerKvSpec, derive_capacity
from exporter.capacity.families import supported_families
from exporter.capacity.settings import EngineSettings
from exporter.capacity.value import (
    NO_CAPACITY,
    EngineCapacity,
    GroupCapacity,
    blocks_for_bytes,
    capacity_tokens,
    kind_of_spec_type,
    merge_capacities,
)

__all__ = [
    "NO_CAPACITY",
    "CapacityResult",
    "EngineCapacity",
    "EngineSettings",
    "GroupCapacity",
    "LayerKvSpec",
    "blocks_for_bytes",
    "capacity_tokens",
    "derive_capacity",
    "kind_of_spec_type",
    "merge_capacities",
    "supported_families",
]
