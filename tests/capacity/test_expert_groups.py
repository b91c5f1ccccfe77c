"""A DeepSeek-V2 MoE config without `n_group` / `topk_group`: what the CUDA records do not hold.

The records (`deepseek-v2-mla128-no-n-group` in `vllm-0.2[3-9]*-cuda.jsonl` and later) pin
the refusal on each release; these are the configs around it that still plan.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from exporter.capacity import EngineSettings, derive_capacity
from exporter.errors import UnsupportedConfiguration
from tests.support.release_records import release_record

GIB = 2**30
CASE_ID = "deepseek-v2-mla128-no-n-group|mml-4096|mnbt-default|mem-1GiB"


def _config() -> dict[str, Any]:
    record = release_record("vllm-0.32.0-cuda.jsonl", CASE_ID)
    config: dict[str, Any] = copy.deepcopy(record["hf_config"])
    assert "n_group" not in config
    assert "topk_group" not in config
    return config


def _plan(config: dict[str, Any], version: str = "0.32.0", platform: str = "cuda") -> None:
    settings = EngineSettings(max_model_len=4096, vllm_version=version, platform=platform)
    derive_capacity(config, settings, available_kv_bytes_per_worker=GIB)


@pytest.mark.parametrize(
    ("version", "kind"), [("0.23.0", "AssertionError"), ("0.24.0", "ValueError")]
)
def test_a_missing_group_count_fails_the_moe_build(version: str, kind: str) -> None:
    with pytest.raises(UnsupportedConfiguration) as caught:
        _plan({**_config(), "topk_group": 1}, version)  # one of the two missing is enough
    assert caught.value.vllm_error_type == kind


def test_vllm_cpu_takes_it_from_0_30_with_its_own_router() -> None:
    # 0.29.0 builds the grouped top-k router on CPU too; 0.30.0's CPURouter comes first.
    with pytest.raises(UnsupportedConfiguration, match="must be provided when use_grouped_topk"):
        _plan(_config(), "0.29.0", platform="cpu")
    _plan(_config(), "0.30.0", platform="cpu")


@pytest.mark.parametrize(
    "changes",
    [
        {"n_group": 1, "topk_group": 1},  # the tiny cases' fix
        {"model_type": "deepseek_v3"},  # DeepseekV3Config defaults 8 and 4
        {"first_k_dense_replace": 2},  # both layers dense: no MoE layer is built
    ],
    ids=["groups-given", "deepseek-v3-config", "no-moe-layer"],
)
def test_configs_that_build_a_router_plan(changes: dict[str, Any]) -> None:
    _plan({**_config(), **changes})
