"""kvcap as users run it beside live vLLM: a `kvcap-exporter serve` process, scraped over HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tools import probe
from tools.live.process import LoggedProcess
from tools.probe import Scrape, free_port, parse

T = TypeVar("T")
EXPORTER = Path(sys.executable).with_name("kvcap-exporter")


class Sidecar(LoggedProcess):
    """One `kvcap-exporter serve` process on a free loopback port, logging JSON to a file."""

    def __init__(
        self,
        workdir: Path,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        listen: str | None = None,
    ):
        listen = listen or f"127.0.0.1:{free_port()}"
        self.port = int(listen.rpartition(":")[2])
        self.url = f"http://{listen}"
        self.log_path = workdir / f"kvcap-{self.port}.log"
        self.command = [
            str(EXPORTER),
            "serve",
            f"--web.listen-address={listen}",
            "--log.format=json",
            "--no-collector.nvml",
            *args,
        ]
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.spawn(self.command, self.env)
        wait_for(lambda: self._get("/healthz") is not None, 30, "kvcap /healthz", self.tail)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _get(self, path: str) -> bytes | None:
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=5) as response:
                body: bytes = response.read()
                return body
        except OSError:
            return None

    def scrape(self) -> Scrape:
        body = self._get("/metrics")
        assert body is not None, f"kvcap /metrics failed\n{self.tail()}"
        text = body.decode()
        return Scrape(200, text, parse(text))

    def engines(self) -> list[dict[str, Any]]:
        body = self._get("/engines")
        assert body is not None, f"kvcap /engines failed\n{self.tail()}"
        document = json.loads(body)
        engines: list[dict[str, Any]] = (
            document["engines"] if isinstance(document, dict) else document
        )
        return engines

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events


def wait_for(
    condition: Callable[[], T | None],
    timeout_s: float,
    what: str,
    context: Callable[[], str] = lambda: "",
) -> T:
    """`tools.probe.wait_for` at a live pace: 0.1 s between tries leaves the cores to vLLM."""
    return probe.wait_for(condition, timeout_s, what, context, interval_s=0.1)
