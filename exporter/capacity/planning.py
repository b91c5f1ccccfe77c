"""Blocks per worker, the startup memory check, max_model_len auto-fit and the capacity figures."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from exporter.capacity.grouping import KvCacheGroup
from exporter.capacity.releases import MemoryCheckWording
from exporter.capacity.specs import RequestLimits
from exporter.errors import DoesNotFit

_DOCS = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."


def pipeline_stage_layers(num_layers: int, pp: int) -> list[range]:
    """Decoder layers of each PP stage; leftovers go to the stages before the last one."""
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    stages, start = [], 0
    for size in sizes:
        stages.append(range(start, start + size))
        start += size
    return stages


def bytes_per_block_per_stage(groups: Sequence[KvCacheGroup], stages: Sequence[range]) -> list[int]:
    """Bytes one block id takes on a worker of each stage: the fullest group decides,
    because all groups carve the same block ids out of one allocation."""
    return [
        max(
            (
                sum(
                    layer.spec.page_size_bytes
                    for layer in group.layers
                    if layer.decoder_index in stage
                )
                for group in groups
            ),
            default=0,
        )
        for stage in stages
    ]


def blocks_per_request(groups: Sequence[KvCacheGroup], limits: RequestLimits) -> int:
    return sum(group.blocks_per_request(limits) for group in groups)


def _gib(num_bytes: int, wording: MemoryCheckWording) -> str:
    # vLLM prints str(round(bytes / GiB, 2)): "16.0", "10.72"; before 0.14 f"{...:.2f}".
    if wording in ("two_decimals_no_link", "two_decimals"):
        return f"{num_bytes / 2**30:.2f}"
    return str(round(num_bytes / 2**30, 2))


def fit_max_model_len(needed_bytes: Callable[[int], int], available_bytes: int, upper: int) -> int:
    """The largest length in [1, upper] whose KV need fits, or 0 when not even 1 fits."""
    if needed_bytes(1) > available_bytes:
        return 0
    low, high = 1, upper
    while low < high:
        mid = (low + high + 1) // 2
        if needed_bytes(mid) <= available_bytes:
            low = mid
        else:
            high = mid - 1
    return low


def check_fits(
    *,
    max_model_len: int,
    usable_bytes: int,
    needed_bytes: Callable[[int], int],
    wording: MemoryCheckWording,
) -> None:
    """vLLM's startup check on one worker, on the bytes its release counts as usable."""
    notes_cpu_backend = wording == "cpu_note"  # the wording from vLLM 0.22 on
    docs = "" if wording == "two_decimals_no_link" else f" {_DOCS}"  # 0.13 on: the link
    if usable_bytes <= 0:
        flag_note = (
            " (this flag also controls CPU memory reservation on the CPU backend, despite its name)"
            if notes_cpu_backend
            else ""
        )
        raise DoesNotFit(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
            f"when initializing the engine{flag_note}.{docs}",
            available_bytes=usable_bytes,
        )
    needed = needed_bytes(max_model_len)
    if needed <= usable_bytes:
        return
    estimate = fit_max_model_len(needed_bytes, usable_bytes, max_model_len)
    hint = (
        f"Based on the available memory, the estimated maximum model length is {estimate}. "
        if estimate > 0
        else ""
    )
    if wording in ("two_decimals_no_link", "two_decimals") and not hint:
        hint = " "  # before 0.14 the message keeps the space after the missing estimate
    whose = "model's" if notes_cpu_backend else "models's"
    cpu_note = " (which also controls CPU memory on the CPU backend)" if notes_cpu_backend else ""
    raise DoesNotFit(
        f"To serve at least one request with the {whose} max seq len ({max_model_len}), "
        f"({_gib(needed, wording)} GiB KV cache is needed, which is larger than the available "
        f"KV cache memory ({_gib(usable_bytes, wording)} GiB). {hint}Try increasing "
        f"`gpu_memory_utilization`{cpu_note} or decreasing `max_model_len` when initializing "
        f"the engine.{docs}",
        max_model_len=max_model_len,
        needed_bytes=needed,
        available_bytes=usable_bytes,
        estimated_max_model_len=estimate,
    )


def auto_fit_failure() -> DoesNotFit:
    return DoesNotFit(
        "Cannot auto-fit max_model_len: not enough GPU memory available to serve even a "
        "single token. Try increasing `gpu_memory_utilization`."
    )
