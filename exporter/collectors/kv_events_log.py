"""What the kv_events collector logs and counts under a flood: one log line per cause per
interval, and its error counts handed to the state once per tick.

A hostile or broken publisher can make the same thing happen on every batch (a sequence
that goes back, a gap whose replay never answers, a batch past a bound); each cause is
logged when it first happens, then at most once per `interval_s` with how many lines were
left out meanwhile. The counts reach `kvcap_collector_errors_total{collector="kv_events"}`
whole, in one state change per reason and tick rather than one per batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import structlog

from exporter.state import StateSink

LOG_INTERVAL_S: Final = 60.0


class LimitedLog:
    """A structlog logger that writes each event (the cause) at most `lines` times per
    interval (1 unless the call says more: a new subscription per engine at start-up)."""

    def __init__(
        self,
        name: str,
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = structlog.get_logger(name)
        self._interval_s = interval_s
        self._clock = clock
        self._written: dict[str, tuple[float, int]] = {}  # event -> (interval start, lines)
        self._left_out: dict[str, int] = {}

    def info(self, event: str, *, lines: int = 1, **fields: Any) -> None:
        self._write("info", event, lines, fields)

    def warning(self, event: str, *, lines: int = 1, **fields: Any) -> None:
        self._write("warning", event, lines, fields)

    def _write(self, level: str, event: str, lines: int, fields: dict[str, Any]) -> None:
        now = self._clock()
        began, written = self._written.get(event, (now, 0))
        if now - began >= self._interval_s:
            began, written = now, 0
        if written >= lines:
            self._left_out[event] = self._left_out.get(event, 0) + 1
            return
        self._written[event] = (began, written + 1)
        left_out = self._left_out.pop(event, 0)
        if left_out:
            fields["left_out"] = left_out  # lines of this cause not written since the last
        getattr(self._log, level)(event, **fields)


@dataclass(slots=True)
class _Count:
    target: str
    message: str
    count: int


class ErrorTally:
    """Errors of the collector by reason, handed to the state on each tick."""

    def __init__(self, collector: str) -> None:
        self._collector = collector
        self._pending: dict[str, _Count] = {}

    def count(self, reason: str, target: str, message: str, count: int = 1) -> None:
        found = self._pending.get(reason)
        if found is None:
            self._pending[reason] = _Count(target, message, count)
        else:
            found.count += count

    def flush(self, sink: StateSink) -> None:
        pending, self._pending = self._pending, {}
        for reason, found in pending.items():
            sink.reject(self._collector, found.target, reason, found.message, count=found.count)
