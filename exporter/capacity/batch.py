"""Batch mode: golden-style case records in, one JSON result (or error) per record out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter.capacity.derive import CapacityResult, derive_capacity
from exporter.capacity.settings import EngineSettings
from exporter.errors import ConfigError, KvcapError

# The `settings` keys of a case record that map one to one onto EngineSettings.
_SETTING_KEYS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "decode_context_parallel_size",
    "dtype",
    "kv_cache_dtype",
    "block_size",
    "max_model_len",
    "max_num_batched_tokens",
    "num_gpu_blocks_override",
    "enable_prefix_caching",
    "mamba_cache_dtype",
    "mamba_ssm_cache_dtype",
    "disable_hybrid_kv_cache_manager",
)
# The environment variable of a record's `settings.env` that changes the plan.
_CHUNKED_LOCAL_HYBRID_ENV = "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE"


# Top-level keys of a case record, next to `settings`: what plans (default: cuda, and the
# newest release kvcap knows).
_TARGET_KEYS = ("platform", "vllm_version")


def settings_from_record(
    settings: Mapping[str, Any], target: Mapping[str, Any] | None = None
) -> EngineSettings:
    """EngineSettings from a record's `settings` and its top-level `platform` and
    `vllm_version` (strings); `null` means vLLM's default."""
    values: dict[str, Any] = {}
    for key in _TARGET_KEYS:
        value = (target or {}).get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        values[key] = value
    for key in _SETTING_KEYS:
        value = settings.get(key)
        if value is None:
            continue
        expected = type(getattr(_DEFAULTS, key) if getattr(_DEFAULTS, key) is not None else 0)
        if key in ("enable_prefix_caching", "disable_hybrid_kv_cache_manager"):
            expected = bool
        if type(value) is not expected:
            raise ConfigError(f"settings.{key} must be {expected.__name__}, got {value!r}")
        values[key] = value
    values.update(_switches(settings))
    return EngineSettings(**values)


def _switches(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`kv_events_config` (any object: given) and the hybrid-manager environment variable."""
    values: dict[str, Any] = {}
    events = settings.get("kv_events_config")
    if events is not None:
        if not isinstance(events, Mapping):
            raise ConfigError(f"settings.kv_events_config must be an object, got {events!r}")
        values["kv_events"] = True
    env = settings.get("env") or {}
    if not isinstance(env, Mapping):
        raise ConfigError(f"settings.env must be an object, got {env!r}")
    flag = env.get(_CHUNKED_LOCAL_HYBRID_ENV)
    if flag is not None:
        if flag not in ("0", "1"):
            raise ConfigError(f'settings.env.{_CHUNKED_LOCAL_HYBRID_ENV} must be "0" or "1"')
        values["chunked_local_attn_with_hybrid_kv_cache"] = flag == "1"
    return values


_DEFAULTS = EngineSettings()


def result_to_json(result: CapacityResult) -> dict[str, Any]:
    """The batch output of one successful record (golden field names)."""
    return {
        "num_gpu_blocks": result.capacity.num_gpu_blocks,
        "block_size": result.capacity.block_size,
        "kv_cache_size_tokens": result.capacity.kv_cache_size_tokens,
        "max_concurrency": result.capacity.kv_cache_max_concurrency,
        "max_model_len": result.capacity.max_model_len,
        "max_model_len_before_planning": result.max_model_len_before_planning,
        "effective_attention_block_size": result.effective_attention_block_size,
        "bytes_per_block_per_worker": list(result.capacity.bytes_per_block_per_worker),
        "log_lines": list(result.log_lines),
        "logged_kv_cache_size_tokens": result.logged_kv_cache_size_tokens,
        "log_note": result.log_note,
        "vllm_version": result.vllm_version,
        "approximate": result.capacity.approximate,
        "family": result.family,
        "platform": result.platform,
        "groups": [
            {
                "spec_type": group.spec_type,
                "kind": group.kind,
                "num_layers": group.num_layers,
                "block_size": group.block_size,
                "page_size_bytes": group.page_size_bytes,
                "blocks_per_request": group.blocks_per_request,
                "max_memory_usage_bytes_per_request": group.max_memory_usage_bytes_per_request,
                "sliding_window": group.sliding_window,
                "attention_chunk_size": group.attention_chunk_size,
            }
            for group in result.capacity.groups
        ],
    }


def error_to_json(error: Exception) -> dict[str, Any]:
    """`type` is the exception vLLM raises in the same case when there is one."""
    kvcap_type = type(error).__name__
    vllm_type = getattr(error, "vllm_error_type", None)
    return {"type": vllm_type or kvcap_type, "kvcap_type": kvcap_type, "message": str(error)}


def run_case(record: Any) -> dict[str, Any]:
    """One record to one output line. Never raises: a bad record becomes an error line."""
    case_id = record.get("id") if isinstance(record, Mapping) else None
    try:
        if not isinstance(record, Mapping):
            raise ConfigError("a case record must be a JSON object")
        config, settings = record.get("hf_config"), record.get("settings")
        if not isinstance(config, Mapping) or not isinstance(settings, Mapping):
            raise ConfigError("a case record needs `hf_config` and `settings` objects")
        result = derive_capacity(
            config,
            settings_from_record(settings, record),
            available_kv_bytes_per_worker=_optional_int(settings, "available_kv_bytes_per_worker"),
            num_gpu_blocks=_optional_int(settings, "num_gpu_blocks"),
        )
    except KvcapError as error:
        return {"id": case_id, "error": error_to_json(error)}
    except (ArithmeticError, ValueError, TypeError, KeyError) as error:
        # Inputs kvcap did not anticipate: still one error line, never a crashed batch.
        return {"id": case_id, "error": error_to_json(error)}
    return {"id": case_id, "result": result_to_json(result)}


def _optional_int(settings: Mapping[str, Any], key: str) -> int | None:
    value = settings.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"settings.{key} must be an integer, got {value!r}")
    return value
