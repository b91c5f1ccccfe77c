"""`--sweep max-model-len=8k,32k,128k --sweep tp=1,2`: one row per combination of values,
the planner's "what fits, at what concurrency" in one command."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.capacity_cli.memory import GIB
from exporter.capacity_cli.offload_tier import LmcacheTier, engine_tier
from exporter.capacity_cli.report import Outcome, table
from exporter.capacity_cli.verdict import memory_verdict
from exporter.collectors.parsing import VllmServeArgs, vllm_flag_value
from exporter.errors import UsageError


@dataclass(frozen=True, slots=True)
class Axis:
    """One swept setting: its name on --sweep, the vLLM flag and the VllmServeArgs field."""

    name: str
    flag: str
    field: str
    values: tuple[Any, ...]


# --sweep names (short and as vLLM spells the flag) -> (vLLM flag, column title).
AXES: dict[str, tuple[str, str]] = {
    "max-model-len": ("--max-model-len", "max-model-len"),
    "tp": ("--tensor-parallel-size", "tp"),
    "tensor-parallel-size": ("--tensor-parallel-size", "tp"),
    "pp": ("--pipeline-parallel-size", "pp"),
    "pipeline-parallel-size": ("--pipeline-parallel-size", "pp"),
    "kv-cache-dtype": ("--kv-cache-dtype", "kv-cache-dtype"),
    "gpu-memory-utilization": ("--gpu-memory-utilization", "gpu-mem-util"),
    "block-size": ("--block-size", "block-size"),
    "max-num-batched-tokens": ("--max-num-batched-tokens", "max-batched"),
    "kv-offloading-size": ("--kv-offloading-size", "offload-GiB"),
}


def parse_axis(text: str) -> Axis:
    name, equals, values = text.partition("=")
    key = name.strip().lstrip("-").replace("_", "-")
    if not equals or key not in AXES:
        known = ", ".join(sorted({k for k in AXES if "-" in k or k in ("tp", "pp")}))
        raise UsageError(f"--sweep {text!r}: give SETTING=V1,V2,... with SETTING one of {known}")
    flag, _ = AXES[key]
    parts = [part.strip() for part in values.split(",") if part.strip()]
    if not parts:
        raise UsageError(f"--sweep {text!r}: no values")
    field, converted = zip(*(vllm_flag_value(flag, part) for part in parts), strict=True)
    return Axis(key, flag, field[0], tuple(converted))


def combinations(base: VllmServeArgs, axes: Sequence[Axis]) -> list[VllmServeArgs]:
    """Every combination, the first axis varying slowest."""
    if len({axis.field for axis in axes}) != len(axes):
        raise UsageError("--sweep: each setting may be swept once")
    rows = []
    for values in itertools.product(*(axis.values for axis in axes)):
        changes = {axis.field: value for axis, value in zip(axes, values, strict=True)}
        rows.append(dataclasses.replace(base, **changes))
    return rows


# An estimate's verdict that outranks the plan's own "fits" or "does not fit".
SWEEP_VERDICTS = {
    "weights_exceed_gpu": "does not fit (the weights exceed the GPU)",
    "no_kv_memory": "does not fit (no memory left for the KV cache)",
}


def sweep_rows(
    axes: Sequence[Axis], outcomes: Sequence[Outcome | Exception]
) -> tuple[list[str], list[list[str]]]:
    header = [AXES[axis.name][1] for axis in axes]
    header += ["KV GiB/worker", "blocks", "KV tokens", "tokens/request", "concurrency", "result"]
    rows = []
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            rows.append(["?" for _ in axes] + ["-", "-", "-", "-", "-", f"error: {outcome}"])
            continue
        cells = [_cell(getattr(outcome.inputs.vllm, axis.field)) for axis in axes]
        memory = outcome.inputs.memory
        kv = "-" if memory.bytes_per_worker is None else f"{memory.bytes_per_worker / GIB:.2f}"
        if memory.bytes_per_worker is not None and memory.bytes_per_worker <= 0:
            kv = "none"  # never a negative cache
        if not memory.exact:
            kv += " (est.)"
        result, refusal = outcome.result, outcome.refusal
        verdict = (
            None
            if memory.estimate is None
            else memory_verdict(memory.estimate, refusal, memory.smallest_fit).kind
        )
        if verdict in SWEEP_VERDICTS:
            cells += [kv, "-", "-", "-", "-", SWEEP_VERDICTS[verdict]]
        elif result is not None:
            cells += [
                kv,
                f"{result.capacity.num_gpu_blocks:,}",
                f"{result.capacity.kv_cache_size_tokens:,}",
                f"{result.capacity.max_model_len:,}",
                f"{result.capacity.kv_cache_max_concurrency:.2f}x",
                "fits",
            ]
        else:
            longest = refusal.estimated_max_model_len if refusal is not None else None
            hint = f" (longest that fits: {longest:,})" if longest else ""
            cells += [kv, "-", "-", "-", "-", f"does not fit{hint}"]
        rows.append(cells)
    if any(_offloads(outcome) for outcome in outcomes):
        header.append("offload tokens")
        for row, outcome in zip(rows, outcomes, strict=True):
            row.append(_offload_cell(outcome))
    return header, rows


def _offloads(outcome: Outcome | Exception) -> bool:
    if isinstance(outcome, Exception):
        return False
    vllm = outcome.inputs.vllm
    return vllm.kv_offloading_size is not None or vllm.kv_transfer_config is not None


def _offload_cell(outcome: Outcome | Exception) -> str:
    if isinstance(outcome, Exception) or outcome.result is None:
        return "-"
    tier = engine_tier(outcome.inputs.vllm, outcome.inputs.settings, outcome.result)
    if tier is None or isinstance(tier, LmcacheTier):
        return "-"
    return f"{tier.capacity_tokens:,}"


def sweep_text(
    axes: Sequence[Axis], outcomes: Sequence[Outcome | Exception], used: Callable[[], list[str]]
) -> str:
    header, rows = sweep_rows(axes, outcomes)
    swept = ", ".join(axis.flag for axis in axes)
    lines = [*used(), "", f"sweep over {swept}: one row per combination", ""]
    lines += table([header, *rows])
    return "\n".join(lines) + "\n"


def _cell(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return "auto" if value == -1 else f"{value:,}"
    return "default" if value is None else str(value)
