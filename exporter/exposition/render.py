"""Render /metrics bodies from snapshots, once per snapshot and format.

The exposition is a pure function of the snapshot, so it is rendered when the snapshot
changes and served as bytes until the next change. Only the process_* series (CPU,
memory of this process), the prefix-cache residency (it changes with every KV event batch)
and the counters of what the HTTP server refused are rendered per
scrape, and appended.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client import exposition as text_format
from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as openmetrics_format

from exporter.exposition.families import engine_families, gpu_families, self_families
from exporter.state import Snapshot

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
_EOF = b"# EOF\n"
# Fast compression: bodies are re-compressed only when the snapshot changes, but a
# smaller level keeps that cheap for large deployments.
_GZIP_LEVEL = 6


class Collector(Protocol):
    """prometheus_client's collector protocol: fresh families on each call."""

    def collect(self) -> Iterable[Metric]: ...


class _Families:
    """A collector that yields prepared families (prometheus_client's Collector protocol)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _render(families: Iterable[Metric], openmetrics: bool) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    if openmetrics:
        # prometheus_client's OpenMetrics module has no type annotations.
        body: bytes = openmetrics_format.generate_latest(registry)  # type: ignore[no-untyped-call]
        return body
    return text_format.generate_latest(registry)


class _Rendered:
    """The bodies of one snapshot, each variant rendered the first time it is asked for."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.version = snapshot.version
        self._families = [
            *engine_families(snapshot.engines, snapshot.engine_gpus),
            *gpu_families(snapshot),
            *self_families(snapshot),
        ]
        self._bodies: dict[tuple[bool, bool], bytes] = {}
        # Re-entrant: a gzip body is made from the plain body of the same snapshot.
        self._lock = threading.RLock()

    def body(self, *, openmetrics: bool, gzipped: bool) -> bytes:
        key = (openmetrics, gzipped)
        body = self._bodies.get(key)
        if body is None:
            with self._lock:
                body = self._bodies.get(key)
                if body is None:
                    body = self._make(openmetrics, gzipped)
                    self._bodies[key] = body
        return body

    def _make(self, openmetrics: bool, gzipped: bool) -> bytes:
        if gzipped:
            plain = self.body(openmetrics=openmetrics, gzipped=False)
            return gzip.compress(plain, compresslevel=_GZIP_LEVEL, mtime=0)
        if openmetrics:
            # Without "# EOF": the per-scrape part ends the body.
            return _render(self._families, openmetrics=True).removesuffix(_EOF)
        return _render(self._families, openmetrics=False)


@dataclass(frozen=True, slots=True)
class Body:
    content: bytes
    content_type: str
    gzipped: bool


def wants_openmetrics(accept: str | None) -> bool:
    return bool(accept) and "application/openmetrics-text" in accept  # type: ignore[operator]


def wants_gzip(accept_encoding: str | None) -> bool:
    if not accept_encoding:
        return False
    return any(part.split(";")[0].strip() == "gzip" for part in accept_encoding.split(","))


class ExpositionCache:
    """Serves the /metrics body for the current snapshot, rendering it at most once."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        *,
        process_metrics: bool = True,
        per_scrape: Sequence[Collector] = (),
    ) -> None:
        self._snapshot = snapshot
        self._lock = threading.Lock()
        self._rendered: _Rendered | None = None
        process = [ProcessCollector(registry=None)] if process_metrics else []
        self._per_scrape_collectors: list[Collector] = [*per_scrape, *process]

    def body(self, *, accept: str | None = None, accept_encoding: str | None = None) -> Body:
        rendered = self._current()
        openmetrics = wants_openmetrics(accept)
        tail = self._per_scrape(openmetrics)
        gzipped = wants_gzip(accept_encoding)
        head = rendered.body(openmetrics=openmetrics, gzipped=gzipped)
        # A gzip stream may hold several members (RFC 1952, section 2.2); every gzip
        # reader, Prometheus' included, concatenates them. So the cached member is reused
        # and only the small per-scrape part is compressed now.
        content = head + (gzip.compress(tail, compresslevel=1) if gzipped else tail)
        content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        return Body(content, content_type, gzipped)

    def _current(self) -> _Rendered:
        snapshot = self._snapshot()
        rendered = self._rendered
        if rendered is not None and rendered.version == snapshot.version:
            return rendered
        with self._lock:
            rendered = self._rendered
            if rendered is None or rendered.version != snapshot.version:
                rendered = _Rendered(snapshot)
                self._rendered = rendered
        return rendered

    def _per_scrape(self, openmetrics: bool) -> bytes:
        if not self._per_scrape_collectors:
            return _EOF if openmetrics else b""
        families = [f for collector in self._per_scrape_collectors for f in collector.collect()]
        return _render(families, openmetrics)
