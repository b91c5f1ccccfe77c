"""The worked examples of the vLLM capacity reference, beyond the golden settings.

Each expected figure is the reference's own arithmetic (shared/reference/vllm-kv-capacity.md,
section 5), restated in the comments.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from exporter.capacity import EngineSettings, derive_capacity
from tests.conftest import load_golden_cases

CONFIGS: dict[str, dict[str, Any]] = {}
for _case in load_golden_cases():
    CONFIGS.setdefault(_case["model"], _case["hf_config"])
GIB = 2**30


def test_llama_dense_examples() -> None:
    # page = 16 tokens x 8 heads x (128 + 128) x 2 B = 65,536; 32 layers -> 2 MiB a block.
    config = CONFIGS["llama-3.1-8b"]
    for length, tokens, concurrency in [
        (8192, 491520, 60.0),
        (131072, 491520, 3.75),
        (10000, 491520, 49.152),
    ]:
        result = derive_capacity(
            config, EngineSettings(max_model_len=length), available_kv_bytes_per_worker=60 * GIB
        )
        assert result.capacity.num_gpu_blocks == 30720
        assert result.capacity.kv_cache_size_tokens == tokens
        assert result.capacity.kv_cache_max_concurrency == pytest.approx(concurrency)


def test_gpt_oss_120b_two_groups_of_18() -> None:
    # 36 layers, even ones slide over 128 tokens: groups of 18, page 32,768, 589,824 B a
    # block; 40 GiB -> 72,817 blocks; a request needs cdiv(127 + 16,384, 16) + 1 = 1,033
    # sliding blocks plus 8,192 full blocks.
    config = copy.deepcopy(CONFIGS["gpt-oss-20b"])
    config["num_hidden_layers"] = 36
    config["num_local_experts"] = 128
    config["layer_types"] = [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(36)
    ]
    result = derive_capacity(config, EngineSettings(), available_kv_bytes_per_worker=40 * GIB)
    assert [(g.spec_type, g.num_layers, g.blocks_per_request) for g in result.capacity.groups] == [
        ("SlidingWindowSpec", 18, 1033),
        ("FullAttentionSpec", 18, 8192),
    ]
    assert result.capacity.bytes_per_block_per_worker[0] == 589824
    assert result.capacity.num_gpu_blocks == 72817
    assert result.capacity.kv_cache_size_tokens == 1034609


@pytest.mark.parametrize(
    ("kv_cache_dtype", "block_size", "blocks", "tokens", "chosen_block"),
    [
        # bf16 latent, FlashAttention-MLA: 16 x 1,152 B pages, 61 layers on every rank.
        ("auto", None, 47749, 763984, 16),
        # fp8 latent: FlashMLA only takes 64-token blocks.
        ("fp8", None, 23874, 1527936, 64),
        # fp8 with --block-size 16 keeps 16 (Triton MLA).
        ("fp8", 16, 95498, 1527968, 16),
    ],
)
@pytest.mark.parametrize("tp", [4, 8])
def test_deepseek_v3_latent_is_not_split_by_tensor_parallelism(
    kv_cache_dtype: str,
    block_size: int | None,
    blocks: int,
    tokens: int,
    chosen_block: int,
    tp: int,
) -> None:
    result = derive_capacity(
        CONFIGS["deepseek-v3"],
        EngineSettings(
            tensor_parallel_size=tp, kv_cache_dtype=kv_cache_dtype, block_size=block_size
        ),
        available_kv_bytes_per_worker=50 * GIB,
    )
    assert (result.capacity.num_gpu_blocks, result.capacity.kv_cache_size_tokens) == (
        blocks,
        tokens,
    )
    assert result.capacity.block_size == chosen_block


def test_deepseek_v3_pipeline_stages_split_61_layers_31_30() -> None:
    result = derive_capacity(
        CONFIGS["deepseek-v3"],
        EngineSettings(tensor_parallel_size=8, pipeline_parallel_size=2),
        available_kv_bytes_per_worker=50 * GIB,
    )
    per_layer = 16 * 576 * 2
    assert (
        result.capacity.bytes_per_block_per_worker == (31 * per_layer,) * 8 + (30 * per_layer,) * 8
    )
    # The fuller stage decides the block count.
    assert result.capacity.num_gpu_blocks == 50 * GIB // (31 * per_layer)
    assert result.capacity.groups[0].num_layers == 31


@pytest.mark.parametrize(
    ("prefix_caching", "block", "blocks", "tokens"),
    [
        # align mode, FlashInfer GDN on Hopper: 64-token checkpoints, 3 state blocks each.
        (True, 320, 10922, 3453723),
        # prefix caching off: plain 16-token alignment, 1 state block per request.
        (False, 272, 12850, 3483506),
    ],
)
def test_qwen3_next_tp4(prefix_caching: bool, block: int, blocks: int, tokens: int) -> None:
    result = derive_capacity(
        CONFIGS["qwen3-next-80b-a3b"],
        EngineSettings(tensor_parallel_size=4, enable_prefix_caching=prefix_caching),
        available_kv_bytes_per_worker=40 * GIB,
    )
    assert (
        result.capacity.block_size,
        result.capacity.num_gpu_blocks,
        result.capacity.kv_cache_size_tokens,
    ) == (
        block,
        blocks,
        tokens,
    )


def test_gemma3_27b_example() -> None:
    # 10 full + 52 sliding layers -> group size 10: 1 full group + 6 sliding groups.
    result = derive_capacity(
        CONFIGS["gemma-3-27b-text"], EngineSettings(), available_kv_bytes_per_worker=40 * GIB
    )
    assert sorted(g.num_layers for g in result.capacity.groups) == [8, 8, 9, 9, 9, 9, 10]
    assert result.blocks_per_request == 8192 + 6 * 1089
    assert result.capacity.num_gpu_blocks == 32768
    assert result.capacity.kv_cache_size_tokens == 291658
