"""A kvcap daemon in its own process, and what the hostile-input tests measure of it."""

from __future__ import annotations

import http.client
import os
import re
import resource
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tests.support import cli_command

# What the issue holds every attack to, on the chart's 128 MiB sidecar limit.
MAX_RSS_MIB = 96.0
SCRAPE_WITHIN_S = 1.0
THREAD_SLACK = 16


@dataclass
class Daemon:
    """A running `kvcap-exporter serve`; its stderr is collected on a thread."""

    process: subprocess.Popen[str]
    url: str
    log: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None
        return port

    def rss_mib(self) -> float:
        return _status_field(self.process.pid, "VmRSS") / 1024

    def peak_rss_mib(self) -> float:
        return _status_field(self.process.pid, "VmHWM") / 1024

    def threads(self) -> int:
        return _status_field(self.process.pid, "Threads")

    def cpu_s(self) -> float:
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def sigterm_s(self, wait_s: float = 10) -> float:
        """Send SIGTERM and wait for the exit; the seconds it took."""
        began = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(wait_s)
        return time.monotonic() - began

    def logged(self, event: str) -> list[str]:
        return [line for line in list(self.log) if event in line]

    def counter(self, name: str, headers: dict[str, str] | None = None, **labels: str) -> float:
        """A sample of the daemon's own /metrics, 0 when absent."""
        body = scrape(self, headers=headers).body.decode()
        wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
        for line in body.splitlines():
            match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
            if match and (match[1] or "") == wanted:
                return float(match[2])
        return 0.0


def _status_field(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {name} in /proc/{pid}/status")


@contextmanager
def daemon(
    *flags: str, nofile: int | None = None, env: dict[str, str] | None = None
) -> Iterator[Daemon]:
    """`serve` on 127.0.0.1:0 with no collectors but those `flags` turn on."""
    argv = cli_command(
        "serve",
        "--web.listen-address=127.0.0.1:0",
        "--no-collector.nvml",
        "--no-collector.vllm_http",
        "--no-collector.handshake",
        *flags,
    )

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    process = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        # Only setrlimit runs between fork and exec; the tests' threads hold no lock it needs.
        preexec_fn=limit,  # noqa: PLW1509
    )
    log: list[str] = []
    started = threading.Event()
    url: list[str] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            log.append(line)
            if "exporter_started" in line:
                url.append(next(p.split("=", 1)[1] for p in line.split() if p.startswith("url=")))
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not started.wait(20):
            raise AssertionError("the daemon did not start:\n" + "".join(log))
        yield Daemon(process, url[0], log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        reader.join(5)
        if process.stderr is not None:
            process.stderr.close()


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    elapsed_s: float


def scrape(
    target: Daemon,
    path: str = "/metrics",
    headers: dict[str, str] | None = None,
    source_address: str = "127.0.0.1",
) -> Reply:
    """One legitimate request on a new connection, timed from connect to the last byte."""
    began = time.monotonic()
    connection = http.client.HTTPConnection(
        "127.0.0.1", target.port, timeout=10, source_address=(source_address, 0)
    )
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    return Reply(response.status, body, time.monotonic() - began)


def raw_connections(target: Daemon, count: int) -> list[socket.socket]:
    """`count` plain TCP connections to the daemon, sending nothing."""
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", target.port), timeout=5)
        sockets.append(sock)
    return sockets


def close_all(sockets: Sequence[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


def during(attack: Callable[[threading.Event], None], workers: int) -> Callable[[], None]:
    """Starts `workers` threads running attack(stop) until the returned function is called."""
    stop = threading.Event()
    threads = [threading.Thread(target=attack, args=(stop,), daemon=True) for _ in range(workers)]
    for thread in threads:
        thread.start()

    def end() -> None:
        stop.set()
        for thread in threads:
            thread.join(10)

    return end
