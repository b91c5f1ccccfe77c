"""A few lines per event and interval: a storm of engine changes is summarized, not echoed.

An engine restart is one log line; a peer that forges a restart a second on each of 256
engine indices would make that 256 lines a second (issue 25 measured 213). Each event gets
`lines` lines per `interval_s`; the first line after a quiet spell says how many were left
out (`suppressed`), and the counters (kvcap_engine_restarts_total, the collectors' errors)
keep the full count.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Enough for a data-parallel deployment's engines starting together to be logged one by
# one at a usual scale; past it the summary line speaks for the rest.
LINES_PER_INTERVAL = 16
INTERVAL_S = 10.0


@dataclass(slots=True)
class _Window:
    began_s: float
    logged: int = 0
    suppressed: int = 0


class LogLimit:
    """Whether a line of an event may be written now; not thread-safe (its owner's lock or
    thread: the store's, the kv_events collector's)."""

    def __init__(
        self,
        lines: int = LINES_PER_INTERVAL,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lines = lines
        self.interval_s = interval_s
        self.clock = clock
        self._windows: dict[str, _Window] = {}

    def allow(self, event: str, lines: int | None = None) -> int | None:
        """None: leave the line out. Else the lines of `event` left out before this one.
        `lines` overrides the budget for this event (default: the instance's)."""
        budget = self.lines if lines is None else lines
        now = self.clock()
        window = self._windows.get(event)
        if window is None or now - window.began_s >= self.interval_s:
            left_out = window.suppressed if window else 0
            self._windows[event] = _Window(now, logged=1)
            return left_out
        if window.logged >= budget:
            window.suppressed += 1
            return None
        window.logged += 1
        return 0

    def emit(
        self, write: Callable[..., Any], event: str, *, lines: int | None = None, **fields: Any
    ) -> None:
        """`write(event, **fields)` if the event's budget (`lines`, as for `allow`) allows,
        with `suppressed` when lines were left out before it."""
        left_out = self.allow(event, lines)
        if left_out is None:
            return
        if left_out:
            fields["suppressed"] = left_out
        write(event, **fields)
