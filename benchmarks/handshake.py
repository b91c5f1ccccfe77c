"""Handshake: how soon a ready response is visible in /metrics, and decode cost.

1. Latency: a PUSH socket sends vLLM 0.33's ready-response bytes of an engine (a new DP
   rank, later a restarted one with a new instance id) to a running exporter that watches
   up to 64 engines; the clock stops when GET /metrics shows the change.
2. Throughput: kvcap's decode of a ready message (tolerant Struct + extras + report) vs a
   raw `msgspec.msgpack.decode` of the same bytes to plain Python objects.
Run: .venv/bin/python -m benchmarks.handshake
"""

from __future__ import annotations

import http.client
import tempfile
import time
from pathlib import Path

import msgspec
import zmq

from benchmarks.common import Row, median, p99, print_rows
from exporter.collectors.handshake import HandshakeCollector, HandshakeSettings, engine_report
from exporter.handshake_wire import ReadyExtras, decode_extras, decode_ready, encode, ready_message
from exporter.logs import configure_logging
from exporter.serve import Exporter
from tests.handshake_data import HANDSHAKE, ready_for_rank

RECORDING = "qwen3-next-80b-a3b-dp2-tp2.engine0.msgpack"
READY = (HANDSHAKE / RECORDING).read_bytes()
ENGINES = 64
ROUNDS = 4  # round 0 adds the engines, later rounds restart each (a new instance id)


def latency(tmp: Path) -> list[float]:
    endpoint = f"ipc://{tmp}/handshake.sock"
    source = HandshakeCollector(HandshakeSettings(endpoint=endpoint, max_messages_per_s=1e6))
    exporter = Exporter([source], "127.0.0.1:0")
    exporter.start()
    host, port = exporter.server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port))
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    push.connect(endpoint)
    extras = ReadyExtras(model_name="Qwen/Qwen3-Next-80B-A3B-Instruct")
    delays = []
    try:
        for round_ in range(ROUNDS):
            for rank in range(ENGINES):
                needle = f'engine="{rank}",instance_id="r{round_}"'.encode()
                started = time.perf_counter()
                push.send_multipart(
                    ready_message(ready_for_rank(rank, f"r{round_}", RECORDING), extras)
                )
                while True:
                    connection.request("GET", "/metrics")
                    if needle in connection.getresponse().read():
                        break
                delays.append(time.perf_counter() - started)
    finally:
        push.close(linger=0)
        context.term()
        exporter.stop()
    return delays


def throughput() -> tuple[float, float]:
    extras = encode(ReadyExtras(model_name="m", bytes_per_block_per_worker=[1, 2]))
    rounds = 20_000

    def ours() -> None:
        engine_report(decode_ready(READY), decode_extras(extras))

    def raw() -> None:
        msgspec.msgpack.decode(READY)
        msgspec.msgpack.decode(extras)

    results = []
    for func in (ours, raw):
        began = time.perf_counter()
        for _ in range(rounds):
            func()
        results.append(rounds / (time.perf_counter() - began))
    return results[0], results[1]


def rows() -> list[Row]:
    configure_logging("warn")
    with tempfile.TemporaryDirectory() as tmp:
        delays = latency(Path(tmp))
    ours, raw = throughput()
    figure = f"handshake receipt to /metrics ({ENGINES} engines)"
    return [
        Row(f"{figure}: median", median(delays) * 1e3, "ms", target="report"),
        Row(
            f"{figure}: p99", p99(delays) * 1e3, "ms", target="< 20 ms", passed=p99(delays) < 0.020
        ),
        # Throughput: a higher value is better, so the ratio column is raw/ours.
        Row(
            "handshake decode, messages/s (Struct+extras+report)",
            ours,
            "/s",
            raw,
            "raw msgspec.msgpack.decode",
            "report",
        ),
    ]


def main() -> None:
    print_rows(rows())


if __name__ == "__main__":
    main()
