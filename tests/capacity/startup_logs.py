"""The published vLLM start-ups of tests/fixtures/startup-logs, judged against kvcap's estimate.

Each index.jsonl row names the GPU, the release, the flags and what vLLM logged ("Model
loading took", "Available KV cache memory", a refusal). Two judgements: the formula's
non-weight terms with the log's own weights, and the whole `capacity --gpu-memory` run
with kvcap's weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.capacity import derive_capacity
from exporter.capacity.weights import WorkerWeights
from exporter.capacity_cli.inputs import estimate_with_weights
from exporter.capacity_cli.memory import GIB, parse_gpu_memory
from exporter.capacity_cli.verdict import memory_verdict
from exporter.cli import main
from exporter.collectors.parsing import parse_vllm_serve_args, to_engine_settings
from exporter.errors import DoesNotFit, KvcapError

FIXTURES = Path(__file__).parents[1] / "fixtures"
LOGS = FIXTURES / "startup-logs"
SHAPES = FIXTURES / "startup-log-shapes.json"
# The oldest release kvcap plans; a row that does not say its release is judged by it.
OLDEST = (0, 10, 0)
# Within this fraction of vLLM's logged KV memory counts as close (the bar).
TOLERANCE = 0.10


@dataclass(frozen=True, slots=True)
class StartUp:
    """One published start-up, as far as it can be judged."""

    file: str
    gpu: str
    release: tuple[int, int, int]
    release_known: bool
    tensor_parallel: int
    pipeline_parallel: int
    utilization: float
    flags: list[str]
    config: dict[str, Any]
    logged_weights_gib: float | None
    logged_kv_gib: float
    started: bool
    quantization: str | None


def _release(
    row: dict[str, Any], by_prefix: dict[str, dict[str, Any]]
) -> tuple[int, int, int] | None:
    """The row's release: stated, else inferred by the collector ("as 022": that row's)."""
    inferred = row.get("vllm_version_inferred") or ""
    same = re.match(r"as (\d{3})\b", inferred)
    if same and same[1] in by_prefix:
        return _release(by_prefix[same[1]], by_prefix)
    for text in (row.get("vllm_version") or "", inferred, row.get("notes") or ""):
        # "main between 0.9.2 and 0.10.0": the later one's rules
        match = re.search(r"between 0\.\d+\.\d+ and 0\.(\d+)\.(\d+)", text)
        match = (
            match or re.search(r"\b0\.(\d+)\.(\d+|x)\b", text) or re.search(r">= ?0\.(\d+)()", text)
        )
        if match:
            return 0, int(match[1]), int(match[2]) if match[2].isdigit() else 0
    return None


def _v0_engine(row: dict[str, Any]) -> bool:
    texts = (row.get("vllm_version"), row.get("vllm_version_inferred"), row.get("notes"))
    return any("V0 engine" in (text or "") for text in texts)


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


def rows() -> list[dict[str, Any]]:
    lines = (LOGS / "index.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def why_not_judged(
    row: dict[str, Any], shapes: dict[str, Any], by_prefix: dict[str, dict[str, Any]]
) -> str | None:
    """Why a row cannot be judged (None: it can)."""
    if _gpu(row.get("gpu")) is None:
        return f"GPU {row.get('gpu')!r} not in kvcap's table"
    if row["logged"].get("available_kv_gib") is None:
        return "no Available KV cache memory in the log"
    if row.get("model") not in shapes:
        return "model shapes unknown"
    release = _release(row, by_prefix)
    if _v0_engine(row) or (release is not None and release < OLDEST):
        return "vLLM's V0 engine or older than 0.10: kvcap plans 0.10 and later"
    if (row.get("pp") or 1) > 1 and (row.get("gpu_count") or 0) != (row.get("tp") or 1) * row["pp"]:
        return "pipeline stages of different GPUs"
    return None


def start_ups() -> list[StartUp]:
    """The rows that name a known GPU, a modelled model and vLLM's available KV memory."""
    shapes = json.loads(SHAPES.read_text(encoding="utf-8"))
    found = []
    every = rows()
    by_prefix = {row["file"][:3]: row for row in every}
    for row in every:
        if why_not_judged(row, shapes, by_prefix) is not None:
            continue
        logged = row["logged"]
        gpu = _gpu(row.get("gpu"))
        assert gpu is not None
        release = _release(row, by_prefix)
        found.append(
            StartUp(
                file=row["file"],
                gpu=gpu,
                release=release or OLDEST,
                release_known=release is not None,
                tensor_parallel=row.get("tp") or 1,
                pipeline_parallel=row.get("pp") or 1,
                utilization=row.get("gpu_memory_utilization") or 0.9,
                flags=_flags(row.get("command")),
                config=shapes[row["model"]],
                logged_weights_gib=logged.get("model_loading_gib"),
                logged_kv_gib=logged["available_kv_gib"],
                started=not logged.get("refusal"),
                quantization=row.get("quantization"),
            )
        )
    return found


def capacity_run(case: StartUp, folder: Path) -> dict[str, Any]:
    """`capacity --json --gpu-memory GPU` on the row's config, as an operator would run it."""
    model = folder / case.file.removesuffix(".log")
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(case.config), encoding="utf-8")
    argv = ["capacity", "--json", "--gpu-memory", case.gpu, "--vllm-version", _version(case)]
    argv += ["--", "vllm", "serve", str(model), *_parallel_flags(case), *case.flags]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(argv)
    document: dict[str, Any] = json.loads(out.getvalue())
    return document


def _version(case: StartUp) -> str:
    return ".".join(map(str, case.release))


def _parallel_flags(case: StartUp) -> list[str]:
    return [
        "-tp", str(case.tensor_parallel), "-pp", str(case.pipeline_parallel),
        "--gpu-memory-utilization", str(case.utilization),
    ]  # fmt: skip


def close(estimate_gib: float, logged_gib: float) -> bool:
    return abs(estimate_gib - logged_gib) <= TOLERANCE * abs(logged_gib)


# The verdicts that say vLLM would not start, and the one that says it would.
REFUSALS = frozenset({"weights_exceed_gpu", "no_kv_memory", "request_too_long"})


def contradicts(kind: str, *, started: bool) -> bool:
    """A "does not fit" where vLLM started, or a "fits" where vLLM refused."""
    return kind in REFUSALS if started else kind == "fits"


@dataclass(frozen=True, slots=True)
class Judged:
    """One start-up against one run of kvcap: its KV estimate and its verdict."""

    case: StartUp
    kv_gib: float
    low_gib: float
    high_gib: float
    verdict: str
    contradicts: bool

    @property
    def close(self) -> bool:
        return close(self.kv_gib, self.case.logged_kv_gib)

    def row(self) -> str:
        case = self.case
        release = ".".join(map(str, case.release)) + ("" if case.release_known else "?")
        error = 100 * (self.kv_gib - case.logged_kv_gib) / abs(case.logged_kv_gib)
        return (
            f"{case.file[:42]:42} {case.gpu:10} {release:8} TP{case.tensor_parallel} "
            f"PP{case.pipeline_parallel} vLLM {case.logged_kv_gib:6.2f} kvcap {self.kv_gib:7.2f} "
            f"({self.low_gib:.2f}-{self.high_gib:.2f}) {error:+7.1f}% "
            f"{'started' if case.started else 'refused'}/{self.verdict}"
            f"{' CONTRADICTS' if self.contradicts else ''}"
        )


def judge(case: StartUp, folder: Path, *, logged_weights: bool) -> Judged:
    """With `logged_weights`, the formula around the log's own "Model loading took" (the
    non-weight terms alone, whatever kvcap's weights say); else the whole command."""
    if logged_weights:
        return _judge_with_logged_weights(case)
    document = capacity_run(case, folder)
    memory = document["used"]["kv_cache_memory"]
    low, high = memory["estimate"]["kv_cache_range_bytes"]
    kind = document["verdict"]["kind"]
    return Judged(
        case,
        memory["bytes_per_worker"] / GIB,
        low / GIB,
        high / GIB,
        kind,
        contradicts(kind, started=case.started),
    )


def _judge_with_logged_weights(case: StartUp) -> Judged:
    assert case.logged_weights_gib is not None
    vllm = parse_vllm_serve_args(["serve", "model", *_parallel_flags(case), *case.flags])
    settings = dataclasses.replace(
        to_engine_settings(vllm), platform="cuda", vllm_version=_version(case)
    )
    logged = round(case.logged_weights_gib * GIB)
    estimate = estimate_with_weights(
        gpu=parse_gpu_memory(case.gpu),
        release=case.release,
        vllm=vllm,
        settings=settings,
        config=case.config,
        weights=WorkerWeights(logged, "the log's Model loading took", 0, (logged,), "as logged"),
    )
    refusal = None
    try:
        derive_capacity(case.config, settings, available_kv_bytes_per_worker=estimate.kv_bytes)
    except DoesNotFit as error:
        refusal = error
    kind = memory_verdict(estimate, refusal).kind
    low, high = estimate.kv_range
    return Judged(
        case,
        estimate.kv_bytes / GIB,
        low / GIB,
        high / GIB,
        kind,
        contradicts(kind, started=case.started),
    )
