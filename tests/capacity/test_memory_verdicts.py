"""`capacity --gpu-memory`: verdicts that say which step refuses, and never a negative cache."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from exporter.cli import main

SHAPES = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "startup-log-shapes.json").read_text()
)


def _model(folder: Path, name: str, *, bf16: bool = False) -> str:
    model = folder / name.replace("/", "--")
    model.mkdir(exist_ok=True)
    config = dict(SHAPES[name])
    if bf16:  # the same shapes as the unquantized checkpoint
        config.pop("quantization_config", None)
    (model / "config.json").write_text(json.dumps(config))
    return str(model)


def _capacity(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["capacity", *argv])
    return code, out.getvalue()


def _kv_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("KV cache:"))


@pytest.fixture
def llama_70b(tmp_path: Path) -> str:
    # Llama 70B in bf16: ~70.6 B parameters x 2 bytes.
    return _model(tmp_path, "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", bf16=True)


def test_weights_past_the_whole_gpu_run_out_of_memory_loading_them(llama_70b: str) -> None:
    code, text = _capacity(llama_70b, "--gpu-memory", "H100", "--max-model-len", "8192")
    assert code == 1
    verdict = next(line for line in text.splitlines() if line.startswith("verdict:"))
    assert "the weights alone" in verdict
    assert "per worker, exceed the GPU" in verdict
    assert "torch.OutOfMemoryError" in verdict
    # vLLM never reaches its KV cache check, so its advice is not quoted.
    assert "vLLM's message" not in text
    assert "gpu_memory_utilization`" not in text
    assert re.search(r"smallest that fits: TP [248] x PP 1: weights [\d.]+ GiB per worker", verdict)
    assert "-" not in _kv_line(text).split("**")[0].replace("KV cache:", "")


def test_weights_within_the_gpu_but_past_the_budget_quote_vllms_message(llama_70b: str) -> None:
    code, text = _capacity(
        llama_70b, "--gpu-memory", "H100", "-tp", "2", "--gpu-memory-utilization", "0.5"
    )
    assert code == 1
    assert "verdict: does not fit: the weights (65.7" in text
    assert "vLLM's message: No available memory for the cache blocks" in text
    assert _kv_line(text).startswith("KV cache:       none per worker: the weights and the")
    assert not re.search(r"-\d", _kv_line(text))


def test_a_cache_near_nothing_is_borderline_with_its_margin(tmp_path: Path) -> None:
    llama = _model(tmp_path, "meta-llama/Llama-3.1-8B-Instruct")
    code, text = _capacity(
        llama, "--gpu-memory", "L4", "--gpu-memory-utilization", "0.78",
        "--max-model-len", "1024",
    )  # fmt: skip
    assert code == 0
    assert re.search(r"verdict: borderline: .*range .* to [\d.]+ GiB", text)


def test_a_request_longer_than_the_cache_is_vllms_start_up_check(tmp_path: Path) -> None:
    # 041: Llama 3.1 8B on a 24 GB A10 at its 131,072-token default: vLLM refused.
    llama = _model(tmp_path, "meta-llama/Llama-3.1-8B-Instruct")
    code, text = _capacity(llama, "--gpu-memory", "A10", "--max-model-len", "131072")
    assert code == 1
    assert (
        "verdict: vLLM would refuse to start: one request of 131072 tokens needs 16.00 GiB" in text
    )
    assert "vLLM's message: To serve at least one request" in text


def test_json_carries_every_term_the_range_and_the_verdict(tmp_path: Path) -> None:
    llama = _model(tmp_path, "meta-llama/Llama-3.1-8B-Instruct")
    code, text = _capacity("--json", llama, "--gpu-memory", "H100", "--max-model-len", "8192")
    assert code == 0
    document: dict[str, Any] = json.loads(text)
    estimate = document["used"]["kv_cache_memory"]["estimate"]
    names = [term["name"] for term in estimate["terms"]]
    assert names == ["activation peak", "non-torch memory", "CUDA graphs"]
    low, high = estimate["kv_cache_range_bytes"]
    central = document["used"]["kv_cache_memory"]["bytes_per_worker"]
    assert low < central < high == estimate["kv_cache_range_bytes"][1]
    assert central == (
        estimate["budget_bytes"] - estimate["weights_bytes_per_worker"] - estimate["margin_bytes"]
    )
    assert document["verdict"]["kind"] == "fits"
    assert document["verdict"]["vllm_message_applies"] is False


def test_a_sweep_never_shows_a_negative_cache_and_says_why_a_row_fails(llama_70b: str) -> None:
    _, text = _capacity(llama_70b, "--gpu-memory", "H100", "--sweep", "tp=1,4")
    rows = text.splitlines()[-2:]
    assert rows[0].split()[:3] == ["1", "none", "(est.)"]
    assert rows[0].endswith("does not fit (the weights exceed the GPU)")
    assert rows[1].split()[0] == "4"
    assert rows[1].endswith("fits")
