"""vLLM's MLA attention backend choice on CUDA up to 0.17: a latent other than 576 is refused.

Every MLA attention backend of 0.11 to 0.17 takes one head size, DeepSeek's latent of 576
(`kv_lora_rank` 512 + `qk_rope_head_dim` 64: MLACommonBackend.get_supported_head_sizes), so
CudaPlatform's backend choice (platforms/cuda.py get_attn_backend_cls, get_valid_backends)
finds none for another and raises a ValueError naming each backend it tried with its
reasons (`validate_configuration`, in its order: head size, ..., sparse, compute capability).
0.18 adds 320 and Triton MLA takes any.

Composed for what the records show (a bfloat16 or float16 model, `--kv-cache-dtype auto`, no
indexer); other KV dtypes, float32 and sparse models keep kvcap's other answers. FlashInfer
is installed (the CUDA wheel depends on it), so FLASHINFER_MLA gives its own reasons.
"""

from __future__ import annotations

from exporter.capacity.hf_config import HfConfig
from exporter.capacity.mla_prefill import BLACKWELL_MAJOR, HOPPER, MLA_DTYPES
from exporter.capacity.platforms import FLASHMLA_BLOCK, PlatformRules
from exporter.capacity.releases import RuleSet
from exporter.capacity.settings import EngineSettings
from exporter.errors import UnsupportedConfiguration

_LATENT = 576
# The backends tried, in order (platforms/cuda.py _get_backend_priorities, non-sparse MLA),
# and the compute capability majors each takes (`supports_compute_capability`; None: any).
_HOPPER_ORDER = ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", "FLASHMLA_SPARSE")
_BLACKWELL_ORDER = (
    "CUTLASS_MLA",
    "FLASHINFER_MLA",
    "FLASH_ATTN_MLA",
    "FLASHMLA",
    "TRITON_MLA",
    "FLASHMLA_SPARSE",
)
_MAJORS: dict[str, frozenset[int] | None] = {
    "CUTLASS_MLA": frozenset({10}),
    "FLASHINFER_MLA": frozenset({10}),
    "FLASH_ATTN_MLA": frozenset({9}),
    "FLASHMLA": frozenset({9, 10}),
    "TRITON_MLA": None,
    "FLASHMLA_SPARSE": frozenset({9, 10}),
}
_SPARSE_BACKEND = "FLASHMLA_SPARSE"


def refuse_mla_latent(
    hf: HfConfig, settings: EngineSettings, platform: PlatformRules, release: RuleSet
) -> None:
    """Raise the release's refusal of an MLA latent no attention backend takes."""
    words = release.cuda_mla_latent_words
    if words == "none" or platform.is_cpu or not hf.is_mla or hf.has("index_topk"):
        return
    if not (hf.has("kv_lora_rank") and hf.has("qk_rope_head_dim")):
        return
    latent = hf.get_int("kv_lora_rank") + hf.get_int("qk_rope_head_dim")
    dtype = hf.model_dtype(settings.dtype)
    if latent == _LATENT or dtype not in MLA_DTYPES or settings.kv_cache_dtype != "auto":
        return
    capability = settings.cuda_compute_capability or HOPPER
    order = _BLACKWELL_ORDER if capability[0] == BLACKWELL_MAJOR else _HOPPER_ORDER
    reasons = ", ".join(f"{name}: [{', '.join(_reasons(name, capability))}]" for name in order)
    kv = settings.kv_cache_dtype
    if words == "fields":
        block = _block_asked(settings, release)
        config = (
            f"head_size: {latent}, dtype: torch.{dtype}, kv_cache_dtype: {kv}, "
            f"block_size: {block}, use_mla: True, has_sink: False, use_sparse: False"
        )
    else:
        quant = "use_per_head_quant_scales=False, " if words == "selector_quant" else ""
        attn_type = "decoder" if words == "selector_config" else "AttentionType.DECODER"
        config = (
            f"AttentionSelectorConfig(head_size={latent}, dtype=torch.{dtype}, "
            f"kv_cache_dtype={kv}, block_size=None, use_mla=True, has_sink=False, "
            f"use_sparse=False, use_mm_prefix=False, {quant}attn_type={attn_type})"
        )
    raise UnsupportedConfiguration(
        f"No valid attention backend found for cuda with {config}. Reasons: {{{reasons}}}.",
        vllm_error_type="ValueError",
    )


def _reasons(backend: str, capability: tuple[int, int]) -> list[str]:
    """One backend's `validate_configuration` reasons for a non-576 latent."""
    reasons = ["head_size not supported"]
    if backend == _SPARSE_BACKEND:
        reasons.append("non-sparse not supported")
    majors = _MAJORS[backend]
    if majors is not None and capability[0] not in majors:
        reasons.append("compute capability not supported")
    return reasons


def _block_asked(settings: EngineSettings, release: RuleSet) -> int:
    """The block size the platform set before the backend choice (0.11, 0.12): FlashMLA's 64,
    or --block-size where it is a multiple of it."""
    block = settings.block_size
    if release.cuda_mla_block == "flashmla_64" or block is None or block % FLASHMLA_BLOCK:
        return FLASHMLA_BLOCK
    return block
