"""Weight bytes per worker as vLLM allocates them: TP/PP/EP splits, padding, quantization.

Follows what the release's model classes create on each rank before the checkpoint is
read: `VocabParallelEmbedding` pads the vocabulary to a multiple of 64 and splits it,
column- and row-parallel linears split one side by TP (KV heads are replicated when fewer
than the ranks), `FusedMoE` splits each expert's intermediate size by TP or, with
`--enable-expert-parallel`, the experts themselves across TP x DP ranks, and
`get_pp_indices` gives each pipeline stage its layers (the first stage the embeddings,
the last the final norm and LM head). Each attention layer keeps four float32 scales,
each rotary embedding one cos/sin cache. The worker that holds the most is the binding one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.capacity.hf_config import MAX_CONFIG_INT, HfConfig
from exporter.capacity.settings import dtype_bytes
from exporter.capacity.weights_hybrid import (
    falcon_h1,
    granite_hybrid,
    jamba,
    nemotron_h,
    qwen3_next,
    siglip_tower,
)
from exporter.capacity.weights_layers import (
    ATTENTION_SCALES,
    VOCAB_PADDING,
    ParallelLayout,
    RankCounter,
    attention,
    dense_mlp,
    moe_layer,
)
from exporter.capacity.weights_quantization import (
    FP32,
    ExpertShape,
    parse_quantization,
)
from exporter.errors import ConfigError

__all__ = ["ParallelLayout", "WorkerWeights", "weights_per_worker"]

# Model classes that build the embeddings, final norm and LM head on every pipeline
# stage, not only on the first and last.
_EDGES_ON_EVERY_STAGE = frozenset(
    {
        "qwen3_moe",
        "mixtral",
        "gpt_oss",
        "nemotron_h",
        "jamba",
        "granitemoehybrid",
        "gemma3_text",
        "qwen3_next",
    }
)
# ... of which the final norm is still built on the last stage only.
_NORM_ON_LAST_STAGE = frozenset({"qwen3_next"})


@dataclass(frozen=True, slots=True)
class WorkerWeights:
    """The weight bytes of the binding worker (the pipeline stage that holds the most)."""

    bytes_per_worker: int
    source: str
    binding_stage: int
    stage_bytes: tuple[int, ...]
    quantization: str
    checkpoint_total_bytes: int | None = None  # the safetensors index's total, to compare
    # A byte count as vLLM allocates the layers (False: a checkpoint's total split evenly).
    exact: bool = True


def _pp_indices(layers: int, rank: int, size: int) -> tuple[int, int]:
    """The decoder layers of one pipeline stage, as vLLM's `get_pp_indices` splits them."""
    per = [layers // size] * size
    remaining = layers % size
    if remaining:
        if size > 2 and remaining <= size - 2:
            for i in range(1, remaining + 1):  # the middle stages take one more each
                per[i] += 1
        else:
            for i in range(2, remaining + 2):  # all but the last stage, from the end
                per[-i] += 1
    start = sum(per[:rank])
    return start, start + per[rank]


def weights_per_worker(
    config: Mapping[str, Any], layout: ParallelLayout, dtype: str = "auto"
) -> WorkerWeights:
    """The weight bytes of the binding worker, from config.json alone."""
    hf = HfConfig(config)
    quant = parse_quantization(config)
    element = dtype_bytes(hf.model_dtype(dtype))
    pp = layout.pipeline_parallel_size
    stages = []
    for rank in range(pp):
        counter = RankCounter(hf, quant, layout, element)
        _count_stage(counter, rank, pp)
        stages.append(counter.total)
    binding = max(range(pp), key=lambda r: stages[r])
    shape = f"TP {layout.tensor_parallel_size}"
    if pp > 1:
        shape += f", PP stage {binding + 1} of {pp}"
    if layout.enable_expert_parallel:
        shape += ", expert parallel"
    source = f"computed from config.json ({quant.label}, {shape})"
    towers = [
        key.removesuffix("_config")
        for key in _TOWERS
        if isinstance(config.get(key), Mapping) and not layout.language_model_only
    ]
    if _has_siglip_tower(hf) and not layout.language_model_only:
        towers.remove("vision")  # counted, on the first stage
        source = source.replace(")", ", with its vision tower)", 1)
    if towers:  # multimodal: only the language model is modelled
        source += f"; the {' and '.join(towers)} tower not counted"
    return WorkerWeights(stages[binding], source, binding, tuple(stages), quant.label)


def _count_stage(c: RankCounter, rank: int, pp: int) -> None:
    hf = c.hf
    hidden = hf.positive_int("hidden_size")
    vocab = hf.positive_int("vocab_size")
    layers = hf.num_hidden_layers
    start, end = _pp_indices(layers, rank, pp)
    tied = bool(hf.get("tie_word_embeddings", hf.raw.get("tie_word_embeddings", False)))
    every_stage = hf.model_type in _EDGES_ON_EVERY_STAGE
    if rank == 0 and _has_siglip_tower(hf) and not c.language_model_only:
        siglip_tower(c, HfConfig(hf.raw["vision_config"]), hidden)
    if rank == 0 or every_stage:
        c.vocab(vocab, hidden)
        if hf.model_type == "gemma3_text":
            c.raw(c.dtype)  # the embedding normalizer, sqrt(hidden_size)
    if rank == pp - 1 or (every_stage and hf.model_type not in _NORM_ON_LAST_STAGE):
        c.norm(hidden)
    if rank == pp - 1 or every_stage:
        # A tied LM head shares the embeddings only where both are on one stage.
        if c.quant.quantizes_lm_head:
            padded = -(-vocab // VOCAB_PADDING) * VOCAB_PADDING
            c.column("lm_head", hidden, (padded,))
        elif not tied or (pp > 1 and not every_stage):
            c.vocab(vocab, hidden)
    nope = hf.model_type in _WITHOUT_ROPE or hf.get("position_embedding_type") == "nope"
    if end > start and not nope:
        c.raw(_rope_cache_bytes(hf, c.dtype))
    family = _FAMILIES.get(hf.model_type)
    if family is None:
        raise ConfigError(f"weights of model_type {hf.model_type!r} are not modelled")
    for index in range(start, end):
        family(c, index)


def _has_siglip_tower(hf: HfConfig) -> bool:
    """Gemma 3's multimodal checkpoints: a SigLIP vision tower (the tower kvcap sizes)."""
    vision = hf.raw.get("vision_config")
    return (
        hf.raw.get("model_type") == "gemma3"
        and isinstance(vision, Mapping)
        and vision.get("model_type") == "siglip_vision_model"
    )


def _rope_cache_bytes(hf: HfConfig, element: int) -> int:
    """One cos/sin cache per rotary embedding (vLLM shares one across layers); gpt-oss
    keeps its cache in float32."""
    if hf.model_type == "gpt_oss":
        element = FP32
    head = hf.head_size() if not hf.is_mla else hf.get_int("qk_rope_head_dim")
    rotary = int(head * hf.get_float("partial_rotary_factor", 1.0))
    base = positions = hf.get_int("max_position_embeddings", 2048)
    for rope in hf.rope_parameters():
        kind = str(rope.get("rope_type", rope.get("type", "default")))
        if kind in ("yarn", "deepseek_yarn", "linear", "dynamic"):
            original = _rope_number(rope, "original_max_position_embeddings", positions)
            positions = int(original * _rope_number(rope, "factor", 1.0))
    caches = positions
    if hf.model_type == "gemma3_text":
        caches += base  # the sliding layers' own, unscaled rotary embedding
    return caches * rotary * element


def _rope_number(rope: Mapping[str, Any], key: str, default: float) -> float:
    """A RoPE scaling field: a positive, finite number (a length or a factor)."""
    value = rope.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"config.json RoPE scaling `{key}` must be a number, got {value!r:.40}")
    if not 0 < value <= MAX_CONFIG_INT:  # NaN fails this too
        raise ConfigError(f"config.json RoPE scaling `{key}` must be positive and finite")
    return float(value)


def _llama(c: RankCounter, index: int) -> None:
    prefix = f"model.layers.{index}"
    attention(c, f"{prefix}.self_attn")
    dense_mlp(c, f"{prefix}.mlp", c.hf.positive_int("intermediate_size"))
    c.norm(c.hf.positive_int("hidden_size"), 2)


def _qwen3_moe(c: RankCounter, index: int) -> None:
    hf = c.hf
    prefix = f"model.layers.{index}"
    attention(c, f"{prefix}.self_attn")
    step = hf.get_int("decoder_sparse_step", 1)
    dense_only = index in (hf.int_list("mlp_only_layers") or [])
    experts = hf.positive_int("num_experts")
    if not dense_only and step > 0 and (index + 1) % step == 0:
        inter = hf.positive_int("moe_intermediate_size")
        moe_layer(c, f"{prefix}.mlp", experts, inter, quantized_router=True)
    else:
        dense_mlp(c, f"{prefix}.mlp", hf.positive_int("intermediate_size"))
    c.norm(hf.positive_int("hidden_size"), 2)


def _mixtral(c: RankCounter, index: int) -> None:
    hf = c.hf
    prefix = f"model.layers.{index}"
    attention(c, f"{prefix}.self_attn")
    experts = hf.positive_int("num_local_experts")
    moe_layer(c, f"{prefix}.block_sparse_moe", experts, hf.positive_int("intermediate_size"))
    c.norm(hf.positive_int("hidden_size"), 2)


def _gpt_oss(c: RankCounter, index: int) -> None:
    hf = c.hf
    prefix = f"model.layers.{index}"
    hidden = hf.positive_int("hidden_size")
    heads = hf.num_attention_heads
    head = hf.head_size()
    kv = hf.total_num_kv_heads()
    c.qkv(f"{prefix}.self_attn.qkv_proj", heads=heads, kv_heads=kv, head=head, bias=True)
    c.row(f"{prefix}.self_attn.o_proj", heads * head, hidden, bias=True)
    c.raw(heads // c.tp * c.dtype)  # attention sinks
    c.raw(ATTENTION_SCALES + c.quant.attention_scale_bytes(c.dtype))
    moe_layer(
        c,
        f"{prefix}.mlp",
        hf.positive_int("num_local_experts"),
        hf.positive_int("intermediate_size"),
        bias=True,
    )
    c.norm(hidden, 2)


def _deepseek(c: RankCounter, index: int) -> None:
    hf = c.hf
    prefix = f"model.layers.{index}"
    hidden = hf.positive_int("hidden_size")
    heads = hf.num_attention_heads
    nope, rope = hf.get_int("qk_nope_head_dim"), hf.get_int("qk_rope_head_dim")
    v_head, kv_lora = hf.get_int("v_head_dim"), hf.positive_int("kv_lora_rank")
    q_lora = hf.optional_int("q_lora_rank")
    attn = f"{prefix}.self_attn"
    if q_lora:
        c.replicated(f"{attn}.fused_qkv_a_proj", hidden, (q_lora, kv_lora + rope))
        c.norm(q_lora)
        c.column(f"{attn}.q_b_proj", q_lora, (heads * (nope + rope),))
    else:
        c.column(f"{attn}.q_proj", hidden, (heads * (nope + rope),))
        c.replicated(f"{attn}.kv_a_proj_with_mqa", hidden, (kv_lora + rope,))
    c.norm(kv_lora)
    c.column(f"{attn}.kv_b_proj", kv_lora, (heads * (nope + v_head),))
    c.row(f"{attn}.o_proj", heads * v_head, hidden)
    c.raw(ATTENTION_SCALES)  # MLA layers take no KV cache scales from the quantization
    experts = hf.get_int("n_routed_experts", 0)
    first_dense = hf.get_int("first_k_dense_replace", 0)
    freq = hf.positive_int("moe_layer_freq", 1)
    if experts and index >= first_dense and index % freq == 0:
        inter = hf.positive_int("moe_intermediate_size")
        c.total += experts * hidden * c.dtype  # router
        if hf.get("topk_method") == "noaux_tc":
            c.total += experts * FP32  # e_score_correction_bias
        shared = hf.get_int("n_shared_experts", 0)
        if shared:
            dense_mlp(c, f"{prefix}.mlp.shared_experts", inter * shared)
        c.experts(f"{prefix}.mlp.experts", ExpertShape(experts, hidden, inter))
    else:
        dense_mlp(c, f"{prefix}.mlp", hf.positive_int("intermediate_size"))
    c.norm(hidden, 2)


def _gemma3(c: RankCounter, index: int) -> None:
    hf = c.hf
    prefix = f"model.layers.{index}"
    attention(c, f"{prefix}.self_attn")
    c.norm(hf.head_size(), 2)  # q_norm, k_norm
    dense_mlp(c, f"{prefix}.mlp", hf.positive_int("intermediate_size"))
    c.norm(hf.positive_int("hidden_size"), 4)


def _llama4(c: RankCounter, index: int) -> None:
    hf = c.hf
    prefix = f"model.layers.{index}"
    hidden = hf.positive_int("hidden_size")
    attention(c, f"{prefix}.self_attn")
    step = hf.positive_int("interleave_moe_layer_step", 1)
    if (index + 1) % step == 0:
        inter = hf.positive_int("intermediate_size")
        experts = hf.positive_int("num_local_experts")
        c.total += experts * hidden * c.dtype  # router
        dense_mlp(c, f"{prefix}.feed_forward.shared_expert", inter)
        c.experts(f"{prefix}.feed_forward.experts", ExpertShape(experts, hidden, inter))
    else:
        dense_mlp(c, f"{prefix}.feed_forward", hf.positive_int("intermediate_size_mlp"))
    c.norm(hidden, 2)


# Each family's layer: what one decoder layer holds on one rank.
_FAMILIES: dict[str, Callable[[RankCounter, int], None]] = {
    "llama": _llama,
    "mistral": _llama,
    "qwen2": _llama,
    "qwen3": _llama,
    "qwen3_moe": _qwen3_moe,
    "mixtral": _mixtral,
    "gpt_oss": _gpt_oss,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "gemma3_text": _gemma3,
    "llama4_text": _llama4,
    "nemotron_h": nemotron_h,
    "jamba": jamba,
    "granitemoehybrid": granite_hybrid,
    "qwen3_next": qwen3_next,
    "falcon_h1": falcon_h1,
}
# Sub-configs of multimodal checkpoints whose encoders vLLM also loads.
_TOWERS = ("vision_config", "audio_config")
# Families whose attention layers have no rotary embedding (no cos/sin cache).
_WITHOUT_ROPE = frozenset({"nemotron_h", "jamba"})
