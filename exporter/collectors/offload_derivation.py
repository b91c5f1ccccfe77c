"""The offload tier released vLLM configures, cut into chunks, blocks and tokens by kvcap's
model of the release's offloading code (exporter/capacity/offload.py).

Released vLLM shows only the tier's size (`vllm:cache_config_info`'s `kv_offloading_size`);
with the engine's derived GPU plan (`--vllm.args` or the plugin's view) and the chunk size
of its `--kv-transfer-config`, the tier's chunks, blocks, tokens and per-group blocks follow.
A tier vLLM reports itself (`vllm:kv_offload_config_info`) is kept as it is.
"""

from __future__ import annotations

from exporter.capacity import CapacityResult, EngineCapacity
from exporter.capacity.offload import OffloadSettings, OffloadTierPlan, plan_offload
from exporter.capacity.offload_settings import native_settings, parse_transfer_config
from exporter.collectors.parsing import VllmServeArgs
from exporter.errors import KvcapError
from exporter.state import OffloadGroupBlocks, OffloadTier


def derive_offload(
    tiers: tuple[OffloadTier, ...],
    plan: CapacityResult | None,
    args: VllmServeArgs | None,
    version: str | None,
) -> tuple[OffloadTier, ...]:
    """Each configured CPU tier with its derived figures where the engine's plan is known;
    a tier that cannot be derived keeps the configured bytes only."""
    if plan is None or args is None:
        return tiers
    return tuple(_derived(tier, plan, args, version) for tier in tiers)


def _derived(
    tier: OffloadTier, plan: CapacityResult, args: VllmServeArgs, version: str | None
) -> OffloadTier:
    if tier.source != "cache_config_info" or tier.medium != "cpu" or not tier.capacity_bytes:
        return tier
    try:
        return cut_tier(
            plan.capacity,
            _settings(tier.capacity_bytes, args),
            world_size=(args.tensor_parallel_size or 1) * (args.pipeline_parallel_size or 1),
            tensor_parallel_size=args.tensor_parallel_size or 1,
            platform=plan.platform,
            version=version,
        )
    except KvcapError:
        return tier  # a release kvcap does not model, or a chunk size vLLM would refuse


def cut_tier(
    capacity: EngineCapacity,
    settings: OffloadSettings,
    *,
    world_size: int,
    tensor_parallel_size: int,
    platform: str,
    version: str | None,
) -> OffloadTier:
    """The tier `settings` give the engine `capacity` describes (derived from its settings,
    or vLLM's own plan as the plugin sent it), cut as the release's offloading code cuts it.
    Raises KvcapError where it cannot be: no GPU plan, a release or model kvcap does not
    model, a chunk size vLLM would refuse."""
    cut = plan_offload(
        capacity,
        settings,
        world_size=world_size,
        tensor_parallel_size=tensor_parallel_size,
        platform=platform,
        vllm_version=version,
    )
    return _as_tier(cut)


def _settings(cpu_bytes: int, args: VllmServeArgs) -> OffloadSettings:
    """The configured bytes with the chunk size of the engine's `--kv-transfer-config`, read
    as the planner reads it (a chunk size vLLM would refuse raises UsageError)."""
    transfer = args.kv_transfer_config
    return native_settings(cpu_bytes, None if transfer is None else parse_transfer_config(transfer))


def _as_tier(cut: OffloadTierPlan) -> OffloadTier:
    return OffloadTier(
        medium=cut.medium,
        capacity_tokens=cut.capacity_tokens,
        capacity_blocks=cut.num_blocks,
        capacity_bytes=cut.num_chunks * cut.kv_bytes_per_chunk,
        source="derived",
        groups=tuple(OffloadGroupBlocks(g.group, g.kind, g.blocks) for g in cut.groups),
    )
