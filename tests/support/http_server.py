"""A stand-in HTTP server on a loopback port, for the tests that play a vLLM or a target."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def http_serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served from a thread on 127.0.0.1; yields the base URL, stops on leaving."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
