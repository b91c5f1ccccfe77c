"""What a followed KV event stream and a resident block cost the busy daemon, fitted from
real runs: the daemon process of benchmarks.daemon (64 engines, 1 s polling, 10 scrapes a
second) without KV events, then with them while each engine keeps N blocks resident for
several N. A least-squares line through (resident blocks, RSS) gives the cost per block
(its slope) and per followed engine (its intercept over the run without KV events). The
residency's own structures are measured beside it with tracemalloc, in this process, fed
the simulated engines' stream shape (with its churn: stores, and removals of the oldest).
Run: .venv/bin/python -m benchmarks.kv_events_cost [--seconds S] [--working-sets 8,128,...]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from benchmarks.daemon import ENGINES, daemon_watching, proc_figures, resident_blocks, scrape
from exporter.collectors.kv_events_subscription import SUBSCRIPTION_RCVHWM
from exporter.demo import simulated_deployment
from exporter.demo.simulated_kv_events import BLOCKS_PER_STEP, KvGroup, ResidentBlocks
from exporter.kv_events_wire import BatchDecoder
from exporter.logs import configure_logging
from exporter.prefix_cache import EngineResidency

# Blocks of the full-attention group each engine keeps (a sliding-window group a quarter):
# BLOCKS_PER_STEP is the least the simulated publisher can keep (it stores that many a step).
WORKING_SETS = (BLOCKS_PER_STEP, 128, 256, 512, 1024)
MEASURE_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class Point:
    """One busy run: the working set asked for, the blocks resident at its end, and the
    daemon's peak and median RSS while measured (MiB)."""

    working_set: int | None  # None: no KV events
    blocks: int
    peak_rss_mib: float
    median_rss_mib: float


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through the points."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    return mean_y - slope * mean_x, slope


def expected_blocks(working_set: int, groups: Sequence[KvGroup]) -> int:
    """Blocks an engine holds once its working set is full (a sliding-window group keeps
    a quarter of them)."""
    return sum(working_set if window is None else working_set // 4 for _, _, window in groups)


def busy_point(working_set: int | None, seconds: float, groups: Sequence[KvGroup]) -> Point:
    """A daemon following 64 engines (of the demo's KV cache `groups`), measured while
    scraped 10 times a second once each engine holds its whole working set."""
    wanted = ENGINES * expected_blocks(working_set, groups) if working_set else 0
    with daemon_watching(
        ENGINES, kv_events=working_set is not None, working_set=working_set or BLOCKS_PER_STEP
    ) as (process, port):
        deadline = time.monotonic() + 120
        while resident_blocks(port) < wanted and time.monotonic() < deadline:
            for _ in range(10):
                scrape(port)
                time.sleep(0.1)
        samples = []
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            for _ in range(10):
                scrape(port)
                time.sleep(0.1)
            samples.append(proc_figures(process.pid)[0])
        return Point(working_set, resident_blocks(port), max(samples), statistics.median(samples))


def _stream(
    working_set: int, groups: tuple[KvGroup, ...], block_size: int, steps: int, seed: int
) -> list[bytes]:
    """Batches as a simulated engine publishes them (exporter.demo's ResidentBlocks): per
    step, per group, BlockRemoved events for the oldest blocks past the working set, then a
    BlockStored of new ones (a sliding-window group keeps a quarter of the blocks)."""
    blocks = ResidentBlocks(groups, seed)
    return [
        msgspec.msgpack.encode(
            [1.7e9 + step * 0.2, blocks.step(BLOCKS_PER_STEP, working_set, block_size), 0]
        )
        for step in range(steps)
    ]


def traced_bytes_per_block(
    working_set: int, groups: tuple[KvGroup, ...], block_size: int
) -> tuple[float, float]:
    """(bytes per resident block, bytes of an engine's residency with its blocks taken
    out) of ENGINES residencies in steady churn, as tracemalloc counts them."""
    steps = 3 * working_set // BLOCKS_PER_STEP + 50
    streams = [_stream(working_set, groups, block_size, steps, seed) for seed in range(ENGINES)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    residencies = []
    for engine, payloads in enumerate(streams):
        residency = EngineResidency(str(engine))
        residency.set_pool_blocks(100_000)
        decoder = BatchDecoder()
        for payload in payloads:
            residency.apply(decoder.decode(payload))
        residencies.append(residency)
    gc.collect()
    total = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    blocks = sum(p.resident_blocks for r in residencies for p in r.view().pools)
    return total / blocks, total / ENGINES


# Publishers in a child process (their buffers are not the subscriber's): one PUB per
# stream, each sending a batch of the simulated engines' size every 0.2 s.
_PUBLISHERS = """
import sys, time, zmq
context = zmq.Context()
pubs = [context.socket(zmq.PUB) for _ in range(int(sys.argv[1]))]
for pub in pubs:
    pub.bind("tcp://127.0.0.1:0")
print(" ".join(pub.getsockopt_string(zmq.LAST_ENDPOINT) for pub in pubs), flush=True)
while True:
    for pub in pubs:
        pub.send_multipart([b"", bytes(8), bytes(1200)])
    time.sleep(0.2)
"""


def zmq_bytes_per_stream(seconds: float = 10.0) -> float:
    """RSS one followed stream costs in libzmq: a SUB socket set up as the collector's
    (its monitor socket included), connected over TCP and drained for `seconds`."""
    child = subprocess.Popen(
        [sys.executable, "-c", _PUBLISHERS, str(ENGINES)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    endpoints = child.stdout.readline().split()
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        context.socket(zmq.SUB).close()  # the I/O thread and the context's own
        before_mib = proc_figures(os.getpid())[0]
        poller = zmq.Poller()
        for endpoint in endpoints:
            socket = context.socket(zmq.SUB)
            socket.setsockopt(zmq.RCVHWM, SUBSCRIPTION_RCVHWM)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.SUBSCRIBE, b"")
            poller.register(socket.get_monitor_socket(zmq.EVENT_CONNECTED), zmq.POLLIN)
            poller.register(socket, zmq.POLLIN)
            socket.connect(endpoint)
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            for ready, _ in poller.poll(200):
                if ready.socket_type == zmq.PAIR:
                    recv_monitor_message(ready)
                    continue
                while ready.poll(0):
                    ready.recv_multipart(copy=False)
        return (proc_figures(os.getpid())[0] - before_mib) * 2**20 / ENGINES
    finally:
        child.kill()
        child.wait()
        context.destroy(linger=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=MEASURE_SECONDS)
    parser.add_argument(
        "--working-sets", default=",".join(map(str, WORKING_SETS)), help="comma-separated"
    )
    args = parser.parse_args()
    configure_logging("warn")
    # First, while this process has freed nothing that libzmq's allocations could reuse
    # (RSS would not show them).
    zmq_kib = zmq_bytes_per_stream() / 1024
    working_sets = [int(n) for n in args.working_sets.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        demo = simulated_deployment(Path(directory) / "gemma")
    groups = demo.kv_events_groups
    points = [busy_point(None, args.seconds, groups)]
    points += [busy_point(n, args.seconds, groups) for n in working_sets]
    print(f"{'working set':>12s} {'blocks':>8s} {'peak MiB':>9s} {'median MiB':>11s}")
    for point in points:
        label = "no events" if point.working_set is None else str(point.working_set)
        print(
            f"{label:>12s} {point.blocks:8,d} {point.peak_rss_mib:9.1f} "
            f"{point.median_rss_mib:11.1f}"
        )
    followed = points[1:]
    for figure in ("peak_rss_mib", "median_rss_mib"):
        ys = [getattr(p, figure) for p in followed]
        intercept, slope = fit_line([p.blocks for p in followed], ys)
        engine_kib = (intercept - getattr(points[0], figure)) * 1024 / ENGINES
        print(
            f"fit of {figure}: {slope * 2**20:.0f} B per resident block, "
            f"{engine_kib:.0f} KiB per followed engine (intercept {intercept:.1f} MiB)"
        )
    for n in working_sets:
        per_block, per_engine = traced_bytes_per_block(n, groups, demo.kv_events_block_size)
        print(
            f"tracemalloc, working set {n}: {per_block:.0f} B a block, "
            f"{per_engine:,.0f} B an engine"
        )
    print(f"libzmq, a followed stream: {zmq_kib:.0f} KiB")


if __name__ == "__main__":
    main()
