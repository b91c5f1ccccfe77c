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

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.capacity.hf_config import HfConfig
from exporter.capacity.weights_quantization import (
    FP32,
    INT32,
    ExpertShape,
    LinearShape,
    Quantization,
    parse_quantization,
)
from exporter.errors import ConfigError

_VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
_ATTENTION_SCALES = 4 * FP32  # _k_scale, _v_scale, _q_scale, _prob_scale buffers
# Model classes that build the embeddings, final norm and LM head on every pipeline
# stage, not only on the first and last.
_EDGES_ON_EVERY_STAGE = frozenset(
    {"qwen3_moe", "mixtral", "gpt_oss", "nemotron_h", "jamba", "granitemoehybrid"}
)
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    """How vLLM spreads the model: `-tp`, `-pp`, `--enable-expert-parallel`, `-dp`."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool = False
    data_parallel_size: int = 1


@dataclass(frozen=True, slots=True)
class WorkerWeights:
    """The weight bytes of the binding worker (the pipeline stage that holds the most)."""

    bytes_per_worker: int
    source: str
    binding_stage: int
    stage_bytes: tuple[int, ...]
    quantization: str
    checkpoint_total_bytes: int | None = None  # the safetensors index's total, to compare


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


class _Counter:
    """Sums one rank's tensors, module by module."""

    def __init__(
        self, hf: HfConfig, quant: Quantization, layout: ParallelLayout, dtype: int
    ) -> None:
        self.hf = hf
        self.quant = quant
        self.tp = layout.tensor_parallel_size
        self.ep = layout.enable_expert_parallel
        self.ep_size = layout.tensor_parallel_size * layout.data_parallel_size
        self.dtype = dtype
        self.total = 0

    def _split(self, size: int, what: str) -> int:
        if size % self.tp:
            raise ConfigError(
                f"{what} ({size}) is not divisible by --tensor-parallel-size {self.tp}"
            )
        return size // self.tp

    def column(self, name: str, k: int, outs: tuple[int, ...], bias: bool = False) -> None:
        local = tuple(self._split(n, name) for n in outs)
        self._linear(name, LinearShape(k, local, row=False, k_full=k), bias)

    def row(self, name: str, k: int, n: int, bias: bool = False) -> None:
        self._linear(name, LinearShape(self._split(k, name), (n,), row=True, k_full=k), bias)

    def replicated(self, name: str, k: int, outs: tuple[int, ...], bias: bool = False) -> None:
        self._linear(name, LinearShape(k, outs, row=False, k_full=k), bias)

    def _linear(self, name: str, shape: LinearShape, bias: bool) -> None:
        self.total += self.quant.linear_bytes(name, shape, self.dtype)
        if bias:
            self.total += sum(shape.outs) * self.dtype

    def qkv(self, name: str, *, heads: int, kv_heads: int, head: int, bias: bool) -> None:
        """QKVParallelLinear: query heads split; KV heads split, or replicated when fewer
        than the ranks."""
        hidden = self.hf.positive_int("hidden_size")
        q = self._split(heads, f"{name}: attention heads") * head
        kv = max(1, kv_heads // self.tp) * head
        self._linear(name, LinearShape(hidden, (q, kv, kv), k_full=hidden), bias)

    def norm(self, size: int, count: int = 1) -> None:
        self.total += size * count * self.dtype

    def raw(self, nbytes: int) -> None:
        self.total += nbytes

    def vocab(self, vocab: int, hidden: int) -> None:
        padded = -(-vocab // _VOCAB_PADDING) * _VOCAB_PADDING
        self.total += padded // self.tp * hidden * self.dtype

    def experts(self, name: str, shape: ExpertShape) -> None:
        """A FusedMoE block: all experts with their intermediate size split by TP, or
        with expert parallelism whole experts spread over TP x DP ranks."""
        if self.ep and self.ep_size > 1:
            self.total += shape.experts * INT32  # the expert map: local index of each expert
            local = ExpertShape(
                -(-shape.experts // self.ep_size), shape.hidden, shape.inter, shape.bias
            )
        else:
            inter = self._split(shape.inter, f"{name}: expert intermediate size")
            local = ExpertShape(shape.experts, shape.hidden, inter, shape.bias)
        self.total += self.quant.expert_bytes(local, self.dtype)


def weights_per_worker(
    config: Mapping[str, Any], layout: ParallelLayout, dtype: str = "auto"
) -> WorkerWeights:
    """The weight bytes of the binding worker, from config.json alone."""
    hf = HfConfig(config)
    quant = parse_quantization(config)
    element = _DTYPE_BYTES.get(hf.model_dtype(dtype), 2)
    pp = layout.pipeline_parallel_size
    stages = []
    for rank in range(pp):
        counter = _Counter(hf, quant, layout, element)
        _count_stage(counter, rank, pp)
        stages.append(counter.total)
    binding = max(range(pp), key=lambda r: stages[r])
    shape = f"TP {layout.tensor_parallel_size}"
    if pp > 1:
        shape += f", PP stage {binding + 1} of {pp}"
    if layout.enable_expert_parallel:
        shape += ", expert parallel"
    source = f"computed from config.json ({quant.label}, {shape})"
    return WorkerWeights(stages[binding], source, binding, tuple(stages), quant.label)


def _count_stage(c: _Counter, rank: int, pp: int) -> None:
    hf = c.hf
    hidden = hf.positive_int("hidden_size")
    vocab = hf.positive_int("vocab_size")
    layers = hf.num_hidden_layers
    start, end = _pp_indices(layers, rank, pp)
    tied = bool(hf.get("tie_word_embeddings", hf.raw.get("tie_word_embeddings", False)))
    every_stage = hf.model_type in _EDGES_ON_EVERY_STAGE
    if rank == 0 or every_stage:
        c.vocab(vocab, hidden)
    if rank == pp - 1 or every_stage:
        c.norm(hidden)
        # A tied LM head shares the embeddings only where both are on one stage.
        if c.quant.quantizes_lm_head:
            padded = -(-vocab // _VOCAB_PADDING) * _VOCAB_PADDING
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


def _rope_cache_bytes(hf: HfConfig, element: int) -> int:
    """One cos/sin cache per rotary embedding (vLLM shares one across layers); gpt-oss
    keeps its cache in float32."""
    if hf.model_type == "gpt_oss":
        element = FP32
    head = hf.head_size() if not hf.is_mla else hf.get_int("qk_rope_head_dim")
    rotary = int(head * float(hf.get("partial_rotary_factor", 1.0)))
    positions = hf.get_int("max_position_embeddings", 2048)
    for rope in hf.rope_parameters():
        kind = str(rope.get("rope_type", rope.get("type", "default")))
        if kind in ("yarn", "deepseek_yarn", "linear", "dynamic"):
            original = int(rope.get("original_max_position_embeddings", positions))
            positions = int(original * float(rope.get("factor", 1.0)))
    return positions * rotary * element


def _attention(c: _Counter, prefix: str) -> None:
    hf = c.hf
    hidden = hf.positive_int("hidden_size")
    heads = hf.num_attention_heads
    kv = hf.total_num_kv_heads()
    head = hf.head_size()
    bias = bool(hf.get("attention_bias", False)) or hf.model_type == "qwen2"
    c.qkv(f"{prefix}.qkv_proj", heads=heads, kv_heads=kv, head=head, bias=bias)
    c.row(f"{prefix}.o_proj", heads * head, hidden, bias=bool(hf.get("attention_bias", False)))
    if hf.model_type in ("qwen3", "qwen3_moe"):
        c.norm(head, 2)  # q_norm, k_norm
    c.raw(_ATTENTION_SCALES + c.quant.attention_scale_bytes(c.dtype))


def _dense_mlp(c: _Counter, prefix: str, inter: int) -> None:
    hidden = c.hf.positive_int("hidden_size")
    c.column(f"{prefix}.gate_up_proj", hidden, (inter, inter))
    c.row(f"{prefix}.down_proj", inter, hidden)


def _llama(c: _Counter, index: int) -> None:
    prefix = f"model.layers.{index}"
    _attention(c, f"{prefix}.self_attn")
    _dense_mlp(c, f"{prefix}.mlp", c.hf.positive_int("intermediate_size"))
    c.norm(c.hf.positive_int("hidden_size"), 2)


def _moe_layer(
    c: _Counter,
    prefix: str,
    experts: int,
    inter: int,
    *,
    bias: bool = False,
    quantized_router: bool = False,
) -> None:
    hidden = c.hf.positive_int("hidden_size")
    if quantized_router:
        c.replicated(f"{prefix}.gate", hidden, (experts,), bias=bias)
    else:
        c.total += experts * hidden * c.dtype + (experts * c.dtype if bias else 0)
    c.experts(f"{prefix}.experts", ExpertShape(experts, hidden, inter, bias))


def _qwen3_moe(c: _Counter, index: int) -> None:
    hf = c.hf
    prefix = f"model.layers.{index}"
    _attention(c, f"{prefix}.self_attn")
    step = hf.get_int("decoder_sparse_step", 1)
    dense_only = index in (hf.int_list("mlp_only_layers") or [])
    experts = hf.positive_int("num_experts")
    if not dense_only and step > 0 and (index + 1) % step == 0:
        inter = hf.positive_int("moe_intermediate_size")
        _moe_layer(c, f"{prefix}.mlp", experts, inter, quantized_router=True)
    else:
        _dense_mlp(c, f"{prefix}.mlp", hf.positive_int("intermediate_size"))
    c.norm(hf.positive_int("hidden_size"), 2)


def _mixtral(c: _Counter, index: int) -> None:
    hf = c.hf
    prefix = f"model.layers.{index}"
    _attention(c, f"{prefix}.self_attn")
    experts = hf.positive_int("num_local_experts")
    _moe_layer(c, f"{prefix}.block_sparse_moe", experts, hf.positive_int("intermediate_size"))
    c.norm(hf.positive_int("hidden_size"), 2)


def _gpt_oss(c: _Counter, index: int) -> None:
    hf = c.hf
    prefix = f"model.layers.{index}"
    hidden = hf.positive_int("hidden_size")
    heads = hf.num_attention_heads
    head = hf.head_size()
    kv = hf.total_num_kv_heads()
    c.qkv(f"{prefix}.self_attn.qkv_proj", heads=heads, kv_heads=kv, head=head, bias=True)
    c.row(f"{prefix}.self_attn.o_proj", heads * head, hidden, bias=True)
    c.raw(heads // c.tp * c.dtype)  # attention sinks
    c.raw(_ATTENTION_SCALES + c.quant.attention_scale_bytes(c.dtype))
    _moe_layer(
        c,
        f"{prefix}.mlp",
        hf.positive_int("num_local_experts"),
        hf.positive_int("intermediate_size"),
        bias=True,
    )
    c.norm(hidden, 2)


def _deepseek(c: _Counter, index: int) -> None:
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
    c.raw(_ATTENTION_SCALES)  # MLA layers take no KV cache scales from the quantization
    experts = hf.get_int("n_routed_experts", 0)
    first_dense = hf.get_int("first_k_dense_replace", 0)
    freq = hf.get_int("moe_layer_freq", 1)
    if experts and index >= first_dense and index % freq == 0:
        inter = hf.positive_int("moe_intermediate_size")
        c.total += experts * hidden * c.dtype  # router
        if hf.get("topk_method") == "noaux_tc":
            c.total += experts * FP32  # e_score_correction_bias
        shared = hf.get_int("n_shared_experts", 0)
        if shared:
            _dense_mlp(c, f"{prefix}.mlp.shared_experts", inter * shared)
        c.experts(f"{prefix}.mlp.experts", ExpertShape(experts, hidden, inter))
    else:
        _dense_mlp(c, f"{prefix}.mlp", hf.positive_int("intermediate_size"))
    c.norm(hidden, 2)


def _mamba2(
    c: _Counter, prefix: str, *, heads: int, head_dim: int, groups: int, state: int, kernel: int
) -> None:
    """vLLM's MambaMixer2: with fewer groups than ranks, each rank gets a copy of one."""
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
    c.norm(inner // c.tp)  # the gated RMSNorm
    c.row(f"{prefix}.out_proj", inner, hidden, bias=proj_bias)


def _plain_attention(c: _Counter, prefix: str, kv_scales: bool = True) -> None:
    hf = c.hf
    hidden = hf.positive_int("hidden_size")
    heads, head = hf.num_attention_heads, hf.head_size()
    bias = bool(hf.get("attention_bias", False))
    kv = hf.total_num_kv_heads()
    c.qkv(f"{prefix}.qkv_proj", heads=heads, kv_heads=kv, head=head, bias=bias)
    c.row(f"{prefix}.o_proj", heads * head, hidden, bias=bias)
    c.raw(_ATTENTION_SCALES + (c.quant.attention_scale_bytes(c.dtype) if kv_scales else 0))


def _nemotron_h(c: _Counter, index: int) -> None:
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
        _plain_attention(c, prefix)
    elif kind == "-":
        inter = hf.positive_int("intermediate_size")
        bias = bool(hf.get("mlp_bias", False))
        c.column(f"{prefix}.up_proj", hidden, (inter,), bias=bias)
        c.row(f"{prefix}.down_proj", inter, hidden, bias=bias)
    else:
        raise ConfigError(f"hybrid_override_pattern letter {kind!r} is not modelled")
    c.norm(hidden)


def _jamba(c: _Counter, index: int) -> None:
    hf = c.hf
    hidden = hf.positive_int("hidden_size")
    prefix = f"model.layers.{index}"
    attn_period, attn_offset = (
        hf.positive_int("attn_layer_period", 8),
        hf.get_int("attn_layer_offset", 4),
    )
    if index % attn_period == attn_offset:
        _plain_attention(c, f"{prefix}.self_attn", kv_scales=False)  # Jamba's takes none
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
        _moe_layer(c, f"{prefix}.feed_forward", experts, inter)
    else:
        _dense_mlp(c, f"{prefix}.feed_forward", inter)
    c.norm(hidden, 2)


def _granite_hybrid(c: _Counter, index: int) -> None:
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
        _plain_attention(c, f"{prefix}.self_attn")
    experts = hf.get_int("num_local_experts", 0)
    if experts:
        _moe_layer(c, f"{prefix}.block_sparse_moe", experts, hf.positive_int("intermediate_size"))
    shared = hf.get_int("shared_intermediate_size", 0)
    if shared:
        c.column(f"{prefix}.shared_mlp.input_linear", hidden, (shared, shared))
        c.row(f"{prefix}.shared_mlp.output_linear", shared, hidden)
    c.norm(hidden, 2)


_FAMILIES: dict[str, Any] = {
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
    "nemotron_h": _nemotron_h,
    "jamba": _jamba,
    "granitemoehybrid": _granite_hybrid,
}
# Families whose attention layers have no rotary embedding (no cos/sin cache).
_WITHOUT_ROPE = frozenset({"nemotron_h", "jamba"})


def iter_families() -> Iterator[str]:
    return iter(_FAMILIES)
