"""`kvcap-exporter capacity`: vLLM's capacity log lines for a config and engine settings."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from exporter.capacity import CapacityResult, EngineSettings, derive_capacity
from exporter.capacity.batch import result_to_json, run_case
from exporter.capacity.platforms import CUDA, PLATFORMS
from exporter.capacity.releases import NEWEST
from exporter.errors import ConfigError
from exporter.model_config import load_model_config
from exporter.units import parse_count, parse_size


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "capacity",
        help="print vLLM's KV cache capacity for a model config and engine settings",
        description=(
            "Re-derive vLLM 0.33's group-aware KV cache capacity. Prints the two startup log "
            "lines exactly as vLLM does, then the KV cache groups. Flag names match `vllm serve`."
        ),
    )
    parser.add_argument("--config", help="config.json, or the model directory holding it")
    parser.add_argument("--cases", help="batch mode: a JSONL file of golden-style case records")
    parser.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    parser.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1)
    parser.add_argument("-dcp", "--decode-context-parallel-size", type=int, default=1)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--max-model-len", type=_count, help="tokens, or -1 / auto to auto-fit")
    parser.add_argument("--max-num-batched-tokens", type=_count)
    parser.add_argument("--num-gpu-blocks-override", type=int)
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None
    )
    parser.add_argument("--mamba-cache-dtype", default="auto")
    parser.add_argument("--mamba-ssm-cache-dtype", default="auto")
    parser.add_argument(
        "--vllm-version",
        help="plan as this vLLM release does (e.g. 0.18.1; default: the newest kvcap knows)",
    )
    parser.add_argument(
        "--platform",
        choices=list(PLATFORMS),
        default=CUDA,
        help="plan as vLLM's CUDA backend (an H100-class GPU, default) or its CPU backend",
    )
    memory = parser.add_mutually_exclusive_group()
    memory.add_argument(
        "--available-kv-bytes",
        type=_size,
        help="KV cache memory per worker: 42949672960, 40GiB or 40G (GiB); 40GB is decimal",
    )
    memory.add_argument("--num-gpu-blocks", type=int, help="the engine's known block count")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    parser.set_defaults(handler=run)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _count(text: str) -> int:
    if text.strip().lower() == "auto":
        return -1
    try:
        return parse_count(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    if args.cases:
        return _run_batch(Path(args.cases), out)
    if not args.config:
        raise ConfigError("give --config PATH|DIR (or --cases FILE.jsonl)")
    if args.available_kv_bytes is None and args.num_gpu_blocks is None:
        raise ConfigError("give --available-kv-bytes SIZE or --num-gpu-blocks N")
    settings = EngineSettings(
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        decode_context_parallel_size=args.decode_context_parallel_size,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        enable_prefix_caching=args.enable_prefix_caching,
        mamba_cache_dtype=args.mamba_cache_dtype,
        mamba_ssm_cache_dtype=args.mamba_ssm_cache_dtype,
        platform=args.platform,
        vllm_version=args.vllm_version,
    )
    result = derive_capacity(
        load_model_config(Path(args.config)),
        settings,
        available_kv_bytes_per_worker=args.available_kv_bytes,
        num_gpu_blocks=args.num_gpu_blocks,
    )
    if args.json:
        json.dump(result_to_json(result), out, indent=2)
        out.write("\n")
    else:
        out.write(format_result(result))
    return 0


def format_result(result: CapacityResult) -> str:
    lines = [*result.log_lines, ""]
    if result.log_note:
        lines.append(
            f"note: kvcap's capacity is {result.kv_cache_size_tokens:,} tokens: {result.log_note}"
        )
    if result.family == "generic":
        lines.append(
            f"note: {result.architecture} is not a known family; derived with the generic "
            "rule (approximate)"
        )
    elif result.approximate:
        lines.append(
            f"note: vLLM {result.vllm_version} is newer than the newest release kvcap knows "
            f"({NEWEST.name}); planned with that release's rules (approximate)"
        )
    lines.append(
        f"num_gpu_blocks={result.num_gpu_blocks} block_size={result.block_size} "
        f"max_model_len={result.max_model_len} blocks_per_request={result.blocks_per_request} "
        f"bytes_per_block_per_worker={result.bytes_per_block_per_worker[0]}"
    )
    header = ("group", "spec", "layers", "block", "page bytes", "blocks/req", "window/chunk")
    rows = [header]
    for index, group in enumerate(result.groups):
        window = group.sliding_window or group.attention_chunk_size
        rows.append(
            (
                str(index),
                group.spec_type,
                str(group.num_layers),
                str(group.block_size),
                str(group.page_size_bytes),
                str(group.blocks_per_request),
                "-" if window is None else str(window),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines.extend(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
    return "\n".join(lines) + "\n"


def _run_batch(path: Path, out: TextIO) -> int:
    """One output line per input line, in order; a line that is not JSON is an error line."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror or error}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                message = f"line {number} is not valid JSON: {error}"
                output: dict[str, Any] = {
                    "id": None,
                    "error": {
                        "type": "ConfigError",
                        "kvcap_type": "ConfigError",
                        "message": message,
                    },
                }
            else:
                output = run_case(record)
            out.write(json.dumps(output) + "\n")
    return 0
