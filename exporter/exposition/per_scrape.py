"""The families read afresh on every scrape (the HTTP server's counters, process_*), as
tables, and `build_exposition`: the one way the daemon and its tests put /metrics together."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporter.exposition.columns import Column, ScrapeTable, Table, live_gauge
from exporter.exposition.process import PROCESS, ProcessReader
from exporter.exposition.render import ExpositionCache
from exporter.state import Snapshot
from exporter.web import WebCounters

Count = tuple[str, int]


def _by_reason(name: str, help_text: str) -> Table[Count]:
    """A counter per refusal reason (every reason from the start: its series exist)."""
    column: Column[Count] = Column(name, help_text, lambda c: c[1], kind="counter", live=True)
    return Table(("reason",), lambda c: (c[0],), (column,))


REJECTED = _by_reason(
    "kvcap_web_requests_rejected",
    "Requests and connections the HTTP server refused before serving them, by reason.",
)
RELOAD_ERRORS = _by_reason(
    "kvcap_web_config_reload_errors",
    "Web config reloads refused (the last good config is kept), by reason.",
)

CONNECTIONS: Table[int] = Table(
    (),
    lambda _: (),
    (
        live_gauge(
            "kvcap_web_connections",
            "Open HTTP connections (at most --web.max-requests).",
            lambda count: count,
        ),
    ),
)


def web_tables(counters: WebCounters) -> list[ScrapeTable[Any]]:
    """The HTTP server's counters: their text is kept while nothing moves."""

    def version() -> int:
        return counters.version

    return [
        ScrapeTable(REJECTED, lambda: sorted(counters.rejected().items()), version),
        ScrapeTable(RELOAD_ERRORS, lambda: sorted(counters.reload_errors().items()), version),
        ScrapeTable(CONNECTIONS, lambda: [counters.connections()], version),
    ]


def build_exposition(
    snapshot: Callable[[], Snapshot],
    counters: WebCounters | None = None,
    *,
    process: bool = True,
    proc: ProcessReader | None = None,
) -> ExpositionCache:
    """/metrics of the snapshots `snapshot` returns: the snapshot's tables, then the HTTP
    server's counters (when given) and process_* (this process, or `proc`)."""
    per_scrape: list[ScrapeTable[Any]] = web_tables(counters) if counters is not None else []
    if process:
        per_scrape.append(ScrapeTable(PROCESS, (proc or ProcessReader()).rows))
    return ExpositionCache(snapshot, per_scrape=per_scrape)
