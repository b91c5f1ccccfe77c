"""A start-up that vLLM refused, or that stopped after logging its KV cache memory,
re-planned with that memory: kvcap's refusal next to vLLM's, figure by figure (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.capacity import EngineSettings, derive_capacity
from exporter.capacity.startup_log import StartupLog
from exporter.capacity_cli.log_reproduction import GIB, Binding, binding_worker
from exporter.errors import CapacityError, DoesNotFit


@dataclass(frozen=True, slots=True)
class RefusalReproduction:
    """A start-up vLLM refused (or that died after logging its KV memory), re-planned."""

    binding: Binding
    vllm_refusal: str | None
    kvcap_refusal: str | None
    kvcap_plan: tuple[str, ...]  # the lines kvcap would print where it does not refuse
    differences: tuple[str, ...]

    @property
    def reproduced(self) -> bool:
        return self.kvcap_refusal is not None and not self.differences


# The figures of vLLM's refusal, as every release from 0.10 words it.
_REFUSAL_FIGURES = {
    "max_model_len": re.compile(r"max seq len \((\d+)\)"),
    "needed GiB": re.compile(r"\(([\d.]+) GiB KV cache is needed"),
    "available GiB": re.compile(r"available KV cache memory \(([-\d.]+) GiB\)"),
    "estimated max_model_len": re.compile(r"estimated maximum model length is (\d+)"),
}


def reproduce_refusal(
    config: Mapping[str, Any],
    settings: EngineSettings,
    log: StartupLog,
    *,
    kv_memory_bytes: int | None,
) -> RefusalReproduction:
    """Re-plan with the least KV memory a worker logged: does kvcap refuse as vLLM did?"""
    own = tuple(w for w in log.workers if w.available_kv_gib is not None)
    binding = binding_worker(own, 1, (1,), settings.tensor_parallel_size)
    vllm_refusal = log.refusals[0] if log.refusals else None
    if kv_memory_bytes is None and binding.available_kv_gib is None:
        raise CapacityError(
            "the log shows a refusal but no worker's KV cache memory: nothing to re-plan with"
        )
    memory = kv_memory_bytes or round((binding.available_kv_gib or 0.0) * GIB)
    try:
        result = derive_capacity(config, settings, available_kv_bytes_per_worker=memory)
    except DoesNotFit as refusal:
        kvcap = " ".join(str(refusal).split())
        return RefusalReproduction(
            binding, vllm_refusal, kvcap, (), _refusal_differences(vllm_refusal, kvcap)
        )
    return RefusalReproduction(
        binding,
        vllm_refusal,
        None,
        result.log_lines,
        (f"kvcap plans this engine with {memory / GIB:.2f} GiB; vLLM did not start",),
    )


def _refusal_differences(vllm: str | None, kvcap: str) -> tuple[str, ...]:
    if vllm is None:
        return ()
    differences = []
    for name, pattern in _REFUSAL_FIGURES.items():
        theirs, ours = pattern.search(vllm), pattern.search(kvcap)
        if theirs is not None and (ours is None or ours[1] != theirs[1]):
            differences.append(f"{name}: vLLM {theirs[1]}, kvcap {ours[1] if ours else 'none'}")
    return tuple(differences)
