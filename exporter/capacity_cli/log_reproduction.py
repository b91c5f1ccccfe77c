"""Each engine of a start-up log re-planned with its release's rules: the block count that
prints the logged lines, or the difference when none does (pure; no I/O)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from exporter.capacity import (
    CapacityResult,
    EngineSettings,
    capacity_tokens,
    derive_capacity,
)
from exporter.capacity.log_lines import log_lines, logged_tokens
from exporter.capacity.releases import RuleSet
from exporter.capacity.startup_log import EngineLines, StartupLog, WorkerMemory
from exporter.errors import CapacityError, DoesNotFit

GIB = 2**30
# vLLM prints GiB rounded to 2 decimals: the bytes behind "1.0 GiB" are within +-0.005 GiB.
GIB_ROUNDING = 0.005
# Block counts tried against the logged figures (0.01 GiB of 4 KiB blocks is 2,622).
MAX_CANDIDATES = 2_000_000


@dataclass(frozen=True, slots=True)
class Binding:
    """The worker whose KV memory decides the engine's block count, and why."""

    worker: str | None
    available_kv_gib: float | None
    reason: str


@dataclass(frozen=True, slots=True)
class EngineReproduction:
    """One engine: what it logged, the plan that prints it, and any difference."""

    logged: EngineLines
    binding: Binding
    result: CapacityResult | None  # the plan with the block count found (else kvcap's own)
    candidates: tuple[int, int] | None  # the block counts tried (from memory or concurrency)
    matching: tuple[int, int] | None  # the first and last block count that print the log
    expected_lines: tuple[str, ...]  # what kvcap prints for the chosen block count
    refusal: str | None = None  # kvcap's refusal where vLLM (or kvcap) refused
    differences: tuple[str, ...] = ()

    @property
    def reproduced(self) -> bool:
        return self.matching is not None and not self.differences


def own_workers(
    engine: EngineLines, workers: tuple[WorkerMemory, ...], engines: int
) -> tuple[WorkerMemory, ...]:
    """The workers of this engine that logged their KV cache memory."""
    return tuple(
        w
        for w in workers
        if w.available_kv_gib is not None and _engine_of(w, engines) in (engine.engine, None)
    )


def binding_worker(
    own: tuple[WorkerMemory, ...],
    engines: int,
    bytes_per_block_per_worker: tuple[int, ...],
    tensor_parallel_size: int,
) -> Binding:
    """The worker that holds the fewest blocks: vLLM plans every worker of an engine with
    that count (the minimum over workers); a worker's block is as large as its PP stage's."""
    if not own:
        return Binding(None, None, "no worker of this engine logged its KV cache memory")

    def page(worker: WorkerMemory) -> int:
        rank = worker_rank(worker.process, tensor_parallel_size)
        if rank is not None and rank < len(bytes_per_block_per_worker):
            return bytes_per_block_per_worker[rank]
        return max(bytes_per_block_per_worker)

    def blocks(worker: WorkerMemory) -> int:
        return int((worker.available_kv_gib or 0.0) * GIB) // page(worker)

    worker = min(own, key=blocks)
    if len(own) == 1:
        reason = "the only worker that logged its KV cache memory"
    else:
        others = ", ".join(
            f"{w.process or '(no prefix)'} {w.available_kv_gib} GiB ~{blocks(w):,} blocks"
            for w in own
            if w is not worker
        )
        unranked = engines > 1 and all(_engine_of(w, engines) is None for w in own)
        scope = (
            f"of all {len(own)} workers (their names carry no DP rank, so any engine's)"
            if unranked
            else f"of {len(own)} workers"
        )
        reason = (
            f"~{blocks(worker):,} blocks of {page(worker):,} bytes, the fewest {scope}; the "
            f"others: {others}; vLLM gives every worker of an engine the fewest"
        )
    return Binding(worker.process or "(no process prefix)", worker.available_kv_gib, reason)


def worker_rank(process: str, tensor_parallel_size: int) -> int | None:
    """A worker's rank (stage-major) from "rank=3", "Worker_PP1_TP0", "VllmWorker TP1"."""
    if match := re.search(r"\brank=(\d+)", process):
        return int(match[1])
    tp = re.search(r"TP(\d+)", process)
    pp = re.search(r"PP(\d+)", process)
    if tp is None and pp is None:
        return None
    return (int(pp[1]) if pp else 0) * tensor_parallel_size + (int(tp[1]) if tp else 0)


def _engine_of(worker: WorkerMemory, engines: int) -> int | None:
    match = re.search(r"DP(\d+)", worker.process)
    if match:
        return int(match[1])
    return 0 if engines == 1 else None  # a worker without a DP rank: any engine's


def reproduce_engine(
    config: Mapping[str, Any],
    settings: EngineSettings,
    rules: RuleSet,
    engine: EngineLines,
    workers: tuple[WorkerMemory, ...],
    *,
    engines: int,
    kv_memory_bytes: int | None,
    attention_block_size: int | None = None,
) -> EngineReproduction:
    """Find the block counts that print this engine's logged lines under `rules`."""
    if engine.max_model_len is not None and settings.max_model_len is None:
        settings = replace(settings, max_model_len=engine.max_model_len)
    override = engine.override[1] if engine.override else settings.num_gpu_blocks_override
    own = own_workers(engine, workers, engines)
    tp = settings.tensor_parallel_size
    binding = binding_worker(own, engines, (1,), tp)
    memory = _memory_interval(binding, kv_memory_bytes)
    try:
        if override is not None:
            base = derive_capacity(config, settings, num_gpu_blocks=override)
        elif memory is not None:
            base = derive_capacity(
                config, settings, available_kv_bytes_per_worker=(memory[0] + memory[1]) // 2
            )
        else:
            base = _from_concurrency(config, settings, engine)
    except DoesNotFit as refusal:
        return EngineReproduction(
            engine,
            binding,
            None,
            None,
            None,
            (),
            refusal=" ".join(str(refusal).split()),
            differences=(f"kvcap refuses to plan this engine, which vLLM started: {refusal}",),
        )
    worker_bytes = base.capacity.bytes_per_block_per_worker
    binding = binding_worker(own, engines, worker_bytes, tp)
    memory = _memory_interval(binding, kv_memory_bytes)
    per_request = _per_request(base)
    bound = [w for w in own if (w.process or "(no process prefix)") == binding.worker]
    bytes_per_block = max(worker_bytes)
    if bound and (rank := worker_rank(bound[0].process, tp)) is not None:
        bytes_per_block = worker_bytes[rank % len(worker_bytes)]
    if override is not None:
        low = high = override
    elif memory is not None:
        low, high = memory[0] // bytes_per_block, memory[1] // bytes_per_block
    else:
        low, high = _concurrency_interval(engine, per_request)
    dcp = settings.decode_context_parallel_size
    found = _matching_blocks(rules, base, engine, per_request, (low, high), dcp=dcp)
    if found is None:
        return EngineReproduction(
            engine,
            binding,
            base,
            (low, high),
            None,
            base.log_lines,
            differences=_differences(
                engine,
                base,
                _matching_blocks(
                    rules,
                    base,
                    engine,
                    per_request,
                    _concurrency_interval(engine, per_request),
                    dcp=dcp,
                ),
                bytes_per_block,
            )
            + _attention_block_difference(attention_block_size, base),
        )
    base_blocks = base.figures.num_gpu_blocks
    chosen = _closest(found, base_blocks)
    result = (
        derive_capacity(config, settings, num_gpu_blocks=chosen) if chosen != base_blocks else base
    )
    differences = _group_differences(engine, result) + _attention_block_difference(
        attention_block_size, result
    )
    if engine.num_blocks is not None and not found[0] <= engine.num_blocks <= found[1]:
        differences += (
            f"vLLM logged {engine.num_blocks:,} blocks; its capacity lines need "
            f"{found[0]:,}..{found[1]:,} under kvcap's plan",
        )
    return EngineReproduction(
        engine, binding, result, (low, high), found, result.log_lines, differences=differences
    )


def _per_request(result: CapacityResult) -> int:
    # The release's blocks per request (its formula may differ from the per-group sum).
    known = result.figures
    return round(known.num_gpu_blocks / known.kv_cache_max_concurrency)


def _memory_interval(binding: Binding, exact: int | None) -> tuple[int, int] | None:
    if exact is not None:
        return exact, exact
    if binding.available_kv_gib is None:
        return None
    low = max(0.0, binding.available_kv_gib - GIB_ROUNDING)
    return math.ceil(low * GIB), math.floor((binding.available_kv_gib + GIB_ROUNDING) * GIB)


def _from_concurrency(
    config: Mapping[str, Any], settings: EngineSettings, engine: EngineLines
) -> CapacityResult:
    """No KV memory in the log: plan with one block to learn blocks per request, then with
    the block count the logged concurrency stands for."""
    if engine.max_concurrency is None:
        raise CapacityError("the log gives neither the KV cache memory nor the concurrency")
    probe = derive_capacity(config, settings, num_gpu_blocks=10**9)
    per_request = _per_request(probe)
    blocks = max(1, round(engine.max_concurrency * per_request))
    return derive_capacity(config, settings, num_gpu_blocks=blocks)


def _concurrency_interval(engine: EngineLines, per_request: int) -> tuple[int, int]:
    concurrency = engine.max_concurrency or 0.0
    return (
        max(1, math.floor((concurrency - 0.005) * per_request)),
        math.ceil((concurrency + 0.005) * per_request),
    )


def _expected(
    rules: RuleSet, base: CapacityResult, per_request: int, blocks: int, dcp: int
) -> tuple[str, ...]:
    concurrency = blocks / per_request
    max_model_len, groups = base.figures.max_model_len, base.capacity.groups
    tokens = logged_tokens(
        rules,
        capacity_tokens=capacity_tokens(blocks, per_request, max_model_len),
        num_blocks=blocks,
        num_groups=len(groups),
        min_block_size=min(g.block_size for g in groups),
        context_parallel_size=dcp,
    )
    return log_lines(
        rules,
        platform=base.platform,
        tokens=tokens,
        max_model_len=max_model_len,
        concurrency=concurrency,
    )


def capacity_lines(engine: EngineLines) -> tuple[str, ...]:
    """The logged lines that state the size and the concurrency."""
    return tuple(
        line for line in engine.lines if "KV cache size" in line or "Maximum concurrency" in line
    )


def _matching_blocks(
    rules: RuleSet,
    base: CapacityResult,
    engine: EngineLines,
    per_request: int,
    interval: tuple[int, int],
    *,
    dcp: int,
) -> tuple[int, int] | None:
    low, high = interval
    logged = capacity_lines(engine)
    if not logged or high - low > MAX_CANDIDATES:
        return None
    matches = [
        n
        for n in range(max(low, 1), high + 1)
        if _expected(rules, base, per_request, n, dcp) == logged
    ]
    return (matches[0], matches[-1]) if matches else None


def _closest(found: tuple[int, int], blocks: int) -> int:
    return min(max(blocks, found[0]), found[1])


def _differences(
    engine: EngineLines,
    base: CapacityResult,
    by_concurrency: tuple[int, int] | None,
    bytes_per_block: int,
) -> tuple[str, ...]:
    logged, planned = capacity_lines(engine), base.figures
    if by_concurrency is not None:
        low, high = by_concurrency
        return (
            f"the logged lines are printed by {low:,}..{high:,} blocks ("
            f"{low * bytes_per_block / GIB:.3f}..{high * bytes_per_block / GIB:.3f} GiB at "
            f"{bytes_per_block:,} bytes per block), not by the logged KV cache memory "
            f"(kvcap plans {planned.num_gpu_blocks:,} blocks: {' | '.join(base.log_lines)})",
            *_group_differences(engine, base),
        )
    lines = [
        f"vLLM logged: {' | '.join(logged) or '(no capacity line)'}",
        f"kvcap plans: {' | '.join(base.log_lines)}",
    ]
    if engine.max_model_len is not None and engine.max_model_len != planned.max_model_len:
        lines.append(
            f"max_model_len: vLLM {engine.max_model_len:,}, kvcap {planned.max_model_len:,}"
        )
    return (*lines, *_group_differences(engine, base))


def _group_differences(engine: EngineLines, result: CapacityResult) -> tuple[str, ...]:
    if not engine.group_block_sizes:
        return ()
    planned = tuple(g.block_size for g in result.capacity.groups)
    if planned == engine.group_block_sizes:
        return ()
    return (f"kv cache group sizes: vLLM {engine.group_block_sizes}, kvcap {planned}",)


def _attention_block_difference(logged: int | None, result: CapacityResult) -> tuple[str, ...]:
    planned = [g.block_size for g in result.capacity.groups if g.kind == "full_attention"]
    if logged is None or not planned or planned[0] == logged:
        return ()
    return (f"attention block size: vLLM set {logged} tokens, kvcap plans {planned[0]}",)


def engines_of(log: StartupLog) -> tuple[EngineLines, ...]:
    """The engines that printed a capacity figure."""
    return tuple(
        e
        for e in log.engines
        if e.kv_cache_size_tokens is not None or e.max_concurrency is not None
    )
