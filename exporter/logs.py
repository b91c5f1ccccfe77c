"""structlog setup: one event per line, logfmt or JSON, to stderr."""

from __future__ import annotations

import logging
import sys

import structlog

LEVELS = ("debug", "info", "warn", "error")
_NUMERIC = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}
# What the logs print (`level=warning`) is accepted as a level too.
_ALIASES = {"warning": "warn"}


def parse_level(text: str) -> str:
    """`debug`, `info`, `warn` (or `warning`), `error`, in any case."""
    level = _ALIASES.get(text.strip().lower(), text.strip().lower())
    if level not in _NUMERIC:
        raise ValueError(f"not a log level: {text!r} (one of debug, info, warn, error)")
    return level


def configure_logging(level: str = "info", fmt: str = "logfmt") -> None:
    numeric = _NUMERIC[parse_level(level)]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.processors.LogfmtRenderer(
            key_order=["ts", "level", "event"], bool_as_flag=False
        )
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", key="ts"),
            structlog.processors.format_exc_info,
            _logfmt_lists if fmt != "json" else _keep,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def _logfmt_lists(
    logger: object, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """logfmt has no lists: `collectors=vllm_http,nvml`, not a Python repr."""
    for key, value in event.items():
        if isinstance(value, list | tuple | set | frozenset):
            event[key] = ",".join(str(item) for item in value)
    return event


def _keep(
    logger: object, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    return event
