"""The capacity model: pure functions that re-derive vLLM's group-aware KV cache capacity.

    derive_capacity(config_json, EngineSettings(...), available_kv_bytes_per_worker=...)

No I/O happens here; callers load config.json and pass a dict.
"""

from exporter.capacity.derive import CapacityResult, GroupCapacity, LayerKvSpec, derive_capacity
from exporter.capacity.families import supported_families
from exporter.capacity.settings import EngineSettings

__all__ = [
    "CapacityResult",
    "EngineSettings",
    "GroupCapacity",
    "LayerKvSpec",
    "derive_capacity",
    "supported_families",
]
