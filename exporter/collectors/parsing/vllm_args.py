"""The capacity-relevant flags of a `vllm serve` command line, read without vLLM.

    parse_vllm_serve_args("/models/x -tp 2 --max-model-len 32k") -> VllmServeArgs(...)
    parse_vllm_serve_args(["python3", "-m", "vllm.entrypoints.openai.api_server", ...])

It reads the argument string the Helm chart hands to both containers (`--vllm.args`),
an argv list from /proc/<pid>/cmdline, or the command line given to `kvcap-exporter
capacity`. Like vLLM's FlexibleArgumentParser it takes `--flag=value` and `--flag value`,
underscores for dashes, the last of a repeated flag, and `--config FILE.yaml` (its keys
are flags; the command line wins). Flags it does not know are skipped with their value,
if any, and listed in `ignored`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.bounded_files import FileRefused, load_yaml
from exporter.capacity import EngineSettings
from exporter.capacity.offload_settings import BACKENDS, MAX_OFFLOAD_GIB, MAX_TRANSFER_CONFIG_CHARS
from exporter.errors import ConfigError, UsageError
from exporter.units import parse_count, parse_size


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmServeArgs:
    """What the command line says; None means "not given" (vLLM's default applies)."""

    model: str | None = None
    served_model_name: str | None = None  # the first name: the `model_name` metric label
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    data_parallel_size: int | None = None
    data_parallel_size_local: int | None = None
    data_parallel_start_rank: int | None = None
    data_parallel_rank: int | None = None  # set only under external load balancing
    decode_context_parallel_size: int | None = None
    max_model_len: int | None = None  # -1: auto-fit to the available memory
    block_size: int | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    max_num_batched_tokens: int | None = None
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None
    mamba_cache_dtype: str | None = None
    mamba_ssm_cache_dtype: str | None = None
    kv_cache_memory_bytes: int | None = None
    mamba_cache_mode: str | None = None
    # --disable-hybrid-kv-cache-manager; --kv-events-config given (any object); and
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0|1 set before the launcher
    # (`VAR=1 vllm serve ...`): all three decide whether the hybrid manager is on.
    disable_hybrid_kv_cache_manager: bool | None = None
    kv_events: bool | None = None
    chunked_local_attn_with_hybrid_kv_cache: bool | None = None
    max_num_seqs: int | None = None
    revision: str | None = None
    config_file: str | None = None  # --config FILE.yaml, already merged when it was read
    # Why the --config file's settings are missing (a file past kvcap's bounds): the
    # engine is not derived from the command line alone, which would be wrong figures.
    config_refused: str | None = None
    speculative: SpeculativeConfig | None = None
    # The offload tier: --kv-offloading-size (GiB, the engine's), --kv-offloading-backend,
    # --kv-transfer-config (its JSON text, checked to be an object), and the LMCACHE_*
    # assignments before the launcher (LMCache reads its settings from the environment).
    kv_offloading_size: float | None = None
    kv_offloading_backend: str | None = None
    kv_transfer_config: str | None = None
    lmcache_env: tuple[tuple[str, str], ...] = ()
    # Flags that do not change capacity, as typed; not part of equality, for the same reason.
    ignored: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    @property
    def model_name(self) -> str | None:
        """The name vLLM serves and labels metrics with: the first served name, or the model."""
        return self.served_model_name or self.model


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """`--speculative-config` (a JSON object), the fields that bear on KV capacity."""

    method: str | None
    model: str | None
    num_speculative_tokens: int | None

    def describe(self) -> str:
        parts = [
            f"method {self.method or 'unset'}",
            f"draft model {self.model}" if self.model else "",
            f"{self.num_speculative_tokens} speculative tokens"
            if self.num_speculative_tokens is not None
            else "",
        ]
        return ", ".join(part for part in parts if part)


def parse_vllm_serve_args(
    args: str | Sequence[str],
    *,
    read_config: Callable[[str], str] | None = None,
    accepted: Callable[[str], str] | None = None,
) -> VllmServeArgs:
    """Read a `vllm serve` argument string or argv list; raises ConfigError naming a flag.

    A string is split as a POSIX shell would (shlex). A leading launcher (`vllm serve`,
    `python -m vllm.entrypoints.openai.api_server`, ...) is skipped. The model is the first
    positional argument, else `--model`. `read_config` returns the text of the file that
    `--config` names; without it the file is only recorded in `config_file`.
    `accepted` checks a flag kvcap does not model against the release's own flags (see
    exporter.capacity.serve_flags): it returns the flag vLLM reads it as (an abbreviation
    of a modelled flag is that flag) or raises UsageError; without it such a flag is
    listed in `ignored`, unchecked.
    """
    try:
        tokens = shlex.split(args) if isinstance(args, str) else list(args)
    except ValueError as error:  # an unbalanced quote
        raise UsageError(f"cannot split the vLLM arguments: {error}") from None
    environment, tokens = _environment(tokens)
    tokens = without_launcher(tokens)
    config_file = _config_file(tokens)
    if config_file is not None and read_config is not None:
        # vLLM puts the file's flags first, so the command line wins over the file.
        file_tokens = config_tokens(config_file, read_config)
        _check_values(file_tokens, f"--config {config_file}")
        tokens = [*file_tokens, *tokens]
    parsed = _parse_tokens(tokens, accepted)
    return dataclasses.replace(parsed, **environment) if environment else parsed


# Environment variables that change the KV cache plan: (VllmServeArgs field).
_ENVIRONMENT = {
    "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE": "chunked_local_attn_with_hybrid_kv_cache"
}
# LMCache's settings as variables before the launcher (`LMCACHE_MAX_LOCAL_CPU_SIZE=40 vllm
# serve ...`); more than this many are not a command line a person wrote.
LMCACHE_PREFIX = "LMCACHE_"
MAX_LMCACHE_VARIABLES = 64
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)


def leading_assignments(tokens: Sequence[str]) -> int:
    """How many shell assignments (`NAME=value`) start the command line."""
    count = 0
    while count < len(tokens) and _ASSIGNMENT.fullmatch(tokens[count]):
        count += 1
    return count


def _environment(tokens: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Leading shell assignments (`NAME=value vllm serve ...`): the known ones, read as
    vLLM reads them (an integer, 0 off), and the tokens after them."""
    values: dict[str, Any] = {}
    count = leading_assignments(tokens)
    lmcache: list[tuple[str, str]] = []
    for assignment in tokens[:count]:
        name, _, text = assignment.partition("=")  # a name holds no "="
        if name.startswith(LMCACHE_PREFIX) and len(lmcache) < MAX_LMCACHE_VARIABLES:
            lmcache.append((name[:64], text[:256]))
        if name not in _ENVIRONMENT:
            continue
        try:
            values[_ENVIRONMENT[name]] = bool(int(text))
        except ValueError:
            raise UsageError(f"{name} must be an integer (0 or 1), got {text!r}") from None
    if lmcache:
        values["lmcache_env"] = tuple(lmcache)
    return values, tokens[count:]


def _parse_tokens(tokens: list[str], accepted: Callable[[str], str] | None) -> VllmServeArgs:
    values: dict[str, Any] = {}  # VllmServeArgs fields, typed by the converters
    positionals: list[str] = []
    ignored: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token == "--":
            positionals.extend(tokens[index:])
            break
        if not _is_flag(token):
            positionals.append(token)
            continue
        flag, has_value, value = _split_flag(token, accepted)
        if flag in _BOOLEANS:
            field, meaning = _BOOLEANS[flag]
            if not has_value and index < len(tokens) and tokens[index].lower() in _LITERALS:
                # Older releases declared booleans with nargs="?": `--flag False`.
                has_value, value = True, tokens[index]
                index += 1
            values[field] = meaning if not has_value else meaning == _literal(flag, value)
        elif flag == "--served-model-name":
            names, index = _greedy_values(tokens, index, flag, value if has_value else None)
            values["served_model_name"] = names[0]
        elif flag in _FLAGS:
            field, convert = _FLAGS[flag]
            if not has_value:
                if index >= len(tokens) or _is_flag(tokens[index]):
                    raise UsageError(f"{flag} needs a value")
                value = tokens[index]
                index += 1
            values[field] = convert(flag, value)
        elif not has_value and index < len(tokens) and _swallows(flag, tokens[index]):
            ignored.append(f"{token} {tokens[index]}")
            index += 1
        else:
            ignored.append(token)
    # `vllm serve` prefers the positional model over --model (cli/serve.py).
    if positionals:
        values["model"] = positionals[0]
    ignored.extend(positionals[1:])
    return dataclasses.replace(VllmServeArgs(), **values, ignored=tuple(ignored))


# --- --config FILE.yaml ---------------------------------------------------------------


def _config_file(tokens: list[str]) -> str | None:
    """The value of the last `--config` before any `--`."""
    found = None
    for index, token in enumerate(tokens):
        if token == "--":
            break
        if token == "--config" and index + 1 < len(tokens):
            found = tokens[index + 1]
        elif token.startswith("--config="):
            found = token.partition("=")[2]
    return found


def _check_values(tokens: list[str], where: str) -> None:
    """A bad value of a known flag among `tokens` (a config file's) names `where`."""
    for flag, value in zip(tokens, [*tokens[1:], ""], strict=True):
        if flag in _FLAGS and not value.startswith("--"):
            try:
                vllm_flag_value(flag, value)
            except UsageError as error:
                raise UsageError(f"{where}: {error}") from None


def config_tokens(path: str, read_config: Callable[[str], str]) -> list[str]:
    """The flags a vLLM YAML config file stands for: `max_model_len: 8192` is
    `--max-model-len 8192`, `true` a bare switch, `false` its `--no-` form, a list the
    flag's values, a mapping JSON (as vLLM's `load_config_file` does)."""
    try:
        text = read_config(path)
        document = load_yaml(text)
    except FileRefused as error:  # past a bound of bounded_files, or not valid YAML
        raise error.naming(f"--config {path}") from None
    except OSError as error:
        raise ConfigError(f"--config {path}: cannot read it: {error.strerror or error}") from None
    except ValueError as error:  # not UTF-8, or a NUL byte in the path
        raise ConfigError(f"--config {path}: cannot read it: {error}") from None
    if document is None:
        return []
    if not isinstance(document, dict):
        raise FileRefused(
            "file_malformed", f"--config {path}: must be a mapping of flag names to values"
        )
    return mapping_tokens(document)


def mapping_tokens(document: dict[object, object]) -> list[str]:
    """The flags a mapping of flag names to values stands for, as a config file's are."""
    tokens: list[str] = []
    for key, value in document.items():
        flag = "--" + str(key).replace("_", "-")
        if flag == "--config":
            continue  # vLLM refuses nesting; kvcap does not follow it either
        if isinstance(value, bool):
            tokens.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, list):
            tokens.extend([flag, *(str(item) for item in value)])
        elif isinstance(value, dict):
            tokens.extend([flag, json.dumps(value)])
        elif value is not None:
            tokens.extend([flag, str(value)])
    return tokens


def vllm_flag_value(flag: str, text: str) -> tuple[str, object]:
    """(VllmServeArgs field, value) of one known flag's value, converted as in a command."""
    field, convert = _FLAGS[flag]
    return field, convert(flag, text)


def to_engine_settings(args: VllmServeArgs) -> EngineSettings:
    """The capacity model's settings; flags not given keep EngineSettings' defaults."""
    given = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(EngineSettings)
        if getattr(args, field.name, None) is not None
    }
    return dataclasses.replace(EngineSettings(), **given)


# --- launcher -------------------------------------------------------------------------

# `python -m <module>` entry points whose own flags follow the module name.
_API_SERVER_MODULES = frozenset(
    {"vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"}
)
_CLI_MODULES = frozenset({"vllm.entrypoints.cli.main"})


def without_launcher(tokens: list[str]) -> list[str]:
    """The tokens after `[python ...] vllm serve` or `python -m <api server module>`."""
    if tokens[:1] == ["serve"]:
        return tokens[1:]
    for index, token in enumerate(tokens):
        if token.startswith("--"):
            break  # the launcher, if any, comes before the first long flag
        previous = tokens[index - 1] if index else ""
        if token == "serve" and (os.path.basename(previous) == "vllm" or previous in _CLI_MODULES):
            return tokens[index + 1 :]
        if token in _API_SERVER_MODULES and previous == "-m":
            return tokens[index + 1 :]
    return tokens


# --- tokens ---------------------------------------------------------------------------

# argparse reads a token that looks like a negative number as a value, not a flag.
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")
_LITERALS = frozenset({"true", "false"})


def _is_flag(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _NEGATIVE_NUMBER.fullmatch(token)


def _split_flag(token: str, accepted: Callable[[str], str] | None = None) -> tuple[str, bool, str]:
    """(canonical flag, whether `=value` was attached, the value); `accepted` gives the
    flag vLLM reads an unmodelled one as, or refuses it."""
    flag, equals, value = token.partition("=")
    if flag.startswith("--"):
        # vLLM's FlexibleArgumentParser accepts `--max_model_len` for `--max-model-len`.
        flag = flag.replace("_", "-")
    if accepted is not None and flag not in _MODELLED:
        flag = accepted(flag)
    return flag, bool(equals), value


def _literal(flag: str, value: str) -> bool:
    if value.lower() not in _LITERALS:
        raise UsageError(f"{flag} takes no value or true/false, got {value!r}")
    return value.lower() == "true"


def _greedy_values(
    tokens: list[str], index: int, flag: str, attached: str | None
) -> tuple[list[str], int]:
    """Values of an nargs="+" flag: the attached one, or every token up to the next flag."""
    if attached is not None:
        return [attached], index
    start = index
    while index < len(tokens) and not _is_flag(tokens[index]):
        index += 1
    if index == start:
        raise UsageError(f"{flag} needs a value")
    return tokens[start:index], index


# Unknown flags of these shapes are switches in vLLM (store_true or BooleanOptionalAction),
# so the token after them is not their value: `--trust-remote-code /models/x`.
_SWITCH_PREFIXES = ("--enable-", "--disable-", "--no-")
_OPTIMIZATION = re.compile(r"-O\d")
_SWITCHES = frozenset(
    {
        "--trust-remote-code",
        "--enforce-eager",
        "--headless",
        "--async-scheduling",
        "--data-parallel-hybrid-lb",
        "--data-parallel-external-lb",
        "--skip-tokenizer-init",
        "--calculate-kv-scales",
        "--kv-sharing-fast-prefill",
        "--use-tqdm-on-load",
        "--ray-workers-use-nsight",
        "--fully-sharded-loras",
        "--interleave-mm-strings",
        "--skip-mm-profiling",
        "--return-tokens-as-token-ids",
    }
)


def _swallows(flag: str, following: str) -> bool:
    """Whether the unknown `flag` takes `following` as its value.

    At most one token, and never one that is a flag, so an unknown flag cannot hide a
    known one. A switch takes only a true/false literal, as older releases allowed.
    """
    if _is_flag(following):
        return False
    switch = (
        flag in _SWITCHES
        or flag.startswith(_SWITCH_PREFIXES)
        # `-O3` is `--compilation-config 3` with the value attached.
        or _OPTIMIZATION.fullmatch(flag) is not None
    )
    return not switch or following.lower() in _LITERALS


# --- values ---------------------------------------------------------------------------


def _integer(minimum: int) -> Callable[[str, str], int]:
    def convert(flag: str, text: str) -> int:
        try:
            value = int(text)  # what argparse's type=int accepts
        except ValueError:
            raise UsageError(f"{flag} must be an integer, got {text!r}") from None
        if value < minimum:
            raise UsageError(f"{flag} must be at least {minimum}, got {value}")
        return value

    return convert


def _count(flag: str, text: str) -> int:
    """vLLM's human_readable_int: `8192`, `8k` (8000), `8K` (8192)."""
    try:
        value = parse_count(text)
    except ConfigError as error:
        raise UsageError(f"{flag}: {error}") from None
    if value < 1:
        raise UsageError(f"{flag} must be a positive integer, got {text!r}")
    return value


def _max_model_len(flag: str, text: str) -> int:
    # -1 and `auto` ask vLLM to fit the longest context the KV cache holds.
    if text.strip().lower() in ("auto", "-1"):
        return -1
    return _count(flag, text)


def _bytes(flag: str, text: str) -> int:
    try:
        return parse_size(text)
    except ConfigError as error:
        raise UsageError(f"{flag}: {error}") from None


def _fraction(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{flag} must be a number, got {text!r}") from None
    # vLLM's CacheConfig: gt=0, le=1.
    if not (math.isfinite(value) and 0 < value <= 1):
        raise UsageError(f"{flag} must be in (0, 1], got {text!r}")
    return value


def _speculative(flag: str, text: str) -> SpeculativeConfig:
    document = _json_object(flag, text)
    tokens = document.get("num_speculative_tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)):
        raise UsageError(f"{flag}: num_speculative_tokens must be an integer, got {tokens!r}")
    method, model = document.get("method"), document.get("model")
    return SpeculativeConfig(
        method=None if method is None else str(method),
        model=None if model is None else str(model),
        num_speculative_tokens=tokens,
    )


def _json_object_given(flag: str, text: str) -> bool:
    """A JSON-object flag whose presence is what matters (vLLM: the config is not None)."""
    _json_object(flag, text)
    return True


def _json_object(flag: str, text: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except ValueError:
        raise UsageError(f"{flag} must be a JSON object, got {text[:60]!r}") from None
    if not isinstance(document, dict):
        raise UsageError(f"{flag} must be a JSON object, got {text[:60]!r}")
    return document


def _offloading_size(flag: str, text: str) -> float:
    """vLLM's float GiB; kvcap's offload model checks it against the host (offload_settings)."""
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{flag} must be a number of GiB, got {text[:40]!r}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_OFFLOAD_GIB):
        raise UsageError(f"{flag} must be a positive number of GiB up to 2**20, got {text[:40]!r}")
    return value


def _offloading_backend(flag: str, text: str) -> str:
    if text not in BACKENDS:
        raise UsageError(f"{flag} must be one of {', '.join(BACKENDS)}, got {text[:40]!r}")
    return text


def _transfer_config(flag: str, text: str) -> str:
    if len(text) > MAX_TRANSFER_CONFIG_CHARS:
        raise UsageError(f"{flag}: {len(text)} characters, more than {MAX_TRANSFER_CONFIG_CHARS}")
    _json_object(flag, text)
    return text


def _mamba_cache_mode(flag: str, text: str) -> str:
    if text not in _MAMBA_CACHE_MODES:
        raise UsageError(f"{flag} must be one of {', '.join(_MAMBA_CACHE_MODES)}, got {text!r}")
    return text


_MAMBA_CACHE_MODES = ("none", "align", "all")


def _text(flag: str, text: str) -> str:
    if not text:
        raise UsageError(f"{flag} needs a non-empty value")
    return text


_POSITIVE = _integer(1)
_RANK = _integer(0)

# Flag -> (VllmServeArgs field, converter). Short aliases as vLLM's arg_utils declares them.
_FLAGS: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "--model": ("model", _text),
    "--tensor-parallel-size": ("tensor_parallel_size", _POSITIVE),
    "-tp": ("tensor_parallel_size", _POSITIVE),
    "--pipeline-parallel-size": ("pipeline_parallel_size", _POSITIVE),
    "-pp": ("pipeline_parallel_size", _POSITIVE),
    "--data-parallel-size": ("data_parallel_size", _POSITIVE),
    "-dp": ("data_parallel_size", _POSITIVE),
    "--data-parallel-size-local": ("data_parallel_size_local", _RANK),
    "-dpl": ("data_parallel_size_local", _RANK),
    "--data-parallel-start-rank": ("data_parallel_start_rank", _RANK),
    "-dpr": ("data_parallel_start_rank", _RANK),
    "--data-parallel-rank": ("data_parallel_rank", _RANK),
    "-dpn": ("data_parallel_rank", _RANK),
    "--decode-context-parallel-size": ("decode_context_parallel_size", _POSITIVE),
    "-dcp": ("decode_context_parallel_size", _POSITIVE),
    "--max-model-len": ("max_model_len", _max_model_len),
    "--block-size": ("block_size", _POSITIVE),
    "--kv-cache-dtype": ("kv_cache_dtype", _text),
    "--dtype": ("dtype", _text),
    "--max-num-batched-tokens": ("max_num_batched_tokens", _count),
    "--num-gpu-blocks-override": ("num_gpu_blocks_override", _POSITIVE),
    "--gpu-memory-utilization": ("gpu_memory_utilization", _fraction),
    "--mamba-cache-dtype": ("mamba_cache_dtype", _text),
    "--mamba-ssm-cache-dtype": ("mamba_ssm_cache_dtype", _text),
    "--kv-cache-memory-bytes": ("kv_cache_memory_bytes", _bytes),
    "--mamba-cache-mode": ("mamba_cache_mode", _mamba_cache_mode),
    "--max-num-seqs": ("max_num_seqs", _POSITIVE),
    "--revision": ("revision", _text),
    "--config": ("config_file", _text),
    "--speculative-config": ("speculative", _speculative),
    "--kv-events-config": ("kv_events", _json_object_given),
    "--kv-offloading-size": ("kv_offloading_size", _offloading_size),
    "--kv-offloading-backend": ("kv_offloading_backend", _offloading_backend),
    "--kv-transfer-config": ("kv_transfer_config", _transfer_config),
}

_BOOLEANS: dict[str, tuple[str, bool]] = {
    "--enable-prefix-caching": ("enable_prefix_caching", True),
    "--no-enable-prefix-caching": ("enable_prefix_caching", False),
    "--disable-hybrid-kv-cache-manager": ("disable_hybrid_kv_cache_manager", True),
    "--no-disable-hybrid-kv-cache-manager": ("disable_hybrid_kv_cache_manager", False),
}

# Flags read as themselves, never looked up among a release's flags: kvcap's inputs (e.g.
# --kv-cache-memory-bytes) work with every release it plans for.
_MODELLED = frozenset({*_FLAGS, *_BOOLEANS, "--served-model-name"})
