"""A vLLM start-up log read into the capacity facts it states, per process (a pure parser).

Reads what vLLM 0.10 to 0.33 prints, CUDA or CPU, one engine or DP: each line may carry
ANSI colours, a container timestamp, a `(EngineCore_DP1 pid=42)` / `(Worker_TP1 pid=7)`
process prefix and the `INFO 12-01 12:32:31 [file.py:12]` header, in any interleaving.
Unknown lines are skipped; a malformed known line is kept as a problem, never raised.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# The longest `non-default args: {...}` dict read (a Python literal: evaluated, never run).
MAX_ARGS_CHARS = 64 * 1024

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d[T ][\d:.,]+(?:Z|[+-]\d\d:?\d\d)?\s+")
_PREFIX = re.compile(r"^\((?P<name>[A-Za-z][\w:.-]*)(?P<attrs>(?:\s+\w+=[\w.-]+)*)\)\s*")
_HEADER = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d\s+[\d:.]+\s+\[[^\]]*\]\s?"
)
_NUMBER = r"[\d,]+"
_ATTRS = ("rank", "pid")

_VERSION = (
    re.compile(r"vLLM (?:API )?server version (?P<v>v?\d+\.\d+[\w.+-]*)"),
    re.compile(r"Initializing an? (?:V1 )?LLM engine \(v(?P<v>\d+\.\d+[\w.+-]*)\)"),
    re.compile(r"█\s+version (?P<v>v?\d+\.\d+[\w.+-]*)"),
)
_MODEL = (
    re.compile(r"serving model (?P<m>\S+)"),
    re.compile(r"█\s+model\s+(?P<m>\S+)"),
    re.compile(r"with config: model='(?P<m>[^']+)'"),
)
_PLATFORM = re.compile(r"Automatically detected platform (?P<p>\w+)\.")
_DEVICE_CONFIG = re.compile(r"\bdevice_config=(?P<p>\w+)")
_NON_DEFAULT = re.compile(r"non-default args: (?P<args>\{.*)$")
_SIZE = re.compile(rf"(?P<device>[A-Z]+)(?: \+ host)? KV cache size: (?P<tokens>{_NUMBER}) tokens")
_CONCURRENCY = re.compile(
    rf"Maximum concurrency for (?P<len>{_NUMBER}) tokens per request: (?P<x>[\d.]+)x"
)
_LOADING = re.compile(r"Model loading took (?P<gib>[\d.]+) ?GiB")
_AVAILABLE = re.compile(r"Available KV cache memory: (?P<gib>[\d.]+) ?GiB")
_CPU_KV = re.compile(r"(?:Explicitly|Auto) set \((?P<gib>[\d.]+)/[\d.]+\) GiB for KV cache")
_PROFILING = re.compile(r"Memory profiling takes .*")
_GRAPH = re.compile(
    r"(?:Graph capturing finished in \d+ secs?, took|CUDA graph pool memory:|"
    r"Estimated CUDA graph memory:) (?P<gib>[\d.]+) ?GiB"
)
_BLOCKS = re.compile(r"# (?:GPU|CUDA|cuda|gpu|CPU|cpu) blocks: (?P<n>\d+)")
_GROUP_SIZES = re.compile(r"kv cache group sizes \((?P<sizes>[\d, ]*)\)")
_OVERRIDE = re.compile(
    r"Overriding num_gpu_blocks=(?P<profiled>\d+) with num_gpu_blocks_override=(?P<n>\d+)"
)
_AUTO_FIT = re.compile(
    r"Auto-fit max_model_len: (?:reduced from (?P<from>\d+) to (?P<to>\d+)|"
    r"full model context length (?P<full>\d+) fits)"
)
_REFUSALS = (
    re.compile(r"To serve at least one request with the model's max seq len .*"),
    re.compile(r"No available memory for the cache blocks\..*"),
    re.compile(r"Cannot auto-fit max_model_len: .*"),
)
_EXCEPTION = re.compile(r"^(?P<error>(?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)): (?P<text>.+)$")
# Another engine's start-up (SGLang prints its ServerArgs and its own KV cache line).
_OTHER_ENGINES = (
    ("SGLang", re.compile(r"server_args=ServerArgs\(|sglang\.|KV Cache is allocated\. #tokens")),
    ("TensorRT-LLM", re.compile(r"\[TRT-LLM\]|tensorrt_llm")),
    ("Text Generation Inference", re.compile(r"text_generation_(?:launcher|router)")),
)


@dataclass(frozen=True, slots=True)
class WorkerMemory:
    """What one process logged about its memory (GiB as vLLM rounds them: 2 decimals)."""

    process: str
    model_loading_gib: float | None = None
    available_kv_gib: float | None = None
    cuda_graph_gib: float | None = None
    profiling_line: str | None = None


@dataclass(frozen=True, slots=True)
class EngineLines:
    """The capacity lines one engine core printed (one per data-parallel rank)."""

    process: str
    engine: int
    device: str | None = None
    kv_cache_size_tokens: int | None = None
    max_model_len: int | None = None
    max_concurrency: float | None = None
    concurrency_text: str | None = None  # "512.00", as printed
    num_blocks: int | None = None  # "# GPU blocks" where printed
    group_block_sizes: tuple[int, ...] = ()
    override: tuple[int, int] | None = None  # (profiled blocks, override)
    auto_fit: tuple[int, int] | None = None  # (from, to); equal when the full length fits
    lines: tuple[str, ...] = ()  # the capacity lines verbatim, without prefix and header


@dataclass(frozen=True, slots=True)
class StartupLog:
    """Every capacity fact a start-up log states, with the problems met reading it."""

    version: str | None = None
    model: str | None = None
    platform: str | None = None
    non_default_args: dict[str, Any] | None = None
    engines: tuple[EngineLines, ...] = ()
    workers: tuple[WorkerMemory, ...] = ()
    refusals: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    other_engine: str | None = None  # "SGLang": the log is not vLLM's
    vllm_lines: int = 0  # lines carrying a vLLM process prefix or header
    problems: tuple[str, ...] = ()


@dataclass(slots=True)
class _Reader:
    version: str | None = None
    model: str | None = None
    platform: str | None = None
    non_default_args: dict[str, Any] | None = None
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    other: dict[str, int] = field(default_factory=dict)
    vllm_lines: int = 0
    problems: list[str] = field(default_factory=list)


def split_line(raw: str) -> tuple[str, str, bool]:
    """(process, message, whether vLLM's prefix or header was there) of one line; the
    process is its name, with the rank and pid vLLM prints: "Worker_TP1 pid=7"."""
    line = _ANSI.sub("", raw).rstrip("\r\n")
    line = _TIMESTAMP.sub("", line, count=1)
    process, known = "", False
    prefix = _PREFIX.match(line)
    if prefix is not None:
        attrs = dict(a.split("=", 1) for a in prefix["attrs"].split())
        process = prefix["name"] + "".join(f" {k}={v}" for k, v in attrs.items() if k in _ATTRS)
        line, known = line[prefix.end() :], True
    header = _HEADER.match(line)
    if header is not None:
        line, known = line[header.end() :], True
    return process, line.strip(), known


def engine_index(process: str) -> int:
    """The DP rank in an engine core's name ("EngineCore_DP1", "EngineCore_1"), else 0."""
    match = re.search(r"EngineCore_(?:DP)?(\d+)\b", process)
    return int(match[1]) if match else 0


def parse_startup_log(lines: Iterable[str]) -> StartupLog:
    """Read a start-up log; never raises on what the lines say."""
    reader = _Reader()
    for number, raw in enumerate(lines, start=1):
        process, message, known = split_line(raw)
        reader.vllm_lines += known
        if message:
            _read_message(reader, number, process, message)
    return _finish(reader)


def _read_message(r: _Reader, number: int, process: str, message: str) -> None:
    for name, pattern in _OTHER_ENGINES:
        if pattern.search(message):
            r.other[name] = r.other.get(name, 0) + 1
    if r.version is None:
        r.version = _first(_VERSION, message, "v")
    if r.model is None:
        r.model = _first(_MODEL, message, "m")
    if r.platform is None and (
        match := _PLATFORM.search(message) or _DEVICE_CONFIG.search(message)
    ):
        r.platform = match["p"].lower()
    if match := _NON_DEFAULT.search(message):
        _read_args(r, number, match["args"])
    _read_worker(r, process, message)
    _read_engine(r, process, message)
    for refusal in _REFUSALS:
        if (match := refusal.search(message)) and match[0] not in r.refusals:
            r.refusals.append(match[0])
    if (match := _EXCEPTION.match(message)) and message not in r.errors:
        r.errors.append(message)


def _first(patterns: tuple[re.Pattern[str], ...], message: str, group: str) -> str | None:
    for pattern in patterns:
        if match := pattern.search(message):
            return match[group]
    return None


def _read_args(r: _Reader, number: int, text: str) -> None:
    if len(text) > MAX_ARGS_CHARS:
        r.problems.append(
            f"line {number}: non-default args longer than {MAX_ARGS_CHARS} characters"
        )
        return
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        r.problems.append(f"line {number}: non-default args are not a complete Python dict")
        return
    if isinstance(value, dict):
        r.non_default_args = {str(k): v for k, v in value.items()}


def _read_worker(r: _Reader, process: str, message: str) -> None:
    found: dict[str, Any] = {}
    if match := _LOADING.search(message):
        found["model_loading_gib"] = float(match["gib"])
    if match := _AVAILABLE.search(message) or _CPU_KV.search(message):
        found["available_kv_gib"] = float(match["gib"])
    if match := _GRAPH.search(message):
        found["cuda_graph_gib"] = float(match["gib"])
    if match := _PROFILING.search(message):
        found["profiling_line"] = match[0]
    if found:
        r.workers.setdefault(process, {}).update(found)


def _read_engine(r: _Reader, process: str, message: str) -> None:
    found: dict[str, Any] = {}
    if match := _SIZE.search(message):
        found["device"] = match["device"]
        found["kv_cache_size_tokens"] = _int(match["tokens"])
    if match := _CONCURRENCY.search(message):
        found["max_model_len"] = _int(match["len"])
        found["concurrency_text"] = match["x"]
        found["max_concurrency"] = float(match["x"])
    if match := _BLOCKS.search(message):
        found["num_blocks"] = int(match["n"])
    if match := _GROUP_SIZES.search(message):
        found["group_block_sizes"] = tuple(_int(s) for s in match["sizes"].split(",") if s.strip())
    if match := _OVERRIDE.search(message):
        found["override"] = (int(match["profiled"]), int(match["n"]))
    if match := _AUTO_FIT.search(message):
        full = match["full"]
        found["auto_fit"] = (
            (int(full), int(full)) if full else (int(match["from"]), int(match["to"]))
        )
    if not found:
        return
    entry = r.engines.setdefault(process, {"lines": []})
    if "kv_cache_size_tokens" in found and "kv_cache_size_tokens" in entry:
        return  # a second start in one file: the first one is explained
    entry.update(found)
    if {"kv_cache_size_tokens", "max_concurrency", "group_block_sizes"} & found.keys():
        entry["lines"].append(message)


def _int(text: str) -> int:
    return int(text.replace(",", "").strip())


def _finish(r: _Reader) -> StartupLog:
    engines = tuple(
        EngineLines(
            process=name,
            engine=engine_index(name),
            **{k: v for k, v in entry.items() if k != "lines"},
            lines=tuple(entry["lines"]),
        )
        for name, entry in r.engines.items()
    )
    other = max(r.other, key=r.other.__getitem__) if r.other else None
    return StartupLog(
        version=r.version,
        model=r.model,
        platform=r.platform,
        non_default_args=r.non_default_args,
        engines=tuple(sorted(engines, key=lambda e: (e.engine, e.process))),
        workers=tuple(WorkerMemory(process=name, **entry) for name, entry in r.workers.items()),
        refusals=tuple(r.refusals),
        errors=tuple(r.errors),
        other_engine=other,
        vllm_lines=r.vllm_lines,
        problems=tuple(r.problems),
    )
