"""The KV cache memory of one worker when only the GPU is known: an estimate, labelled so.

vLLM measures what it takes before the KV cache at start-up (weights, the activation peak
of a profiling run, CUDA graphs, non-torch allocations) and gives the cache the rest of
`total x gpu_memory_utilization`. kvcap cannot measure, so it estimates:

    kv = total x utilization - weights / (TP x PP) - PRE_KV_MARGIN_BYTES

The exact paths stay `--kv-cache-memory-bytes` (vLLM skips profiling) and
`--num-gpu-blocks-override`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.errors import UsageError

GIB = 2**30
MIB = 2**20
# vLLM's default --gpu-memory-utilization.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# Activation peak, CUDA graphs and non-torch memory per worker: a rule of thumb for a
# default --max-num-batched-tokens, not a measurement. Documented in docs/capacity.md.
PRE_KV_MARGIN_BYTES = int(2.5 * GIB)

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
}
_ALIASES = {"H100": "H100 80GB", "H100 SXM": "H100 80GB", "H100 PCIE": "H100 80GB"}
_ALIASES |= {"H200 141GB": "H200", "B200 180GB": "B200", "L40S 48GB": "L40S"}


def _key(name: str) -> str:
    return re.sub(r"[\s_-]+", "", name).upper()


_BY_KEY = {_key(name): name for name in GPU_MEMORY_MIB} | {
    _key(alias): name for alias, name in _ALIASES.items()
}


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """The total memory of one GPU, and the table name it came from (None: given in GiB)."""

    total_bytes: int
    name: str | None

    def describe(self) -> str:
        size = f"{self.total_bytes / GIB:.2f} GiB"
        return f"{self.name} ({size}, kvcap's GPU table)" if self.name else f"{size} (given)"


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
        return GpuMemory(GPU_MEMORY_MIB[name] * MIB, name)
    if not 0 < gib < 100_000:
        raise UsageError(f"--gpu-memory must be a positive number of GiB, got {text!r}")
    return GpuMemory(int(gib * GIB), None)


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """The estimate's terms, each per worker, so the output can show its arithmetic."""

    gpu: GpuMemory
    utilization: float
    weights_bytes: int  # the whole model's
    weights_source: str
    world_size: int
    margin_bytes: int = PRE_KV_MARGIN_BYTES

    @property
    def budget_bytes(self) -> int:
        return int(self.gpu.total_bytes * self.utilization)

    @property
    def weights_per_worker(self) -> int:
        return -(-self.weights_bytes // self.world_size)

    @property
    def kv_bytes(self) -> int:
        return self.budget_bytes - self.weights_per_worker - self.margin_bytes

    def describe(self) -> str:
        return (
            f"estimate: {self.gpu.describe()} x {self.utilization:g} = "
            f"{self.budget_bytes / GIB:.2f} GiB, minus weights {self.weights_per_worker / GIB:.2f}"
            f" GiB per worker ({self.weights_source}), minus {self.margin_bytes / GIB:.2f} GiB "
            "for activations, CUDA graphs and non-torch memory"
        )


def estimate_parameters(config: Mapping[str, Any]) -> int:
    """Parameters from config.json's shapes: embeddings, attention, MLP or experts.

    Rough (no biases, norms, vision towers; MLA and Mamba layers counted as attention),
    which is why a folder's model.safetensors.index.json is preferred.
    """
    text = config.get("text_config")
    c: Mapping[str, Any] = text if isinstance(text, Mapping) else config
    hidden = _int(c, "hidden_size")
    layers = _int(c, "num_hidden_layers")
    heads = _int(c, "num_attention_heads") or 1
    kv_heads = _int(c, "num_key_value_heads") or heads
    head_dim = _int(c, "head_dim") or hidden // heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    experts = _int(c, "n_routed_experts") or _int(c, "num_local_experts") or _int(c, "num_experts")
    dense = _int(c, "intermediate_size")
    if experts:
        expert = _int(c, "moe_intermediate_size") or dense
        shared = _int(c, "shared_expert_intermediate_size") or expert * _int(c, "n_shared_experts")
        mlp = 3 * hidden * (expert * experts + shared)
    else:
        mlp = 3 * hidden * dense
    embeddings = _int(c, "vocab_size") * hidden
    tied = bool(c.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    return embeddings * (1 if tied else 2) + layers * (attention + mlp)


def _int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    return value if type(value) is int and value > 0 else 0
