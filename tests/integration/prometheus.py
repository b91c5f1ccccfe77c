"""A real Prometheus server on loopback, started by a test and queried over its HTTP API."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.tools import require_tool


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Prometheus:
    def __init__(
        self,
        workdir: Path,
        targets: list[str],
        scrape_interval: str = "1s",
        labels: dict[str, str] | None = None,
    ) -> None:
        self.binary = require_tool("prometheus")
        self.port = free_port()
        self.workdir = workdir
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {scrape_interval}\n"
            f"  scrape_timeout: {scrape_interval}\n"
            "scrape_configs:\n"
            "  - job_name: kvcap\n"
            f"    static_configs: [{{targets: {json.dumps(targets)}, "
            f"labels: {json.dumps(labels or {})}}}]\n"
        )
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None
        self.log = (workdir / "prometheus.log").open("wb")

    def __enter__(self) -> Prometheus:
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        self.wait_until(lambda: self._get("/-/ready") is not None, "Prometheus ready", 30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def _get(self, path: str) -> bytes | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                body: bytes = r.read()
                return body
        except OSError:
            return None

    def query(self, promql: str) -> list[dict[str, Any]]:
        body = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        if body is None:
            return []
        answer = json.loads(body)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def targets_up(self) -> bool:
        return any(float(r["value"][1]) == 1 for r in self.query("up"))

    @staticmethod
    def wait_until(condition: Any, what: str, timeout_s: float = 20) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")
