"""Which GPU each engine worker runs on, and how many tokens free GPU memory would add."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from exporter.capacity import EngineCapacity, capacity_tokens
from exporter.state.records import GpuReport, engine_number
from exporter.state.snapshot import EngineGpu, EngineView


def map_engine_gpus(
    engines: Sequence[EngineView], gpus: Sequence[GpuReport]
) -> tuple[EngineGpu, ...]:
    """vLLM's rule (mp backend): engine k of a node with W workers per engine uses the
    logical GPUs k*W .. k*W+W-1 of CUDA_VISIBLE_DEVICES; `gpus` is in that order.

    When a collector knows the engine's own CUDA_VISIBLE_DEVICES entries, those name the
    physical GPUs (by index or UUID) instead of the sidecar's view.
    """
    by_name = {gpu.uuid: gpu for gpu in gpus} | {gpu.index: gpu for gpu in gpus}
    # A lost GPU is left out of the list, so positions come from visible_index when set.
    by_logical = {
        gpu.visible_index if gpu.visible_index is not None else position: gpu
        for position, gpu in enumerate(gpus)
    }
    mapped: list[EngineGpu] = []
    for view in engines:
        workers = view.world_size or len(view.capacity.bytes_per_block_per_worker)
        if not workers:
            continue
        local = view.local_rank if view.local_rank is not None else engine_number(view.engine)
        if local is None:
            continue
        # Only workers that can land on a known GPU are walked: a bogus worker count from
        # some collector must not turn this into a long loop under the store's lock.
        known = len(view.devices) if view.devices else max(by_logical, default=-1) + 1
        for worker in range(max(0, min(workers, known - local * workers))):
            logical = local * workers + worker
            gpu: GpuReport | None
            if view.devices:
                name = view.devices[logical] if logical < len(view.devices) else None
                gpu = by_name.get(name) if name is not None else None
            else:
                gpu = by_logical.get(logical)
            if gpu is not None:
                mapped.append(EngineGpu(view.engine, view.model_name, worker, gpu.index, gpu.uuid))
    return tuple(mapped)


def headroom_tokens(
    engines: Sequence[EngineView], engine_gpus: Sequence[EngineGpu], gpus: Sequence[GpuReport]
) -> dict[str, int]:
    """Tokens each engine would gain if its most constrained GPU's free memory became KV
    cache: extra blocks = min over its workers of free bytes // bytes per block there."""
    free = {gpu.index: gpu.memory_free_bytes for gpu in gpus}
    workers_of: dict[str, list[EngineGpu]] = {}
    for entry in engine_gpus:
        workers_of.setdefault(entry.engine, []).append(entry)
    result: dict[str, int] = {}
    for view in engines:
        capacity = view.capacity
        extra = _extra_blocks(capacity, workers_of.get(view.engine, []), free)
        blocks, per_request, length = (
            capacity.num_gpu_blocks,
            capacity.blocks_per_request,
            capacity.max_model_len,
        )
        if extra is None or blocks is None or not per_request or not length:
            continue
        more = capacity_tokens(blocks + extra, per_request, length)
        result[view.engine] = more - capacity_tokens(blocks, per_request, length)
    return result


def _extra_blocks(
    capacity: EngineCapacity, workers: Sequence[EngineGpu], free: Mapping[str, int]
) -> int | None:
    """Blocks the free memory of the engine's most constrained GPU would hold."""
    per_worker = capacity.bytes_per_block_per_worker
    if not workers or capacity.num_gpu_blocks is None or not per_worker:
        return None
    if len(workers) != len(per_worker):
        return None  # a worker's GPU is unknown or lost: no figure rather than a wrong one
    blocks = []
    for entry in workers:
        if (
            entry.worker >= len(per_worker)
            or entry.gpu not in free
            or per_worker[entry.worker] <= 0
        ):
            return None
        blocks.append(free[entry.gpu] // per_worker[entry.worker])
    return min(blocks)
