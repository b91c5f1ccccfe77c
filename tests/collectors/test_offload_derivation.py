"""A released engine's configured offload size, cut by kvcap's model, or left as bytes."""

from __future__ import annotations

import json

import pytest

from exporter.capacity import EngineSettings, derive_capacity
from exporter.collectors.offload_derivation import derive_offload
from exporter.collectors.parsing import parse_vllm_serve_args
from exporter.state import OffloadTier
from tests.conftest import FIXTURES

RECORDING = FIXTURES / "offload" / "0.32.0-pr53902"
CONFIG = json.loads((RECORDING / "model" / "config.json").read_text())
SERVER = json.loads((RECORDING / "server.json").read_text())
CONFIGURED = OffloadTier("cpu", capacity_bytes=2**28, source="cache_config_info")
PLAN = derive_capacity(
    CONFIG,
    EngineSettings(max_model_len=2048, platform="cpu", vllm_version="0.32.0"),
    num_gpu_blocks=SERVER["num_gpu_blocks_per_engine"],
)


def test_the_recorded_engines_tier_is_cut_as_vllm_cut_it() -> None:
    (tier,) = derive_offload(
        (CONFIGURED,), PLAN, parse_vllm_serve_args(SERVER["vllm_args"]), "0.32.0"
    )
    facts = SERVER["offload"]
    assert tier.source == "derived"
    assert tier.capacity_blocks == facts["num_chunks"] * facts["blocks_per_chunk"]
    assert tier.capacity_bytes == facts["num_chunks"] * facts["kv_bytes_per_chunk"]


def test_a_chunk_of_several_blocks_from_the_transfer_config() -> None:
    args = parse_vllm_serve_args(
        SERVER["vllm_args"]
        + """ --kv-transfer-config '{"kv_connector_extra_config": {"block_size": 512}}'"""
    )
    (tier,) = derive_offload((CONFIGURED,), PLAN, args, "0.32.0")
    # Four 128-token blocks a chunk: a quarter of the chunks, the same blocks.
    assert tier.capacity_blocks == SERVER["offload"]["num_chunks"]
    assert tier.capacity_bytes == 2**28


@pytest.mark.parametrize(
    ("extra", "version"),
    [
        ("", "0.26.0"),  # before the native tier kvcap models
        (
            """ --kv-transfer-config '{"kv_connector_extra_config": {"block_size": 100}}'""",
            "0.32.0",
        ),
        # A chunk size the planner refuses (not a whole number): not guessed at.
        (
            """ --kv-transfer-config '{"kv_connector_extra_config": {"block_size": "512"}}'""",
            "0.32.0",
        ),
    ],
)
def test_what_cannot_be_cut_keeps_the_configured_bytes_only(extra: str, version: str) -> None:
    args = parse_vllm_serve_args(SERVER["vllm_args"] + extra)
    assert derive_offload((CONFIGURED,), PLAN, args, version) == (CONFIGURED,)


def test_a_reported_tier_is_kept_as_vllm_reported_it() -> None:
    reported = OffloadTier("cpu", capacity_tokens=1, capacity_blocks=2, capacity_bytes=3)
    args = parse_vllm_serve_args(SERVER["vllm_args"])
    assert derive_offload((reported,), PLAN, args, "0.32.0") == (reported,)
