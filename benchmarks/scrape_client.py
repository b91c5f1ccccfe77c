"""A scraper in a process of its own, as Prometheus is: GETs /metrics and times each GET.

Before each GET it writes the request's number on stdout and waits for a line on stdin, so
the process that serves /metrics can change its state first (the cold path), untimed; then
it waits the pause and times the GET. Last, it writes the timings (seconds) as JSON.
A client inside the exporter's process would share its interpreter lock, with the poller and
the server both: its own parsing of each response would count as the exporter's latency.
Run by benchmarks.scrape: python -m benchmarks.scrape_client PORT plain|gzip PAUSE_S REQUESTS
"""

from __future__ import annotations

import http.client
import json
import sys
import time


def main(argv: list[str]) -> int:
    port, encoding, pause_s, requests = int(argv[1]), argv[2], float(argv[3]), int(argv[4])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Accept-Encoding": "gzip"} if encoding == "gzip" else {}
    timings = []
    for number in range(requests):
        print(number, flush=True)
        if not sys.stdin.readline():
            return 1  # the benchmark went away
        if pause_s:
            time.sleep(pause_s)
        start = time.perf_counter()
        connection.request("GET", "/metrics", headers=headers)
        response = connection.getresponse()
        response.read()
        timings.append(time.perf_counter() - start)
        if response.status != 200:
            print(json.dumps({"status": response.status}), flush=True)
            return 1
    connection.close()
    print(json.dumps(timings), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
