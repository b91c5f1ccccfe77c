"""vLLM's MLA prefill backend choice on CUDA: a model whose head dims no backend takes is refused.

Read in each release's `v1/attention/backends/mla/prefill/` (0.24.0 to 0.31.0: `selector.py`
`_get_mla_prefill_backend_priorities`, `_auto_select_mla_prefill_backend`; 0.32.0:
`platforms/interface.py` `Platform.get_mla_prefill_backend_cls`) and the backends'
`validate_configuration` (`base.py`): every backend the GPU's compute capability lists is
tried in order, and where none is valid the release raises a ValueError naming each one with
its reasons. Off Blackwell (compute capability major 10) FlashAttention is the only one tried.

What kvcap cannot know is answered as a stock CUDA wheel install has it: FlashInfer installed
(a dependency of vLLM's CUDA wheel: the TRT-LLM ragged and FlashInfer prefills are
available), `tokenspeed_mla` not (no requirement of vLLM's names it; its backend asks for it
by an install hint).
"""

from __future__ import annotations

from exporter.capacity.hf_config import HfConfig
from exporter.capacity.platforms import PlatformRules
from exporter.capacity.releases import MlaDims, RuleSet
from exporter.capacity.settings import EngineSettings
from exporter.errors import UnsupportedConfiguration

# The GPU kvcap's CUDA platform plans for when none is named: an H100-class GPU.
HOPPER = (9, 0)
BLACKWELL_MAJOR = 10
# The dtypes every MLA prefill backend takes (base.py MLAPrefillBackend.supported_dtypes),
# as every MLA attention backend does (mla_latent).
MLA_DTYPES = frozenset({"float16", "bfloat16"})
# The other backends Blackwell tries after FlashAttention, and the dims each takes
# (`supported_mla_dimensions`, the same in 0.26.0 and 0.32.0).
_DEEPSEEK: MlaDims = (128, 64, 128)
_GLM5: MlaDims = (192, 64, 256)
_TRTLLM_RAGGED_DIMS = (_DEEPSEEK, _GLM5)
_FLASHINFER_DIMS = (_DEEPSEEK,)
_TOKENSPEED_DIMS = (_DEEPSEEK,)
_TOKENSPEED_HINT = (
    "tokenspeed_mla package is not installed. Install it with: `uv pip install tokenspeed-mla`"
)
_DIM_NAMES = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def refuse_mla_prefill(
    hf: HfConfig, settings: EngineSettings, platform: PlatformRules, release: RuleSet
) -> None:
    """Raise the release's refusal when no MLA prefill backend on the engine's GPU takes the
    model's head dims; nothing before 0.24, on CPU, or for other models. A dtype no backend
    takes (float32) is refused first by the MLA attention backend's own choice, which the
    layer makes before its prefill backend (layer_specs.py)."""
    if not release.cuda_mla_prefill_selector or platform.is_cpu or not hf.is_mla:
        return
    if hf.has("index_topk") and release.cuda_sparse_mla_without_prefill:
        return  # sparse MLA (DeepSeek-V3.2, GLM-5): without a prefill backend it uses top-k MQA
    dims = _mla_dims(hf)
    dtype = hf.model_dtype(settings.dtype)
    if dims is None or dtype not in MLA_DTYPES:
        return
    capability = settings.cuda_compute_capability or HOPPER
    message = selector_refusal(dtype, dims, capability, release)
    if message is not None:
        raise UnsupportedConfiguration(message, vllm_error_type="ValueError")


def selector_refusal(
    dtype: str, dims: MlaDims, capability: tuple[int, int], release: RuleSet
) -> str | None:
    """The release's MLA prefill selector on a GPU: None where a backend takes the model's
    dtype and head dims, else its ValueError's message."""
    accepted = release.cuda_mla_prefill_fa_dims or (dims,)  # (): FlashAttention takes any
    reasons = {"FLASH_ATTN": _reasons(dtype, dims, accepted, listed=False)}
    if capability[0] == BLACKWELL_MAJOR:
        reasons["TRTLLM_RAGGED"] = _reasons(dtype, dims, _TRTLLM_RAGGED_DIMS)
        reasons["FLASHINFER"] = _reasons(dtype, dims, _FLASHINFER_DIMS)
        reasons["TOKENSPEED_MLA"] = _reasons(
            dtype, dims, _TOKENSPEED_DIMS, missing_package=_TOKENSPEED_HINT
        )
    if any(not found for found in reasons.values()):
        return None  # a backend takes it
    shown = ", ".join(f"{name}: [{', '.join(found)}]" for name, found in reasons.items())
    return (
        f"No valid MLA prefill backend found with MLAPrefillSelectorConfig(dtype=torch.{dtype}, "
        f"mla_dimensions={_shown(dims)}). Reasons: {{{shown}}}."
    )


def _mla_dims(hf: HfConfig) -> MlaDims | None:
    """The three head dims, None where config.json lacks one (the config class's own default
    then decides, which kvcap does not read)."""
    if not all(hf.has(name) for name in _DIM_NAMES):
        return None
    nope, rope, v = (hf.get_int(name) for name in _DIM_NAMES)
    return nope, rope, v


def _reasons(
    dtype: str,
    dims: MlaDims,
    accepted: tuple[MlaDims, ...],
    *,
    listed: bool = True,
    missing_package: str | None = None,
) -> list[str]:
    """One backend's `validate_configuration` reasons, in its order: compute capability
    (every backend tried on a GPU takes it), dtype, a package not installed, dims.
    FlashAttention checks its dims in code, so its reason lists none (`listed=False`); the
    others name their `supported_mla_dimensions`."""
    reasons = [] if dtype in MLA_DTYPES else [f"dtype torch.{dtype} not supported"]
    if missing_package is not None:
        reasons.append(missing_package)
    if dims not in accepted:
        supported = "; supported: " + ", ".join(map(_shown, accepted)) if listed else ""
        reasons.append(
            f"Model does not have supported MLA dimensions (got {_shown(dims)}{supported})"
        )
    return reasons


def _shown(dims: MlaDims) -> str:
    """MLADimensions.__str__."""
    named = (f"{name}={value}" for name, value in zip(_DIM_NAMES, dims, strict=True))
    return "(" + ", ".join(named) + ")"
