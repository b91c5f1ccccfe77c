"""Tiny model folders for live vLLM servers: a config.json each, random weights at load time.

Sizes are the smallest the CPU kernels take (hidden 128-256, 2-6 layers, vocab 512), so a
server starts in well under a minute; each keeps its family's KV layout (sliding-window
pattern, chunked layers, Mamba or linear-attention layers, latent attention). Prompts are
token ids below `VOCAB_SIZE` (the servers run without a tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VOCAB_SIZE = 512

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 4096,
}

_ATTENTION: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rope_theta": 10000.0,
}

TINY_MODELS: dict[str, dict[str, Any]] = {
    "llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 2,
        **_ATTENTION,
    },
    # Five sliding-window layers, then one full-attention layer (Gemma 3's 5:1 pattern).
    "gemma3": {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "num_hidden_layers": 6,
        **_ATTENTION,
        "head_dim": 64,
        "sliding_window": 256,
        "sliding_window_pattern": 6,
        "query_pre_attn_scalar": 64,
        "rope_local_base_freq": 10000.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
    },
}


def write_model(root: Path, name: str, **overrides: Any) -> Path:
    """A folder holding only `name`'s config.json (with `overrides`), as vLLM's --model."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    config = {**_COMMON, **TINY_MODELS[name], **overrides}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder
