"""What one `kvcap-exporter capacity` run works from: the vLLM command line, the model's
files, and the KV cache memory of each worker (with where that number came from)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.bounded_files import read_regular_file, read_vllm_config
from exporter.capacity import (
    EngineSettings,
    ReleaseRules,
    parse_version,
    release_rules,
)
from exporter.capacity.weights import ParallelLayout, WorkerWeights, weights_per_worker
from exporter.capacity_cli.memory import (
    GpuMemory,
    MemoryEstimate,
    default_gpu_memory_utilization,
    parse_gpu_memory,
)
from exporter.capacity_cli.memory_formula import (
    ModelShape,
    Workload,
    default_batch_limits,
    non_kv_terms,
)
from exporter.capacity_cli.verdict import Parallelism
from exporter.collectors.parsing import (
    VllmServeArgs,
    parse_vllm_serve_args,
    to_engine_settings,
    without_launcher,
)
from exporter.collectors.parsing.vllm_args import leading_assignments
from exporter.errors import ConfigError, UsageError
from exporter.model_config import ResolvedModel, load_model_config, resolve_model

# The platform planned for without `--platform`.
PLATFORM = "cuda"


@dataclass(frozen=True, slots=True)
class KvMemory:
    """The KV cache size of each worker, or the engine's block count, and its provenance."""

    source: str
    exact: bool
    bytes_per_worker: int | None = None
    num_gpu_blocks: int | None = None
    estimate: MemoryEstimate | None = None
    smallest_fit: Parallelism | None = None  # when the estimate leaves no KV cache


@dataclass(frozen=True, slots=True)
class CapacityInputs:
    """Everything a run used, echoed before the result."""

    vllm: VllmServeArgs
    model: ResolvedModel
    config: Mapping[str, Any]
    settings: EngineSettings
    memory: KvMemory
    not_modelled: tuple[str, ...]
    notes: tuple[str, ...]
    vllm_version: str  # the release whose rules plan (`--vllm-version`, else the newest)
    platform: str = PLATFORM

    @property
    def data_parallel_size(self) -> int:
        return self.vllm.data_parallel_size or 1


def vllm_command(
    args: argparse.Namespace, accepted: Callable[[str], str] | None = None
) -> VllmServeArgs:
    """The vLLM flags of a capacity run: `--vllm-command "..."`, then what follows `--`,
    then loose vLLM flags given to `capacity` itself; a later flag wins, as in vLLM.
    `accepted` checks the flags kvcap does not model against the planned release's."""
    tokens: list[str] = []
    assignments: list[str] = []  # `NAME=value` before the launcher: read as vLLM's environment
    for source in (_split(args.vllm_command) if args.vllm_command else [], args.vllm_tail or []):
        leading = leading_assignments(source)
        assignments += source[:leading]
        tokens += without_launcher(list(source[leading:]))
    tokens += list(args.vllm_tokens or [])
    tokens, legacy_model = _legacy_config(tokens)
    parsed = parse_vllm_serve_args(
        [*assignments, "serve", *tokens], read_config=read_vllm_config, accepted=accepted
    )
    if parsed.model is None and legacy_model is not None:
        parsed = dataclasses.replace(parsed, model=legacy_model)
    return parsed


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as error:
        raise UsageError(f"--vllm-command: cannot split it: {error}") from None


def _legacy_config(tokens: list[str]) -> tuple[list[str], str | None]:
    """`--config DIR` or `--config config.json` named the model before kvcap followed
    vLLM's `--config FILE.yaml`; such a value is still taken as the model."""
    for index, token in enumerate(tokens):
        value = None
        if token == "--config" and index + 1 < len(tokens):
            value, end = tokens[index + 1], index + 2
        elif token.startswith("--config="):
            value, end = token.partition("=")[2], index + 1
        if value is not None and (value.endswith(".json") or Path(value).is_dir()):
            return tokens[:index] + tokens[end:], value
    return tokens, None


def build_inputs(args: argparse.Namespace, vllm: VllmServeArgs) -> CapacityInputs:
    if vllm.model is None:
        raise UsageError(
            "give the model: `capacity -- vllm serve MODEL ...`, `capacity MODEL ...` or "
            "--vllm-command 'vllm serve MODEL ...' (MODEL: a folder, a config.json or a "
            "Hugging Face id in the local HF cache)"
        )
    model = resolve_model(vllm.model, revision=vllm.revision)
    config = load_model_config(model.config_file)
    return inputs_for(args, vllm, model, config)


def inputs_for(
    args: argparse.Namespace,
    vllm: VllmServeArgs,
    model: ResolvedModel,
    config: Mapping[str, Any],
) -> CapacityInputs:
    """The inputs for one combination of settings (a sweep calls this once per row)."""
    platform = args.platform or PLATFORM
    release = _release(args.vllm_version)
    settings = dataclasses.replace(
        to_engine_settings(vllm), platform=platform, vllm_version=args.vllm_version
    )
    settings = _named_gpu_defaults(args, vllm, settings)
    memory = kv_memory(args, vllm, settings, model, config)
    return CapacityInputs(
        vllm_version=release.version,
        platform=platform,
        vllm=vllm,
        model=model,
        config=config,
        settings=settings,
        memory=memory,
        not_modelled=_not_modelled(vllm),
        notes=_notes(vllm),
    )


def _named_gpu_defaults(
    args: argparse.Namespace, vllm: VllmServeArgs, settings: EngineSettings
) -> EngineSettings:
    """A named GPU settles what vLLM takes from it: `vllm serve`'s --max-num-batched-tokens
    default (2048 on an A100, L4 or L40S; 8192 on an H100), so the plan uses what vLLM
    would, and its compute capability, which picks vLLM's MLA prefill backends
    (capacity/mla_prefill.py). A size in GiB leaves the CUDA platform's H100-class GPU."""
    if args.gpu_memory is None or settings.platform != PLATFORM:
        return settings
    gpu = parse_gpu_memory(args.gpu_memory)
    if gpu.name is None:
        return settings
    batched = settings.max_num_batched_tokens
    if vllm.max_num_batched_tokens is None:
        batched, _ = default_batch_limits(gpu.total_bytes, gpu.name)
    return dataclasses.replace(
        settings, max_num_batched_tokens=batched, cuda_compute_capability=gpu.compute_capability
    )


def _release(version: str | None) -> ReleaseRules:
    if version is not None:
        try:
            parse_version(version)
        except ConfigError as error:  # not a release number at all: the flag is wrong
            raise UsageError(f"--vllm-version: {error}") from None
    return release_rules(version)  # older than kvcap models: a ConfigError of kvcap's


def kv_memory(
    args: argparse.Namespace,
    vllm: VllmServeArgs,
    settings: EngineSettings,
    model: ResolvedModel,
    config: Mapping[str, Any],
) -> KvMemory:
    """The most exact of: the engine's known block count, vLLM's block override, an
    explicit KV cache size, an estimate from the GPU's memory."""
    if args.num_gpu_blocks is not None:
        return KvMemory(
            "--num-gpu-blocks (the engine's block count)", True, None, args.num_gpu_blocks
        )
    if vllm.num_gpu_blocks_override is not None:
        return KvMemory("--num-gpu-blocks-override", True, None, vllm.num_gpu_blocks_override)
    if args.available_kv_bytes is not None:
        return KvMemory("--available-kv-bytes (exact)", True, args.available_kv_bytes)
    if vllm.kv_cache_memory_bytes is not None:
        source = "--kv-cache-memory-bytes (exact: vLLM skips memory profiling)"
        return KvMemory(source, True, vllm.kv_cache_memory_bytes)
    if args.gpu_memory is not None:
        estimate = memory_estimate(args, vllm, settings, model, config)
        smallest = None
        if estimate.kv_range[0] <= 0 or not estimate.weights_fit_the_gpu:
            smallest = smallest_fit(args, vllm, settings, model, config)
        return KvMemory(
            estimate.describe(), False, estimate.kv_bytes, estimate=estimate, smallest_fit=smallest
        )
    raise UsageError(
        "give the KV cache memory: --kv-cache-memory-bytes SIZE per GPU (exact), "
        "--num-gpu-blocks-override N, --num-gpu-blocks N (from the engine's log), or "
        "--gpu-memory GiB|GPU name (an estimate)"
    )


def memory_estimate(
    args: argparse.Namespace,
    vllm: VllmServeArgs,
    settings: EngineSettings,
    model: ResolvedModel,
    config: Mapping[str, Any],
) -> MemoryEstimate:
    """vLLM's memory formula for `--gpu-memory`, term by term, for the planned release."""
    return estimate_with_weights(
        gpu=parse_gpu_memory(args.gpu_memory),
        release=parse_version(_release(args.vllm_version).version),
        vllm=vllm,
        settings=settings,
        config=config,
        weights=binding_worker_weights(model, config, settings, vllm),
    )


def estimate_with_weights(
    *,
    gpu: GpuMemory,
    release: tuple[int, int, int],
    vllm: VllmServeArgs,
    settings: EngineSettings,
    config: Mapping[str, Any],
    weights: WorkerWeights,
) -> MemoryEstimate:
    """The formula around the binding worker's given weights. Pure: the start-up tests
    judge the other terms with each log's own "Model loading took"."""
    batched, seqs = default_batch_limits(gpu.total_bytes, gpu.name)
    flags = {entry.split(" ", 1)[0].split("=", 1)[0].replace("_", "-") for entry in vllm.ignored}
    workload = Workload(
        tensor_parallel=settings.tensor_parallel_size,
        pipeline_parallel=settings.pipeline_parallel_size,
        max_num_batched_tokens=vllm.max_num_batched_tokens or batched,
        max_num_seqs=vllm.max_num_seqs or seqs,
        enforce_eager="--enforce-eager" in flags,
        release=release,
        expert_parallel="--enable-expert-parallel" in flags or "-ep" in flags,
    )
    return MemoryEstimate(
        gpu=gpu,
        utilization=vllm.gpu_memory_utilization or default_gpu_memory_utilization(release),
        weights_per_worker=weights.bytes_per_worker,
        weights_source=weights.source,
        weights_exact=weights.exact,
        world_size=settings.world_size,
        terms=non_kv_terms(ModelShape.from_config(config), workload),
    )


# The shapes tried when the asked one leaves no KV cache, smallest world first: TP within
# a node of 8 GPUs, then pipeline stages across nodes.
PARALLEL_SHAPES = ((1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4))


def smallest_fit(
    args: argparse.Namespace,
    vllm: VllmServeArgs,
    settings: EngineSettings,
    model: ResolvedModel,
    config: Mapping[str, Any],
) -> Parallelism | None:
    """The smallest TP x PP, larger than the asked one, whose central estimate leaves a KV
    cache (its range is printed with it)."""
    for tp, pp in PARALLEL_SHAPES:
        if tp * pp <= settings.world_size:
            continue
        shape = dataclasses.replace(settings, tensor_parallel_size=tp, pipeline_parallel_size=pp)
        estimate = memory_estimate(args, vllm, shape, model, config)
        if estimate.weights_fit_the_gpu and estimate.kv_bytes > 0:
            return Parallelism(tp, pp, estimate)
    return None


def binding_worker_weights(
    model: ResolvedModel, config: Mapping[str, Any], settings: EngineSettings, vllm: VllmServeArgs
) -> WorkerWeights:
    """The binding worker's weight bytes: computed from config.json as vLLM splits and
    quantizes the layers; the checkpoint's own total (its safetensors index) is the
    fallback where the model is not modelled, split evenly over the workers."""
    layout = ParallelLayout(
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size,
        enable_expert_parallel=_expert_parallel(vllm),
        data_parallel_size=vllm.data_parallel_size or 1,
        language_model_only=_language_model_only(vllm),
    )
    checkpoint = _checkpoint_total(model)
    try:
        computed = weights_per_worker(config, layout, settings.dtype)
    except ConfigError as error:
        if checkpoint is None:
            raise ConfigError(
                f"{model.config_file}: cannot size the weights ({error}); give "
                "--kv-cache-memory-bytes"
            ) from None
        total, name = checkpoint
        share = -(-total // settings.world_size)
        source = f"{name} split evenly over {settings.world_size} worker(s); {error}"
        return WorkerWeights(share, source, 0, (share,), "from the checkpoint", exact=False)
    if checkpoint is None:
        return computed
    total, name = checkpoint
    source = f"{computed.source}; the checkpoint's {name}: {total / 2**30:.2f} GiB in all"
    return dataclasses.replace(computed, source=source, checkpoint_total_bytes=total)


def _expert_parallel(vllm: VllmServeArgs) -> bool:
    return any(flag in ("--enable-expert-parallel", "-ep") for flag in vllm.ignored)


def _language_model_only(vllm: VllmServeArgs) -> bool:
    """`--language-model-only`, or `--limit-mm-per-prompt` with every modality at 0: vLLM
    builds no encoder tower."""
    for flag in vllm.ignored:
        name, _, value = flag.partition(" ")
        if name.partition("=")[0] == "--language-model-only":
            return value.lower() not in ("false", "0") and "=false" not in name.lower()
        if name.startswith("--limit-mm-per-prompt"):
            text = value or name.partition("=")[2]
            try:
                limits = json.loads(text)
            except ValueError:
                continue
            if isinstance(limits, dict) and limits and not any(limits.values()):
                return True
    return False


def _checkpoint_total(model: ResolvedModel) -> tuple[int, str] | None:
    """The checkpoint's total tensor bytes: its index's `total_size`, or the size of a
    single model.safetensors; None when the folder has neither."""
    index = model.folder / "model.safetensors.index.json"
    from exporter.capacity_cli import checkpoint_index  # noqa: PLC0415 (msgspec: only here)

    try:
        data = read_regular_file(index, max_bytes=checkpoint_index.MAX_INDEX_BYTES)
        total = checkpoint_index.total_size(data)
    except (OSError, ValueError, ConfigError):  # FileRefused is a ConfigError
        total = None
    if total is not None:
        return total, f"total_size of {index.name}"
    single = model.folder / "model.safetensors"
    if single.is_file():
        return single.stat().st_size, "model.safetensors"
    return None


def _not_modelled(vllm: VllmServeArgs) -> tuple[str, ...]:
    lines = []
    if vllm.speculative is not None:
        lines.append(
            f"--speculative-config ({vllm.speculative.describe()}): not modelled; the draft "
            "model's KV cache groups and extra Mamba speculative blocks are not counted, so "
            "vLLM's numbers will be lower than these"
        )
    return tuple(lines)


def _notes(vllm: VllmServeArgs) -> tuple[str, ...]:
    lines = []
    if vllm.gpu_memory_utilization is not None and vllm.kv_cache_memory_bytes is not None:
        lines.append("--gpu-memory-utilization has no effect with --kv-cache-memory-bytes")
    if vllm.max_num_seqs is not None:
        lines.append(
            f"--max-num-seqs {vllm.max_num_seqs} caps running requests; it does not change "
            "the KV cache plan"
        )
    return tuple(lines)
