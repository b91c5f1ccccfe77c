"""Families beyond the golden file, checked against the reference rules worked by hand.

Configs are under tests/fixtures/configs/ (public shapes of each model). Every expected
number is restated as arithmetic in a comment; `cd` is ceiling division.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from exporter.capacity import EngineSettings, derive_capacity
from exporter.errors import UnsupportedConfiguration
from tests.conftest import FIXTURES, load_golden_cases

GIB = 2**30
KV_40GIB = 40 * GIB


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "configs" / f"{name}.json").read_text())
    return data


def kinds(result: Any) -> list[tuple[str, int, int]]:
    return sorted((g.spec_type, g.num_layers, g.blocks_per_request) for g in result.capacity.groups)


def test_granite_4_h_small() -> None:
    # attention bytes/token: 8 heads x 256 x 2 B = 4,096. Mamba2 state: conv (3, 8192 + 2 x
    # 128) + ssm (128, 64, 128), bf16 = 2,147,840 B -> block 16 x cd(2,147,840, 65,536) = 528,
    # page 528 x 4,096 = 2,162,688. 4 attention vs 36 Mamba layers -> groups of 4: 1 + 9.
    result = derive_capacity(
        config("granite-4.0-h-small"), EngineSettings(), available_kv_bytes_per_worker=KV_40GIB
    )
    assert result.capacity.block_size == 528
    assert {g.page_size_bytes for g in result.capacity.groups} == {2162688}
    assert kinds(result) == [("FullAttentionSpec", 4, 249)] + [("MambaSpec", 4, 3)] * 9
    assert result.capacity.bytes_per_block_per_worker == (8650752,)
    assert result.capacity.num_gpu_blocks == 4964
    # blocks/request = cd(131,072, 528) + 9 x 3 = 276
    assert result.capacity.kv_cache_size_tokens == 2357396


def test_falcon_h1_every_layer_has_attention_and_mamba() -> None:
    # attention 2 x 256 x 2 = 1,024 B/token; Mamba2 conv (3, 3072 + 512) + ssm (24, 128, 256)
    # = 1,594,368 B -> block 16 x cd(1,594,368, 16,384) = 1,568; 24 + 24 layers -> 2 groups.
    result = derive_capacity(
        config("falcon-h1-1.5b-deep"), EngineSettings(), available_kv_bytes_per_worker=KV_40GIB
    )
    assert result.capacity.block_size == 1568
    assert kinds(result) == [("FullAttentionSpec", 24, 84), ("MambaSpec", 24, 3)]
    assert result.capacity.num_gpu_blocks == 1114
    assert result.capacity.kv_cache_size_tokens == 1678324


def test_falcon_h1_pipeline_stages_keep_both_layers_of_a_decoder_layer_together() -> None:
    result = derive_capacity(
        config("falcon-h1-1.5b-deep"),
        EngineSettings(pipeline_parallel_size=2, max_model_len=32768),
        available_kv_bytes_per_worker=KV_40GIB,
    )
    assert kinds(result)[0][1] == 12
    assert result.capacity.bytes_per_block_per_worker == (12 * 1605632, 12 * 1605632)


def test_zamba2_hybrid_layers_add_multi_head_attention() -> None:
    # 9 "hybrid" layers hold MHA KV: 32 heads x 2 x 160 x 2 B = 20,480 B/token. Mamba2 conv
    # (3, 5120 + 128) + ssm (80, 64, 64) = 686,848 B -> block 16 x cd(686,848, 327,680) = 48.
    # 54 Mamba + 9 attention layers -> groups of 9: 6 + 1; page 48 x 20,480 = 983,040.
    result = derive_capacity(
        config("zamba2-2.7b"), EngineSettings(), available_kv_bytes_per_worker=KV_40GIB
    )
    assert result.capacity.max_model_len == 4096
    assert result.capacity.block_size == 48
    assert kinds(result) == [("FullAttentionSpec", 9, 86)] + [("MambaSpec", 9, 3)] * 6
    assert result.capacity.num_gpu_blocks == 4854
    assert result.capacity.kv_cache_size_tokens == 191172


def test_zamba2_refuses_pipeline_parallelism() -> None:
    with pytest.raises(UnsupportedConfiguration, match="pipeline"):
        derive_capacity(
            config("zamba2-2.7b"),
            EngineSettings(pipeline_parallel_size=2),
            available_kv_bytes_per_worker=KV_40GIB,
        )


def test_cohere2_sliding_layers_see_one_token_more() -> None:
    # 24 sliding + 8 global layers -> 3 sliding groups of 8 + 1 global group.
    # commandr.py passes sliding_window + 1 = 4,097 to vLLM.
    result = derive_capacity(
        config("command-r7b"), EngineSettings(), available_kv_bytes_per_worker=KV_40GIB
    )
    assert {g.sliding_window for g in result.capacity.groups} == {4097, None}
    # sliding blocks = cd(min(4,096 + 16,384, 131,072), 16) + 1 = 1,281
    assert kinds(result) == [("FullAttentionSpec", 8, 8192)] + [("SlidingWindowSpec", 8, 1281)] * 3
    assert result.capacity.num_gpu_blocks == 81920
    assert result.capacity.kv_cache_size_tokens == 892182
    # The +1 shows when the window ends on a block edge: 4,097 + 16,384 = 20,481 tokens.
    odd = config("command-r7b") | {"sliding_window": 4097}
    result = derive_capacity(odd, EngineSettings(), available_kv_bytes_per_worker=KV_40GIB)
    assert {g.blocks_per_request for g in result.capacity.groups} == {8192, 1282}


def test_phi_4_mini_longrope_defaults_to_the_pretraining_length() -> None:
    # LongRoPE: vLLM serves original_max_position_embeddings (4,096) unless told otherwise;
    # every layer is sliding with a window longer than any request.
    result = derive_capacity(
        config("phi-4-mini"), EngineSettings(), available_kv_bytes_per_worker=KV_40GIB
    )
    assert result.capacity.max_model_len == 4096
    assert kinds(result) == [("SlidingWindowSpec", 32, 257)]
    assert result.capacity.kv_cache_size_tokens == 326404
    longest = derive_capacity(
        config("phi-4-mini"),
        EngineSettings(max_model_len=131072),
        available_kv_bytes_per_worker=KV_40GIB,
    )
    assert kinds(longest) == [("SlidingWindowSpec", 32, 8193)]
    assert longest.capacity.kv_cache_size_tokens == 327640


def test_phi3_legacy_su_rope_is_longrope() -> None:
    legacy = config("phi-4-mini")
    legacy["rope_scaling"]["type"] = "su"
    result = derive_capacity(legacy, EngineSettings(), available_kv_bytes_per_worker=KV_40GIB)
    assert result.capacity.max_model_len == 4096


def test_deepseek_v2_lite_mla() -> None:
    # 27 layers x 16 x 1,152 B = 497,664 B a block; yarn does not stretch 163,840.
    result = derive_capacity(
        config("deepseek-v2-lite"), EngineSettings(), available_kv_bytes_per_worker=KV_40GIB
    )
    assert result.capacity.max_model_len == 163840
    assert kinds(result) == [("MLAAttentionSpec", 27, 10240)]
    assert result.capacity.num_gpu_blocks == 86302
    assert result.capacity.kv_cache_size_tokens == 1380832


@pytest.mark.parametrize("tp", [1, 8])
def test_kimi_k2_is_deepseek_v3_mla(tp: int) -> None:
    result = derive_capacity(
        config("kimi-k2"),
        EngineSettings(tensor_parallel_size=tp),
        available_kv_bytes_per_worker=KV_40GIB,
    )
    assert result.capacity.bytes_per_block_per_worker[0] == 61 * 16 * 1152
    assert result.capacity.num_gpu_blocks == 38199
    assert result.capacity.kv_cache_size_tokens == 38199 * 16


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e5m2", "int8_per_token_head"])
def test_mla_without_a_hopper_backend_for_the_dtype_is_refused(kv_cache_dtype: str) -> None:
    with pytest.raises(UnsupportedConfiguration, match="MLA"):
        derive_capacity(
            config("kimi-k2"),
            EngineSettings(kv_cache_dtype=kv_cache_dtype),
            available_kv_bytes_per_worker=KV_40GIB,
        )


def _golden_config(model: str) -> dict[str, Any]:
    for case in load_golden_cases():
        if case["model"] == model:
            return copy.deepcopy(case["hf_config"])
    raise KeyError(model)


def test_qwen3_5_pins_its_ssm_dtype_but_qwen3_next_does_not() -> None:
    text = _golden_config("qwen3-next-80b-a3b")
    text["model_type"] = "qwen3_5_moe_text"
    text["mamba_ssm_dtype"] = "float32"
    qwen35 = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text,
    }
    next_config = _golden_config("qwen3-next-80b-a3b") | {"mamba_ssm_dtype": "float32"}
    settings = EngineSettings(tensor_parallel_size=2)
    pinned = derive_capacity(qwen35, settings, available_kv_bytes_per_worker=KV_40GIB)
    ignored = derive_capacity(next_config, settings, available_kv_bytes_per_worker=KV_40GIB)
    # Qwen3-Next keeps bf16 state: conv 24,576 + ssm 524,288 B -> block 576 (golden).
    assert ignored.capacity.block_size == 576
    # fp32 ssm: 24,576 + 1,048,576 B over 1,024 B/token, on a 64-token grid -> 1,088.
    assert pinned.capacity.block_size == 1088


def test_olmo3_and_exaone4_fill_in_their_layer_types() -> None:
    base = _golden_config("llama-3.1-8b")
    for architecture, model_type in [
        ("Olmo3ForCausalLM", "olmo3"),
        ("Exaone4ForCausalLM", "exaone4"),
    ]:
        model = base | {
            "architectures": [architecture],
            "model_type": model_type,
            "sliding_window": 4096,
        }
        result = derive_capacity(
            model, EngineSettings(max_model_len=32768), available_kv_bytes_per_worker=KV_40GIB
        )
        assert not result.capacity.approximate
        # 8 global layers (every 4th), 24 sliding layers in 3 groups of 8.
        assert [(s, n) for s, n, _ in kinds(result)] == [("FullAttentionSpec", 8)] + [
            ("SlidingWindowSpec", 8)
        ] * 3


def test_generic_rule_respects_use_sliding_window_false() -> None:
    model = _golden_config("qwen3-8b") | {
        "architectures": ["Qwen2_5_VLTextLikeForCausalLM"],
        "sliding_window": 32768,
    }
    result = derive_capacity(model, EngineSettings(), available_kv_bytes_per_worker=KV_40GIB)
    assert result.capacity.approximate
    assert kinds(result) == [("FullAttentionSpec", 36, 2560)]


def test_generic_rule_does_not_guess_unknown_latent_attention() -> None:
    model = _golden_config("deepseek-v3") | {
        "architectures": ["MiniCPM3ForCausalLM"],
        "model_type": "minicpm3",
    }
    with pytest.raises(Exception, match="latent attention"):
        derive_capacity(
            model, EngineSettings(tensor_parallel_size=8), available_kv_bytes_per_worker=KV_40GIB
        )
