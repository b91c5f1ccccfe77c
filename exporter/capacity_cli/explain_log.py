"""`kvcap-exporter capacity --explain-log FILE|-`: every capacity figure of a vLLM start-up
log re-planned with its release's rules and explained, per engine, worker and KV cache group.

    kvcap-exporter capacity --explain-log vllm.log [MODEL]   # MODEL: else the one the log names
    kubectl logs vllm-0 | kvcap-exporter capacity --explain-log - --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from exporter.capacity import (
    CPU,
    CUDA,
    PLATFORMS,
    EngineSettings,
    ReleaseRules,
    parse_version,
    release_rules,
)
from exporter.capacity.startup_log import StartupLog, WorkerMemory, parse_startup_log
from exporter.capacity_cli.log_explanation import (
    engine_document,
    engine_text,
    metrics_lines,
    refusal_document,
    refusal_text,
)
from exporter.capacity_cli.log_refusal import RefusalReproduction, reproduce_refusal
from exporter.capacity_cli.log_reproduction import (
    EngineReproduction,
    engines_of,
    reproduce_engine,
)
from exporter.collectors.parsing import parse_vllm_serve_args, to_engine_settings
from exporter.collectors.parsing.vllm_args import mapping_tokens
from exporter.errors import ConfigError, KvcapError
from exporter.model_config import ResolvedModel, load_model_config, resolve_model

# The most of a log read: a start-up log is a few hundred KiB; a whole day's log is cut
# to its start-up part by the operator (head -c), not read whole.
MAX_LOG_BYTES = 16 * 2**20
# Longer lines are cut here (vLLM's longest start-up line, its engine config, is ~3 KiB).
MAX_LINE_CHARS = 64 * 1024


@dataclass(frozen=True, slots=True)
class LogExplanation:
    """A start-up log, the release and model it names, and each engine re-planned."""

    source: str
    log: StartupLog
    release: ReleaseRules
    platform: str
    model: ResolvedModel
    settings: EngineSettings
    settings_source: str
    engines: tuple[EngineReproduction, ...]
    refusal: RefusalReproduction | None = None  # a start-up vLLM refused or did not finish

    @property
    def differences(self) -> tuple[str, ...]:
        found = [d for r in self.engines for d in r.differences]
        return (*found, *(self.refusal.differences if self.refusal else ()))

    @property
    def data_parallel_size(self) -> int:
        return max(len(self.engines), 1)


def read_log(name: str, stdin: BinaryIO | None = None) -> list[str]:
    """The lines of FILE (or `-`: standard input), at most MAX_LOG_BYTES; text only."""
    label = "standard input" if name == "-" else name
    try:
        if name == "-":
            data = (stdin or sys.stdin.buffer).read(MAX_LOG_BYTES + 1)
        else:
            with open(name, "rb") as handle:
                data = handle.read(MAX_LOG_BYTES + 1)
    except OSError as error:
        raise ConfigError(
            f"--explain-log {label}: cannot read it: {error.strerror or error}"
        ) from None
    if len(data) > MAX_LOG_BYTES:
        raise ConfigError(
            f"--explain-log {label}: longer than {MAX_LOG_BYTES // 2**20} MiB, the most "
            "explain-log reads; give the start-up part (e.g. head -c 8M)"
        )
    if b"\x00" in data:
        raise ConfigError(f"--explain-log {label}: not a text log (it holds NUL bytes)")
    text = data.decode("utf-8", errors="replace")
    return [line[:MAX_LINE_CHARS] for line in text.splitlines()]


def explain(
    lines: list[str],
    *,
    source: str,
    model: str | None = None,
    vllm_version: str | None = None,
    platform: str | None = None,
    overrides: Sequence[str] = (),
) -> LogExplanation:
    """Parse, check and re-plan a start-up log; raises ConfigError naming what is missing."""
    log = parse_startup_log(lines)
    engines = engines_of(log)
    _check_is_vllm(log, source, has_capacity=bool(engines))
    release = _release(log, vllm_version, source)
    died_after_memory = log.failed_start and any(
        w.available_kv_gib is not None for w in log.workers
    )
    if not engines and not log.refusals and not died_after_memory:
        raise ConfigError(_no_capacity(log, source, len(lines)))
    platform = platform or _platform(log)
    resolved, config = _model(log, model)
    settings, settings_source = _settings(log, release.version, platform, overrides)
    kv_bytes = settings_kv_bytes(log)
    reproductions = tuple(
        reproduce_engine(
            config,
            settings,
            release.rules,
            engine,
            log.workers,
            engines=len(engines),
            kv_memory_bytes=kv_bytes,
            attention_block_size=log.attention_block_size,
        )
        for engine in engines
    )
    refusal = (
        None if engines else reproduce_refusal(config, settings, log, kv_memory_bytes=kv_bytes)
    )
    return LogExplanation(
        source, log, release, platform, resolved, settings, settings_source, reproductions, refusal
    )


def _check_is_vllm(log: StartupLog, source: str, *, has_capacity: bool) -> None:
    if log.other_engine is not None and not has_capacity and log.version is None:
        raise ConfigError(
            f"{source}: a {log.other_engine} log, not vLLM's: explain-log reads vLLM start-up logs"
        )
    if log.vllm_lines == 0 and not has_capacity:
        raise ConfigError(f"{source}: not a vLLM log (no line has vLLM's process prefix or header)")


def _release(log: StartupLog, given: str | None, source: str) -> ReleaseRules:
    version = given or log.version
    if version is None:
        raise ConfigError(
            f"{source}: the log does not name the vLLM release (no 'vLLM API server version' "
            "or 'Initializing a V1 LLM engine (vX.Y.Z)' line): give --vllm-version"
        )
    parse_version(version)  # not a release number: ConfigError naming it
    return release_rules(version)  # older than kvcap models: ConfigError


def _no_capacity(log: StartupLog, source: str, count: int) -> str:
    # The first exception is the cause; what follows it wraps or repeats it.
    cause = f"; its first error: {log.errors[0][:300]}" if log.errors else ""
    return (
        f"{source}: no KV cache capacity line ('KV cache size', 'Maximum concurrency') in its "
        f"{count} lines: the log is cut before the engine planned its KV cache, or the engine "
        f"stopped before it{cause}"
    )


def _platform(log: StartupLog) -> str:
    devices = {e.device for e in log.engines if e.device}
    if log.platform in PLATFORMS:
        return log.platform
    return CPU if devices == {"CPU"} else CUDA


def _model(log: StartupLog, given: str | None) -> tuple[ResolvedModel, Mapping[str, Any]]:
    args = log.non_default_args or {}
    named = given or _text(args.get("model")) or _text(args.get("model_tag")) or log.model
    if named is None:
        raise ConfigError(
            "the log does not name the model: give its folder, config.json or HF id "
            "(capacity --explain-log FILE MODEL)"
        )
    try:
        resolved = resolve_model(named)
        return resolved, load_model_config(resolved.config_file)
    except KvcapError as error:
        raise ConfigError(
            f"the model's config.json is needed to re-plan the log: {error} (give the folder, "
            "a config.json or an HF id in the local cache: capacity --explain-log FILE MODEL)"
        ) from None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _settings(
    log: StartupLog, version: str, platform: str, overrides: Sequence[str]
) -> tuple[EngineSettings, str]:
    """The engine settings the non-default args line gives (vLLM's defaults for the rest),
    the scheduler's resolved batch size, then the vLLM flags given after the log."""
    if log.non_default_args is None:
        settings = EngineSettings(platform=platform, vllm_version=version)
        source = "no 'non-default args' line: vLLM's defaults, max_model_len as logged"
    else:
        # Through JSON (what is not JSON as its text), the dict reads as vLLM's --config
        # file does, flag by flag.
        document = json.loads(json.dumps(log.non_default_args, default=str))
        try:
            tokens = mapping_tokens(document)
            parsed = parse_vllm_serve_args(["serve", *tokens])
        except KvcapError as error:  # the log's values, not this command line, are wrong
            raise ConfigError(f"the log's non-default args: {error}") from None
        settings = dataclasses.replace(
            to_engine_settings(parsed), platform=platform, vllm_version=version
        )
        source = "the 'non-default args' line (vLLM's defaults for the rest)"
    if settings.max_num_batched_tokens is None and log.max_num_batched_tokens is not None:
        settings = dataclasses.replace(settings, max_num_batched_tokens=log.max_num_batched_tokens)
        source += (
            f"; max_num_batched_tokens {log.max_num_batched_tokens} as the scheduler logged it"
        )
    if log.ssm_state_float32 and settings.mamba_ssm_cache_dtype == "auto":
        settings = dataclasses.replace(settings, mamba_ssm_cache_dtype="float32")
        source += "; the SSM state in float32, as the platform logged it (Mamba layers only)"
    if overrides:
        given = parse_vllm_serve_args(["serve", "model", *overrides])
        changed = {
            name: getattr(given, name)
            for name in (
                "block_size",
                "max_num_batched_tokens",
                "kv_cache_dtype",
                "dtype",
                "enable_prefix_caching",
                "tensor_parallel_size",
                "pipeline_parallel_size",
                "mamba_cache_mode",
                "mamba_ssm_cache_dtype",
                "mamba_cache_dtype",
                "max_model_len",
            )
            if getattr(given, name) is not None
        }
        settings = dataclasses.replace(settings, **changed)
        source += f"; given after the log: {' '.join(overrides)}"
    return settings, source


def settings_kv_bytes(log: StartupLog) -> int | None:
    """`kv_cache_memory_bytes` of the non-default args: exact, no profiling."""
    value = (log.non_default_args or {}).get("kv_cache_memory_bytes")
    return value if type(value) is int and value > 0 else None


def explanation_text(explanation: LogExplanation) -> str:
    e = explanation
    out = [
        f"{e.source}: vLLM {e.release.version} start-up log, {len(e.engines)} engine(s) "
        f"printed capacity, platform {e.platform}",
        f"  rules: kvcap's {e.release.rules.name} entry"
        + (" (approximate: newer than every release kvcap knows)" if e.release.approximate else ""),
        f"  model: {e.model.name} ({e.model.found_in}: {e.model.config_file})",
        f"  settings: {e.settings_source}",
    ]
    for worker in e.log.workers:
        out.append(f"  worker {worker.process or '(no prefix)'}: " + _worker_memory(worker))
    for problem in e.log.problems:
        out.append(f"  log problem: {problem}")
    for refusal in e.log.refusals:
        out.append(f"  vLLM refused to start: {refusal}")
    for reproduction in e.engines:
        out += engine_text(reproduction, e.release.rules)
    if e.refusal is not None:
        out += refusal_text(e.refusal, e.log.errors)
    out += metrics_lines(e.engines, e.release.rules, e.data_parallel_size)
    differences = e.differences
    if differences:
        out.append(f"differences: {len(differences)} (listed above)")
    elif e.refusal is not None and e.refusal.vllm_refusal is None:
        out.append(
            "differences: none found (vLLM's refusal message is not in the log: kvcap's "
            "refusal above is its prediction)"
        )
    else:
        out.append("differences: none: every figure of the log reproduced")
    return "\n".join(out) + "\n"


def _worker_memory(worker: WorkerMemory) -> str:
    parts = []
    if worker.model_loading_gib is not None:
        parts.append(f"weights {worker.model_loading_gib} GiB")
    if worker.available_kv_gib is not None:
        parts.append(f"KV cache {worker.available_kv_gib} GiB")
    if worker.cuda_graph_gib is not None:
        parts.append(f"CUDA graphs {worker.cuda_graph_gib} GiB")
    if worker.profiling_line is not None:
        parts.append(f'profiling: "{worker.profiling_line}"')
    return "; ".join(parts)


def explanation_document(explanation: LogExplanation) -> dict[str, Any]:
    e = explanation
    return {
        "source": e.source,
        "vllm_version": e.release.version,
        "rules": e.release.rules.name,
        "approximate": e.release.approximate,
        "platform": e.platform,
        "model": {"name": e.model.name, "config_file": str(e.model.config_file)},
        "settings_source": e.settings_source,
        "log": {
            "model": e.log.model,
            "non_default_args": e.log.non_default_args,
            "workers": [dataclasses.asdict(w) for w in e.log.workers],
            "refusals": list(e.log.refusals),
            "problems": list(e.log.problems),
        },
        "engines": [engine_document(r, e.release.rules) for r in e.engines],
        "refusal": refusal_document(e.refusal) if e.refusal else None,
        "reproduced": all(r.reproduced for r in e.engines)
        and (e.refusal is None or e.refusal.reproduced),
        "differences": list(e.differences),
    }


def run(args: argparse.Namespace, out: TextIO) -> int:
    """The --explain-log command: 0 explained (differences included), 1 bad input."""
    name = args.explain_log
    tokens = [*(args.vllm_tokens or []), *(args.vllm_tail or [])]
    model = tokens.pop(0) if tokens and not tokens[0].startswith("-") else None
    lines = read_log(name)
    source = "standard input" if name == "-" else Path(name).name
    explanation = explain(
        lines,
        source=source,
        model=model,
        vllm_version=args.vllm_version,
        overrides=tokens,
    )
    if args.json:
        json.dump(explanation_document(explanation), out, indent=2, default=str)
        out.write("\n")
    else:
        out.write(explanation_text(explanation))
    return 0
