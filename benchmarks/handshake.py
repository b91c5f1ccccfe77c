"""Handshake: how soon a ready response is visible in /metrics, and decode cost.

1. Latency: a PUSH socket sends vLLM 0.33's ready-response bytes of an engine (a new DP
   rank, later a restarted one with a new instance id) to `kvcap-exporter serve` (its own
   process) watching up to 64 engines; the clock stops when GET /metrics shows the change.
   Also the exporter's own share in one thread: the message into the state, and the next
   body rendered (on a busy machine the end-to-end figure is mostly thread wake-ups).
2. Throughput: kvcap's decode of a ready message (tolerant Struct + extras + report) vs a
   raw `msgspec.msgpack.decode` of the same bytes to plain Python objects.
Run: .venv/bin/python -m benchmarks.handshake
"""

from __future__ import annotations

import http.client
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import zmq

from benchmarks.common import Row, median, p99, print_rows
from exporter.collectors import (
    HandshakeReceiver,
    HandshakeSettings,
    collector_priority,
    engine_report,
)
from exporter.exposition import build_exposition
from exporter.handshake_wire import ReadyExtras, decode_extras, decode_ready, encode, ready_message
from exporter.logs import configure_logging
from exporter.state import StateStore
from tools.handshake_data import HANDSHAKE, ready_for_rank
from tools.probe import free_port

RECORDING = "qwen3-next-80b-a3b-dp2-tp2.engine0.msgpack"
READY = (HANDSHAKE / RECORDING).read_bytes()
ENGINES = 64
ROUNDS = 4  # round 0 adds the engines, later rounds restart each (a new instance id)


def start_exporter(endpoint: str) -> tuple[subprocess.Popen[bytes], int]:
    """`kvcap-exporter serve` with only the handshake collector, in its own process: the
    measuring client must not share the exporter's interpreter (and its GIL)."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "serve",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--handshake.listen",
            endpoint,
            "--handshake.max-rate",
            "1000000",
            "--no-collector.vllm_http",
            "--no-collector.nvml",
            "--log.level",
            "warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            connection.request("GET", "/readyz")
            if connection.getresponse().status == 200:
                return process, port
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the exporter did not become ready")


def latency(tmp: Path) -> list[float]:
    endpoint = f"ipc://{tmp}/handshake.sock"
    process, port = start_exporter(endpoint)
    connection = http.client.HTTPConnection("127.0.0.1", port)
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
        process.terminate()
        process.wait(5)
    return delays


def in_process() -> list[float]:
    """The exporter's own share of the latency: decoding a message into the state and
    rendering the next body, in one thread (no sockets, no thread hand-offs)."""
    store = StateStore(priority=collector_priority())
    cache = build_exposition(store.snapshot)
    receiver = HandshakeReceiver("ipc://bench", store, HandshakeSettings(max_messages_per_s=1e9))
    extras = ReadyExtras(model_name="Qwen/Qwen3-Next-80B-A3B-Instruct")
    delays = []
    for round_ in range(ROUNDS):
        for rank in range(ENGINES):
            message = ready_message(ready_for_rank(rank, f"r{round_}", RECORDING), extras)
            # CPU time of this thread: what the exporter spends, not what the machine's
            # other processes take from it meanwhile.
            started = time.thread_time()
            receiver.handle(message)
            cache.body()
            delays.append(time.thread_time() - started)
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
    own = in_process()
    ours, raw = throughput()
    figure = f"handshake receipt to /metrics ({ENGINES} engines)"
    return [
        Row(f"{figure}: median", median(delays) * 1e3, "ms", target="report"),
        Row(f"{figure}: p99", p99(delays) * 1e3, "ms", target="< 5 ms", passed=p99(delays) < 0.005),
        Row(
            "handshake message to rendered body, CPU (64 engines): median",
            median(own) * 1e3,
            "ms",
            target="report",
        ),
        Row(
            "handshake message to rendered body, CPU (64 engines): p99",
            p99(own) * 1e3,
            "ms",
            target="< 5 ms",
            passed=p99(own) < 0.005,
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
