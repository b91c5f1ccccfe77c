"""Sources register themselves here; the command line derives --collector.<name> from it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from exporter.state import StateSink


class Source(Protocol):
    """A running source: reads the outside world and writes reports into the state."""

    name: str

    def start(self, sink: StateSink) -> None:
        """Start in the background (threads); return at once."""

    def stop(self, timeout_s: float) -> None:
        """Stop and join within `timeout_s`."""


@dataclass(frozen=True, slots=True)
class SourceSpec:
    name: str
    help: str
    default_enabled: bool
    add_arguments: Callable[[argparse._ArgumentGroup], None]
    # Builds the source from parsed flags; None when it has nothing to read (a sentinel
    # for "no data", not an error: e.g. no --vllm.url given).
    build: Callable[[argparse.Namespace], Source | None]


SOURCES: dict[str, SourceSpec] = {}


def register_source(spec: SourceSpec) -> SourceSpec:
    if spec.name in SOURCES:
        raise RuntimeError(f"source {spec.name} is registered twice")
    SOURCES[spec.name] = spec
    return spec
