"""`kvcap-exporter capacity --gpu-memory GPU` refuses an MLA model as that GPU's vLLM does."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support import cli_command
from tests.support.release_records import release_record

TINY_ID = "deepseek-v2|mml-4096|mnbt-default|mem-1GiB"


def _recorded(version: str) -> dict[str, object]:
    return release_record(f"vllm-{version}-cuda.jsonl", TINY_ID)


@pytest.fixture
def tiny_deepseek(tmp_path: Path) -> str:
    """The tiny DeepSeek-V2 of the CUDA records (32/64/32 head dims) as a model folder."""
    (tmp_path / "config.json").write_text(json.dumps(_recorded("0.32.0")["hf_config"]))
    return str(tmp_path)


def _capacity(model: str, gpu: str, version: str) -> subprocess.CompletedProcess[str]:
    serve = ("vllm", "serve", model, "--max-model-len", "4096")
    return subprocess.run(
        cli_command("capacity", "--gpu-memory", gpu, "--vllm-version", version, "--", *serve),
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.process
@pytest.mark.parametrize("gpu", ["H100", "A100 80GB", "L40S"])
def test_off_blackwell_the_refusal_is_the_recorded_h100s(tiny_deepseek: str, gpu: str) -> None:
    run = _capacity(tiny_deepseek, gpu, "0.32.0")
    assert run.returncode == 1
    error = _recorded("0.32.0")["error"]
    assert isinstance(error, dict)
    assert run.stderr == f"kvcap-exporter: error: {error['message']}\n"
    assert run.stdout == ""


@pytest.mark.process
def test_a_b200_names_every_blackwell_prefill_backend(tiny_deepseek: str) -> None:
    run = _capacity(tiny_deepseek, "B200", "0.26.0")
    assert run.returncode == 1
    reasons = run.stderr.split("Reasons: {", 1)[1]
    names = [part.split(": [", 1)[0] for part in reasons.split("], ")]
    assert names == ["FLASH_ATTN", "TRTLLM_RAGGED", "FLASHINFER", "TOKENSPEED_MLA"]
    assert "supported: (qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)" in reasons


@pytest.mark.process
def test_the_release_before_plans_it(tiny_deepseek: str) -> None:
    run = _capacity(tiny_deepseek, "H100", "0.25.1")
    assert run.returncode == 0, run.stderr
    assert "MLA prefill" not in run.stdout + run.stderr
