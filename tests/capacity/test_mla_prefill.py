"""CUDA's MLA prefill backend choice (0.24 on): which head dims and dtypes a GPU refuses.

The records of the tiny DeepSeek-V2 (`vllm-0.2[6-9]*-cuda.jsonl` and later) pin the refusal
on the stand-in H100 word for word; these are the branches the records do not hold: other
GPUs of the `capacity` command's list, other dims, dtypes, releases.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from exporter.capacity import EngineSettings, derive_capacity, release_rules
from exporter.capacity.mla_prefill import selector_refusal
from exporter.capacity_cli.memory import GPU_COMPUTE_CAPABILITY
from exporter.errors import UnsupportedConfiguration
from tests.conftest import GOLDEN
from tests.support.release_records import release_record, release_records

GIB = 2**30
TINY_ID = "deepseek-v2|mml-4096|mnbt-default|mem-1GiB"
# Each release's own MLA prefill selector on stand-in GPUs of several compute capabilities
# (scripts/mla_prefill_golden.py; the releases README says how it was run).
SELECTOR_RECORDS = release_records(GOLDEN / "releases" / "selectors" / "mla-prefill.jsonl")


def _tiny_record(version: str) -> dict[str, Any]:
    return release_record(f"vllm-{version}-cuda.jsonl", TINY_ID)


def _dsv2(nope: int, rope: int, v: int) -> dict[str, Any]:
    config: dict[str, Any] = copy.deepcopy(_tiny_record("0.32.0")["hf_config"])
    config.update(qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v)
    return config


def _plan(config: dict[str, Any], version: str, **settings: Any) -> None:
    derive_capacity(
        config,
        EngineSettings(max_model_len=4096, vllm_version=version, **settings),
        available_kv_bytes_per_worker=GIB,
    )


def _refusal_any(config: dict[str, Any], version: str, **settings: Any) -> str:
    with pytest.raises(UnsupportedConfiguration) as caught:
        _plan(config, version, **settings)
    return str(caught.value)


def _refusal(config: dict[str, Any], version: str, **settings: Any) -> str:
    with pytest.raises(UnsupportedConfiguration) as caught:
        _plan(config, version, **settings)
    assert caught.value.vllm_error_type == "ValueError"
    return str(caught.value)


@pytest.mark.parametrize("gpu", sorted(GPU_COMPUTE_CAPABILITY))
def test_every_gpu_of_the_list_refuses_the_tiny_dims_blackwell_naming_four_backends(
    gpu: str,
) -> None:
    capability = GPU_COMPUTE_CAPABILITY[gpu]
    message = _refusal(_dsv2(32, 64, 32), "0.32.0", cuda_compute_capability=capability)
    h100 = _tiny_record("0.32.0")["error"]["message"]
    if capability[0] == 10:  # TRT-LLM ragged, FlashInfer, tokenspeed after FlashAttention
        assert message != h100
        assert message.startswith(h100.removesuffix("]}."))
        assert ", TRTLLM_RAGGED: [" in message
        assert "FLASHINFER: [Model does not have supported MLA dimensions (got " in message
        assert "TOKENSPEED_MLA: [tokenspeed_mla package is not installed." in message
    else:  # FlashAttention alone, as on the H100 that recorded it
        assert message == h100


@pytest.mark.parametrize("version", ["0.26.0", "0.29.0", "0.32.0"])
@pytest.mark.parametrize("capability", [(9, 0), (10, 0), (8, 0)])
def test_real_mla_dims_plan_on_every_gpu(version: str, capability: tuple[int, int]) -> None:
    # DeepSeek-V2/V3 and Kimi (128/64/128), GLM-5 (192/64/256), Mistral Small 4 (64/64/128).
    for dims in ((128, 64, 128), (192, 64, 256), (64, 64, 128)):
        _plan(_dsv2(*dims), version, cuda_compute_capability=capability)


def test_the_nope_dims_of_glm_5_3_flash_are_taken_from_0_30() -> None:
    config = _dsv2(256, 0, 256)
    assert "(got (qk_nope_head_dim=256, qk_rope_head_dim=0, v_head_dim=256))" in _refusal(
        config, "0.29.0"
    )
    _plan(config, "0.30.0")


def test_before_0_26_flashattention_pads_v_and_takes_any_dims() -> None:
    _plan(_dsv2(32, 64, 32), "0.25.1")


def test_sparse_mla_runs_without_a_prefill_backend_from_0_26() -> None:
    # DeepSeek-V3.2-style layers (an indexer, `index_topk`) use the top-k MQA path instead.
    sparse = {**_dsv2(32, 64, 32), "index_topk": 2048}
    _plan(sparse, "0.26.0")
    assert "(qk_nope_head_dim=32" in _refusal(_dsv2(32, 64, 32), "0.26.0")


def test_a_dim_the_config_does_not_give_is_not_guessed() -> None:
    config = _dsv2(32, 64, 32)
    del config["v_head_dim"]  # the config class's default decides: not read by kvcap
    _plan(config, "0.32.0")


@pytest.mark.parametrize("dims", [(128, 64, 128), (32, 64, 32)])
def test_a_float32_model_meets_the_attention_backends_refusal_first(
    dims: tuple[int, int, int],
) -> None:
    # No MLA prefill backend takes float32, but the layer picks its attention backend
    # before its prefill backend, and no MLA attention backend takes a float32 cache.
    message = _refusal_any(_dsv2(*dims), "0.32.0", dtype="float32")
    assert "float32" in message
    assert "MLA prefill" not in message


def test_vllm_cpu_chooses_its_own_prefill() -> None:
    _plan(_dsv2(32, 64, 32), "0.32.0", platform="cpu")


@pytest.mark.parametrize(
    "record",
    SELECTOR_RECORDS,
    ids=[
        f"{r['vllm_version']}-cc{'.'.join(map(str, r['compute_capability']))}-{r['dtype']}-"
        + "-".join(map(str, r["mla_dimensions"]))
        for r in SELECTOR_RECORDS
    ],
)
def test_each_release_selector_record_is_reproduced(record: dict[str, Any]) -> None:
    """The release picked a backend: kvcap's selector finds one; it raised: kvcap's has the
    release's words."""
    version = release_rules(record["vllm_version"]).rules
    capability = (record["compute_capability"][0], record["compute_capability"][1])
    nope, rope, v = record["mla_dimensions"]
    got = selector_refusal(record["dtype"], (nope, rope, v), capability, version)
    assert got == (record["error"]["message"] if "error" in record else None)


def test_the_selector_records_hold_both_outcomes_on_both_kinds_of_gpu() -> None:
    outcomes = {("error" in r, r["compute_capability"][0] == 10) for r in SELECTOR_RECORDS}
    assert outcomes == {(True, True), (True, False), (False, True), (False, False)}
