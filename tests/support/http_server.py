"""A stand-in HTTP server on a loopback port, for the tests that play a vLLM or a target."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

from exporter.demo.http_thread import ThreadedHttpServer


@contextmanager
def http_serving(
    handler: type[BaseHTTPRequestHandler],
    server_class: type[ThreadedHttpServer] = ThreadedHttpServer,
) -> Iterator[str]:
    """`handler` served from a thread on 127.0.0.1; yields the base URL, stops on leaving."""
    server = server_class(("127.0.0.1", 0), handler)
    try:
        yield server.start()
    finally:
        server.stop()
