"""What vLLM takes from `total x gpu_memory_utilization` before the KV cache, term by term.

Read from each release's `v1/worker/gpu_worker.py` (`determine_available_memory`),
`utils/mem_utils.py` (`memory_profiling`) and `v1/worker/gpu_model_runner.py`
(`profile_run`, `_dummy_sampler_run`, `profile_cudagraph_memory`), 0.10 to 0.33:

    requested = ceil(mem_get_info total x gpu_memory_utilization)
    kv        = requested - weights - torch peak of the profiling run
                - non-torch growth since the worker started - CUDA graph estimate (0.21+)

The profiling run pushes `--max-num-batched-tokens` tokens through the model, then samples
`--max-num-seqs` dummy requests with top-k, top-p and penalties on; the torch peak is the
larger of the two. kvcap cannot measure, so each term is modelled from the settings it
depends on, with a low-high range; the constants are fitted to published start-up logs
(tests/fixtures/startup-logs) and documented in docs/capacity.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 2**30
MIB = 2**20

# Bytes per activation element in the forward pass (bf16/fp16 activations also for
# quantized weights: AWQ, GPTQ, FP8 and MXFP4 kernels compute in 16 bits).
ACTIVATION_BYTES = 2
# Live tensors of the widest layer during the profiling run, in units of the hidden size
# (residual, normed input, attention or MLP output) beside the MLP's own intermediates.
RESIDUAL_COPIES = 3
# The sampler's peak per logit of its dummy batch (top-k, top-p and penalties all on) in
# PyTorch's path: fp32 logits (4), the sorted copy (4) and its int64 indices (8), softmax and
# cumulative sum (8), the scattered result (4), int64 token counts for the penalties (8) and
# masks (2): 38, what the H100 start-ups of tests/fixtures/startup-logs show. FlashInfer's
# sampler sorts nothing; start-ups that used it show ~8 (the low end of the range).
SAMPLER_BYTES_PER_LOGIT = 38
SAMPLER_BYTES_PER_LOGIT_LOW = 8
# Non-torch memory that appears after the worker's first snapshot: cuBLAS workspaces and
# the attention backend's buffers on one GPU; NCCL and custom all-reduce buffers beside
# them when the worker talks to others.
NON_TORCH_SINGLE = 0.25 * GIB
NON_TORCH_PARALLEL = 0.2 * GIB
# CUDA graphs (counted from 0.21.0): the first capture holds the largest batch's
# activations; every further graph costs this much per layer.
GRAPH_BYTES_PER_LAYER = 48 * 1024
# The release that subtracts its CUDA graph estimate before the KV cache ("CUDA graph
# memory profiling is enabled (default since v0.21.0)" in vLLM's own log).
CUDAGRAPH_RELEASE = (0, 21, 0)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The sizes of a config.json that the activation and sampler terms depend on."""

    hidden: int
    layers: int
    vocab: int
    attention_width: int  # (q heads + 2 x kv heads) x head dim, before TP
    mlp_intermediate: int  # dense MLP width; 0 for a model whose every layer is MoE
    experts: int
    experts_per_token: int
    expert_intermediate: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        text = config.get("text_config")
        c: Mapping[str, Any] = text if isinstance(text, Mapping) else config
        hidden = _int(c, "hidden_size") or _int(c, "d_model")
        heads = _int(c, "num_attention_heads") or 1
        kv_heads = _int(c, "num_key_value_heads") or heads
        head_dim = _int(c, "head_dim") or (hidden // heads if hidden else 0)
        if _int(c, "kv_lora_rank"):  # MLA: q and the latent projection
            head_dim = _int(c, "qk_nope_head_dim") + _int(c, "qk_rope_head_dim") or head_dim
        experts = (
            _int(c, "n_routed_experts") or _int(c, "num_local_experts") or _int(c, "num_experts")
        )
        return cls(
            hidden=hidden,
            layers=_int(c, "num_hidden_layers"),
            vocab=_int(c, "vocab_size"),
            attention_width=(heads + 2 * kv_heads) * head_dim,
            mlp_intermediate=_int(c, "intermediate_size"),
            experts=experts,
            experts_per_token=(_int(c, "num_experts_per_tok") or _int(c, "experts_per_token") or 1)
            if experts
            else 0,
            expert_intermediate=_int(c, "moe_intermediate_size") or _int(c, "intermediate_size"),
        )


@dataclass(frozen=True, slots=True)
class Workload:
    """The settings the non-KV terms depend on."""

    tensor_parallel: int
    pipeline_parallel: int
    max_num_batched_tokens: int
    max_num_seqs: int
    enforce_eager: bool
    release: tuple[int, int, int]
    expert_parallel: bool = False


@dataclass(frozen=True, slots=True)
class Term:
    """One thing vLLM subtracts before the KV cache: a value and its plausible range."""

    name: str
    bytes: int
    low: int
    high: int
    depends_on: str

    def describe(self) -> str:
        return (
            f"{self.name} {self.bytes / GIB:.2f} GiB "
            f"({self.low / GIB:.2f}-{self.high / GIB:.2f}; {self.depends_on})"
        )


def default_batch_limits(total_bytes: int, gpu_name: str | None) -> tuple[int, int]:
    """`vllm serve`'s --max-num-batched-tokens and --max-num-seqs when not given, chosen by
    the GPU's memory (engine/arg_utils.py): 16384/1024 from 160 GiB, 8192/1024 from 70 GiB
    except on an A100 (PR #17885), else 2048/256."""
    if total_bytes >= 160 * GIB:
        return 16384, 1024
    if total_bytes >= 70 * GIB and "A100" not in (gpu_name or "").upper():
        return 8192, 1024
    return 2048, 256


def non_kv_terms(shape: ModelShape, work: Workload) -> tuple[Term, ...]:
    """The terms vLLM subtracts besides the weights, per worker, for one release."""
    terms = [_activation_peak(shape, work), _non_torch(work)]
    if work.release >= CUDAGRAPH_RELEASE and not work.enforce_eager:
        terms.append(_cuda_graphs(shape, work))
    return tuple(terms)


def _forward_peak(shape: ModelShape, work: Workload, tokens: int) -> int:
    tp = work.tensor_parallel
    attention = shape.attention_width // tp * 2  # qkv output and the attention output
    dense = 3 * shape.mlp_intermediate // tp  # gate_up output and the activated half
    moe = 0
    if shape.experts:
        width = (
            shape.expert_intermediate
            if work.expert_parallel
            else -(-shape.expert_intermediate // tp)
        )
        # fused MoE's workspaces: gate_up and activation per routed token, then its output
        moe = shape.experts_per_token * (3 * width + shape.hidden)
    per_token = RESIDUAL_COPIES * shape.hidden + max(attention, dense, moe)
    router = tokens * shape.experts * 4  # fp32 router logits
    return tokens * per_token * ACTIVATION_BYTES + router


def _activation_peak(shape: ModelShape, work: Workload) -> Term:
    forward = _forward_peak(shape, work, work.max_num_batched_tokens)
    seqs = min(work.max_num_seqs, work.max_num_batched_tokens)
    logits = seqs * shape.vocab
    sampler = logits * SAMPLER_BYTES_PER_LOGIT
    peak = max(forward, sampler)
    which = "sampler" if sampler >= forward else "forward pass"
    return Term(
        "activation peak",
        peak,
        int(max(forward * 0.5, logits * SAMPLER_BYTES_PER_LOGIT_LOW)),
        int(max(forward * 2.3, sampler * 1.3)),
        f"profiling run: {work.max_num_batched_tokens} tokens, {seqs} sampled sequences; "
        f"{which} is larger",
    )


def _non_torch(work: Workload) -> Term:
    parallel = work.tensor_parallel * work.pipeline_parallel > 1
    if parallel:
        value = int(NON_TORCH_SINGLE + NON_TORCH_PARALLEL)
        return Term(
            "non-torch memory", value, int(0.2 * GIB), int(2.0 * GIB), "NCCL and all-reduce buffers"
        )
    value = int(NON_TORCH_SINGLE)
    return Term("non-torch memory", value, int(0.05 * GIB), int(0.7 * GIB), "cuBLAS workspaces")


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """How many batch sizes vLLM captures a graph for: 1, 2, 4, then steps of 8 to 256 and
    of 16 above, up to min(2 x --max-num-seqs, 512, --max-num-batched-tokens)."""
    largest = min(2 * max_num_seqs, 512, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= largest]
    sizes += range(8, min(largest, 256) + 1, 8)
    sizes += range(272, largest + 1, 16)
    return len(sizes)


def _cuda_graphs(shape: ModelShape, work: Workload) -> Term:
    graphs = capture_sizes(work.max_num_seqs, work.max_num_batched_tokens)
    largest = min(2 * work.max_num_seqs, 512, work.max_num_batched_tokens)
    layers = -(-shape.layers // work.pipeline_parallel)
    # FULL graphs for decode batches and PIECEWISE graphs for mixed ones: two per size.
    value = _forward_peak(shape, work, largest) + 2 * graphs * layers * GRAPH_BYTES_PER_LAYER
    return Term(
        "CUDA graphs",
        value,
        int(value * 0.4),
        int(value * 2.5),
        f"{graphs} capture sizes up to {largest}; counted from vLLM 0.21 (--enforce-eager: 0)",
    )


def _int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    return value if type(value) is int and value > 0 else 0
