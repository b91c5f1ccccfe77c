"""Engine reports built from the golden deployments, for state and exposition tests."""

from __future__ import annotations

import json
from typing import Any

from exporter.capacity import EngineCapacity, EngineSettings, derive_capacity
from exporter.state import EngineReport, KvUsage
from tests.conftest import GOLDEN

HANDSHAKE = GOLDEN / "handshake"


def deployment(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((HANDSHAKE / f"{name}.json").read_text())
    return data


def reports(
    name: str = "gemma-3-27b-text-dp2-tp2", *, instance_id: str = "1"
) -> list[EngineReport]:
    """One report per engine of a golden deployment: vLLM's numbers plus kvcap's derivation."""
    found = deployment(name)
    config = json.loads((HANDSHAKE / found["model_config_dir"] / "config.json").read_text())
    s = found["settings"]
    settings = EngineSettings(
        tensor_parallel_size=s["tensor_parallel_size"], max_model_len=s["max_model_len"]
    )
    result = []
    for engine in found["engines"]:
        derived = derive_capacity(config, settings, num_gpu_blocks=engine["num_gpu_blocks"])
        result.append(
            EngineReport(
                engine=str(engine["engine"]),
                model_name=found["served_model_name"],
                instance_id=instance_id,
                vllm_version="0.33.0",
                reported=EngineCapacity(
                    num_gpu_blocks=engine["num_gpu_blocks"],
                    block_size=engine["block_size"],
                    kv_cache_size_tokens=engine["kv_cache_size_tokens"],
                    kv_cache_max_concurrency=engine["max_concurrency"],
                    max_model_len=engine["max_model_len"],
                ),
                derived=derived.capacity,
                usage=KvUsage(
                    engine["kv_cache_usage"],
                    engine["num_requests_running"],
                    engine["num_requests_waiting"],
                ),
            )
        )
    return result
