"""The deployments behind the handshake fixtures: per-engine numbers vLLM 0.33 planned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.capacity import EngineSettings, derive_capacity
from tests.conftest import GOLDEN

HANDSHAKE = GOLDEN / "handshake"
DEPLOYMENTS = sorted(HANDSHAKE.glob("*.json"))


def _deployment(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.mark.parametrize("path", DEPLOYMENTS, ids=[p.stem for p in DEPLOYMENTS])
def test_engine_numbers_match_vllm_plan(path: Path) -> None:
    deployment = _deployment(path)
    config = json.loads((HANDSHAKE / deployment["model_config_dir"] / "config.json").read_text())
    settings = deployment["settings"]
    result = derive_capacity(
        config,
        EngineSettings(
            tensor_parallel_size=settings["tensor_parallel_size"],
            pipeline_parallel_size=settings["pipeline_parallel_size"],
            max_model_len=settings["max_model_len"],
            kv_cache_dtype=settings["kv_cache_dtype"],
            block_size=settings["block_size"],
        ),
        available_kv_bytes_per_worker=deployment["available_kv_bytes_per_worker"],
    )
    for engine in deployment["engines"]:
        assert result.capacity.num_gpu_blocks == engine["num_gpu_blocks"]
        assert result.capacity.block_size == engine["block_size"]
        assert result.capacity.kv_cache_size_tokens == engine["kv_cache_size_tokens"]
        assert result.capacity.kv_cache_max_concurrency == pytest.approx(
            engine["max_concurrency"], rel=1e-12
        )
        assert result.capacity.max_model_len == engine["max_model_len"]
        assert result.effective_attention_block_size == engine["effective_attention_block_size"]
        assert result.capacity.bytes_per_block_per_worker[0] == engine["bytes_per_block_per_worker"]
        got = sorted(
            (g.spec_type, g.num_layers, g.page_size_bytes, g.max_memory_usage_bytes_per_request)
            for g in result.capacity.groups
        )
        want = sorted(
            (
                g["spec_type"],
                g["num_layers"],
                g["page_size_bytes"],
                g["max_memory_usage_bytes_per_request"],
            )
            for g in engine["groups"]
        )
        assert got == want


def test_every_deployment_was_checked() -> None:
    assert len(DEPLOYMENTS) == 4
