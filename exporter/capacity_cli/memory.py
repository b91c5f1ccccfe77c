"""The KV cache memory of one worker when only the GPU is known: an estimate with a range.

vLLM measures what it takes before the KV cache at start-up; kvcap models each term
(memory_formula.py) and gives the cache the rest of `total x gpu_memory_utilization`, where
total is what `torch.cuda.mem_get_info` reports, not nvidia-smi's figure. The exact paths
stay `--kv-cache-memory-bytes` (vLLM skips profiling) and `--num-gpu-blocks-override`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from exporter.capacity_cli.memory_formula import CUDAGRAPH_RELEASE, GIB, MIB, Term
from exporter.errors import UsageError

__all__ = ["GIB", "MIB"]

# vLLM's default --gpu-memory-utilization: 0.9, raised to 0.92 when CUDA graphs began to be
# counted before the KV cache (0.21; 0.18.1's engines report 0.9, 0.23.0's 0.92).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
RAISED_UTILIZATION = (0.92, CUDAGRAPH_RELEASE)


def default_gpu_memory_utilization(release: tuple[int, int, int]) -> float:
    value, since = RAISED_UTILIZATION
    return value if release >= since else DEFAULT_GPU_MEMORY_UTILIZATION


# Total memory per GPU as nvidia-smi reports it (MiB), by the names operators use.
GPU_MEMORY_MIB: Mapping[str, int] = {
    "H100 80GB": 81559,
    "H100 NVL": 95830,
    "H200": 143771,
    "H20": 97871,
    "B200": 183359,
    "A100 40GB": 40960,
    "A100 80GB": 81920,
    "L40S": 46068,
    "L40": 46068,
    "L4": 23034,
    "A10G": 23028,
    "RTX 4090": 24564,
    "RTX 3090": 24576,
    "RTX 5090": 32607,
    "A10": 23028,
}
# What `torch.cuda.mem_get_info` reports as total (GiB), the figure vLLM multiplies by the
# utilization: the `total_gpu_memory (...)` of vLLM's start-up logs and PyTorch's "GPU 0
# has a total capacity of ..." on each card (docs/capacity.md lists the sources). The
# driver keeps 0.4-0.7 GiB of nvidia-smi's total for itself.
GPU_USABLE_GIB: Mapping[str, float] = {
    "H100 80GB": 79.18,
    "H100 NVL": 93.10,
    "H200": 139.81,
    "H20": 95.00,
    "B200": 178.36,
    "A100 40GB": 39.39,
    "A100 80GB": 79.25,
    "L40S": 44.53,
    "L40": 44.40,
    "L4": 21.96,
    "A10G": 21.99,
    "RTX 4090": 23.64,
    "RTX 3090": 23.58,
    "RTX 5090": 31.37,
    "A10": 22.07,
}
# The compute capability of each (NVIDIA's CUDA GPU list; torch.cuda.get_device_capability):
# vLLM's platform picks attention backends by it (the MLA prefill from 0.26: Blackwell,
# major 10, tries four backends, every other GPU FlashAttention alone).
GPU_COMPUTE_CAPABILITY: Mapping[str, tuple[int, int]] = {
    "H100 80GB": (9, 0),
    "H100 NVL": (9, 0),
    "H200": (9, 0),
    "H20": (9, 0),
    "B200": (10, 0),
    "A100 40GB": (8, 0),
    "A100 80GB": (8, 0),
    "L40S": (8, 9),
    "L40": (8, 9),
    "L4": (8, 9),
    "A10G": (8, 6),
    "RTX 4090": (8, 9),
    "RTX 3090": (8, 6),
    "RTX 5090": (12, 0),
    "A10": (8, 6),
}
_ALIASES = {"H100": "H100 80GB", "H100 SXM": "H100 80GB", "H100 PCIE": "H100 80GB"}
_ALIASES |= {"H200 141GB": "H200", "B200 180GB": "B200", "L40S 48GB": "L40S"}
_ALIASES |= {"4090": "RTX 4090", "3090": "RTX 3090", "RTX 3090 TI": "RTX 3090"}


def _key(name: str) -> str:
    return re.sub(r"[\s_-]+", "", name).upper()


_BY_KEY = {_key(name): name for name in GPU_MEMORY_MIB} | {
    _key(alias): name for alias, name in _ALIASES.items()
}


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """The memory of one GPU as vLLM sees it, the table name it came from (None: given) and
    the GPU's compute capability (None: a size was given, the GPU is not known)."""

    total_bytes: int
    name: str | None
    compute_capability: tuple[int, int] | None = None

    def describe(self) -> str:
        size = f"{self.total_bytes / GIB:.2f} GiB"
        return (
            f"{self.name} ({size} as CUDA reports it, kvcap's GPU table)"
            if self.name
            else f"{size} (given)"
        )


def parse_gpu_memory(text: str) -> GpuMemory:
    """`80` or `79.6` (GiB, total per GPU), or a GPU name: `H100`, `H200`, `A100 40GB`."""
    stripped = text.strip().removesuffix("GiB").strip()
    try:
        gib = float(stripped)
    except ValueError:
        name = _BY_KEY.get(_key(text))
        if name is None:
            known = ", ".join(GPU_MEMORY_MIB)
            hint = " (A100 40GB or A100 80GB?)" if _key(text) == "A100" else ""
            raise UsageError(
                f"--gpu-memory {text!r}: not a size in GiB or a known GPU{hint}; known: {known}"
            ) from None
        return GpuMemory(int(GPU_USABLE_GIB[name] * GIB), name, GPU_COMPUTE_CAPABILITY[name])
    if not 0 < gib < 100_000:
        raise UsageError(f"--gpu-memory must be a positive number of GiB, got {text!r}")
    return GpuMemory(int(gib * GIB), None)


# How far the weights may be off, by where they came from: a checkpoint's byte count is
# close to what vLLM allocates (padding, fused or dropped tensors aside); a parameter
# count from config.json's shapes is rough.
WEIGHTS_SPREAD_EXACT = 0.03
WEIGHTS_SPREAD_ESTIMATED = 0.15


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """The estimate's terms, each per worker, so the output can show its arithmetic."""

    gpu: GpuMemory
    utilization: float
    weights_per_worker: int  # the binding worker's
    weights_source: str
    world_size: int
    terms: tuple[Term, ...]
    weights_exact: bool = True

    @property
    def budget_bytes(self) -> int:
        return math.ceil(self.gpu.total_bytes * self.utilization)

    @property
    def weights_range(self) -> tuple[int, int]:
        spread = WEIGHTS_SPREAD_EXACT if self.weights_exact else WEIGHTS_SPREAD_ESTIMATED
        return int(self.weights_per_worker * (1 - spread)), int(
            self.weights_per_worker * (1 + spread)
        )

    @property
    def other_bytes(self) -> int:
        return sum(term.bytes for term in self.terms)

    @property
    def kv_bytes(self) -> int:
        """The central estimate; negative when the weights and terms exceed the budget."""
        return self.budget_bytes - self.weights_per_worker - self.other_bytes

    @property
    def kv_range(self) -> tuple[int, int]:
        low_weights, high_weights = self.weights_range
        low = self.budget_bytes - high_weights - sum(term.high for term in self.terms)
        high = self.budget_bytes - low_weights - sum(term.low for term in self.terms)
        return low, high

    @property
    def weights_fit_the_gpu(self) -> bool:
        """vLLM loads the weights before it profiles: past the whole GPU it runs out of
        memory there (torch.OutOfMemoryError), whatever the utilization."""
        return self.weights_per_worker < self.gpu.total_bytes - CUDA_CONTEXT_BYTES

    def describe(self) -> str:
        low, high = self.kv_range
        terms = "; ".join(term.describe() for term in self.terms)
        return (
            f"estimate: {self.gpu.describe()} x {self.utilization:g} = "
            f"{self.budget_bytes / GIB:.2f} GiB, minus weights {self.weights_per_worker / GIB:.2f}"
            f" GiB per worker ({self.weights_source}), minus {terms}; "
            f"KV cache {_gib_or_none(self.kv_bytes)} (range {_gib_or_none(low)} to "
            f"{_gib_or_none(high)})"
        )


# The CUDA context and the driver's own allocations of one process (~0.5 GiB): outside
# vLLM's budget, but inside the GPU's total.
CUDA_CONTEXT_BYTES = int(0.5 * GIB)


def _gib_or_none(value: int) -> str:
    return f"{value / GIB:.2f} GiB" if value > 0 else "none"
