"""The published vLLM start-ups of tests/fixtures/startup-logs, judged against kvcap's estimate.

Each index.jsonl row names the GPU, the release, the flags and what vLLM logged ("Model
loading took", "Available KV cache memory", a refusal). Two judgements: the formula's
non-weight terms with the log's own weights, and the whole `capacity --gpu-memory` run
with kvcap's weights.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.capacity_cli.memory import GIB, parse_gpu_memory
from exporter.capacity_cli.memory_formula import (
    ModelShape,
    Workload,
    default_batch_limits,
    non_kv_terms,
)
from exporter.cli import main
from exporter.collectors.parsing import parse_vllm_serve_args
from exporter.errors import KvcapError

LOGS = Path(__file__).parents[1] / "fixtures" / "startup-logs"
# Within this fraction of vLLM's logged KV memory counts as close (the bar).
TOLERANCE = 0.10


@dataclass(frozen=True, slots=True)
class StartUp:
    """One published start-up, as far as it can be judged."""

    file: str
    gpu: str
    release: tuple[int, int, int]
    tensor_parallel: int
    pipeline_parallel: int
    utilization: float
    flags: list[str]
    config: dict[str, Any]
    config_file: Path
    logged_weights_gib: float | None
    logged_kv_gib: float
    started: bool


def _release(row: dict[str, Any]) -> tuple[int, int, int] | None:
    for text in (row.get("vllm_version") or "", row.get("notes") or ""):
        match = re.search(r"\b0\.(\d+)\.(\d+)\b", text)
        if match:
            return 0, int(match[1]), int(match[2])
        match = re.search(r">= ?0\.(\d+)", text)
        if match:
            return 0, int(match[1]), 0
    return None


def _gpu(name: str | None) -> str | None:
    if not name:
        return None
    text = re.sub(r"\b(NVIDIA|GeForce|HBM3e?|SXM\d?|PCIe)\b", "", name).strip()
    for candidate in (text, name):
        try:
            gpu = parse_gpu_memory(candidate)
        except KvcapError:
            continue
        return gpu.name
    return None


def _flags(command: str | None) -> list[str]:
    if not command:
        return []
    text = re.sub(r"\(.*?\)\s*$", "", command).replace("$port", "8000")
    try:
        tokens = shlex.split(text)
    except ValueError:
        return []
    if tokens[:2] == ["vllm", "serve"]:
        tokens = tokens[3:]  # the model is replaced by the fixture's config
    elif tokens[:1] == ["vllm"]:
        tokens = tokens[1:]
    return tokens


def start_ups() -> list[StartUp]:
    """The rows that name a known GPU, a config and vLLM's available KV memory."""
    found = []
    for line in (LOGS / "index.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        logged = row["logged"]
        gpu = _gpu(row.get("gpu"))
        name = row.get("config") or row.get("pending_config")
        release = _release(row)
        if gpu is None or logged.get("available_kv_gib") is None or not name or not release:
            continue
        config_file = LOGS / name
        if not config_file.is_file():
            continue
        found.append(
            StartUp(
                file=row["file"],
                gpu=gpu,
                release=release,
                tensor_parallel=row.get("tp") or 1,
                pipeline_parallel=row.get("pp") or 1,
                utilization=row.get("gpu_memory_utilization") or 0.9,
                flags=_flags(row.get("command")),
                config=json.loads(config_file.read_text(encoding="utf-8")),
                config_file=config_file,
                logged_weights_gib=logged.get("model_loading_gib"),
                logged_kv_gib=logged["available_kv_gib"],
                started=not logged.get("refusal"),
            )
        )
    return found


def _workload(case: StartUp) -> Workload:
    args = parse_vllm_serve_args(["serve", "model", *case.flags])
    gpu = parse_gpu_memory(case.gpu)
    batched, seqs = default_batch_limits(gpu.total_bytes, gpu.name)
    return Workload(
        tensor_parallel=case.tensor_parallel,
        pipeline_parallel=case.pipeline_parallel,
        max_num_batched_tokens=args.max_num_batched_tokens or batched,
        max_num_seqs=args.max_num_seqs or seqs,
        enforce_eager=any(flag.startswith("--enforce-eager") for flag in case.flags),
        release=case.release,
    )


def kv_with_logged_weights(case: StartUp) -> float | None:
    """The formula's KV memory (GiB) with the log's own weights: the non-weight terms alone."""
    if case.logged_weights_gib is None:
        return None
    total = parse_gpu_memory(case.gpu).total_bytes
    terms = non_kv_terms(ModelShape.from_config(case.config), _workload(case))
    budget = math.ceil(total * case.utilization)
    kv = budget - case.logged_weights_gib * GIB - sum(term.bytes for term in terms)
    return kv / GIB


def capacity_run(case: StartUp, folder: Path) -> dict[str, Any]:
    """`capacity --json --gpu-memory GPU` on the row's config, as an operator would run it."""
    model = folder / case.file.removesuffix(".log")
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(case.config), encoding="utf-8")
    argv = ["capacity", "--json", "--gpu-memory", case.gpu, "--vllm-version"]
    argv += [".".join(map(str, max(case.release, (0, 10, 0)))), "--", "vllm", "serve", str(model)]
    argv += ["-tp", str(case.tensor_parallel), "-pp", str(case.pipeline_parallel)]
    argv += ["--gpu-memory-utilization", str(case.utilization), *case.flags]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(argv)
    document: dict[str, Any] = json.loads(out.getvalue())
    return document


def close(estimate_gib: float, logged_gib: float) -> bool:
    return abs(estimate_gib - logged_gib) <= TOLERANCE * abs(logged_gib)
