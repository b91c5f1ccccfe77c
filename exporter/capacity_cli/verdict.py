"""What an estimated plan means for the operator: fits, borderline, or which step refuses.

vLLM refuses at different steps with different messages: the weights past the whole GPU
run out of CUDA memory while loading (no KV cache is ever planned); weights and profiled
terms past `total x utilization` leave no memory for the cache ("No available memory for
the cache blocks"); a cache too small for one request of `max_model_len` is the start-up
check. Only the last two are vLLM's ValueError texts, so only they are quoted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from exporter.capacity_cli.memory import MemoryEstimate
from exporter.capacity_cli.memory_formula import GIB
from exporter.errors import DoesNotFit

Kind = Literal["fits", "borderline", "weights_exceed_gpu", "no_kv_memory", "request_too_long"]


@dataclass(frozen=True, slots=True)
class Parallelism:
    """A TP x PP shape that fits where the asked one does not, with its estimate."""

    tensor_parallel: int
    pipeline_parallel: int
    estimate: MemoryEstimate

    def describe(self) -> str:
        return (
            f"TP {self.tensor_parallel} x PP {self.pipeline_parallel}: weights "
            f"{self.estimate.weights_per_worker / GIB:.2f} GiB per worker, KV cache "
            f"~{self.estimate.kv_bytes / GIB:.2f} GiB per worker (range "
            f"{max(self.estimate.kv_range[0], 0) / GIB:.2f} to "
            f"{self.estimate.kv_range[1] / GIB:.2f})"
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """The plan's standing, a sentence for it, and whether vLLM's own message applies."""

    kind: Kind
    text: str
    quotes_vllm: bool
    margin_bytes: int | None = None  # how far the estimate is from the line it is near


def memory_verdict(
    estimate: MemoryEstimate,
    refusal: DoesNotFit | None,
    smallest_fit: Parallelism | None = None,
) -> Verdict:
    """The standing of an estimated plan; `refusal` is the derivation's own, if any."""
    low, high = estimate.kv_range
    weights = estimate.weights_per_worker / GIB
    hint = f"; the smallest that fits: {smallest_fit.describe()}" if smallest_fit else ""
    if not estimate.weights_fit_the_gpu:
        return Verdict(
            "weights_exceed_gpu",
            f"does not fit: the weights alone, {weights:.2f} GiB per worker, exceed the GPU "
            f"({estimate.gpu.total_bytes / GIB:.2f} GiB); vLLM runs out of CUDA memory while "
            f"loading them (torch.OutOfMemoryError), before any KV cache is planned{hint}",
            quotes_vllm=False,
        )
    central = estimate.kv_bytes
    if central <= 0 and high <= 0:
        over = -central / GIB
        return Verdict(
            "no_kv_memory",
            f"does not fit: the weights ({weights:.2f} GiB per worker) and the other terms "
            f"exceed total x utilization ({estimate.budget_bytes / GIB:.2f} GiB) by "
            f"{over:.2f} GiB; vLLM loads the weights, then finds no memory for the KV "
            f"cache{hint}",
            quotes_vllm=True,
            margin_bytes=central,
        )
    if low <= 0 or central <= 0:
        return Verdict(
            "borderline",
            f"borderline: the KV cache estimate is {_signed(central)} (range {_signed(low)} "
            f"to {_signed(high)}) per worker; vLLM may start with a small cache or find no "
            f"memory for it{hint}",
            quotes_vllm=False,
            margin_bytes=central,
        )
    if refusal is not None:
        return _too_long(refusal, central, low, high)
    return _fits(estimate, low, high)


def _too_long(refusal: DoesNotFit, central: int, low: int, high: int) -> Verdict:
    """The derivation's refusal (one request of max_model_len does not fit): vLLM's own
    start-up check, unless the estimate's range reaches what the request needs."""
    needed = refusal.needed_bytes
    if needed is None or high < needed:
        return Verdict("request_too_long", refusal.summary, quotes_vllm=True)
    return Verdict(
        "borderline",
        f"borderline: one request of {refusal.max_model_len} tokens needs "
        f"{needed / GIB:.2f} GiB of KV cache per worker; the estimate is "
        f"{central / GIB:.2f} GiB (range {low / GIB:.2f} to {high / GIB:.2f}), short "
        f"by {(needed - central) / GIB:.2f} GiB; vLLM may start or refuse",
        quotes_vllm=False,
        margin_bytes=central - needed,
    )


def _fits(estimate: MemoryEstimate, low: int, high: int) -> Verdict:
    central = estimate.kv_bytes
    text = (
        f"fits: KV cache ~{central / GIB:.2f} GiB per worker (range {low / GIB:.2f} to "
        f"{high / GIB:.2f} GiB)"
    )
    # Within a tenth of the budget of nothing left: the cache is small and the terms'
    # uncertainty matters; say so rather than print a number that looks exact.
    if central < 0.1 * estimate.budget_bytes and low < 0.5 * central:
        return Verdict(
            "borderline",
            f"borderline: {text}; the low end leaves {low / GIB:.2f} GiB",
            quotes_vllm=False,
            margin_bytes=low,
        )
    return Verdict("fits", text, quotes_vllm=False, margin_bytes=low)


def _signed(value: int) -> str:
    return f"{value / GIB:.2f} GiB" if value > 0 else f"none ({value / GIB:.2f} GiB short)"
