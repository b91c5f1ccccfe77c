"""A collector's error counts by reason, handed to the state once per tick, not per input.

Each count the state takes is a lock and a new snapshot; a flood of bad input (a batch of
malformed frames or messages) is many counts of a few reasons, so a collector tallies them
as it reads and hands each reason's total over in one state change (the first message of
each reason goes with it, for the state's log line). The handshake collector uses it: one
socket, up to 1,000 messages a turn. The kv_events collector counts as it goes
(`StateSink.reject`): its errors come a batch at a time, each stream rate-limited.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.state import StateSink


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
