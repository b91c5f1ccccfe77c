"""What `kvcap-exporter capacity` prints: first what it used, then the result; as text or
as one JSON document (also for "does not fit" and for errors)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exporter import __version__
from exporter.capacity import NEWEST, CapacityResult, error_to_json, result_to_json
from exporter.capacity_cli.inputs import CapacityInputs
from exporter.capacity_cli.memory import GIB, MemoryEstimate
from exporter.capacity_cli.offload_tier import engine_tier, tier_document, tier_lines, tier_rows
from exporter.capacity_cli.verdict import Verdict, memory_verdict
from exporter.errors import DoesNotFit

# (flag as vLLM spells it, VllmServeArgs field, what vLLM does when it is not given)
SETTING_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--tensor-parallel-size", "tensor_parallel_size", "1"),
    ("--pipeline-parallel-size", "pipeline_parallel_size", "1"),
    ("--data-parallel-size", "data_parallel_size", "1"),
    ("--decode-context-parallel-size", "decode_context_parallel_size", "1"),
    ("--max-model-len", "max_model_len", "from config.json; -1: the longest that fits"),
    ("--block-size", "block_size", "vLLM's choice"),
    ("--dtype", "dtype", "auto"),
    ("--kv-cache-dtype", "kv_cache_dtype", "auto"),
    ("--kv-cache-memory-bytes", "kv_cache_memory_bytes", "measured by vLLM"),
    ("--gpu-memory-utilization", "gpu_memory_utilization", "0.9; 0.92 from vLLM 0.21"),
    ("--num-gpu-blocks-override", "num_gpu_blocks_override", "none"),
    (
        "--max-num-batched-tokens",
        "max_num_batched_tokens",
        "the platform's default; the GPU's with --gpu-memory",
    ),
    ("--max-num-seqs", "max_num_seqs", "vLLM's default"),
    ("--enable-prefix-caching", "enable_prefix_caching", "on"),
    ("--mamba-cache-mode", "mamba_cache_mode", "align with prefix caching, else none"),
    ("--mamba-cache-dtype", "mamba_cache_dtype", "auto"),
    ("--mamba-ssm-cache-dtype", "mamba_ssm_cache_dtype", "auto"),
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One run: its inputs and either a result or vLLM's refusal."""

    inputs: CapacityInputs
    result: CapacityResult | None
    refusal: DoesNotFit | None


def resolved_settings(result: CapacityResult | None) -> dict[str, object]:
    """What vLLM would choose for the settings left to it, as the derivation found."""
    if result is None:
        return {}
    return {
        "max_model_len": result.capacity.max_model_len,
        "block_size": result.capacity.block_size,
        "kv_cache_dtype": result.capacity.cache_dtype,
        "max_num_batched_tokens": result.max_num_batched_tokens,
        "mamba_cache_mode": result.mamba_cache_mode,
    }


def settings_document(
    inputs: CapacityInputs, result: CapacityResult | None = None
) -> dict[str, Any]:
    resolved = resolved_settings(result)
    return {
        flag: {
            "value": getattr(inputs.vllm, field),
            "given": getattr(inputs.vllm, field) is not None,
            "default": default,
            "resolved": resolved.get(field, getattr(inputs.vllm, field)),
        }
        for flag, field, default in SETTING_FLAGS
    }


def used_document(inputs: CapacityInputs, result: CapacityResult | None = None) -> dict[str, Any]:
    memory = inputs.memory
    estimate = memory.estimate
    return {
        "model": inputs.model.name,
        "config_file": str(inputs.model.config_file),
        "found_in": inputs.model.found_in,
        "release_rules": f"vLLM {inputs.vllm_version}",
        "platform": inputs.platform,
        "settings": settings_document(inputs, result),
        "engines": inputs.data_parallel_size,
        "workers_per_engine": inputs.settings.world_size,
        "kv_cache_memory": {
            "bytes_per_worker": memory.bytes_per_worker,
            "num_gpu_blocks": memory.num_gpu_blocks,
            "source": memory.source,
            "exact": memory.exact,
            "estimate": None if estimate is None else estimate_document(estimate),
        },
        "ignored_flags": list(inputs.vllm.ignored),
        "not_modelled": list(inputs.not_modelled),
        "notes": list(inputs.notes),
    }


def estimate_document(estimate: MemoryEstimate) -> dict[str, Any]:
    """The estimate's arithmetic: the budget, the weights and each other term, with ranges."""
    low, high = estimate.kv_range
    weights_low, weights_high = estimate.weights_range
    return {
        "gpu": estimate.gpu.name,
        "gpu_total_bytes": estimate.gpu.total_bytes,
        "gpu_memory_utilization": estimate.utilization,
        "budget_bytes": estimate.budget_bytes,
        "weights_bytes": estimate.weights_per_worker * estimate.world_size,
        "weights_bytes_per_worker": estimate.weights_per_worker,
        "weights_range_bytes": [weights_low, weights_high],
        "weights_source": estimate.weights_source,
        "terms": [
            {
                "name": term.name,
                "bytes": term.bytes,
                "range_bytes": [term.low, term.high],
                "depends_on": term.depends_on,
            }
            for term in estimate.terms
        ],
        "margin_bytes": estimate.other_bytes,
        "kv_cache_bytes": estimate.kv_bytes,
        "kv_cache_range_bytes": [low, high],
    }


def verdict_document(verdict: Verdict | None) -> dict[str, Any] | None:
    if verdict is None:
        return None
    return {
        "kind": verdict.kind,
        "text": verdict.text,
        "vllm_message_applies": verdict.quotes_vllm,
        "margin_bytes": verdict.margin_bytes,
    }


def outcome_verdict(outcome: Outcome) -> Verdict | None:
    """The estimate's standing; None when the KV memory was given exactly."""
    estimate = outcome.inputs.memory.estimate
    if estimate is None:
        return None
    return memory_verdict(estimate, outcome.refusal, outcome.inputs.memory.smallest_fit)


def refusal_document(refusal: DoesNotFit) -> dict[str, Any]:
    return {
        **error_to_json(refusal),
        "message": refusal.summary,
        "vllm_message": str(refusal),
        "longest_max_model_len_that_fits": refusal.estimated_max_model_len,
    }


def outcome_document(outcome: Outcome) -> dict[str, Any]:
    result = outcome.result
    return {
        "kvcap_version": __version__,
        "used": used_document(outcome.inputs, result),
        "fits": result is not None,
        "result": None if result is None else _result_document(result, outcome.inputs),
        "error": None if outcome.refusal is None else refusal_document(outcome.refusal),
        "verdict": verdict_document(outcome_verdict(outcome)),
    }


def error_document(error: Exception) -> dict[str, Any]:
    return {
        "kvcap_version": __version__,
        "used": None,
        "fits": None,
        "result": None,
        "error": error_to_json(error),
    }


def _result_document(result: CapacityResult, inputs: CapacityInputs) -> dict[str, Any]:
    engines = inputs.data_parallel_size
    tokens = result.capacity.kv_cache_size_tokens
    return {
        **result_to_json(result),
        "engines": engines,
        "kv_cache_size_tokens_all_engines": None if tokens is None else tokens * engines,
        "offload": tier_document(engine_tier(inputs.vllm, inputs.settings, result)),
    }


# --- text -----------------------------------------------------------------------------


def used_text(inputs: CapacityInputs, result: CapacityResult | None = None) -> list[str]:
    model = inputs.model
    lines = [
        "kvcap capacity: vLLM's KV cache plan, re-derived (vLLM itself is not run)",
        f"model:          {model.name}",
        f"config.json:    {model.config_file} ({model.found_in})",
        f"release rules:  vLLM {inputs.vllm_version}",
        f"platform:       {inputs.platform}",
        f"engines:        {inputs.data_parallel_size} (data parallel), "
        f"{inputs.settings.world_size} worker(s) each (TP {inputs.settings.tensor_parallel_size}"
        f" x PP {inputs.settings.pipeline_parallel_size})",
        "settings:",
    ]
    width = max(len(flag) for flag, _, _ in SETTING_FLAGS)
    resolved = resolved_settings(result)
    for flag, field, default in SETTING_FLAGS:
        value = getattr(inputs.vllm, field)
        if value is not None and not (value == -1 and field in resolved):
            shown = _flag_value(value)
        elif field in resolved:
            shown = f"{_flag_value(resolved[field])} ({default})"
        else:
            shown = f"({default})"
        lines.append(f"  {flag.ljust(width)}  {shown}")
    lines.append(f"KV cache:       {_memory_line(inputs)}")
    estimate = inputs.memory.estimate
    if estimate is None:
        lines.append(f"  from {inputs.memory.source}")
    else:
        lines += estimate_lines(estimate)
    if inputs.vllm.ignored:
        lines.append(f"ignored flags:  {', '.join(inputs.vllm.ignored)} (no effect on capacity)")
    lines += [f"not modelled:   {line}" for line in inputs.not_modelled]
    lines += [f"note:           {line}" for line in inputs.notes]
    return lines


def estimate_lines(estimate: MemoryEstimate) -> list[str]:
    """The estimate's arithmetic, one term a line, each with its range."""
    weights_low, weights_high = estimate.weights_range
    rows = [
        f"  {estimate.gpu.describe()} x {estimate.utilization:g} = "
        f"{estimate.budget_bytes / GIB:.2f} GiB, minus:",
        f"    weights           {estimate.weights_per_worker / GIB:6.2f} GiB per worker "
        f"({weights_low / GIB:.2f}-{weights_high / GIB:.2f}; {estimate.weights_source})",
    ]
    rows += [
        f"    {term.name:<17} {term.bytes / GIB:6.2f} GiB ({term.low / GIB:.2f}-"
        f"{term.high / GIB:.2f}; {term.depends_on})"
        for term in estimate.terms
    ]
    return rows


def _flag_value(value: object) -> str:
    if value is True:
        return "on"
    if value is False:
        return "off"
    return str(value)


def _memory_line(inputs: CapacityInputs) -> str:
    memory = inputs.memory
    if memory.bytes_per_worker is None:
        return f"{memory.num_gpu_blocks:,} blocks per engine"
    label = "" if memory.exact else "  ** AN ESTIMATE **"
    estimate = memory.estimate
    if estimate is not None:
        low, high = estimate.kv_range
        if memory.bytes_per_worker <= 0:
            return (
                f"none per worker: the weights and the other terms exceed the budget by "
                f"{-memory.bytes_per_worker / GIB:.2f} GiB{label}"
            )
        return (
            f"~{memory.bytes_per_worker / GIB:.2f} GiB per worker (range "
            f"{max(low, 0) / GIB:.2f} to {max(high, 0) / GIB:.2f} GiB){label}"
        )
    return (
        f"{memory.bytes_per_worker / GIB:.2f} GiB per worker "
        f"({memory.bytes_per_worker:,} bytes){label}"
    )


def outcome_text(outcome: Outcome) -> str:
    lines = used_text(outcome.inputs, outcome.result)
    lines.append("")
    verdict = outcome_verdict(outcome)
    if verdict is not None:
        lines.append(f"verdict: {verdict.text}")
    if outcome.refusal is not None:
        if verdict is None:
            lines.append(f"result: {outcome.refusal.summary}")
        if verdict is None or verdict.quotes_vllm:
            lines.append(f"vLLM's message: {outcome.refusal}")
    elif outcome.result is not None:
        lines += result_lines(outcome.result, outcome.inputs)
    return "\n".join(lines) + "\n"


def result_lines(result: CapacityResult, inputs: CapacityInputs) -> list[str]:
    lines, capacity = [*result.log_lines, ""], result.capacity
    if result.log_note:
        lines.append(
            f"note: kvcap's capacity is {capacity.kv_cache_size_tokens:,} tokens: {result.log_note}"
        )
    if result.family == "generic":
        lines.append(
            f"note: {result.architecture} is not a known family; derived with the generic "
            "rule (approximate)"
        )
    elif result.capacity.approximate:
        lines.append(
            f"note: vLLM {result.vllm_version} is newer than the newest release kvcap knows "
            f"({NEWEST.name}); planned with that release's rules (approximate)"
        )
    lines.append(
        f"num_gpu_blocks={capacity.num_gpu_blocks} block_size={capacity.block_size} "
        f"max_model_len={capacity.max_model_len} blocks_per_request={result.blocks_per_request} "
        f"bytes_per_block_per_worker={capacity.bytes_per_block_per_worker[0]}"
    )
    engines, tokens = inputs.data_parallel_size, result.capacity.kv_cache_size_tokens
    if engines > 1 and tokens is not None:
        lines.append(
            f"all {engines} engines: {tokens * engines:,} tokens "
            "(each engine plans its own cache; the log lines above are per engine)"
        )
    header = ("group", "spec", "layers", "block", "page bytes", "blocks/req", "window/chunk")
    rows = [header]
    for index, group in enumerate(result.capacity.groups):
        window = group.sliding_window or group.attention_chunk_size
        rows.append(
            (
                str(index),
                group.spec_type,
                str(group.num_layers),
                str(group.block_size),
                str(group.page_size_bytes),
                str(group.blocks_per_request),
                "-" if window is None else str(window),
            )
        )
    tier = engine_tier(inputs.vllm, inputs.settings, result)
    rows_of_tier = tier_rows(tier)
    return lines + table(rows) + tier_lines(tier) + (table(rows_of_tier) if rows_of_tier else [])


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
