"""vLLM's start-up capacity log lines, in the wording and with the figure of each release."""

from __future__ import annotations

from exporter.capacity.platforms import platform_rules
from exporter.capacity.releases import RuleSet

# Why a release's logged token figure differs from the group-aware capacity.
GROUP_UNAWARE_NOTE = (
    "this release logs num_blocks // num_groups x the smallest block size, which ignores "
    "that sliding-window, chunked and Mamba groups need fewer blocks per request than full "
    "attention; kvcap_kv_cache_capacity_tokens is int(max_concurrency x max_model_len)"
)


def logged_tokens(
    rules: RuleSet,
    *,
    capacity_tokens: int,
    num_blocks: int,
    num_groups: int,
    min_block_size: int,
    context_parallel_size: int,
) -> int:
    """The token figure the release prints after "KV cache size:"."""
    if rules.log_figure == "concurrency":
        return capacity_tokens
    return num_blocks // num_groups * min_block_size * context_parallel_size


def log_lines(
    rules: RuleSet,
    *,
    platform: str,
    tokens: int,
    max_model_len: int,
    concurrency: float,
    workers: int = 1,
) -> tuple[str, ...]:
    """The line(s) the release prints, as it formats them; `workers`: the engine's TP x PP
    (releases that log the concurrency once per worker)."""
    device = platform_rules(platform).log_device if rules.log_names_device else "GPU"
    size = f"{device} KV cache size: {tokens:,} tokens"
    maximum = f"Maximum concurrency for {max_model_len:,} tokens per request: {concurrency:.2f}x"
    if rules.log_one_line:
        return (f"{size}, {maximum}",)
    if rules.log_per_worker == "both_per_worker":
        return (size, maximum) * workers
    return (size, *[maximum] * (workers if rules.log_per_worker == "concurrency_per_worker" else 1))
