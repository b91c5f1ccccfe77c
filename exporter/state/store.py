"""The per-engine state: sources write into it, the scrape path reads its snapshot."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import structlog

from exporter.state.gpus import headroom_tokens, map_engine_gpus
from exporter.state.records import EngineReport, GpuReport
from exporter.state.snapshot import (
    EMPTY,
    Snapshot,
    SourceReports,
    SourceStatus,
    build_engine_views,
)

log = structlog.get_logger("kvcap.state")


class StateSink(Protocol):
    """What a source may do to the state. Sources never read it."""

    def register_target(self, source: str, target: str) -> None: ...

    def publish(
        self,
        source: str,
        target: str,
        reports: Sequence[EngineReport],
        *,
        duration_s: float | None = None,
    ) -> None: ...

    def fail(
        self,
        source: str,
        target: str,
        reason: str,
        message: str,
        *,
        duration_s: float | None = None,
        stale: bool = True,
    ) -> None: ...

    def reject(self, source: str, target: str, reason: str, message: str) -> None: ...

    def publish_gpus(
        self,
        source: str,
        target: str,
        gpus: Sequence[GpuReport],
        *,
        duration_s: float | None = None,
    ) -> None: ...

    def forget(self, source: str, target: str, engine: str | None = None) -> None: ...


@dataclass(slots=True)
class _Target:
    status: SourceStatus
    reports: SourceReports | None = None


class StateStore:
    """Thread-safe holder of every source's last good reports.

    Each change builds a new immutable `Snapshot` and swaps it in, so a scrape reads one
    consistent view without locks. Errors keep the last good data, marked stale.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._targets: dict[tuple[str, str], _Target] = {}
        self._errors: dict[tuple[str, str], int] = {}
        self._gpus: dict[tuple[str, str], tuple[GpuReport, ...]] = {}
        self._version = 0
        self._snapshot = EMPTY

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def register_target(self, source: str, target: str) -> None:
        with self._lock:
            self._target(source, target)
            self._rebuild()

    def publish(
        self,
        source: str,
        target: str,
        reports: Sequence[EngineReport],
        *,
        duration_s: float | None = None,
    ) -> None:
        """A successful read: these are all the engines this target has now."""
        now = self._clock()
        with self._lock:
            entry = self._target(source, target)
            self._log_changes(entry, reports)
            if not entry.status.up and entry.status.has_reported:
                log.info("source recovered", source=source, target=target)
            entry.reports = SourceReports(source, target, tuple(reports), now, stale=False)
            entry.status = replace(
                entry.status,
                up=True,
                has_reported=True,
                last_success_s=now,
                last_duration_s=duration_s,
                last_error=None,
            )
            self._rebuild()

    def fail(
        self,
        source: str,
        target: str,
        reason: str,
        message: str,
        *,
        duration_s: float | None = None,
        stale: bool = True,
    ) -> None:
        """A failed read: count it and keep the last good data, marked stale unless the
        source says it is still within its freshness window."""
        with self._lock:
            entry = self._target(source, target)
            if entry.status.up or not entry.status.has_reported:
                # Log once per state change, not once per poll.
                log.warning(
                    "source failed", source=source, target=target, reason=reason, error=message
                )
            key = (source, reason)
            self._errors[key] = self._errors.get(key, 0) + 1
            if entry.reports is not None and stale:
                entry.reports = replace(entry.reports, stale=True)
            # GPU figures are live readings: a failed read leaves none rather than old ones.
            self._gpus.pop((source, target), None)
            entry.status = replace(
                entry.status,
                up=False,
                has_reported=True,
                last_duration_s=duration_s,
                last_error=f"{reason}: {message}",
            )
            self._rebuild()

    def publish_gpus(
        self,
        source: str,
        target: str,
        gpus: Sequence[GpuReport],
        *,
        duration_s: float | None = None,
    ) -> None:
        """A successful GPU read: these are all the GPUs of this target now, in the order
        the engines' workers number them."""
        now = self._clock()
        with self._lock:
            entry = self._target(source, target)
            if not entry.status.up and entry.status.has_reported:
                log.info("source recovered", source=source, target=target)
            self._gpus[(source, target)] = tuple(gpus)
            entry.status = replace(
                entry.status,
                up=True,
                has_reported=True,
                last_success_s=now,
                last_duration_s=duration_s,
                last_error=None,
            )
            self._rebuild()

    def reject(self, source: str, target: str, reason: str, message: str) -> None:
        """A bad input that did not stop the source (a malformed frame): count it, log the
        first of each reason, and change nothing else."""
        with self._lock:
            key = (source, reason)
            if key not in self._errors:
                log.warning(
                    "input rejected", source=source, target=target, reason=reason, error=message
                )
            self._errors[key] = self._errors.get(key, 0) + 1
            self._rebuild(engines_changed=False)

    def forget(self, source: str, target: str, engine: str | None = None) -> None:
        """Drop an engine (clean shutdown) or every engine of a target."""
        with self._lock:
            entry = self._targets.get((source, target))
            if entry is None or entry.reports is None:
                return
            kept = tuple(
                r for r in entry.reports.reports if engine is not None and r.engine != engine
            )
            for report in entry.reports.reports:
                if report not in kept:
                    log.info("engine removed", source=source, target=target, engine=report.engine)
            entry.reports = replace(entry.reports, reports=kept)
            self._rebuild()

    def _target(self, source: str, target: str) -> _Target:
        key = (source, target)
        if key not in self._targets:
            self._targets[key] = _Target(
                SourceStatus(
                    source,
                    target,
                    up=False,
                    has_reported=False,
                    last_success_s=None,
                    last_duration_s=None,
                    last_error=None,
                )
            )
        return self._targets[key]

    def _log_changes(self, entry: _Target, reports: Sequence[EngineReport]) -> None:
        before = {r.engine: r for r in entry.reports.reports} if entry.reports else {}
        after = {r.engine: r for r in reports}
        source, target = entry.status.source, entry.status.target
        for engine, report in after.items():
            old = before.get(engine)
            if old is None:
                log.info(
                    "engine added",
                    source=source,
                    target=target,
                    engine=engine,
                    model_name=report.model_name,
                )
            elif old.instance_id != report.instance_id or _blocks(old) != _blocks(report):
                # The HTTP source sees no instance id; a new block count means a restart.
                log.info(
                    "engine restarted",
                    source=source,
                    target=target,
                    engine=engine,
                    instance_id=report.instance_id,
                    num_gpu_blocks=_blocks(report),
                )
        for engine in before.keys() - after.keys():
            log.info("engine vanished", source=source, target=target, engine=engine)

    def _rebuild(self, *, engines_changed: bool = True) -> None:
        self._version += 1
        if engines_changed:
            entries = [t.reports for t in self._targets.values() if t.reports is not None]
            engines = build_engine_views(entries)
        else:
            engines = self._snapshot.engines
        gpus = tuple(gpu for _, found in sorted(self._gpus.items()) for gpu in found)
        engine_gpus = map_engine_gpus(engines, gpus)
        self._snapshot = Snapshot(
            version=self._version,
            engines=engines,
            sources=tuple(t.status for _, t in sorted(self._targets.items())),
            errors=dict(self._errors),
            gpus=gpus,
            engine_gpus=engine_gpus,
            headroom_tokens=headroom_tokens(engines, engine_gpus, gpus),
            taken_at_s=self._clock(),
        )


def _blocks(report: EngineReport) -> int | None:
    return report.reported.num_gpu_blocks if report.reported else None
