"""`make load`: 50 concurrent scrapers for 60 s against a daemon watching 64 engines.

The daemon runs as its own process, polling a simulated 64-engine vLLM API server every
second; 50 client threads each keep one connection and scrape as fast as they can.
Passes when no request fails. LOAD_SECONDS and LOAD_CLIENTS change the run.
Run: .venv/bin/python -m benchmarks.load
"""

from __future__ import annotations

import http.client
import os
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common import Row, median, p99, print_rows
from benchmarks.daemon import daemon_watching

ENGINES = 64


def scraper(port: int, deadline: float) -> tuple[list[float], int]:
    """One client on one keep-alive connection until `deadline`: (latencies, failures)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    latencies: list[float] = []
    failed = 0
    while time.monotonic() < deadline:
        began = time.perf_counter()
        try:
            connection.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            response = connection.getresponse()
            response.read()
            failed += response.status != 200
        except (OSError, http.client.HTTPException):
            failed += 1
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        latencies.append(time.perf_counter() - began)
    connection.close()
    return latencies, failed


def run(seconds: float, clients: int) -> tuple[list[float], int]:
    # One connection per scraper: above the default cap of 40, each would close another's.
    flags = f"--web.max-requests={max(40, clients + 8)}"
    with daemon_watching(ENGINES, flags) as (_, port), ThreadPoolExecutor(clients) as pool:
        deadline = time.monotonic() + seconds
        results = list(pool.map(lambda _: scraper(port, deadline), range(clients)))
    latencies = [value for found, _ in results for value in found]
    return latencies, sum(failed for _, failed in results)


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
