"""Attention-only families: dense, sliding-window, chunked-local and latent (MLA) attention."""

from __future__ import annotations

from exporter.capacity.families.layout import AttentionLayer, BuildContext, ModelLayout
from exporter.capacity.families.registry import register
from exporter.capacity.hf_config import HfConfig
from exporter.errors import ConfigError, UnsupportedArchitecture, UnsupportedConfiguration

SLIDING = "sliding_attention"
FULL = "full_attention"


def kv_heads_per_rank(total_kv_heads: int, tp: int) -> int:
    """KV heads on one TP rank; vLLM replicates heads when there are fewer than ranks."""
    if total_kv_heads >= tp:
        if total_kv_heads % tp:
            raise UnsupportedConfiguration(
                f"the number of KV heads ({total_kv_heads}) is not divisible by the tensor "
                f"parallel size ({tp})"
            )
        return total_kv_heads // tp
    if tp % total_kv_heads:
        raise UnsupportedConfiguration(
            f"the tensor parallel size ({tp}) is not a multiple of the number of KV heads "
            f"({total_kv_heads})"
        )
    return 1


def config_head_dim(hf: HfConfig) -> int:
    """`head_dim` when the config has it, else hidden_size // num_attention_heads."""
    if hf.has("head_dim"):
        return hf.positive_int("head_dim")
    return hf.hidden_size_per_attention_head()


def sliding_window(hf: HfConfig) -> int | None:
    """The config's window; vLLM treats 0 as no window."""
    window = hf.optional_int("sliding_window")
    return window or None


def layer_types(hf: HfConfig, default: list[str]) -> list[str]:
    """`layer_types` from the config, else the pattern its transformers config class fills in."""
    types = hf.str_list("layer_types")
    if types is None:
        return default
    if len(types) != hf.num_hidden_layers:
        raise ConfigError(
            f"config.json `layer_types` has {len(types)} entries for {hf.num_hidden_layers} layers"
        )
    # transformers renames legacy names before any model code sees them.
    renamed = {"attention": FULL, "mamba": "linear_attention"}
    return [renamed.get(t, t) for t in types]


def pattern_layer_types(num_layers: int, pattern: int) -> list[str]:
    """Gemma 3 / Cohere 2 default: every `pattern`-th layer is global, the others slide."""
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers)]


def attention_layers(
    hf: HfConfig,
    ctx: BuildContext,
    windows: list[int | None],
    *,
    head_size: int | None = None,
    total_kv_heads: int | None = None,
) -> tuple[AttentionLayer, ...]:
    kv = kv_heads_per_rank(total_kv_heads or hf.total_num_kv_heads(), ctx.tp)
    size = head_size or config_head_dim(hf)
    return tuple(
        AttentionLayer(
            name=f"model.layers.{i}.self_attn.attn",
            decoder_index=i,
            num_kv_heads=kv,
            head_size=size,
            sliding_window=window,
        )
        for i, window in enumerate(windows)
    )


def llama_windows(hf: HfConfig) -> list[int | None]:
    """Llama-style models: a per-layer window from `layer_types`, or one for every layer.

    Without `layer_types`, vLLM puts the config's `sliding_window` into the cache config
    and every layer slides (Mistral-7B-v0.1, Phi-3-mini-4k).
    """
    n = hf.num_hidden_layers
    window = sliding_window(hf)
    if window is None:
        return [None] * n
    if hf.str_list("layer_types") is None:
        return [window] * n
    return [window if t == SLIDING else None for t in layer_types(hf, [])]


@register(
    "llama",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Phi3ForCausalLM",
    "GraniteForCausalLM",
    "GraniteMoeForCausalLM",
    "GemmaForCausalLM",
    "Mistral3ForConditionalGeneration",
    "Ministral3ForCausalLM",
)
def llama(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    return ModelLayout(
        layers=attention_layers(hf, ctx, llama_windows(hf)),
        num_decoder_layers=hf.num_hidden_layers,
    )


@register(
    "qwen",
    "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
)
def qwen(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    """Qwen2/Qwen3 layers take the cache config's window, set only if every layer slides.

    The transformers config keeps `sliding_window` only with `use_sliding_window: true`
    and marks layers from `max_window_layers` on as sliding.
    """
    n = hf.num_hidden_layers
    window = sliding_window(hf) if hf.get("use_sliding_window", False) else None
    windows: list[int | None] = [None] * n
    if window is not None:
        max_window_layers = hf.get_int("max_window_layers", n)
        default = [SLIDING if i >= max_window_layers else FULL for i in range(n)]
        if all(t == SLIDING for t in layer_types(hf, default)):
            windows = [window] * n
    return ModelLayout(layers=attention_layers(hf, ctx, windows), num_decoder_layers=n)


def _per_layer_windows(hf: HfConfig, default_types: list[str]) -> list[int | None]:
    window = sliding_window(hf)
    return [window if t == SLIDING else None for t in layer_types(hf, default_types)]


@register("gemma2", "Gemma2ForCausalLM")
def gemma2(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    n = hf.num_hidden_layers
    # Gemma2Config default: even layers slide, odd layers are global.
    default = [SLIDING if i % 2 == 0 else FULL for i in range(n)]
    return ModelLayout(
        layers=attention_layers(hf, ctx, _per_layer_windows(hf, default)), num_decoder_layers=n
    )


@register("gemma3", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
def gemma3(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    n = hf.num_hidden_layers
    default = pattern_layer_types(n, hf.positive_int("sliding_window_pattern", 6))
    return ModelLayout(
        layers=attention_layers(hf, ctx, _per_layer_windows(hf, default)), num_decoder_layers=n
    )


@register("cohere2", "Cohere2ForCausalLM")
def cohere2(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    """Cohere 2 / Command A: a sliding layer sees its window plus the current token, so
    commandr.py hands vLLM `sliding_window + 1`."""
    n = hf.num_hidden_layers
    default = pattern_layer_types(n, hf.positive_int("sliding_window_pattern", 4))
    windows = [w + 1 if w is not None else None for w in _per_layer_windows(hf, default)]
    return ModelLayout(layers=attention_layers(hf, ctx, windows), num_decoder_layers=n)


@register("cohere", "CohereForCausalLM")
def cohere(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    """Command-R (Cohere v1): no sliding window."""
    n = hf.num_hidden_layers
    return ModelLayout(layers=attention_layers(hf, ctx, [None] * n), num_decoder_layers=n)


@register("exaone4", "Exaone4ForCausalLM")
def exaone4(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    """EXAONE 4: per-layer windows; the default pattern is an int period or "LLLG"."""
    n = hf.num_hidden_layers
    pattern = hf.get("sliding_window_pattern", 4)
    if isinstance(pattern, str) and pattern:
        default = [SLIDING if pattern[i % len(pattern)] == "L" else FULL for i in range(n)]
    elif isinstance(pattern, int) and pattern > 0:
        default = pattern_layer_types(n, pattern)
    else:
        default = [FULL] * n
    return ModelLayout(
        layers=attention_layers(hf, ctx, _per_layer_windows(hf, default)), num_decoder_layers=n
    )


@register("olmo3", "Olmo3ForCausalLM")
def olmo3(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    """OLMo 3 (served by vLLM's transformers backend): every 4th layer is global."""
    n = hf.num_hidden_layers
    return ModelLayout(
        layers=attention_layers(
            hf,
            ctx,
            _per_layer_windows(hf, pattern_layer_types(n, 4)),
            head_size=hf.head_size(),
        ),
        num_decoder_layers=n,
    )


@register("gpt_oss", "GptOssForCausalLM")
def gpt_oss(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    """GPT-OSS hard-codes the pattern: even layers slide (128 tokens), odd layers are global."""
    n = hf.num_hidden_layers
    window = sliding_window(hf)
    windows = [window if i % 2 == 0 else None for i in range(n)]
    # gpt_oss.py divides KV heads by TP without replication.
    total_kv = hf.total_num_kv_heads()
    if total_kv % ctx.tp:
        raise UnsupportedConfiguration(
            f"GPT-OSS needs its {total_kv} KV heads divisible by the tensor parallel size "
            f"({ctx.tp})"
        )
    return ModelLayout(layers=attention_layers(hf, ctx, windows), num_decoder_layers=n)


@register("llama4", "Llama4ForCausalLM", "Llama4ForConditionalGeneration")
def llama4(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    """Llama 4: NoPE layers are global, RoPE layers attend within fixed chunks."""
    n = hf.num_hidden_layers
    # Llama4TextConfig fills in the default for a missing or empty list.
    no_rope_layers = hf.int_list("no_rope_layers")
    if not no_rope_layers:
        interval = hf.positive_int("no_rope_layer_interval", 4)
        no_rope_layers = [int((i + 1) % interval != 0) for i in range(n)]
    if len(no_rope_layers) < n:
        raise ConfigError(
            f"config.json `no_rope_layers` has {len(no_rope_layers)} entries for {n} layers"
        )
    # vLLM chunks a RoPE layer only when attention_chunk_size is truthy: 0 is full attention.
    chunk = hf.optional_int("attention_chunk_size") or None
    kv = kv_heads_per_rank(hf.total_num_kv_heads(), ctx.tp)
    layers = tuple(
        AttentionLayer(
            name=f"language_model.model.layers.{i}.self_attn.attn",
            decoder_index=i,
            num_kv_heads=kv,
            head_size=config_head_dim(hf),
            attention_chunk_size=chunk if no_rope_layers[i] != 0 else None,
        )
        for i in range(n)
    )
    return ModelLayout(layers=layers, num_decoder_layers=n)


@register(
    "deepseek_mla",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "KimiK2ForCausalLM",
)
def deepseek_mla(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    """Multi-head latent attention: one latent of kv_lora_rank + rope dims per token,
    stored whole on every TP rank (not split by heads)."""
    n = hf.num_hidden_layers
    if not hf.has("kv_lora_rank"):
        raise ConfigError("a DeepSeek MLA config needs `kv_lora_rank`")
    latent = hf.latent_size()
    layers = tuple(
        AttentionLayer(
            name=f"model.layers.{i}.self_attn.attn",
            decoder_index=i,
            num_kv_heads=1,
            head_size=latent,
            mla=True,
        )
        for i in range(n)
    )
    return ModelLayout(layers=layers, num_decoder_layers=n)


_GENERIC_LAYER_TYPES = frozenset({FULL, SLIDING})
# MLA model types whose layers are all plain latent attention, as DeepSeek-V3's are.
_GENERIC_MLA_MODEL_TYPES = frozenset(
    {"deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe_lite", "longcat_flash", "pangu_ultra_moe"}
)


def generic(hf: HfConfig, ctx: BuildContext) -> ModelLayout:
    """Fallback for unknown architectures that carry the usual attention fields.

    Dense or sliding-window layers as Llama does it; MLA when the config has a latent.
    The result is marked approximate.
    """
    architecture = hf.architecture
    types = hf.str_list("layer_types")
    if types is not None and not set(types) <= _GENERIC_LAYER_TYPES:
        unknown = ", ".join(sorted(set(types) - _GENERIC_LAYER_TYPES))
        raise UnsupportedArchitecture(
            f"{architecture} has layer types kvcap cannot derive generically ({unknown})"
        )
    for key in ("num_hidden_layers", "num_attention_heads"):
        if not hf.has(key):
            raise UnsupportedArchitecture(
                f"{architecture} is not a known family and its config lacks `{key}`"
            )
    if hf.has("kv_lora_rank"):
        if hf.model_type not in _GENERIC_MLA_MODEL_TYPES:
            # Latent-looking fields without a known MLA model type (MiniCPM3 uses plain
            # attention; DeepSeek-V3.2 and GLM-5 add indexer caches): do not guess.
            raise UnsupportedArchitecture(
                f"{architecture} (model_type {hf.model_type!r}) has latent attention fields "
                "that kvcap cannot derive generically"
            )
        layout = deepseek_mla(hf, ctx)
    elif hf.get("use_sliding_window") is False:
        # Qwen2-style configs carry a window they do not use.
        n = hf.num_hidden_layers
        layout = ModelLayout(attention_layers(hf, ctx, [None] * n), num_decoder_layers=n)
    else:
        layout = llama(hf, ctx)
    return ModelLayout(
        layers=layout.layers, num_decoder_layers=layout.num_decoder_layers, approximate=True
    )
