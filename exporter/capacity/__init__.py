"""The capacity model: pure functions that re-derive vLLM's group-aware KV cache capacity.

    derive_capacity(config_json, EngineSettings(...), available_kv_bytes_per_worker=...)

No I/O happens here; callers load config.json and pass a dict.
"""

from exporter.capacity.batch import error_to_json, result_to_json, run_case, settings_from_record
from exporter.capacity.derive import CapacityResult, LayerKvSpec, derive_capacity
from exporter.capacity.families import supported_families
from exporter.capacity.hf_config import MAX_LAYERS, HfConfig
from exporter.capacity.platforms import CPU, CPU_AMX, CUDA, PLATFORMS, platform_rules
from exporter.capacity.releases import NEWEST, RELEASES, ReleaseRules, parse_version, release_rules
from exporter.capacity.settings import KV_CACHE_DTYPES, EngineSettings, dtype_bytes
from exporter.capacity.specs import MambaSpec, cdiv
from exporter.capacity.value import (
    NO_CAPACITY,
    EngineCapacity,
    Figures,
    GroupCapacity,
    blocks_for_bytes,
    capacity_tokens,
    kind_of_spec_type,
    merge_capacities,
)

__all__ = [
    "CPU",
    "CPU_AMX",
    "CUDA",
    "KV_CACHE_DTYPES",
    "MAX_LAYERS",
    "NEWEST",
    "NO_CAPACITY",
    "PLATFORMS",
    "RELEASES",
    "CapacityResult",
    "EngineCapacity",
    "EngineSettings",
    "Figures",
    "GroupCapacity",
    "HfConfig",
    "LayerKvSpec",
    "MambaSpec",
    "ReleaseRules",
    "blocks_for_bytes",
    "capacity_tokens",
    "cdiv",
    "derive_capacity",
    "dtype_bytes",
    "error_to_json",
    "kind_of_spec_type",
    "merge_capacities",
    "parse_version",
    "platform_rules",
    "release_rules",
    "result_to_json",
    "run_case",
    "settings_from_record",
    "supported_families",
]
