"""Refusals: vLLM's own refusals, unknown architectures and malformed configs."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from exporter.capacity import EngineSettings, derive_capacity, supported_families
from exporter.errors import (
    ConfigError,
    DoesNotFit,
    UnsupportedArchitecture,
    UnsupportedConfiguration,
)
from tests.conftest import load_golden_cases

CONFIGS: dict[str, dict[str, Any]] = {}
for _case in load_golden_cases():
    CONFIGS.setdefault(_case["model"], _case["hf_config"])
GIB = 2**30


def llama() -> dict[str, Any]:
    return copy.deepcopy(CONFIGS["llama-3.1-8b"])


def test_does_not_fit_carries_plain_numbers() -> None:
    with pytest.raises(DoesNotFit) as caught:
        derive_capacity(llama(), EngineSettings(), available_kv_bytes_per_worker=10 * GIB)
    error = caught.value
    assert error.max_model_len == 131072
    assert error.needed_bytes == 16 * GIB
    assert error.available_bytes == 10 * GIB - 2 * 2**20
    assert error.estimated_max_model_len == 81904
    assert "needs 16.00 GiB" in error.summary
    assert "81904" in error.summary


def test_no_memory_at_all_is_vllms_no_memory_error() -> None:
    with pytest.raises(DoesNotFit, match="No available memory for the cache blocks"):
        derive_capacity(
            llama(), EngineSettings(max_model_len=1024), available_kv_bytes_per_worker=1
        )


def test_auto_fit_without_room_for_one_token() -> None:
    with pytest.raises(DoesNotFit, match="Cannot auto-fit max_model_len"):
        derive_capacity(
            llama(), EngineSettings(max_model_len=-1), available_kv_bytes_per_worker=3 * 2**20
        )


def test_heads_must_divide_over_tensor_parallel_ranks() -> None:
    with pytest.raises(UnsupportedConfiguration, match=r"attention heads \(32\).*\(3\)"):
        derive_capacity(
            llama(), EngineSettings(tensor_parallel_size=3), available_kv_bytes_per_worker=GIB
        )


def test_max_model_len_above_the_model_maximum_is_refused() -> None:
    with pytest.raises(UnsupportedConfiguration, match="VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        derive_capacity(
            llama(), EngineSettings(max_model_len=262144), available_kv_bytes_per_worker=80 * GIB
        )


def test_memory_input_is_exactly_one_of_bytes_or_blocks() -> None:
    with pytest.raises(ConfigError):
        derive_capacity(llama(), EngineSettings())
    with pytest.raises(ConfigError):
        derive_capacity(
            llama(), EngineSettings(), available_kv_bytes_per_worker=GIB, num_gpu_blocks=10
        )


def test_unknown_architecture_with_generic_fields_is_derived_and_marked_approximate() -> None:
    config = llama()
    config["architectures"] = ["SomeNewLlamaLikeForCausalLM"]
    config["model_type"] = "some_new"
    result = derive_capacity(config, EngineSettings(), available_kv_bytes_per_worker=40 * GIB)
    known = derive_capacity(llama(), EngineSettings(), available_kv_bytes_per_worker=40 * GIB)
    assert result.capacity.approximate
    assert not known.capacity.approximate
    assert result.family == "generic"
    assert result.capacity.kv_cache_size_tokens == known.capacity.kv_cache_size_tokens


def test_unknown_architecture_with_sliding_layer_types_follows_them() -> None:
    config = copy.deepcopy(CONFIGS["gemma-3-12b-text"])
    config["architectures"] = ["Olmo3LikeForCausalLM"]
    config["layer_types"] = [
        "full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(48)
    ]
    result = derive_capacity(config, EngineSettings(), available_kv_bytes_per_worker=40 * GIB)
    kinds = sorted(group.spec_type for group in result.capacity.groups)
    assert kinds == ["FullAttentionSpec"] + ["SlidingWindowSpec"] * 3
    assert result.capacity.approximate


def test_unknown_architecture_without_generic_fields_lists_the_families() -> None:
    config = {"architectures": ["MysteryModel"], "hidden_size": 1024}
    with pytest.raises(UnsupportedArchitecture) as caught:
        derive_capacity(config, EngineSettings(), available_kv_bytes_per_worker=GIB)
    message = str(caught.value)
    assert "MysteryModel" in message
    for family in ("gemma3", "jamba", "qwen3_next", "deepseek_mla"):
        assert family in message
    assert set(supported_families()) >= {"llama", "gemma2", "gpt_oss", "nemotron_h", "zamba2"}


def test_unknown_hybrid_layer_types_are_not_guessed() -> None:
    config = copy.deepcopy(CONFIGS["qwen3-next-80b-a3b"])
    config["architectures"] = ["FutureHybridForCausalLM"]
    with pytest.raises(UnsupportedArchitecture, match="linear_attention"):
        derive_capacity(config, EngineSettings(tensor_parallel_size=2), num_gpu_blocks=1000)


@pytest.mark.parametrize(
    ("model", "field", "value", "message"),
    [
        ("gpt-oss-20b", "num_hidden_layers", None, "num_hidden_layers"),
        ("gpt-oss-20b", "num_hidden_layers", "32", "num_hidden_layers"),
        ("gpt-oss-20b", "num_key_value_heads", 2.5, "num_key_value_heads"),
        ("gpt-oss-20b", "architectures", [], "architectures"),
        ("gemma-2-9b", "layer_types", ["full_attention"], "layer_types"),
        ("jamba-mini", "mamba_d_state", "big", "mamba_d_state"),
        ("nemotron-h-8b", "hybrid_override_pattern", "M*", "hybrid_override_pattern"),
        ("qwen3-next-80b-a3b", "linear_num_value_heads", None, "linear_num_value_heads"),
    ],
)
def test_malformed_config_fields_are_named(
    model: str, field: str, value: Any, message: str
) -> None:
    config = copy.deepcopy(CONFIGS[model])
    config[field] = value
    with pytest.raises((ConfigError, UnsupportedArchitecture), match=message):
        derive_capacity(config, EngineSettings(), available_kv_bytes_per_worker=40 * GIB)


def test_config_must_be_an_object() -> None:
    with pytest.raises(ConfigError):
        derive_capacity([], EngineSettings(), available_kv_bytes_per_worker=GIB)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tensor_parallel_size": 0},
        {"block_size": 0},
        {"max_model_len": -2},
        {"num_gpu_blocks_override": -1},
    ],
)
def test_settings_reject_impossible_values(kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        EngineSettings(**kwargs)  # type: ignore[arg-type]
