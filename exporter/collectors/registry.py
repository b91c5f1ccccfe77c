"""Collectors register themselves here; the command line derives --collector.<name> from it."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from exporter.errors import UsageError
from exporter.flags import FlagGroup
from exporter.state import Snapshot, StateSink, StateStore


class Collector(Protocol):
    """A running collector: reads one outside interface and writes what changed into the
    state."""

    name: str

    def start(self, sink: StateSink) -> None:
        """Start in the background (threads); return at once."""

    def stop(self, timeout_s: float) -> None:
        """Stop and join within `timeout_s`."""


@runtime_checkable
class EngineFollower(Protocol):
    """A collector whose targets come from what the others found (the kv_events collector
    follows the publishers vLLM reports). The daemon hands it each new snapshot; it does
    not ask the sink it writes to."""

    def engines_changed(self, snapshot: Snapshot) -> None: ...


def follow_engines(store: StateStore, collectors: Iterable[object]) -> None:
    """Hand the store's snapshots to the collectors that follow engines, now and after
    each change."""
    for collector in collectors:
        if isinstance(collector, EngineFollower):
            collector.engines_changed(store.snapshot())
            store.subscribe(functools.partial(_hand_over, store, collector))


def _hand_over(store: StateStore, follower: EngineFollower) -> None:
    follower.engines_changed(store.snapshot())


@dataclass(frozen=True, slots=True)
class CollectorSpec:
    name: str
    help: str
    default_enabled: bool
    add_arguments: Callable[[FlagGroup], None]
    # Builds the collector from parsed flags; None when it has nothing to read (a sentinel
    # for "no data", not an error: e.g. no --vllm.url given).
    build: Callable[[argparse.Namespace], Collector | None]
    # When two collectors describe one engine, each figure comes from the one with the
    # lowest priority that knows it.
    priority: int = 100


COLLECTORS: dict[str, CollectorSpec] = {}

# The most engines one target may hold (a --<collector>.max-engines flag's range).
MAX_ENGINES_LIMIT = 65536
# The engine collectors' defaults (--handshake.*, --vllm.*). Ten minutes of forget window:
# past KvcapEngineStale's `for: 5m` (so the alert fires and is seen) and past a vLLM restart
# of a large model (which returns under the same engine index), yet short enough that a dead
# engine's capacity leaves `sum by` within a few Prometheus windows.
DEFAULT_FORGET_AFTER_S = 600.0
# Data-parallel engines per pod are tens; 256 leaves room and bounds the series (issue 25:
# 1,024 forged engines of 256 groups each passed 1.5 GiB).
DEFAULT_MAX_ENGINES = 256


def register_collector(spec: CollectorSpec) -> CollectorSpec:
    if spec.name in COLLECTORS:
        raise RuntimeError(f"collector {spec.name} is registered twice")
    COLLECTORS[spec.name] = spec
    return spec


def collector_priority() -> dict[str, int]:
    """Each registered collector's rank for merging engines (the state's `priority`)."""
    return {spec.name: spec.priority for spec in COLLECTORS.values()}


def check_engine_windows(
    flag_prefix: str, stale_after_s: float | None, forget_after_s: float
) -> None:
    """The window check every engine collector's flags share: a positive forget window and
    a stale window (None: the collector's own default) inside it."""
    if not forget_after_s > 0 or (
        stale_after_s is not None and not 0 < stale_after_s < forget_after_s
    ):
        raise UsageError(
            f"--{flag_prefix}.stale-after and --{flag_prefix}.forget-after must be positive, "
            "the stale window shorter than the forget window"
        )


def check_max_engines(flag_prefix: str, max_engines: int | None) -> None:
    """An engine collector's --<prefix>.max-engines in range (None: its own default)."""
    if max_engines is not None and not 1 <= max_engines <= MAX_ENGINES_LIMIT:
        raise UsageError(f"--{flag_prefix}.max-engines must be between 1 and {MAX_ENGINES_LIMIT}")
