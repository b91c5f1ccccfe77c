"""The release rules no release record pins down on its own: what turns the hybrid KV cache
manager off, and what a release refuses instead of planning."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from exporter.capacity import EngineSettings, derive_capacity
from exporter.collectors.parsing import parse_vllm_serve_args, to_engine_settings
from exporter.errors import UnsupportedConfiguration
from tests.conftest import GOLDEN
from tests.support.release_records import release_records

GIB = 2**30


def _config(model: str) -> dict[str, Any]:
    """The tiny config.json of a family, as the release records carry it."""
    for record in release_records(GOLDEN / "releases" / "vllm-0.32.0-cpu.jsonl"):
        if record["model"] == model:
            config: dict[str, Any] = record["hf_config"]
            return config
    raise AssertionError(f"no {model} record")


def _plan(model: str, version: str, **settings: Any) -> tuple[int, list[str]]:
    result = derive_capacity(
        _config(model),
        EngineSettings(platform="cpu", vllm_version=version, max_model_len=4096, **settings),
        available_kv_bytes_per_worker=GIB,
    )
    return result.figures.num_gpu_blocks, [group.spec_type for group in result.capacity.groups]


def test_kv_events_turn_the_hybrid_manager_off_only_before_0_20() -> None:
    hybrid = _plan("gemma3", "0.18.1")
    assert _plan("gemma3", "0.18.1", kv_events=True) == (5461, ["FullAttentionSpec"])
    assert hybrid[1].count("SlidingWindowSpec") == 5
    assert _plan("gemma3", "0.20.1", kv_events=True) == _plan("gemma3", "0.20.1")


def test_the_chunked_local_default_flips_in_0_14_and_the_variable_wins() -> None:
    off, on = (8192, ["FullAttentionSpec"]), _plan("llama4", "0.15.1")
    assert len(on[1]) == 4
    assert _plan("llama4", "0.13.0") == off
    assert _plan("llama4", "0.14.0") == on
    assert _plan("llama4", "0.11.1", chunked_local_attn_with_hybrid_kv_cache=True) == on
    assert _plan("llama4", "0.32.0", chunked_local_attn_with_hybrid_kv_cache=False) == off
    assert _plan("llama4", "0.32.0", disable_hybrid_kv_cache_manager=True) == off


def test_a_mamba_hybrid_without_the_hybrid_manager_is_refused_as_vllm_does() -> None:
    with pytest.raises(UnsupportedConfiguration, match="failed to convert") as refused:
        _plan("granite-4.0-h", "0.15.1", disable_hybrid_kv_cache_manager=True)
    assert getattr(refused.value, "vllm_error_type", None) == "ValueError"


def test_vllm_cpu_0_10_refuses_sliding_window_as_its_v0_fallback_does() -> None:
    # 0.10 falls back to V0 for a sliding window on CPU; its only worker is V1's, whose
    # attention selector refuses (the CPU grid's 0.10.2 records).
    with pytest.raises(UnsupportedConfiguration, match=r"^CPU backend only supports V1\.$") as no:
        _plan("gemma3", "0.10.2")
    assert no.value.vllm_error_type == "ValueError"
    assert _plan("gemma3", "0.11.1")[0] == 32768
    # On CUDA 0.10's V1 engine plans sliding window itself.
    result = derive_capacity(
        _config("gemma3"),
        EngineSettings(vllm_version="0.10.2", max_model_len=4096),
        available_kv_bytes_per_worker=GIB,
    )
    assert len(result.capacity.groups) == 6


def test_a_command_line_with_kv_events_plans_an_old_engine_without_the_hybrid_manager() -> None:
    # What the sidecar and `capacity -- vllm serve ...` read from the engine's command line.
    args = parse_vllm_serve_args(
        'vllm serve /m --max-model-len 4096 --kv-events-config \'{"publisher": "zmq"}\''
    )
    settings = dataclasses.replace(to_engine_settings(args), platform="cpu", vllm_version="0.15.1")
    result = derive_capacity(_config("gemma3"), settings, available_kv_bytes_per_worker=GIB)
    assert (result.capacity.num_gpu_blocks, len(result.capacity.groups)) == (5461, 1)
    assert round(result.figures.kv_cache_max_concurrency, 2) == 170.66
