"""The offload tier of every golden record, made by a release's own offloading code, reproduced.

`tests/fixtures/golden/offload/vllm-<release>-cuda.jsonl` are written by
`scripts/offload_golden.py` (not run here: it needs that release's vLLM); see the README there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.capacity import derive_capacity, settings_from_record
from exporter.capacity.offload import OffloadTierPlan, plan_engine_offload
from exporter.capacity.offload_settings import offload_settings
from exporter.errors import KvcapError
from tests.conftest import GOLDEN

OFFLOAD_FILES = sorted((GOLDEN / "offload").glob("vllm-*.jsonl"))


def _records(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


RECORDS = [(path.stem, record) for path in OFFLOAD_FILES for record in _records(path)]


def plan_record(record: dict[str, Any]) -> OffloadTierPlan:
    """kvcap's tier for a record's engine: the GPU plan, then the offload tier."""
    settings = record["settings"]
    engine = settings_from_record(settings, record)
    result = derive_capacity(
        record["hf_config"],
        engine,
        available_kv_bytes_per_worker=settings["available_kv_bytes_per_worker"],
    )
    tier = offload_settings(
        size_gib=settings.get("kv_offloading_size"),
        backend=None,
        transfer_config=settings.get("kv_transfer_config"),
    )
    assert tier is not None
    return plan_engine_offload(result.capacity, engine, tier)


def test_the_records_cover_what_the_issue_asks() -> None:
    """Two releases; a plain, sliding-window, Mamba and MLA model; TP 1 and 2; two sizes;
    chunks of one and several blocks."""
    assert {stem for stem, _ in RECORDS} >= {"vllm-0.27.0-cuda", "vllm-0.32.0-cuda"}
    ok = [r for _, r in RECORDS if "result" in r]
    assert {r["model"] for r in ok} >= {
        "llama",
        "gemma3",
        "granite-4.0-h",
        "deepseek-v2-mla128",
        "llama4",
    }
    assert {r["settings"]["tensor_parallel_size"] for r in ok} == {1, 2}
    assert len({r["settings"]["kv_offloading_size"] for r in ok}) >= 2
    assert {r["result"]["offload"]["blocks_per_chunk"] for r in ok} >= {1, 4}


@pytest.mark.parametrize(
    ("stem", "record"), RECORDS, ids=[f"{stem}:{record['id']}" for stem, record in RECORDS]
)
def test_kvcap_sizes_the_tier_as_the_release_did(stem: str, record: dict[str, Any]) -> None:
    if "error" in record:  # the release refused the engine: so does kvcap
        with pytest.raises(KvcapError):
            plan_record(record)
        return
    want = record["result"]["offload"]
    got = plan_record(record)
    assert got.worker_kv_bytes_per_block == want["worker_kv_bytes_per_block"]
    assert got.blocks_per_chunk == want["blocks_per_chunk"]
    assert got.copies == (1 if want["replicated_layout"] else want["world_size"])
    assert got.kv_bytes_per_chunk == want["kv_bytes_per_chunk"]
    assert got.num_chunks == want["num_chunks"]
    assert got.cpu_bytes == int(want["cpu_bytes_to_use"])
    assert [(g.tokens_per_block, g.window_chunks) for g in got.groups] == [
        (g["tokens_per_block"], g["window_chunks"]) for g in want["groups"]
    ]
