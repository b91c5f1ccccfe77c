"""The offload tier under the GPU plan: `--kv-offloading-size`, `--kv-transfer-config` and
LMCache's `LMCACHE_*` variables of the planned command line, as text and JSON."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from exporter.capacity import CapacityResult, EngineSettings
from exporter.capacity.offload import GIB, OffloadTierPlan, plan_engine_offload
from exporter.capacity.offload_settings import (
    offload_settings,
    parse_transfer_config,
    uses_lmcache,
)
from exporter.collectors.parsing import VllmServeArgs
from exporter.errors import ConfigError, UsageError

# LMCache's local CPU backend settings kvcap reads (its documented defaults: 5.0 GB of
# pinned CPU memory per worker, 256-token chunks, the CPU backend on).
LMCACHE_NUMBERS: Final = {"LMCACHE_MAX_LOCAL_CPU_SIZE": 5.0, "LMCACHE_CHUNK_SIZE": 256.0}
LMCACHE_SWITCHES: Final = ("LMCACHE_LOCAL_CPU",)
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


@dataclass(frozen=True, slots=True)
class LmcacheTier:
    """LMCache's local CPU tier as its variables set it; LMCache sizes it itself, per worker."""

    local_cpu: bool
    max_local_cpu_size_gb: float
    chunk_size: int


EngineTier = OffloadTierPlan | LmcacheTier


def check_offload_flags(vllm: VllmServeArgs, host_memory_bytes: int | None) -> None:
    """Refuse bad offload flags before anything is planned (UsageError: exit 2)."""
    transfer = _transfer(vllm)
    offload_settings(
        size_gib=vllm.kv_offloading_size,
        backend=vllm.kv_offloading_backend,
        transfer_config=transfer,
        host_memory_bytes=host_memory_bytes,
    )
    if uses_lmcache(backend=vllm.kv_offloading_backend, transfer_config=transfer):
        _lmcache(vllm)


def engine_tier(
    vllm: VllmServeArgs, settings: EngineSettings, result: CapacityResult
) -> EngineTier | None:
    """The engine's offload tier, or None when the command line gives it none."""
    transfer = _transfer(vllm)
    if uses_lmcache(backend=vllm.kv_offloading_backend, transfer_config=transfer):
        return _lmcache(vllm)
    tier = offload_settings(
        size_gib=vllm.kv_offloading_size,
        backend=vllm.kv_offloading_backend,
        transfer_config=transfer,
    )
    if tier is None:
        return None
    try:
        return plan_engine_offload(result.capacity, settings, tier)
    except ConfigError as error:
        raise UsageError(f"--kv-transfer-config: {error}") from None


def tier_document(tier: EngineTier | None) -> dict[str, Any] | None:
    """The tier in `capacity --json` (`result.offload`)."""
    if tier is None:
        return None
    if isinstance(tier, LmcacheTier):
        return {
            "backend": "lmcache",
            "medium": "cpu",
            "local_cpu": tier.local_cpu,
            "max_local_cpu_size_gb_per_worker": tier.max_local_cpu_size_gb,
            "chunk_size": tier.chunk_size,
            "capacity_tokens": None,
        }
    return {
        "backend": tier.backend,
        "medium": tier.medium,
        "vllm_rules": tier.rules_release,
        "cpu_bytes": tier.cpu_bytes,
        "worker_kv_bytes_per_block": tier.worker_kv_bytes_per_block,
        "copies_per_chunk": tier.copies,
        "blocks_per_chunk": tier.blocks_per_chunk,
        "kv_bytes_per_chunk": tier.kv_bytes_per_chunk,
        "num_chunks": tier.num_chunks,
        "num_blocks": tier.num_blocks,
        "prefix_len": tier.prefix_len,
        "capacity_tokens": tier.capacity_tokens,
        "stored_tokens": tier.stored_tokens,
        "groups": [
            {
                "group": g.group,
                "kind": g.kind,
                "tokens_per_chunk": g.tokens_per_chunk,
                "window_chunks": g.window_chunks,
                "blocks": g.blocks,
            }
            for g in tier.groups
        ],
    }


def tier_lines(tier: EngineTier | None) -> list[str]:
    """The tier under the GPU plan, in the report's words."""
    if tier is None:
        return []
    if isinstance(tier, LmcacheTier):
        state = "on" if tier.local_cpu else "off (LMCACHE_LOCAL_CPU)"
        return [
            "",
            f"offload tier (LMCache, cpu): local CPU backend {state}, "
            f"{tier.max_local_cpu_size_gb:g} GB per worker, {tier.chunk_size}-token chunks; "
            "LMCache sizes it itself: no token figure (kvcap does not model LMCache's allocator)",
        ]
    lines = [
        "",
        f"offload tier (native, {tier.medium}; offloading code of vLLM {tier.rules_release}+): "
        f"{tier.cpu_bytes / GIB:g} GiB -> {tier.num_chunks:,} chunks of "
        f"{tier.blocks_per_chunk} block(s), {tier.kv_bytes_per_chunk:,} bytes each "
        f"({tier.copies} worker cop{'y' if tier.copies == 1 else 'ies'} per chunk)",
        f"offload tier tokens: {tier.capacity_tokens:,} (prefixes of {tier.prefix_len:,} "
        "tokens, each with the chunks every group needs for a hit)",
    ]
    if tier.stored_tokens != tier.capacity_tokens:
        lines.append(
            f"  vLLM's own stores: {tier.stored_tokens:,} tokens (a chunk of each of the "
            f"{len(tier.groups)} groups for every chunk of a prefix, windows included)"
        )
    return lines


def tier_rows(tier: EngineTier | None) -> list[Sequence[str]]:
    """The native tier's groups as table rows (header first); none for LMCache."""
    if tier is None or isinstance(tier, LmcacheTier):
        return []
    header: Sequence[str] = ("offload group", "kind", "tokens/chunk", "window chunks", "blocks")
    return [header] + [
        (
            str(g.group),
            g.kind,
            str(g.tokens_per_chunk),
            "-" if g.window_chunks is None else str(g.window_chunks),
            f"{g.blocks:,}",
        )
        for g in tier.groups
    ]


def _transfer(vllm: VllmServeArgs) -> dict[str, Any] | None:
    if vllm.kv_transfer_config is None:
        return None
    return parse_transfer_config(vllm.kv_transfer_config)


def _lmcache(vllm: VllmServeArgs) -> LmcacheTier:
    values = dict(vllm.lmcache_env)
    numbers = dict(LMCACHE_NUMBERS)
    for name in numbers:
        if name in values:
            try:
                number = float(values[name])
            except ValueError:
                number = math.nan
            if not math.isfinite(number) or number <= 0:
                raise UsageError(f"{name}: must be a positive number, got {values[name][:40]!r}")
            numbers[name] = number
    local = values.get("LMCACHE_LOCAL_CPU", "true").lower()
    if local not in _TRUE + _FALSE:
        raise UsageError(f"LMCACHE_LOCAL_CPU: must be true or false, got {local[:40]!r}")
    chunk = numbers["LMCACHE_CHUNK_SIZE"]
    if chunk != int(chunk):
        raise UsageError(f"LMCACHE_CHUNK_SIZE: must be a whole number of tokens, got {chunk:g}")
    return LmcacheTier(
        local_cpu=local in _TRUE,
        max_local_cpu_size_gb=numbers["LMCACHE_MAX_LOCAL_CPU_SIZE"],
        chunk_size=int(chunk),
    )
