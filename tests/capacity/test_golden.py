"""Every record of vLLM 0.33's own capacity computation is reproduced exactly."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from typing import Any

import pytest

from exporter.capacity import run_case
from tests.conftest import GOLDEN_CASES, load_golden_cases
from tests.support import cli_command

CASES = load_golden_cases()
GROUP_KEY = ("spec_type", "num_layers", "block_size", "page_size_bytes")


def group_multiset(groups: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(group[key] for key in GROUP_KEY) for group in groups)


def assert_matches(expected: dict[str, Any], actual: dict[str, Any]) -> None:
    if "error" in expected:
        assert "error" in actual, f"vLLM refused this case but kvcap gave {actual.get('result')}"
        assert actual["error"]["type"] == expected["error"]["type"]
        assert actual["error"]["message"] == expected["error"]["message"]
        return
    assert "result" in actual, actual.get("error")
    want, got = expected["result"], actual["result"]
    for key in ("num_gpu_blocks", "block_size", "kv_cache_size_tokens", "max_model_len"):
        assert got[key] == want[key], key
    assert got["max_concurrency"] == pytest.approx(want["max_concurrency"], rel=1e-12)
    assert group_multiset(got["groups"]) == group_multiset(want["groups"])
    assert got["bytes_per_block_per_worker"] == want["bytes_per_block_per_worker"]
    assert got["log_lines"] == want["log_lines"]
    per_request = Counter(
        (g["spec_type"], g["max_memory_usage_bytes_per_request"]) for g in got["groups"]
    )
    assert per_request == Counter(
        (g["spec_type"], g["max_memory_usage_bytes_per_request"]) for g in want["groups"]
    )


def test_golden_file_is_complete() -> None:
    assert len(CASES) == 225
    assert sum("error" in case for case in CASES) == 22


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_golden_case(case: dict[str, Any]) -> None:
    record = {key: case[key] for key in ("id", "hf_config", "settings")}
    assert_matches(case, run_case(record))


@pytest.mark.process
def test_batch_command_reproduces_the_whole_file() -> None:
    """The CLI batch mode: one line per record, in input order, all matching."""
    completed = subprocess.run(
        cli_command("capacity", "--cases", str(GOLDEN_CASES)),
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [json.loads(line) for line in completed.stdout.splitlines()]
    assert [line["id"] for line in lines] == [case["id"] for case in CASES]
    for case, line in zip(CASES, lines, strict=True):
        assert_matches(case, line)
