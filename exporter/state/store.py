"""The state: it alone holds the engine set; collectors write changes, scrapes read snapshots."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import structlog

from exporter.state.gpus import headroom_tokens, map_engine_gpus
from exporter.state.log_limit import LogLimit
from exporter.state.records import EngineReport, GpuReport, ResidencyView, engine_sort_key
from exporter.state.snapshot import (
    EMPTY,
    CollectorStatus,
    EngineView,
    Sighting,
    Snapshot,
    merge_engine,
)

log = structlog.get_logger("kvcap.state")


class StateSink(Protocol):
    """What a collector may tell the state. Collectors never read it."""

    def register_target(self, collector: str, target: str) -> None: ...

    def unregister_target(self, collector: str, target: str) -> None: ...

    def publish(
        self,
        collector: str,
        target: str,
        reports: Sequence[EngineReport],
        *,
        duration_s: float | None = None,
    ) -> None: ...

    def update_engine(self, collector: str, target: str, report: EngineReport) -> None: ...

    def remove_engine(
        self, collector: str, target: str, engine: str, instance_id: str | None
    ) -> None: ...

    def mark_engine_stale(
        self, collector: str, target: str, engine: str, instance_id: str | None
    ) -> None: ...

    def forget(self, collector: str, target: str) -> None: ...

    def fail(
        self,
        collector: str,
        target: str,
        reason: str,
        message: str,
        *,
        duration_s: float | None = None,
        stale: bool = True,
    ) -> None: ...

    def reject(
        self, collector: str, target: str, reason: str, message: str, *, count: int = 1
    ) -> None: ...

    def publish_gpus(
        self,
        collector: str,
        target: str,
        gpus: Sequence[GpuReport],
        *,
        duration_s: float | None = None,
    ) -> None: ...

    def publish_residency(self, collector: str, residency: Sequence[ResidencyView]) -> None: ...

    def remove_residency(self, collector: str, engines: Sequence[str]) -> None: ...


@dataclass(frozen=True, slots=True)
class _Heard:
    report: EngineReport
    received_at_s: float
    # The collector stopped hearing from this engine (no heartbeat) while the target is fine.
    stale: bool = False


@dataclass(slots=True)
class _Target:
    status: CollectorStatus
    engines: dict[str, _Heard] = field(default_factory=dict)
    stale: bool = False


class StateStore:
    """Thread-safe holder of the engines every collector target reported, and their health.

    Each change builds a new immutable `Snapshot` and swaps it in, so a scrape reads one
    consistent view without locks. Errors keep the last good data, marked stale. Engine
    changes (added, restarted, vanished) are logged here, once per engine, whichever
    collectors see them.

    `priority` ranks collectors by name (0 best): when two describe one engine, each
    figure comes from the best one that knows it. It comes from the collectors'
    registrations; a collector missing from it ranks last.
    """

    def __init__(
        self, clock: Callable[[], float] = time.time, *, priority: Mapping[str, int] | None = None
    ) -> None:
        self._clock = clock
        self._priority = dict(priority or {})
        self._lock = threading.Lock()
        self._targets: dict[tuple[str, str], _Target] = {}
        self._errors: dict[tuple[str, str], int] = {}
        self._gpus: dict[tuple[str, str], tuple[GpuReport, ...]] = {}
        # The last instance id of each engine that vanished: one that comes back as a new
        # instance (after a forget window or a bye) is logged as restarted, not added.
        self._departed: dict[str, str] = {}
        self._restarts: dict[str, int] = {}
        self._residency: dict[str, ResidencyView] = {}
        self._version = 0
        self._snapshot = EMPTY
        self._merged: dict[str, tuple[tuple[Sighting, ...], EngineView]] = {}
        self._listeners: list[Callable[[], None]] = []
        # Engine changes are logged a few lines per event and interval (a forged restart
        # storm is one summary line, not hundreds a second).
        self._log_limit = LogLimit()

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call `listener` after each change of the data (not after a rejected input, which
        changes a counter only), on the changing collector's thread, outside the lock.
        The exporter renders the next /metrics body there, off the scrape path."""
        self._listeners.append(listener)

    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """The lock; then, where a new snapshot was built under it, the listeners."""
        with self._lock:
            version = self._version
            yield
            changed = self._version != version
        if changed:
            for listener in self._listeners:
                listener()

    def register_target(self, collector: str, target: str) -> None:
        with self._lock:
            self._target(collector, target)
            self._rebuild(collector, engines_changed=False)

    def unregister_target(self, collector: str, target: str) -> None:
        """A target the collector no longer reads (a KV event endpoint an engine moved
        away from): its status series go with it; its errors stay counted."""
        with self._changing():
            if self._targets.pop((collector, target), None) is not None:
                self._gpus.pop((collector, target), None)
                self._rebuild(collector)

    def publish(
        self,
        collector: str,
        target: str,
        reports: Sequence[EngineReport],
        *,
        duration_s: float | None = None,
    ) -> None:
        """A successful read: these are all the engines this target has now."""
        now = self._clock()
        with self._changing():
            entry = self._target(collector, target)
            entry.engines = {report.engine: _Heard(report, now) for report in reports}
            entry.stale = False
            self._succeeded(entry, now, duration_s)
            self._rebuild(collector)

    def update_engine(self, collector: str, target: str, report: EngineReport) -> None:
        """One engine of this target appeared or changed; its other engines stay."""
        now = self._clock()
        with self._changing():
            entry = self._target(collector, target)
            was = entry.engines.get(report.engine)
            if was is not None and was.stale:
                self._log_limit.emit(
                    log.info, "engine_heard_again", collector=collector, engine=report.engine
                )
            entry.engines[report.engine] = _Heard(report, now)
            self._rebuild(collector)

    def remove_engine(
        self, collector: str, target: str, engine: str, instance_id: str | None
    ) -> None:
        """One engine left (a clean shutdown). The word of an older instance of the engine
        does not remove its restarted successor."""
        with self._changing():
            entry = self._targets.get((collector, target))
            heard = entry.engines.get(engine) if entry else None
            if entry is None or heard is None or heard.report.instance_id != instance_id:
                return
            del entry.engines[engine]
            self._rebuild(collector)

    def mark_engine_stale(
        self, collector: str, target: str, engine: str, instance_id: str | None
    ) -> None:
        """The collector has not heard from this engine within its liveness window: keep
        its last report, marked stale, until it is heard again or removed."""
        now = self._clock()
        with self._changing():
            entry = self._targets.get((collector, target))
            heard = entry.engines.get(engine) if entry else None
            if entry is None or heard is None or heard.report.instance_id != instance_id:
                return
            if heard.stale:
                return
            self._log_limit.emit(
                log.warning,
                "engine_stale",
                collector=collector,
                engine=engine,
                silent_s=round(now - heard.received_at_s, 3),
            )
            entry.engines[engine] = replace(heard, stale=True)
            self._rebuild(collector)

    def forget(self, collector: str, target: str) -> None:
        """Drop every engine of a target the collector has given up on (a server gone past
        its forget window); its status and errors stay."""
        with self._changing():
            entry = self._targets.get((collector, target))
            if entry is None or not entry.engines:
                return
            entry.engines = {}
            self._rebuild(collector)

    def fail(
        self,
        collector: str,
        target: str,
        reason: str,
        message: str,
        *,
        duration_s: float | None = None,
        stale: bool = True,
    ) -> None:
        """A failed read: count it and keep the last good data, marked stale unless the
        collector says it is still within its freshness window."""
        with self._changing():
            entry = self._target(collector, target)
            if entry.status.up or not entry.status.has_reported:
                # Log once per state change, not once per poll.
                log.warning(
                    "collector_failed",
                    collector=collector,
                    target=target,
                    reason=reason,
                    error=message,
                )
            self._count(collector, reason)
            entry.stale = entry.stale or stale
            # GPU figures are live readings: a failed read leaves none rather than old ones.
            self._gpus.pop((collector, target), None)
            entry.status = replace(
                entry.status,
                up=False,
                has_reported=True,
                last_duration_s=duration_s,
                last_error=f"{reason}: {message}",
            )
            self._rebuild(collector)

    def publish_gpus(
        self,
        collector: str,
        target: str,
        gpus: Sequence[GpuReport],
        *,
        duration_s: float | None = None,
    ) -> None:
        """A successful GPU read: these are all the GPUs of this target now, in the order
        the engines' workers number them."""
        now = self._clock()
        with self._changing():
            entry = self._target(collector, target)
            self._gpus[(collector, target)] = tuple(gpus)
            self._succeeded(entry, now, duration_s)
            self._rebuild(collector, engines_changed=False)

    def publish_residency(self, collector: str, residency: Sequence[ResidencyView]) -> None:
        """The residency of the engines whose KV event streams moved; the others keep
        theirs (the same records: a renderer keeps their bytes)."""
        if not residency:
            return
        with self._changing():
            for view in residency:
                self._residency[view.engine] = view
            self._rebuild(collector, engines_changed=False)

    def remove_residency(self, collector: str, engines: Sequence[str]) -> None:
        """The residency of engines no collector follows any more (forgotten, or whose
        endpoint moved away with no stream left to feed them): their series go."""
        with self._changing():
            removed = [e for e in engines if self._residency.pop(e, None) is not None]
            if removed:
                self._rebuild(collector, engines_changed=False)

    def reject(
        self, collector: str, target: str, reason: str, message: str, *, count: int = 1
    ) -> None:
        """A bad input that did not stop the collector (a malformed frame): count it (or
        `count` of them), log the first of each reason, and change nothing else. Only the
        counts of the snapshot are replaced: a flood of bad input is not a rebuild (GPU
        map, headroom, statuses) per message."""
        with self._lock:
            if (collector, reason) not in self._errors:
                log.warning(
                    "input_rejected",
                    collector=collector,
                    target=target,
                    reason=reason,
                    error=message,
                )
            self._count(collector, reason, count)
            self._version += 1
            self._snapshot = replace(
                self._snapshot,
                version=self._version,
                errors=dict(self._errors),
                taken_at_s=self._clock(),
            )

    def _count(self, collector: str, reason: str, count: int = 1) -> None:
        key = (collector, reason)
        self._errors[key] = self._errors.get(key, 0) + count

    def _target(self, collector: str, target: str) -> _Target:
        key = (collector, target)
        if key not in self._targets:
            self._targets[key] = _Target(
                CollectorStatus(
                    collector,
                    target,
                    up=False,
                    has_reported=False,
                    last_success_s=None,
                    last_duration_s=None,
                    last_error=None,
                )
            )
        return self._targets[key]

    def _succeeded(self, entry: _Target, now: float, duration_s: float | None) -> None:
        status = entry.status
        if not status.up and status.has_reported:
            log.info("collector_recovered", collector=status.collector, target=status.target)
        entry.status = replace(
            status,
            up=True,
            has_reported=True,
            last_success_s=now,
            last_duration_s=duration_s,
            last_error=None,
        )

    def _rank(self, key: tuple[str, str]) -> tuple[int, str, str]:
        return (self._priority.get(key[0], len(self._priority)), *key)

    def _views(self) -> tuple[EngineView, ...]:
        """One view per engine index, sorted numerically as vLLM numbers engines."""
        sightings: dict[str, list[Sighting]] = {}
        for key in sorted(self._targets, key=self._rank):
            entry = self._targets[key]
            for engine, heard in entry.engines.items():
                sightings.setdefault(engine, []).append(
                    Sighting(key[0], heard.report, heard.received_at_s, entry.stale or heard.stale)
                )
        # An engine whose sightings are the ones of the last rebuild keeps its view: one
        # handshake message re-merges one engine, not all of them.
        merged: dict[str, tuple[tuple[Sighting, ...], EngineView]] = {}
        for engine, found in sightings.items():
            seen = tuple(found)
            last = self._merged.get(engine)
            merged[engine] = (seen, last[1] if last and last[0] == seen else merge_engine(seen))
        self._merged = merged
        views = [view for _, view in merged.values()]
        return tuple(sorted(views, key=lambda view: engine_sort_key(view.engine)))

    def _residency_records(self) -> tuple[ResidencyView, ...]:
        last, now = self._snapshot.residency, self._residency
        if len(now) == len(last) and all(now.get(r.engine) is r for r in last):
            return last
        found = sorted(self._residency.values(), key=lambda r: engine_sort_key(r.engine))
        return tuple(found)

    def _rebuild(self, collector: str, *, engines_changed: bool = True) -> None:
        self._version += 1
        engines = self._snapshot.engines
        if engines_changed:
            engines = self._views()
            changes = _log_changes(
                collector, self._snapshot.engines, engines, self._departed, self._log_limit
            )
            for engine in changes:
                self._restarts[engine] = self._restarts.pop(engine, 0) + 1
                if len(self._restarts) > _MAX_DEPARTED:
                    del self._restarts[next(iter(self._restarts))]  # the longest quiet
        gpus = tuple(gpu for _, found in sorted(self._gpus.items()) for gpu in found)
        engine_gpus = map_engine_gpus(engines, gpus)
        self._snapshot = Snapshot(
            version=self._version,
            engines=engines,
            collectors=tuple(t.status for _, t in sorted(self._targets.items())),
            errors=dict(self._errors),
            gpus=gpus,
            engine_gpus=engine_gpus,
            headroom_tokens=headroom_tokens(engines, engine_gpus, gpus),
            taken_at_s=self._clock(),
            residency=self._residency_records(),
            restarts=dict(self._restarts) if self._restarts else {},
        )


# More vanished engines than any deployment has: the memory of departed instances is
# bounded, whatever engine labels a target makes up.
_MAX_DEPARTED = 4096


def _log_changes(
    collector: str,
    before: Sequence[EngineView],
    after: Sequence[EngineView],
    departed: dict[str, str],
    limit: LogLimit,
) -> list[str]:
    """One line per engine that appeared, restarted or vanished, over all collectors; the
    engines that restarted (the one place a restart is noticed)."""
    restarted = []
    old = {view.engine: view for view in before}
    new = {view.engine: view for view in after}
    for engine, view in new.items():
        was = old.get(engine)
        left = departed.pop(engine, None)
        if was is None and (left is None or view.instance_id in (None, left)):
            limit.emit(
                log.info,
                "engine_added",
                collector=collector,
                engine=engine,
                model_name=view.model_name,
            )
        elif was is None or _restarted(was, view):
            restarted.append(engine)
            limit.emit(
                log.info,
                "engine_restarted",
                collector=collector,
                engine=engine,
                instance_id=view.instance_id,
                num_gpu_blocks=view.capacity.num_gpu_blocks,
            )
        known = set(was.settings_warnings) if was is not None else set()
        for mismatch in view.settings_warnings:
            if mismatch not in known:  # once, when it appears; again only if it comes back
                log.warning(
                    "engine_settings_mismatch",
                    engine=engine,
                    field=mismatch.field,
                    told=mismatch.told,
                    seen=mismatch.seen,
                    source=mismatch.source,
                )
    for engine in old.keys() - new.keys():
        limit.emit(log.info, "engine_vanished", collector=collector, engine=engine)
        instance_id = old[engine].instance_id
        if instance_id is not None:
            departed[engine] = instance_id
            if len(departed) > _MAX_DEPARTED:
                del departed[next(iter(departed))]  # the oldest
    return restarted


def _restarted(was: EngineView, now: EngineView) -> bool:
    # A new instance id is a restart; where one is unknown (the HTTP collector sees
    # none), a new block count is one.
    if was.instance_id is not None and now.instance_id is not None:
        return was.instance_id != now.instance_id
    return was.capacity.num_gpu_blocks != now.capacity.num_gpu_blocks
