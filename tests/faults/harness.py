"""What the fault tests share: deadlines, a running exporter, scrapes read as Prometheus would.

Recovery is asserted against a deadline measured from the moment the fault is lifted:
one poll interval plus SLACK for the scrape and the thread hand-offs of a loaded CI box.
"""

from __future__ import annotations

import gzip
import json
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors import Collector
from exporter.serve import Exporter
from exporter.state import StateStore

T = TypeVar("T")

POLL_INTERVAL_S = 0.2
# Scheduling, the HTTP round trip of a poll and of our own scrape on 2 busy cores.
SLACK_S = 0.3


def wait_for(condition: Callable[[], T | None], timeout_s: float, what: str) -> tuple[T, float]:
    """Poll `condition` until it returns something truthy; that value and the seconds taken."""
    began = time.monotonic()
    while True:
        value = condition()
        elapsed = time.monotonic() - began
        if value:
            return value, elapsed
        if elapsed > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s:.2f} s")
        time.sleep(0.005)


@dataclass(frozen=True)
class Scrape:
    """One /metrics response, parsed by prometheus_client as Prometheus would read it."""

    status: int
    text: str
    samples: dict[str, list[tuple[dict[str, str], float]]]

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the one sample of `name` whose labels include `labels`."""
        found = [
            v for sample_labels, v in self.samples.get(name, []) if _has(sample_labels, labels)
        ]
        assert len(found) <= 1, f"{name}{labels}: {len(found)} samples"
        return found[0] if found else None

    def by_engine(self, name: str) -> dict[str, float]:
        return {labels["engine"]: v for labels, v in self.samples.get(name, [])}

    def labels(self, name: str) -> list[dict[str, str]]:
        return [labels for labels, _ in self.samples.get(name, [])]


def _has(labels: dict[str, str], wanted: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in wanted.items())


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def fetch(url: str, headers: dict[str, str] | None = None, timeout_s: float = 5.0) -> Any:
    request = urllib.request.Request(url, headers=headers or {})
    return urllib.request.urlopen(request, timeout=timeout_s)


def scrape(base_url: str, *, accept_gzip: bool = False) -> Scrape:
    headers = {"Accept-Encoding": "gzip"} if accept_gzip else {}
    with fetch(f"{base_url}/metrics", headers) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        text = body.decode("utf-8")
        return Scrape(response.status, text, parse(text))


def scrape_until(
    base_url: str, predicate: Callable[[Scrape], bool], timeout_s: float, what: str
) -> tuple[Scrape, float]:
    """Scrape until `predicate` holds; that scrape and the seconds it took to get there."""

    def attempt() -> Scrape | None:
        metrics = scrape(base_url)
        return metrics if predicate(metrics) else None

    return wait_for(attempt, timeout_s, what)


def engines_document(base_url: str) -> dict[str, Any]:
    with fetch(f"{base_url}/engines") as response:
        document: dict[str, Any] = json.loads(response.read())
        return document


@contextmanager
def running_exporter(
    sources: Sequence[Collector], store: StateStore | None = None
) -> Iterator[Exporter]:
    """The real daemon (sources, state, web server) on a free loopback port."""
    exporter = Exporter(sources, "127.0.0.1:0", store=store)
    exporter.start()
    try:
        yield exporter
    finally:
        exporter.stop()
