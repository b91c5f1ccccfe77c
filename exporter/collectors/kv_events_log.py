"""What the kv_events collector logs and counts under a flood: one log line per cause per
interval, and its error counts handed to the state once per tick.

A hostile or broken publisher can make the same thing happen on every batch (a sequence
that goes back, a gap whose replay never answers, a batch past a bound); each cause is
logged when it first happens, then at most once per `interval_s` with how many lines were
left out meanwhile. The counts reach `kvcap_collector_errors_total{collector="kv_events"}`
whole, in one state change per reason and tick rather than one per batch
(exporter/collectors/error_tally.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

import structlog

from exporter.state.log_limit import LogLimit

LOG_INTERVAL_S: Final = 60.0


class LimitedLog:
    """A structlog logger that writes each event (the cause) at most `lines` times per
    interval (1 unless the call says more: a new subscription per engine at start-up),
    then says how many lines it left out (`suppressed`), as the store's log does."""

    def __init__(
        self,
        name: str,
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = structlog.get_logger(name)
        self._limit = LogLimit(lines=1, interval_s=interval_s, clock=clock)

    def info(self, event: str, *, lines: int = 1, **fields: Any) -> None:
        self._write(self._log.info, event, lines, fields)

    def warning(self, event: str, *, lines: int = 1, **fields: Any) -> None:
        self._write(self._log.warning, event, lines, fields)

    def _write(
        self, write: Callable[..., Any], event: str, lines: int, fields: dict[str, Any]
    ) -> None:
        left_out = self._limit.allow(event, lines)
        if left_out is None:
            return
        if left_out:
            fields["suppressed"] = left_out  # lines of this cause not written since the last
        write(event, **fields)
