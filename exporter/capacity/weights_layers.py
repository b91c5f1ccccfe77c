"""One worker's tensors, module by module: the linear, attention, MLP and MoE blocks that
vLLM's model classes build, sized per TP rank (exporter/capacity/weights.py walks them)."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.capacity.hf_config import HfConfig
from exporter.capacity.weights_quantization import (
    FP32,
    INT32,
    ExpertShape,
    LinearShape,
    Quantization,
)
from exporter.errors import ConfigError

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
ATTENTION_SCALES = 4 * FP32  # _k_scale, _v_scale, _q_scale, _prob_scale buffers


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    """How vLLM spreads the model: `-tp`, `-pp`, `--enable-expert-parallel`, `-dp`."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool = False
    data_parallel_size: int = 1
    # `--language-model-only` (or every modality limited to 0): no vision tower is built.
    language_model_only: bool = False


class RankCounter:
    """Sums one rank's tensors, module by module."""

    def __init__(
        self, hf: HfConfig, quant: Quantization, layout: ParallelLayout, dtype: int
    ) -> None:
        self.hf = hf
        self.quant = quant
        self.tp = layout.tensor_parallel_size
        self.ep = layout.enable_expert_parallel
        self.language_model_only = layout.language_model_only
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
        shape = LinearShape(k, local, k_full=k, split_outputs=self.tp > 1, column=True)
        self._linear(name, shape, bias)

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
        self.qkv_of(name, hidden, heads=heads, kv_heads=kv_heads, head=head, bias=bias)

    def qkv_of(
        self, name: str, hidden: int, *, heads: int, kv_heads: int, head: int, bias: bool
    ) -> None:
        """A QKV projection from an input of `hidden` (a tower's own width)."""
        q = self._split(heads, f"{name}: attention heads") * head
        kv = max(1, kv_heads // self.tp) * head
        split = self.tp > 1
        shape = LinearShape(hidden, (q, kv, kv), k_full=hidden, split_outputs=split, column=True)
        self._linear(name, shape, bias)

    def norm(self, size: int, count: int = 1) -> None:
        self.total += size * count * self.dtype

    def raw(self, nbytes: int) -> None:
        self.total += nbytes

    def vocab(self, vocab: int, hidden: int) -> None:
        padded = -(-vocab // VOCAB_PADDING) * VOCAB_PADDING
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


def attention(c: RankCounter, prefix: str) -> None:
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
    c.raw(ATTENTION_SCALES + c.quant.attention_scale_bytes(c.dtype))


def dense_mlp(c: RankCounter, prefix: str, inter: int) -> None:
    hidden = c.hf.positive_int("hidden_size")
    c.column(f"{prefix}.gate_up_proj", hidden, (inter, inter))
    c.row(f"{prefix}.down_proj", inter, hidden)


def moe_layer(
    c: RankCounter,
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


def plain_attention(c: RankCounter, prefix: str, kv_scales: bool = True) -> None:
    hf = c.hf
    hidden = hf.positive_int("hidden_size")
    heads, head = hf.num_attention_heads, hf.head_size()
    bias = bool(hf.get("attention_bias", False))
    kv = hf.total_num_kv_heads()
    c.qkv(f"{prefix}.qkv_proj", heads=heads, kv_heads=kv, head=head, bias=bias)
    c.row(f"{prefix}.o_proj", heads * head, hidden, bias=bias)
    c.raw(ATTENTION_SCALES + (c.quant.attention_scale_bytes(c.dtype) if kv_scales else 0))
