"""kvcap's estimate judged on published vLLM start-ups (tests/fixtures/startup-logs).

Accuracy: the KV memory within 10 % of vLLM's logged "Available KV cache memory" on at
least 80 % of the start-ups that logged a positive figure; verdicts: no "does not fit"
where vLLM started, no "fits" where it refused. Run with `-s` to see the tables.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from exporter.capacity_cli.memory import GIB
from tests.capacity.startup_logs import (
    StartUp,
    capacity_run,
    judge,
    rows,
    start_ups,
)

# The bar: within 10 % on at least 80 % of the start-ups.
REQUIRED_SHARE = 0.8


def _accuracy(judged: list[tuple[StartUp, bool]]) -> tuple[int, int]:
    counted = [close for case, close in judged if case.started and case.logged_kv_gib > 0]
    return sum(counted), len(counted)


def test_the_set_covers_gpus_releases_and_quantized_models() -> None:
    cases = start_ups()
    assert len(rows()) >= 40
    assert len(cases) >= 15
    assert {"H100 80GB", "A100 80GB", "A100 40GB", "L4", "L40S"} <= {case.gpu for case in cases}
    assert any(case.tensor_parallel > 1 for case in cases)
    assert any(case.pipeline_parallel > 1 for case in cases)
    assert any(not case.started for case in cases)
    assert any("kv_lora_rank" in case.config for case in cases)  # MLA
    assert {"mxfp4", "awq"} <= {case.quantization for case in cases}


def test_the_formula_with_the_logs_own_weights(tmp_path: Path) -> None:
    """The non-weight terms alone: each log's "Model loading took" is the weights."""
    cases = [case for case in start_ups() if case.logged_weights_gib is not None]
    judged = [judge(case, tmp_path, logged_weights=True) for case in cases]
    print("\nkvcap with each log's own weights (GiB per worker):")
    for one in judged:
        print(one.row())
    within, counted = _accuracy([(one.case, one.close) for one in judged])
    print(f"within 10 % of vLLM's KV memory: {within} of {counted}")
    assert counted >= 12
    assert within >= REQUIRED_SHARE * counted
    assert [one.row() for one in judged if one.contradicts] == []


def test_the_whole_estimate_with_kvcaps_weights(tmp_path: Path) -> None:
    """kvcap's own weights: exact for bf16 checkpoints; quantized ones printed, not judged
    here (their weights come from the quantization config: docs/capacity.md)."""
    judged = [judge(case, tmp_path, logged_weights=False) for case in start_ups()]
    print("\nkvcap with its own weights (GiB per worker):")
    for one in judged:
        print(one.row())
    plain = [one for one in judged if one.case.quantization is None]
    within, counted = _accuracy([(one.case, one.close) for one in plain])
    everything = _accuracy([(one.case, one.close) for one in judged])
    print(
        f"within 10 %: {within} of {counted} bf16 start-ups; {everything[0]} of {everything[1]} all"
    )
    assert counted >= 8
    assert within >= REQUIRED_SHARE * counted
    assert [one.row() for one in plain if one.contradicts] == []


def test_the_estimate_moves_with_utilization_as_vllm_did(tmp_path: Path) -> None:
    """016/017 and 018/019: the same deployment at 0.25 and 0.5; vLLM's KV memory moved by
    0.25 x the GPU's total and so does kvcap's, the other terms unchanged."""
    by_file = {case.file[:3]: case for case in start_ups()}
    for low, high in (("016", "017"), ("018", "019")):
        quarter, half = by_file[low], by_file[high]
        moved = [judge(case, tmp_path, logged_weights=True).kv_gib for case in (quarter, half)]
        assert moved[1] - moved[0] == pytest.approx(
            half.logged_kv_gib - quarter.logged_kv_gib, abs=0.05
        )


def test_given_the_logged_kv_memory_tokens_equal_the_log(tmp_path: Path) -> None:
    """With vLLM's own "Available KV cache memory" instead of the GPU, kvcap's tokens
    match the logged "GPU KV cache size" within the rounding of the GiB figure."""
    checked = []
    for case in start_ups():
        row = next(row for row in rows() if row["file"] == case.file)
        tokens = row["logged"].get("kv_cache_tokens")
        # Pipeline stages hold different layers and log different memory (036: 12.13 and
        # 11.33 GiB); the log names one, so one figure for every worker cannot match.
        if not tokens or case.pipeline_parallel > 1:
            continue
        bounds = []
        for edge in (-0.005, 0.005):
            kv = int((case.logged_kv_gib + edge) * GIB)
            document = _run_with_kv(case, tmp_path, kv, row.get("max_model_len"))
            bounds.append(_logged_tokens(document["result"]["log_lines"]))
        assert bounds[0] <= tokens <= bounds[1], (case.file, bounds, tokens)
        checked.append(case.file)
    assert len(checked) >= 5, checked


def _logged_tokens(lines: list[str]) -> int:
    """The figure of the release's own "GPU KV cache size: N tokens" line."""
    match = re.search(r"KV cache size: ([\d,]+) tokens", " ".join(lines))
    assert match, lines
    return int(match[1].replace(",", ""))


def _run_with_kv(case: StartUp, folder: Path, kv: int, max_model_len: int | None) -> dict[str, Any]:
    extra = ["--max-model-len", str(max_model_len)] if max_model_len else []
    flags = [*case.flags, *extra, "--kv-cache-memory-bytes", str(kv)]
    document = capacity_run(dataclasses.replace(case, flags=flags), folder)
    assert document["result"] is not None, json.dumps(document["error"])
    return document
