"""structlog setup: one event per line, logfmt or JSON, to stderr."""

from __future__ import annotations

import logging
import sys

import structlog

LEVELS = ("debug", "info", "warn", "error")


def configure_logging(level: str = "info", fmt: str = "logfmt") -> None:
    numeric = {
        "debug": logging.DEBUG,
        "info": logging.INFO,
        "warn": logging.WARNING,
        "error": logging.ERROR,
    }[level]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.processors.LogfmtRenderer(key_order=["ts", "level", "event"])
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", key="ts"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
