"""The daemon as a process: start-up time, idle and busy memory and CPU.

Busy = 64 engines behind one simulated vLLM API server, polled every second, while a
client scrapes /metrics 10 times a second. Figures come from /proc of the daemon.
Run: .venv/bin/python -m benchmarks.daemon
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.common import Row, print_rows
from exporter.demo import simulated_deployment
from exporter.logs import configure_logging

BUSY_SECONDS = 30.0
ENGINES = 64


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def proc_figures(pid: int) -> tuple[float, float, int]:
    """(RSS MiB, CPU seconds used, threads) of a process."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    rss = int(next(line.split()[1] for line in status if line.startswith("VmRSS"))) / 1024
    threads = int(next(line.split()[1] for line in status if line.startswith("Threads")))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return rss, cpu, threads


def start_daemon(
    port: int, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "serve",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--handshake.listen",
            "tcp://127.0.0.1:0",
            "--log.level",
            "warn",
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


def scrape(port: int) -> bool:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        connection.request("GET", "/metrics")
        ok = connection.getresponse().status == 200
        connection.close()
        return ok
    except OSError:
        return False


def startup_seconds() -> float:
    port = free_port()
    began = time.perf_counter()
    process = start_daemon(port)
    try:
        while not scrape(port):
            time.sleep(0.01)
        return time.perf_counter() - began
    finally:
        process.terminate()
        process.wait(5)


@contextmanager
def daemon_watching(engines: int, *flags: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A serving daemon process (with `flags`) polling a simulated `engines`-engine vLLM
    every second; yields the process and its port, and stops both afterwards."""
    with tempfile.TemporaryDirectory() as directory:
        simulation = simulated_deployment(Path(directory) / "gemma", data_parallel_size=engines)
        url = simulation.start()
        port = free_port()
        process = start_daemon(
            port, "--vllm.url", url, "--vllm.poll-interval", "1",
            "--vllm.args", simulation.vllm_args, *flags,
        )  # fmt: skip
        try:
            while not scrape(port):
                time.sleep(0.05)
            yield process, port
        finally:
            process.terminate()
            process.wait(5)
            simulation.stop()


def idle_and_busy() -> tuple[tuple[float, float], tuple[float, float, int, int]]:
    with daemon_watching(ENGINES) as (process, port):
        time.sleep(2)
        idle_rss, cpu_before, _ = proc_figures(process.pid)
        began = time.monotonic()
        failures = 0
        while time.monotonic() - began < BUSY_SECONDS:
            failures += not scrape(port)
            time.sleep(0.1)
        busy_rss, cpu_after, threads = proc_figures(process.pid)
        cpu_share = (cpu_after - cpu_before) / (time.monotonic() - began)
        return (idle_rss, cpu_share), (busy_rss, cpu_share, threads, failures)


def rows() -> list[Row]:
    configure_logging("warn")
    started = startup_seconds()
    (rss_start, _), (busy_rss, cpu_share, threads, failures) = idle_and_busy()
    return [
        Row("start to first successful /metrics", started, "s", target="< 2 s", passed=started < 2),
        Row(
            f"busy RSS ({ENGINES} engines, 1 s polling, 10 scrapes/s)",
            busy_rss,
            "MiB",
            target="<= 80 MiB",
            passed=busy_rss <= 80,
        ),
        Row(
            f"busy CPU ({ENGINES} engines, 1 s polling, 10 scrapes/s)",
            cpu_share * 100,
            "%",
            target="<= 25% of one core",
            passed=cpu_share <= 0.25,
        ),
        Row("busy scrapes failed", failures, "", target="0", passed=failures == 0),
        Row("daemon threads while busy", threads, "", target="report"),
        Row("RSS after start-up with 64 engines", rss_start, "MiB", target="report"),
    ]


def main() -> None:
    print_rows(rows())


if __name__ == "__main__":
    main()
