"""Plain lines (and JSON) that explain each capacity figure of a re-planned start-up log:
the binding worker, each KV cache group, pool blocks vs tokens, the release's figure, and
what `vllm:cache_config_info`, `/metrics` and kvcap's gauges show per engine."""

from __future__ import annotations

from typing import Any

from exporter.capacity import CapacityResult, GroupCapacity
from exporter.capacity.releases import RuleSet
from exporter.capacity_cli.log_refusal import RefusalReproduction
from exporter.capacity_cli.log_reproduction import (
    EngineReproduction,
    capacity_lines,
)

# The release that first put tokens and concurrency into cache_config_info's labels (#42206).
INFO_TOKENS_RELEASE = (0, 24, 0)
_KINDS = {
    "full_attention": "full attention: every token of the request",
    "mla": "latent attention (MLA): every token, one latent vector per layer",
    "sliding_window": "sliding window: the window plus the tokens in flight, not the whole request",
    "chunked_local": "chunked local attention: the current chunk plus the tokens in flight",
    "mamba": "Mamba / linear attention: a fixed number of state blocks, whatever the length",
}


def _bytes(count: int) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.2f} MiB"


def group_lines(groups: tuple[GroupCapacity, ...], max_model_len: int) -> list[str]:
    """One line per run of equal groups ("groups 0-4"): vLLM splits a kind into groups of
    equal layer counts, which read the same."""
    out: list[str] = []
    start = 0
    for index in range(1, len(groups) + 1):
        if index < len(groups) and _same(groups[index], groups[start]):
            continue
        label = f"group {start}" if index - 1 == start else f"groups {start}-{index - 1}"
        out.append(group_line(label, groups[start], max_model_len))
        start = index
    return out


def _same(a: GroupCapacity, b: GroupCapacity) -> bool:
    return (a.kind, a.spec_type, a.num_layers, a.block_size, a.page_size_bytes) == (
        b.kind,
        b.spec_type,
        b.num_layers,
        b.block_size,
        b.page_size_bytes,
    ) and a.blocks_per_request == b.blocks_per_request


def group_line(label: str, group: GroupCapacity, max_model_len: int) -> str:
    window = ""
    if group.sliding_window is not None:
        window = f", window {group.sliding_window:,}"
    elif group.attention_chunk_size is not None:
        window = f", chunk {group.attention_chunk_size:,}"
    return (
        f"    {label}: {group.kind} ({group.spec_type}{window}), {group.num_layers} "
        f"layer(s) each, block {group.block_size} tokens, page {group.page_size_bytes:,} bytes per "
        f"layer; {group.blocks_per_request} blocks per request at {max_model_len:,} tokens "
        f"({_KINDS.get(group.kind, group.kind)})"
    )


def tokens_vs_blocks(result: CapacityResult, per_request: int) -> str:
    """Why the token figure is, or is not, blocks x block size on this model."""
    known, groups = result.figures, result.capacity.groups
    blocks, size = known.num_gpu_blocks, known.block_size
    naive = blocks * size
    head = (
        f"  tokens: int({known.kv_cache_max_concurrency:.6g} x {known.max_model_len:,}) = "
        f"{known.kv_cache_size_tokens:,}; blocks x block size = {blocks:,} x {size} = {naive:,}"
    )
    if known.kv_cache_size_tokens == naive:
        return (
            head + ": equal, one full-attention group and a length that is a whole number of blocks"
        )
    if len(groups) == 1:
        return head + (
            f": not equal, a request of {known.max_model_len:,} tokens takes {per_request} "
            f"whole blocks of {groups[0].block_size} tokens"
            + (
                f" ({groups[0].kind}: it keeps fewer blocks than its length)"
                if groups[0].kind != "full_attention"
                else ""
            )
        )
    return head + (
        f": not equal, every block id is used by each of the {len(groups)} groups, so a "
        f"request holds blocks in every group ({per_request} in all), and the groups need "
        "different numbers of blocks for the same request (see above)"
    )


def release_figure(rules: RuleSet, result: CapacityResult) -> str:
    if rules.log_figure == "concurrency":
        return (
            f"  the release's figure: group-aware (vLLM {rules.name} logs int(max_concurrency x "
            "max_model_len), from 0.20.1 on): it is the capacity the cache admits"
        )
    known, groups = result.figures, result.capacity.groups
    formula = (
        f"num_blocks // num_groups x the smallest block size = {known.num_gpu_blocks:,} // "
        f"{len(groups)} x {min(g.block_size for g in groups)} = "
        f"{result.logged_kv_cache_size_tokens:,}"
    )
    if result.logged_kv_cache_size_tokens == known.kv_cache_size_tokens:
        return (
            f"  the release's figure: before 0.20.1 vLLM logs {formula}, which ignores the "
            "groups; here it equals the group-aware capacity (kvcap_kv_cache_capacity_tokens)"
        )
    return (
        f"  the release's figure: group-unaware (before 0.20.1 vLLM logs {formula}); the "
        f"group-aware capacity is {known.kv_cache_size_tokens:,} tokens "
        "(kvcap_kv_cache_capacity_tokens)"
    )


def engine_text(r: EngineReproduction, rules: RuleSet) -> list[str]:
    logged = capacity_lines(r.logged)
    out = [f"engine {r.logged.engine} ({r.logged.process or 'no process prefix'}):"]
    out += [f"  logged: {line}" for line in logged]
    if r.logged.group_block_sizes:
        out.append(
            f"  logged: kv cache group sizes {r.logged.group_block_sizes} (each group's block size)"
        )
    binding = r.binding
    if binding.worker is not None:
        out.append(
            f"  binding worker: {binding.worker}, {binding.available_kv_gib} GiB of KV cache "
            f"memory ({binding.reason})"
        )
    else:
        out.append(f"  binding worker: unknown ({binding.reason}); the block count is inferred")
    if r.logged.override is not None:
        out.append(
            f"  override: vLLM profiled {r.logged.override[0]:,} blocks and used "
            f"--num-gpu-blocks-override {r.logged.override[1]:,}"
        )
    if r.logged.auto_fit is not None:
        before, after = r.logged.auto_fit
        out.append(f"  auto-fit: max_model_len {before:,} -> {after:,}")
    result = r.result
    if result is None:
        out.append(f"  kvcap: {r.refusal}")
        out += [f"  difference: {d}" for d in r.differences]
        return out
    known, groups = result.figures, result.capacity.groups
    per_request = round(known.num_gpu_blocks / known.kv_cache_max_concurrency)
    if r.matching is not None:
        low, high = r.matching
        spread = (
            ""
            if low == high
            else f" (any count in {low:,}..{high:,} prints them: the GiB are rounded)"
        )
        out.append(
            f"  reproduced: {known.num_gpu_blocks:,} blocks print exactly these lines{spread}"
        )
    out.append(f"  KV cache groups ({len(groups)}), as planned by vLLM {rules.name}'s rules:")
    out += group_lines(groups, known.max_model_len)
    workers = result.capacity.bytes_per_block_per_worker
    out.append(
        f"  pool: {known.num_gpu_blocks:,} blocks shared by every group; one block id takes "
        f"{max(workers):,} bytes on a worker (the group with the most layers there decides) -> "
        f"{_bytes(known.num_gpu_blocks * max(workers))} of KV cache per worker"
    )
    out.append(
        f"  per request: {per_request} blocks (summed over the groups) -> max concurrency "
        f"{known.num_gpu_blocks:,} / {per_request} = {known.kv_cache_max_concurrency:.2f}x"
    )
    out.append(tokens_vs_blocks(result, per_request))
    out.append(release_figure(rules, result))
    out += [f"  difference: {d}" for d in r.differences]
    return out


def metrics_lines(engines: tuple[EngineReproduction, ...], rules: RuleSet, dp: int) -> list[str]:
    """What the engine's /metrics and kvcap's gauges will show, per engine vs summed."""
    results = [r.result for r in engines if r.result is not None]
    if not results:
        return []
    known = [r.figures for r in results]
    blocks = sum(k.num_gpu_blocks for k in known)
    out = ["metrics of this deployment:"]
    summed = (
        f"the sum over the {dp} DP engines ({blocks:,}), on every engine's series"
        if dp > 1
        else "this engine's"
    )
    out.append(
        f'  vllm:cache_config_info{{engine=...}}: num_gpu_blocks="{blocks}" is {summed}; '
        f'block_size="{known[0].block_size}"'
    )
    if rules.release >= INFO_TOKENS_RELEASE:
        out.append(
            f'  vllm:cache_config_info: kv_cache_size_tokens="{known[0].kv_cache_size_tokens}" and '
            "kv_cache_max_concurrency (full precision) per engine, group-aware: labels, so "
            "PromQL cannot add them up"
        )
    else:
        out.append(
            f"  vllm:cache_config_info: no kv_cache_size_tokens / kv_cache_max_concurrency "
            f"labels before 0.24.0 (this is {rules.name}'s rules)"
        )
    out.append(
        "  vllm:kv_cache_usage_perc{engine=...}: the fraction of that engine's own pool in use "
        "(blocks, not tokens)"
    )
    out.append(
        f"  kvcap: kvcap_kv_cache_capacity_tokens {known[0].kv_cache_size_tokens}, "
        f"kvcap_kv_cache_max_concurrency {known[0].kv_cache_max_concurrency:.6g}, "
        f"kvcap_kv_cache_blocks {known[0].num_gpu_blocks} per engine (never summed); the "
        "deployment's total is sum by (model_name) (kvcap_kv_cache_capacity_tokens)"
        + (f" = {sum(k.kv_cache_size_tokens for k in known):,} tokens" if dp > 1 else "")
    )
    return out


def engine_document(r: EngineReproduction, rules: RuleSet) -> dict[str, Any]:
    result = r.result
    document: dict[str, Any] = {
        "engine": r.logged.engine,
        "process": r.logged.process,
        "logged_lines": list(capacity_lines(r.logged)),
        "logged_group_block_sizes": list(r.logged.group_block_sizes),
        "binding_worker": {
            "worker": r.binding.worker,
            "available_kv_gib": r.binding.available_kv_gib,
            "reason": r.binding.reason,
        },
        "block_counts_tried": list(r.candidates) if r.candidates else None,
        "block_counts_matching": list(r.matching) if r.matching else None,
        "reproduced": r.reproduced,
        "expected_lines": list(r.expected_lines),
        "refusal": r.refusal,
        "differences": list(r.differences),
        "log_figure": rules.log_figure,
    }
    if result is not None:
        known = result.figures
        document.update(
            num_gpu_blocks=known.num_gpu_blocks,
            block_size=known.block_size,
            kv_cache_size_tokens=known.kv_cache_size_tokens,
            logged_kv_cache_size_tokens=result.logged_kv_cache_size_tokens,
            max_concurrency=known.kv_cache_max_concurrency,
            max_model_len=known.max_model_len,
            bytes_per_block_per_worker=list(result.capacity.bytes_per_block_per_worker),
            groups=[
                {
                    "kind": g.kind,
                    "spec_type": g.spec_type,
                    "num_layers": g.num_layers,
                    "block_size": g.block_size,
                    "page_size_bytes": g.page_size_bytes,
                    "blocks_per_request": g.blocks_per_request,
                    "sliding_window": g.sliding_window,
                    "attention_chunk_size": g.attention_chunk_size,
                }
                for g in result.capacity.groups
            ],
        )
    return document


def refusal_text(r: RefusalReproduction, errors: tuple[str, ...]) -> list[str]:
    """A start-up that did not plan its KV cache: vLLM's refusal next to kvcap's."""
    out = ["the engine did not start:"]
    if r.vllm_refusal is not None:
        out.append(f"  vLLM refused: {r.vllm_refusal}")
    elif errors:
        out.append(f"  vLLM stopped (its refusal is not in the log): {errors[0]}")
    if r.binding.worker is not None:
        out.append(
            f"  binding worker: {r.binding.worker}, {r.binding.available_kv_gib} GiB of KV "
            f"cache memory ({r.binding.reason})"
        )
    if r.kvcap_refusal is not None:
        out.append(f"  kvcap refuses too, with that memory: {r.kvcap_refusal}")
    else:
        out.append(f"  kvcap would start it: {' | '.join(r.kvcap_plan)}")
    out += [f"  difference: {d}" for d in r.differences]
    return out


def refusal_document(r: RefusalReproduction) -> dict[str, Any]:
    return {
        "vllm_refusal": r.vllm_refusal,
        "kvcap_refusal": r.kvcap_refusal,
        "kvcap_plan": list(r.kvcap_plan),
        "binding_worker": {
            "worker": r.binding.worker,
            "available_kv_gib": r.binding.available_kv_gib,
            "reason": r.binding.reason,
        },
        "reproduced": r.reproduced,
        "differences": list(r.differences),
    }
