"""Waiting for a condition, a free loopback port, and /metrics read as Prometheus reads it.

Shared by the tests (through `tests.support`), the benchmarks and the live tools, so each
waits, picks ports and parses scrapes one way.
"""

from __future__ import annotations

import gzip
import socket
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None],
    timeout_s: float,
    what: str,
    context: Callable[[], str] = lambda: "",
    interval_s: float = 0.005,
) -> T:
    """Poll `condition` until it returns something truthy and return that; else fail,
    naming `what` and showing `context()` (a log tail, the state seen last)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            shown = context()
            raise AssertionError(
                f"{what}: not within {timeout_s:.2f} s" + (f"\n{shown}" if shown else "")
            )
        time.sleep(interval_s)


def wait_timed(condition: Callable[[], T | None], timeout_s: float, what: str) -> tuple[T, float]:
    """`wait_for`, with the seconds it took (recovery deadlines are asserted on them)."""
    began = time.monotonic()
    value = wait_for(condition, timeout_s, what)
    return value, time.monotonic() - began


def free_port() -> int:
    """A loopback TCP port nothing listens on now (the caller binds it soon after)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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
    """Every sample of an exposition, by sample name: (labels, value) in order."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def fetch(url: str, headers: dict[str, str] | None = None, timeout_s: float = 5.0) -> Any:
    request = urllib.request.Request(url, headers=headers or {})
    return urllib.request.urlopen(request, timeout=timeout_s)


def scrape(base_url: str, *, accept_gzip: bool = False, timeout_s: float = 5.0) -> Scrape:
    """GET `base_url`/metrics (gzip when asked) and parse it."""
    headers = {"Accept-Encoding": "gzip"} if accept_gzip else {}
    with fetch(f"{base_url}/metrics", headers, timeout_s) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        text = body.decode("utf-8")
        return Scrape(response.status, text, parse(text))
