"""A loopback HTTP server that plays back recorded vLLM endpoints, or misbehaves on demand.

This is the outermost edge of the system under test: a stand-in for a vLLM API server.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from exporter.collectors import ServerPoller, VllmHttpSettings, fetch
from exporter.state import StateStore
from tests.support.http_server import http_serving


@dataclass
class Playback:
    """What the server answers; tests change `fault` while it runs."""

    metrics: bytes
    documents: dict[str, Any] = field(default_factory=dict)
    # None, or one of: "404", "500", "slow", "truncated", "gzip_corrupt", "gzip", "garbage"
    fault: str | None = None
    slow_s: float = 2.0
    requests: int = 0


class _Handler(BaseHTTPRequestHandler):
    playback: Playback

    def do_GET(self) -> None:
        playback = self.playback
        playback.requests += 1
        fault = playback.fault
        if self.path == "/metrics":
            body = playback.metrics
        elif self.path in playback.documents:
            document = playback.documents[self.path]
            # bytes are served as they are: JSON no encoder would write.
            body = document if isinstance(document, bytes) else json.dumps(document).encode()
        else:
            self.send_error(404)
            return
        if fault in ("404", "500"):
            self.send_error(int(fault))
            return
        if fault == "slow":
            time.sleep(playback.slow_s)
        headers = {"Content-Type": "text/plain; version=0.0.4"}
        if fault == "garbage" and self.path == "/metrics":
            body = bytes(range(256)) * 64
        if fault in ("gzip", "gzip_corrupt"):
            headers["Content-Encoding"] = "gzip"
            body = gzip.compress(body) if fault == "gzip" else b"\x1f\x8b\x08\x00garbage" * 10
        length = len(body) * 2 if fault == "truncated" else len(body)
        self.send_response(200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        self.wfile.write(body)
        if fault == "truncated":
            self.wfile.flush()
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@contextmanager
def serve(playback: Playback) -> Iterator[str]:
    handler = type("Handler", (_Handler,), {"playback": playback})
    with http_serving(handler) as url:
        yield url


def polled_once(playback: Playback, **settings: Any) -> StateStore:
    """The store after one poll of the vllm_http source against `playback` served on a port
    of its own; `settings` are VllmHttpSettings' fields other than `urls`."""
    store = StateStore()
    with serve(playback) as url:
        source = VllmHttpSettings(urls=(url,), **settings)
        ServerPoller(url, source, fetch, store, threading.Event()).poll_once()
    return store
