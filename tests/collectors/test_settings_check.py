"""Told settings against what the engine shows: each contradiction named, nothing invented."""

from __future__ import annotations

import dataclasses
from typing import Any

from exporter.collectors import engine_mismatches, expected_engines, server_mismatches
from exporter.collectors.parsing import CacheConfigInfo, parse_vllm_serve_args
from exporter.state import SettingsMismatch


def info(block_size: int | None = 16, cache_dtype: str | None = "auto") -> CacheConfigInfo:
    fields: dict[str, Any] = {f.name: None for f in dataclasses.fields(CacheConfigInfo)}
    fields |= {"engine": "0", "labels": {}, "block_size": block_size, "cache_dtype": cache_dtype}
    return CacheConfigInfo(**fields)


def test_the_issues_example_names_every_wrong_setting() -> None:
    args = parse_vllm_serve_args("Qwen/Qwen3-0.6B --max-model-len 8192")
    found = server_mismatches(
        args, served_name="google/gemma-3-27b-it", max_model_len=131072, engines=2
    )
    assert found == (
        SettingsMismatch("served_model_name", "Qwen/Qwen3-0.6B", "google/gemma-3-27b-it",
                         "/v1/models"),
        SettingsMismatch("max_model_len", "8192", "131072", "/v1/models"),
        SettingsMismatch("data_parallel_size", "1", "2 engines", "/metrics"),
    )  # fmt: skip
    assert found[1].message == "max_model_len: told 8192, but /v1/models shows 131072"


def test_right_settings_find_nothing() -> None:
    args = parse_vllm_serve_args(
        "/models/gemma --served-model-name google/gemma-3-27b-it -tp 2 -dp 2 --max-model-len 131072"
    )
    assert (
        server_mismatches(
            args, served_name="google/gemma-3-27b-it", max_model_len=131072, engines=2
        )
        == ()
    )
    # Nothing told, nothing checked: auto-fit, no args at all, an empty server.
    auto = parse_vllm_serve_args("/models/gemma --max-model-len auto -dp 2")
    assert server_mismatches(auto, served_name="/models/gemma", max_model_len=9, engines=2) == ()
    assert server_mismatches(None, served_name="x", max_model_len=9, engines=2) == ()
    assert server_mismatches(auto, served_name=None, max_model_len=None, engines=0) == ()


def test_engines_behind_one_api_server() -> None:
    assert expected_engines(parse_vllm_serve_args("m -dp 4")) == 4
    assert expected_engines(parse_vllm_serve_args("m -dp 4 -dpl 2")) == 2
    assert expected_engines(parse_vllm_serve_args("m -dp 4 --data-parallel-rank 3")) == 1
    assert expected_engines(parse_vllm_serve_args("m")) == 1


def test_engine_block_size_and_cache_dtype() -> None:
    told = parse_vllm_serve_args("m --block-size 32 --kv-cache-dtype fp8")
    assert engine_mismatches(told, info(16, "auto"), derived_block_size=32) == (
        SettingsMismatch("block_size", "32", "16", "/metrics"),
        SettingsMismatch("kv_cache_dtype", "fp8", "auto", "/metrics"),
    )
    # vLLM raises a hybrid's block size: the told settings' own plan is what counts.
    hybrid = parse_vllm_serve_args("m --block-size 16")
    assert engine_mismatches(hybrid, info(80), derived_block_size=80) == ()
    # No told block size or dtype: nothing to contradict.
    assert engine_mismatches(parse_vllm_serve_args("m"), info(80, "fp8"), None) == ()
    assert engine_mismatches(told, None, None) == ()
