"""A vLLM API server stand-in in its own process: serves one fixed /metrics body (and a
/version), so a poller in the benchmark's process reads and parses what a 64-engine vLLM
serves without the server's work landing in the measured process.

Run: python -m benchmarks.vllm_standin BODY_FILE (prints the URL, then serves until killed)
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def serve(body: bytes) -> None:
    documents = {
        "/metrics": (body, _METRICS_TYPE),
        "/version": (json.dumps({"version": "0.33.0"}).encode(), "application/json"),
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            found = documents.get(self.path)
            if found is None:
                self.send_error(404)
                return
            content, content_type = found
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"http://{host!s}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    serve(Path(sys.argv[1]).read_bytes())
