"""The engine as vLLM configures it before planning: settings, model layers, Mamba mode."""

from __future__ import annotations

from dataclasses import dataclass, replace

from exporter.capacity import families
from exporter.capacity.config_refusals import refuse_layout, refuse_settings
from exporter.capacity.families import AttentionLayer, BuildContext, MambaLayer, ModelLayout
from exporter.capacity.hf_config import HfConfig
from exporter.capacity.platforms import PlatformRules
from exporter.capacity.releases import RuleSet
from exporter.capacity.settings import EngineSettings
from exporter.capacity.specs import MambaCacheMode
from exporter.errors import UnsupportedArchitecture, UnsupportedConfiguration

# Mamba layer kinds whose model classes cache Mamba prefixes (SupportsMambaPrefixCaching).
_MAMBA_PREFIX_CACHING = frozenset({"mamba1", "mamba2"})


@dataclass(frozen=True, slots=True)
class ResolvedEngine:
    """The engine's settings after the platform's and the release's adjustments."""

    hf: HfConfig
    settings: EngineSettings
    rules: PlatformRules
    release_rules: RuleSet
    derived_len: int
    max_model_len: int
    layout: ModelLayout
    family_name: str
    mode: MambaCacheMode
    hybrid_manager: bool

    @property
    def auto_fits(self) -> bool:
        """`--max-model-len -1` on a release that fits the length to the KV memory (0.14 on)."""
        fits = self.release_rules.max_model_len_minus_one == "auto_fit"
        return fits and self.settings.auto_fit_max_model_len


def resolve_engine(hf: HfConfig, settings: EngineSettings) -> ResolvedEngine:
    """Check the engine's settings and apply what the platform and the release change."""
    release = settings.release
    rules = settings.platform_rules
    refuse_settings(hf, settings, rules, release.rules)
    settings = _platform_settings(hf, settings, rules)

    derived_len = hf.default_max_model_len()
    max_model_len = _resolve_max_model_len(hf, settings, release.rules)
    layout, family_name, settings = _release_layout(hf, settings, release.rules)
    refuse_layout(hf, settings, layout, rules, release.rules)
    return ResolvedEngine(
        hf=hf,
        settings=settings,
        rules=rules,
        release_rules=release.rules,
        derived_len=derived_len,
        max_model_len=max_model_len,
        layout=layout,
        family_name=family_name,
        mode=_mamba_cache_mode(layout, settings, release.rules),
        hybrid_manager=_hybrid_manager_on(layout, settings, release.rules),
    )


def _mamba_cache_mode(
    layout: ModelLayout, settings: EngineSettings, release: RuleSet
) -> MambaCacheMode:
    """How a Mamba layer keeps its state: per block ("align", "all") only where prefix
    caching needs it, unless the engine names its mode."""
    mamba = [layer for layer in layout.layers if isinstance(layer, MambaLayer)]
    if not mamba:
        return "none"
    if settings.mamba_cache_mode is not None:
        return "align" if settings.mamba_cache_mode == "align" else "none"
    if settings.enable_prefix_caching is False or release.mamba_pages == "one":
        return "none"
    # Mamba1/Mamba2 models cache every block's state (SupportsMambaPrefixCaching).
    every_block = all(layer.mamba_type in _MAMBA_PREFIX_CACHING for layer in mamba)
    if release.prefix_caching_mamba_all and every_block:
        return "all"
    if release.mamba_pages == "per_block":
        return "none"  # the model class does not cache Mamba prefixes: prefix caching off
    return "align"


def _hybrid_manager_on(layout: ModelLayout, settings: EngineSettings, release: RuleSet) -> bool:
    """Whether each kind of layer gets its own KV cache groups (vLLM's config decides)."""
    if settings.disable_hybrid_kv_cache_manager:
        return False
    if settings.kv_events and release.kv_events_hybrid_off:
        return False
    chunked = any(
        isinstance(layer, AttentionLayer) and layer.attention_chunk_size is not None
        for layer in layout.layers
    )
    allowed = settings.chunked_local_attn_with_hybrid_kv_cache
    if allowed is None:
        allowed = not release.chunked_local_hybrid_off
    return not (chunked and not allowed)


def _release_layout(
    hf: HfConfig, settings: EngineSettings, release: RuleSet
) -> tuple[ModelLayout, str, EngineSettings]:
    """The model's layers, and the settings after the release's hybrid defaults: before
    0.28 a Mamba / linear-attention hybrid runs without prefix caching unless asked."""
    layout, family_name = _layout(hf, settings)
    hybrid = any(isinstance(layer, MambaLayer) for layer in layout.layers)
    if hybrid and settings.enable_prefix_caching is None and not release.hybrid_prefix_caching:
        settings = replace(settings, enable_prefix_caching=False)
        layout, family_name = _layout(hf, settings)
    return layout, family_name, settings


def _platform_settings(
    hf: HfConfig, settings: EngineSettings, rules: PlatformRules
) -> EngineSettings:
    """The settings after the platform's own overrides (its check_and_update_config)."""
    if hf.is_mla and rules.mla_disables_prefix_caching:
        settings = replace(settings, enable_prefix_caching=False)
    if rules.ssm_state_float32 and not (
        settings.mamba_ssm_cache_dtype in ("float16", "bfloat16")
        and "linear_attention" in (hf.str_list("layer_types") or [])
    ):
        # Only the accelerated gated-delta-net backend keeps a 16-bit SSM state.
        settings = replace(settings, mamba_ssm_cache_dtype="float32")
    return settings


def _resolve_max_model_len(hf: HfConfig, settings: EngineSettings, release: RuleSet) -> int:
    requested = settings.max_model_len
    if requested == -1 and release.max_model_len_minus_one == "planned_as_length":
        return -1  # 0.10 plans with it as it is (config_refusals)
    if requested is None or requested == -1:
        return hf.default_max_model_len()
    if not hf.allows_max_model_len(requested):
        raise UnsupportedConfiguration(
            f"User-specified max_model_len ({requested}) is greater than the derived "
            f"max_model_len ({hf.derived_max_model_len()}) in model's config.json. To allow "
            "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
        )
    return requested


def _layout(hf: HfConfig, settings: EngineSettings) -> tuple[ModelLayout, str]:
    family = families.lookup(hf.architecture)
    model_dtype = hf.model_dtype(settings.dtype)
    ctx = BuildContext(
        settings=settings,
        model_dtype=model_dtype,
        mamba_conv_dtype=(
            model_dtype if settings.mamba_cache_dtype == "auto" else settings.mamba_cache_dtype
        ),
        mamba_ssm_dtype_setting=settings.mamba_ssm_cache_dtype,
        prefix_caching=settings.enable_prefix_caching is not False,
    )
    if family is not None:
        return family.build(hf, ctx), family.name
    try:
        return families.generic(hf, ctx), "generic"
    except UnsupportedArchitecture as error:
        supported = ", ".join(
            f"{name} ({', '.join(archs)})" for name, archs in families.supported_families().items()
        )
        raise UnsupportedArchitecture(f"{error}. Supported families: {supported}") from None
