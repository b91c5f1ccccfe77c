"""Per-layer KV cache specs: how many bytes a block takes and how many a request needs.

Each class restates one of vLLM's `KVCacheSpec` types (v1/kv_cache_interface.py) as a
frozen value. `spec_type` is vLLM's class name, so results compare one to one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal

# "all": the state of every block is kept (vLLM 0.11 with prefix caching, and
# --mamba-cache-mode all), so a request holds cdiv(max_model_len, block_size) pages.
MambaCacheMode = Literal["align", "none", "all"]


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may hold, the inputs of `max_memory_usage_bytes`."""

    max_model_len: int
    # Tokens that can be scheduled but not yet finished: (PP + 1) x max_num_batched_tokens
    # with vLLM 0.33's default V2 model runner and async scheduling.
    in_flight_tokens: int
    decode_context_parallel_size: int = 1
    mamba_cache_mode: MambaCacheMode = "none"


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionSpec:
    """Common page arithmetic of every attention-like spec (AttentionSpec in vLLM)."""

    block_size: int
    num_kv_heads: int
    head_size: int
    head_size_v: int
    dtype_bytes: int
    # Bytes one token of one head stores, when a quantized layout says so.
    state_content_bytes: int | None = None
    # Head slots in the page, when a layout packs more than one slot per KV head.
    num_head_slots: int | None = None
    page_size_padded: int | None = None

    spec_type: ClassVar[str] = "AttentionSpec"
    kind: ClassVar[str] = "attention"
    # Specs with the same base type can share one group (vLLM's UniformTypeKVCacheSpecs).
    base_type: ClassVar[str] = "full"

    @property
    def bytes_per_token(self) -> int:
        heads = self.num_head_slots if self.num_head_slots is not None else self.num_kv_heads
        if self.state_content_bytes is not None:
            return heads * self.state_content_bytes
        return heads * (self.head_size + self.head_size_v) * self.dtype_bytes

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            return self.page_size_padded
        return self.block_size * self.bytes_per_token

    def max_memory_usage_bytes(self, limits: RequestLimits) -> int:
        raise NotImplementedError

    def blocks_per_request(self, limits: RequestLimits) -> int:
        return cdiv(self.max_memory_usage_bytes(limits), self.page_size_bytes)

    def with_block_size(self, block_size: int) -> AttentionSpec:
        return replace(self, block_size=block_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """Global attention: every token of the request stays in the cache."""

    spec_type: ClassVar[str] = "FullAttentionSpec"
    kind: ClassVar[str] = "full_attention"

    def max_memory_usage_bytes(self, limits: RequestLimits) -> int:
        # Decode context parallelism spreads one request's tokens over the DCP ranks.
        tokens = cdiv(limits.max_model_len, limits.decode_context_parallel_size)
        return cdiv(tokens, self.block_size) * self.page_size_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention: one compressed latent per token, on every TP rank."""

    spec_type: ClassVar[str] = "MLAAttentionSpec"
    kind: ClassVar[str] = "mla"


@dataclass(frozen=True, slots=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """Sliding-window attention: a request keeps its window plus what is in flight."""

    sliding_window: int

    spec_type: ClassVar[str] = "SlidingWindowSpec"
    kind: ClassVar[str] = "sliding_window"
    base_type: ClassVar[str] = "sliding_window"

    def max_memory_usage_bytes(self, limits: RequestLimits) -> int:
        tokens = min(self.sliding_window - 1 + limits.in_flight_tokens, limits.max_model_len)
        # One extra block because the window can start in the middle of a block.
        return (cdiv(tokens, self.block_size) + 1) * self.page_size_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Chunked local attention (Llama 4): a request keeps one chunk plus what is in flight."""

    attention_chunk_size: int

    spec_type: ClassVar[str] = "ChunkedLocalAttentionSpec"
    kind: ClassVar[str] = "chunked_local"
    base_type: ClassVar[str] = "chunked_local"

    def max_memory_usage_bytes(self, limits: RequestLimits) -> int:
        tokens = min(self.attention_chunk_size + limits.in_flight_tokens, limits.max_model_len)
        return cdiv(tokens, self.block_size) * self.page_size_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class MambaSpec:
    """A recurrent state (Mamba 1/2, gated delta net, linear attention) of fixed size."""

    block_size: int
    shapes: tuple[tuple[int, ...], ...]
    dtype_bytes: tuple[int, ...]
    mamba_type: str
    # Extra state blocks kept for prefix-cache checkpoints in "align" mode (Mamba2, GDN).
    prefill_checkpoint_blocks: int = 0
    speculative_blocks: int = 0
    page_size_padded: int | None = None

    spec_type: ClassVar[str] = "MambaSpec"
    kind: ClassVar[str] = "mamba"
    base_type: ClassVar[str] = "mamba"

    @property
    def state_bytes(self) -> int:
        total = 0
        for shape, size in zip(self.shapes, self.dtype_bytes, strict=True):
            elements = 1
            for dim in shape:
                elements *= dim
            total += elements * size
        return total

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded if self.page_size_padded is not None else self.state_bytes

    def max_memory_usage_bytes(self, limits: RequestLimits) -> int:
        if limits.mamba_cache_mode == "all":
            return cdiv(limits.max_model_len, self.block_size) * self.page_size_bytes
        if limits.mamba_cache_mode == "align":
            # The running state, the one being written, checkpoints and speculation.
            blocks = 2 + self.speculative_blocks + self.prefill_checkpoint_blocks
        else:
            blocks = 1 + self.speculative_blocks
        return blocks * self.page_size_bytes

    def blocks_per_request(self, limits: RequestLimits) -> int:
        return cdiv(self.max_memory_usage_bytes(limits), self.page_size_bytes)

    def with_block_size(self, block_size: int) -> MambaSpec:
        return replace(self, block_size=block_size)


KvCacheSpec = AttentionSpec | MambaSpec
