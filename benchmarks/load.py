"""`make load`: 50 concurrent scrapers for 60 s against a daemon watching 64 engines.

The daemon runs as its own process, polling a simulated 64-engine vLLM API server every
second; 50 client threads each keep one connection and scrape as fast as they can.
Passes when no request fails. LOAD_SECONDS and LOAD_CLIENTS change the run.
Run: .venv/bin/python -m benchmarks.load
"""

from __future__ import annotations

import http.client
import os
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import Row, median, p99, print_rows
from benchmarks.daemon import free_port, scrape, start_daemon
from exporter.demo import simulated_deployment

ENGINES = 64


def run(seconds: float, clients: int) -> tuple[list[float], int]:
    with tempfile.TemporaryDirectory() as directory:
        simulation = simulated_deployment(Path(directory) / "gemma", data_parallel_size=ENGINES)
        url = simulation.start()
        port = free_port()
        daemon = start_daemon(
            port,
            "--vllm.url",
            url,
            "--vllm.poll-interval",
            "1",
            "--vllm.args",
            simulation.vllm_args,
        )
        latencies: list[float] = []
        errors = [0]
        lock = threading.Lock()
        try:
            while not scrape(port):
                time.sleep(0.05)
            deadline = time.monotonic() + seconds

            def client() -> None:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                mine: list[float] = []
                failed = 0
                while time.monotonic() < deadline:
                    began = time.perf_counter()
                    try:
                        connection.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
                        response = connection.getresponse()
                        response.read()
                        if response.status != 200:
                            failed += 1
                    except (OSError, http.client.HTTPException):
                        failed += 1
                        connection.close()
                        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    mine.append(time.perf_counter() - began)
                connection.close()
                with lock:
                    latencies.extend(mine)
                    errors[0] += failed

            threads = [threading.Thread(target=client) for _ in range(clients)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            daemon.terminate()
            daemon.wait(5)
            simulation.stop()
    return latencies, errors[0]


def rows() -> list[Row]:
    seconds = float(os.environ.get("LOAD_SECONDS", "60"))
    clients = int(os.environ.get("LOAD_CLIENTS", "50"))
    latencies, errors = run(seconds, clients)
    name = f"load: {clients} scrapers x {seconds:.0f} s, {ENGINES} engines"
    return [
        Row(f"{name}: requests", len(latencies), "", target="report"),
        Row(f"{name}: errors", errors, "", target="0", passed=errors == 0),
        Row(f"{name}: p50", median(latencies) * 1e3, "ms", target="report"),
        Row(f"{name}: p99", p99(latencies) * 1e3, "ms", target="report"),
    ]


def main() -> None:
    print_rows(rows())


if __name__ == "__main__":
    main()
