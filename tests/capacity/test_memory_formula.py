"""vLLM's memory formula as kvcap models it: each term moves with the settings it depends on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from exporter.capacity_cli.memory import (
    GPU_COMPUTE_CAPABILITY,
    GPU_MEMORY_MIB,
    GPU_USABLE_GIB,
    default_gpu_memory_utilization,
    parse_gpu_memory,
)
from exporter.capacity_cli.memory_formula import (
    GIB,
    ModelShape,
    Workload,
    capture_sizes,
    default_batch_limits,
    non_kv_terms,
)
from exporter.errors import UsageError

SHAPES = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "startup-log-shapes.json").read_text()
)
LLAMA_8B = ModelShape.from_config(SHAPES["meta-llama/Llama-3.1-8B-Instruct"])
QWEN3_235B = ModelShape.from_config(SHAPES["Qwen/Qwen3-235B-A22B-FP8"])
H100 = Workload(
    tensor_parallel=1,
    pipeline_parallel=1,
    max_num_batched_tokens=8192,
    max_num_seqs=1024,
    enforce_eager=False,
    release=(0, 33, 0),
)


def _terms(shape: ModelShape, work: Workload) -> dict[str, int]:
    return {term.name: term.bytes for term in non_kv_terms(shape, work)}


def test_every_gpu_reports_less_to_cuda_than_to_nvidia_smi() -> None:
    assert GPU_USABLE_GIB.keys() == GPU_MEMORY_MIB.keys()
    for name, usable in GPU_USABLE_GIB.items():
        nvidia_smi = GPU_MEMORY_MIB[name] / 1024
        assert 0.3 <= nvidia_smi - usable <= 0.9, name
    assert parse_gpu_memory("H100").total_bytes == int(79.18 * GIB)
    assert parse_gpu_memory("rtx-3090").name == "RTX 3090"
    assert parse_gpu_memory("80").total_bytes == 80 * GIB  # a size given is taken as is


def test_every_named_gpu_has_its_compute_capability() -> None:
    assert GPU_COMPUTE_CAPABILITY.keys() == GPU_MEMORY_MIB.keys()
    assert parse_gpu_memory("B200 180GB").compute_capability == (10, 0)
    assert parse_gpu_memory("80").compute_capability is None  # a size names no GPU


@pytest.mark.parametrize("text", ["", "-1", "nan", "1e9", "H100 " * 40, "A100"])
def test_a_gpu_that_is_neither_a_size_nor_known_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError):
        parse_gpu_memory(text)


def test_default_batch_limits_follow_the_gpu_as_vllm_serve_chooses_them() -> None:
    h100, a100, l4 = (parse_gpu_memory(name) for name in ("H100", "A100 80GB", "L4"))
    assert default_batch_limits(h100.total_bytes, h100.name) == (8192, 1024)
    assert default_batch_limits(a100.total_bytes, a100.name) == (2048, 256)  # PR #17885
    assert default_batch_limits(l4.total_bytes, l4.name) == (2048, 256)
    b200 = parse_gpu_memory("B200")
    assert default_batch_limits(b200.total_bytes, b200.name) == (16384, 1024)


def test_the_utilization_default_rose_with_cuda_graph_accounting() -> None:
    assert default_gpu_memory_utilization((0, 18, 1)) == 0.9
    assert default_gpu_memory_utilization((0, 23, 0)) == 0.92


def test_cuda_graphs_count_from_0_21_and_not_with_enforce_eager() -> None:
    assert "CUDA graphs" in _terms(LLAMA_8B, H100)
    eager = dataclasses.replace(H100, enforce_eager=True)
    assert "CUDA graphs" not in _terms(LLAMA_8B, eager)
    old = dataclasses.replace(H100, release=(0, 20, 0))
    assert "CUDA graphs" not in _terms(LLAMA_8B, old)
    # vLLM's capture sizes: 1, 2, 4, 8..256 by 8, 272..512 by 16.
    assert capture_sizes(1024, 8192) == 3 + 32 + 16
    assert capture_sizes(4, 8192) == 4  # up to 2 x max_num_seqs = 8
    fewer = dataclasses.replace(H100, max_num_seqs=8)
    assert _terms(LLAMA_8B, fewer)["CUDA graphs"] < _terms(LLAMA_8B, H100)["CUDA graphs"]


def test_the_activation_peak_follows_tokens_sequences_and_tp() -> None:
    peak = _terms(LLAMA_8B, H100)["activation peak"]
    # The sampler's dummy batch: --max-num-seqs x vocabulary logits, the larger here.
    assert _terms(LLAMA_8B, dataclasses.replace(H100, max_num_seqs=256))["activation peak"] < peak
    # A long prefill chunk makes the forward pass the larger.
    long = dataclasses.replace(H100, max_num_batched_tokens=131072)
    assert _terms(LLAMA_8B, long)["activation peak"] > 2 * peak
    tp4 = dataclasses.replace(H100, tensor_parallel=4, max_num_batched_tokens=131072)
    assert _terms(LLAMA_8B, tp4)["activation peak"] < _terms(LLAMA_8B, long)["activation peak"]
    # Fused MoE's workspaces grow with the experts each token is routed to.
    moe = _terms(QWEN3_235B, long)["activation peak"]
    assert moe > _terms(LLAMA_8B, long)["activation peak"]


def test_non_torch_memory_grows_when_workers_talk() -> None:
    one = _terms(LLAMA_8B, H100)["non-torch memory"]
    assert _terms(LLAMA_8B, dataclasses.replace(H100, tensor_parallel=2))["non-torch memory"] > one
    assert (
        _terms(LLAMA_8B, dataclasses.replace(H100, pipeline_parallel=2))["non-torch memory"] > one
    )


def test_every_term_has_a_range_around_its_value() -> None:
    for term in non_kv_terms(QWEN3_235B, dataclasses.replace(H100, tensor_parallel=4)):
        assert 0 <= term.low <= term.bytes <= term.high, term
        assert term.depends_on
