"""Weights per worker of the hybrid families: Nemotron-H, Jamba and Granite 4.0-H, whose
layers mix Mamba mixers, attention, MLPs and experts."""

from __future__ import annotations

from exporter.capacity.hf_config import MAX_LAYERS, HfConfig
from exporter.capacity.weights_layers import (
    ATTENTION_SCALES,
    RankCounter,
    dense_mlp,
    moe_layer,
    plain_attention,
)
from exporter.capacity.weights_quantization import FP32, ExpertShape, Quantization
from exporter.errors import ConfigError


def _mamba2(
    c: RankCounter,
    prefix: str,
    *,
    heads: int,
    head_dim: int,
    groups: int,
    state: int,
    kernel: int,
    gated_norm: bool = True,
) -> int:
    """vLLM's MambaMixer2: with fewer groups than ranks, each rank gets a copy of one.
    Returns the input projection's width per rank."""
    hf = c.hf
    hidden = hf.positive_int("hidden_size")
    inner = heads * head_dim
    conv_bias = bool(hf.get("use_conv_bias", hf.get("mamba_conv_bias", True)))
    proj_bias = bool(hf.get("use_bias", hf.get("mamba_proj_bias", False)))
    if groups % c.tp:
        groups = c.tp  # one group (vLLM asserts it) repeated on every rank: one projection
        outs: tuple[int, ...] = (2 * inner + 2 * groups * state + heads,)
    else:  # a merged projection: gate, x, B, C, dt
        outs = (inner, inner, groups * state, groups * state, heads)
    conv = inner + 2 * groups * state
    c.column(f"{prefix}.in_proj", hidden, outs, bias=proj_bias)
    local_conv = c._split(conv, f"{prefix}.conv1d")
    c.raw(local_conv * kernel * c.dtype + (local_conv * c.dtype if conv_bias else 0))
    local_heads = c._split(heads, f"{prefix}: Mamba heads")
    c.raw(local_heads * (FP32 + 2 * c.dtype))  # A (float32), D, dt_bias
    if gated_norm:
        c.norm(inner // c.tp)  # the gated RMSNorm's weight
    c.row(f"{prefix}.out_proj", inner, hidden, bias=proj_bias)
    return sum(outs) // c.tp


def nemotron_h(c: RankCounter, index: int) -> None:
    hf = c.hf
    pattern = str(hf.get("hybrid_override_pattern", ""))
    if len(pattern) != hf.num_hidden_layers:
        raise ConfigError("config.json `hybrid_override_pattern` must have one letter per layer")
    kind = pattern[index]
    prefix = f"model.layers.{index}.mixer"
    hidden = hf.positive_int("hidden_size")
    if kind == "M":
        _mamba2(
            c,
            prefix,
            heads=hf.positive_int("mamba_num_heads"),
            head_dim=hf.positive_int("mamba_head_dim"),
            groups=hf.positive_int("n_groups"),
            state=hf.positive_int("ssm_state_size"),
            kernel=hf.positive_int("conv_kernel"),
        )
    elif kind == "*":
        plain_attention(c, prefix)
    elif kind == "-":
        inter = hf.positive_int("intermediate_size")
        bias = bool(hf.get("mlp_bias", False))
        c.column(f"{prefix}.up_proj", hidden, (inter,), bias=bias)
        c.row(f"{prefix}.down_proj", inter, hidden, bias=bias)
    else:
        raise ConfigError(f"hybrid_override_pattern letter {kind!r} is not modelled")
    c.norm(hidden)


def jamba(c: RankCounter, index: int) -> None:
    hf = c.hf
    hidden = hf.positive_int("hidden_size")
    prefix = f"model.layers.{index}"
    attn_period, attn_offset = (
        hf.positive_int("attn_layer_period", 8),
        hf.get_int("attn_layer_offset", 4),
    )
    if index % attn_period == attn_offset:
        plain_attention(c, f"{prefix}.self_attn", kv_scales=False)  # Jamba's takes none
    else:
        inner = hf.positive_int("mamba_expand", 2) * hidden
        state, rank = (
            hf.positive_int("mamba_d_state", 16),
            hf.positive_int("mamba_dt_rank", -(-hidden // 16)),
        )
        kernel = hf.positive_int("mamba_d_conv", 4)
        bias = bool(hf.get("mamba_proj_bias", False))
        quant, c.quant = c.quant, Quantization("none")  # Jamba's Mamba mixer is not quantized
        c.column(f"{prefix}.mamba.in_proj", hidden, (inner, inner), bias=bias)
        local = c._split(inner, f"{prefix}.mamba: inner size")
        c.raw(
            local * kernel * c.dtype + (local * c.dtype if hf.get("mamba_conv_bias", True) else 0)
        )
        c.row(f"{prefix}.mamba.x_proj", inner, rank + 2 * state)
        c.column(f"{prefix}.mamba.dt_proj", rank, (inner,), bias=True)
        c.raw(local * state * FP32 + local * c.dtype)  # A (float32), D
        c.row(f"{prefix}.mamba.out_proj", inner, hidden, bias=bias)
        c.norm(rank + 2 * state)  # dt, B and C layer norms
        c.quant = quant
    experts = hf.get_int("num_experts", 1)
    period, offset = hf.positive_int("expert_layer_period", 2), hf.get_int("expert_layer_offset", 1)
    inter = hf.positive_int("intermediate_size")
    if experts > 1 and index % period == offset:
        moe_layer(c, f"{prefix}.feed_forward", experts, inter)
    else:
        dense_mlp(c, f"{prefix}.feed_forward", inter)
    c.norm(hidden, 2)


def granite_hybrid(c: RankCounter, index: int) -> None:
    hf = c.hf
    hidden = hf.positive_int("hidden_size")
    prefix = f"model.layers.{index}"
    kinds = hf.str_list("layer_types") or []
    if len(kinds) != hf.num_hidden_layers:
        raise ConfigError("config.json `layer_types` must name every layer")
    if kinds[index] == "mamba":
        _mamba2(
            c,
            f"{prefix}.mamba",
            heads=hf.positive_int("mamba_n_heads"),
            head_dim=hf.positive_int("mamba_d_head"),
            groups=hf.positive_int("mamba_n_groups", 1),
            state=hf.positive_int("mamba_d_state"),
            kernel=hf.positive_int("mamba_d_conv", 4),
        )
    else:
        plain_attention(c, f"{prefix}.self_attn")
    experts = hf.get_int("num_local_experts", 0)
    if experts:
        moe_layer(c, f"{prefix}.block_sparse_moe", experts, hf.positive_int("intermediate_size"))
    shared = hf.get_int("shared_intermediate_size", 0)
    if shared:
        c.column(f"{prefix}.shared_mlp.input_linear", hidden, (shared, shared))
        c.row(f"{prefix}.shared_mlp.output_linear", shared, hidden)
    c.norm(hidden, 2)


def qwen3_next(c: RankCounter, index: int) -> None:
    """Qwen3-Next: gated DeltaNet layers with a full attention layer every
    `full_attention_interval`; every layer a MoE block with a gated shared expert."""
    hf = c.hf
    hidden = hf.positive_int("hidden_size")
    prefix = f"model.layers.{index}"
    if (index + 1) % hf.positive_int("full_attention_interval", 4) == 0:
        heads, head = hf.num_attention_heads, hf.head_size()
        kv = hf.total_num_kv_heads()
        # The query projection carries the output gate: twice the query heads.
        c.qkv(f"{prefix}.self_attn.qkv_proj", heads=2 * heads, kv_heads=kv, head=head, bias=False)
        c.row(f"{prefix}.self_attn.o_proj", heads * head, hidden)
        c.norm(head, 2)  # q_norm, k_norm
        c.raw(ATTENTION_SCALES + c.quant.attention_scale_bytes(c.dtype))
    else:
        k_heads, v_heads = (
            hf.positive_int("linear_num_key_heads"),
            hf.positive_int("linear_num_value_heads"),
        )
        k_dim = k_heads * hf.positive_int("linear_key_head_dim")
        v_head = hf.positive_int("linear_value_head_dim")
        v_dim = v_heads * v_head
        kernel = hf.positive_int("linear_conv_kernel_dim", 4)
        attn = f"{prefix}.linear_attn"
        c.raw(c._split(2 * k_dim + v_dim, f"{attn}.conv1d") * kernel * c.dtype)
        c.column(f"{attn}.in_proj_qkvz", hidden, (2 * k_dim + 2 * v_dim,))
        c.column(f"{attn}.in_proj_ba", hidden, (2 * v_heads,))
        local_heads = c._split(v_heads, f"{attn}: value heads")
        c.raw(local_heads * (c.dtype + FP32))  # dt_bias, A_log (float32)
        c.norm(v_head)  # the gated RMSNorm, one head wide
        c.row(f"{attn}.out_proj", v_dim, hidden)
    experts = hf.get_int("num_experts", 0)
    step = hf.positive_int("decoder_sparse_step", 1)
    if experts and index not in (hf.int_list("mlp_only_layers") or []) and (index + 1) % step == 0:
        inter = hf.positive_int("moe_intermediate_size")
        c.total += experts * hidden * c.dtype + hidden * c.dtype  # router, shared expert gate
        shared = hf.get_int("shared_expert_intermediate_size", 0)
        if shared:
            dense_mlp(c, f"{prefix}.mlp.shared_expert", shared)
        c.experts(f"{prefix}.mlp.experts", ExpertShape(experts, hidden, inter))
    else:
        dense_mlp(c, f"{prefix}.mlp", hf.positive_int("intermediate_size"))
    c.norm(hidden, 2)


def siglip_tower(c: RankCounter, vision: HfConfig, text_hidden: int) -> None:
    """Gemma 3's SigLIP vision tower and its projector into the language model."""
    width = vision.positive_int("hidden_size")
    inter = vision.positive_int("intermediate_size")
    patch = vision.positive_int("patch_size")
    patches = (vision.positive_int("image_size") // patch) ** 2
    channels = vision.positive_int("num_channels", 3)
    layers = vision.get_int("num_hidden_layers", minimum=1, maximum=MAX_LAYERS)
    c.raw((width * channels * patch * patch + width) * c.dtype)  # patch embedding + bias
    c.raw(patches * width * c.dtype)  # position embedding
    heads = vision.positive_int("num_attention_heads")
    for index in range(layers):
        prefix = f"vision_tower.vision_model.encoder.layers.{index}"
        c.qkv_of(
            f"{prefix}.self_attn.qkv_proj",
            width,
            heads=heads,
            kv_heads=heads,
            head=width // heads,
            bias=True,
        )
        c.row(f"{prefix}.self_attn.out_proj", width, width, bias=True)
        c.column(f"{prefix}.mlp.fc1", width, (inter,), bias=True)
        c.row(f"{prefix}.mlp.fc2", inter, width, bias=True)
        c.norm(width, 4)  # two LayerNorms, weight and bias
    c.norm(width, 2)  # post_layernorm
    c.raw((width * text_hidden + width) * c.dtype)  # projector weight, soft embedding norm


def falcon_h1(c: RankCounter, index: int) -> None:
    """Falcon-H1: every layer runs attention and a Mamba2 mixer side by side, then an MLP."""
    hf = c.hf
    hidden = hf.positive_int("hidden_size")
    prefix = f"model.layers.{index}"
    plain_attention(c, f"{prefix}.self_attn")
    heads, head_dim = hf.positive_int("mamba_n_heads"), hf.positive_int("mamba_d_head")
    width = _mamba2(
        c,
        f"{prefix}.mamba.mamba",
        heads=heads,
        head_dim=head_dim,
        groups=hf.positive_int("mamba_n_groups", 1),
        state=hf.positive_int("mamba_d_state"),
        kernel=hf.positive_int("mamba_d_conv", 4),
        gated_norm=bool(hf.get("mamba_rms_norm", False)),
    )
    c.raw(width * c.dtype)  # the muP multiplier vector over the input projection
    dense_mlp(c, f"{prefix}.feed_forward", hf.positive_int("intermediate_size"))
    c.norm(hidden, 2)
