"""The values a route handler takes and gives: Request, Response, Handler."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    """One GET or HEAD request; `headers` looks names up case-insensitively. `path` is the
    target without its query string: no route reads one (Prometheus' scrape `params` are
    accepted and ignored, as by any exporter without collector filters)."""

    method: str
    path: str
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Response:
    """What a handler answers; Content-Length, Date and Connection are added by the server."""

    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[Request], Response]
