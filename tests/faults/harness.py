"""What the fault tests share: deadlines, a running exporter, scrapes read as Prometheus would.

Recovery is asserted against a deadline measured from the moment the fault is lifted:
one poll interval plus SLACK for the scrape and the thread hand-offs of a loaded CI box.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from exporter.collectors import Collector
from exporter.serve import Exporter, WebSettings
from exporter.state import StateStore
from tools.probe import Scrape, fetch, scrape, wait_timed

T = TypeVar("T")

POLL_INTERVAL_S = 0.2
# Scheduling, the HTTP round trip of a poll and of our own scrape on 2 busy cores.
SLACK_S = 0.3


def scrape_until(
    base_url: str, predicate: Callable[[Scrape], bool], timeout_s: float, what: str
) -> tuple[Scrape, float]:
    """Scrape until `predicate` holds; that scrape and the seconds it took to get there."""

    def attempt() -> Scrape | None:
        metrics = scrape(base_url)
        return metrics if predicate(metrics) else None

    return wait_timed(attempt, timeout_s, what)


def engines_document(base_url: str) -> dict[str, Any]:
    with fetch(f"{base_url}/engines") as response:
        document: dict[str, Any] = json.loads(response.read())
        return document


@contextmanager
def running_exporter(
    sources: Sequence[Collector], store: StateStore | None = None
) -> Iterator[Exporter]:
    """The real daemon (sources, state, web server) on a free loopback port."""
    exporter = Exporter(sources, WebSettings("127.0.0.1:0"), store=store)
    exporter.start()
    try:
        yield exporter
    finally:
        exporter.stop()
