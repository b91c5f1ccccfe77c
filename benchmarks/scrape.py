"""End-to-end /metrics latency: kvcap against plain prometheus_client, same series, same run.

Deployment: 64 engines, each with 4 KV cache groups and 8 workers (GPUs, TP=8), Llama 4
Scout. Baseline: the same series as prometheus_client `Gauge` children, served by
prometheus_client's own HTTP server. Both are fetched over loopback with a keep-alive
client, plain and gzip (Prometheus asks for gzip).

Two paths: cold, the snapshot replaced before each scrape as a poll does (every engine
republished with new usage; the baseline's gauges set anew likewise), and hot, nothing
changed since the last scrape. Only the GET is timed. Also: the CPU one publish of 64
engines costs (state rebuild plus the render of the next scrape) at one poll a second, idle
RSS of `kvcap-exporter serve`, and the same series served by Debian's
prometheus-node-exporter (textfile collector) where it is installed.
Run: .venv/bin/python -m benchmarks.scrape
"""

from __future__ import annotations

import functools
import gzip
import http.client
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import Row, median, p99, print_rows
from benchmarks.parse import wide_exposition
from exporter.capacity import EngineCapacity, EngineSettings, derive_capacity
from exporter.collectors import ServerPoller, VllmHttpSettings, collector_priority, fetch
from exporter.collectors.parsing import parse_vllm_serve_args
from exporter.exposition import build_exposition
from exporter.logs import configure_logging
from exporter.serve import Exporter, WebSettings, set_switch_interval
from exporter.state import EngineReport, KvUsage, StateStore
from tools.probe import free_port

ENGINES = 64
REQUESTS = 400
PUBLISHES = 200
PAUSE_S = 0.005
POLL_INTERVAL_S = 0.25
TARGET = "http://127.0.0.1:8000"
ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests/fixtures/golden/vllm-0.33-capacity.jsonl"


def scout_config() -> dict[str, object]:
    for line in GOLDEN.read_text().splitlines():
        record = json.loads(line)
        if record["model"] == "llama-4-scout-text":
            config: dict[str, object] = record["hf_config"]
            return config
    raise LookupError("llama-4-scout-text")


@functools.cache
def scout_capacity() -> EngineCapacity:
    """Derived once, as vllm_http's cached deriver gives the same object every poll."""
    derived = derive_capacity(
        scout_config(),
        EngineSettings(tensor_parallel_size=8, max_model_len=131072),
        available_kv_bytes_per_worker=40 * 2**30,
    )
    assert len(derived.capacity.groups) == 4
    assert len(derived.capacity.bytes_per_block_per_worker) == 8
    return derived.capacity


def reports(usage: float = 0.5) -> list[EngineReport]:
    """What one poll reports: new report objects, vLLM's numbers, new usage."""
    derived = scout_capacity()
    return [
        EngineReport(
            engine=str(i),
            model_name="meta-llama/Llama-4-Scout-17B-16E-Instruct",
            vllm_version="0.33.0",
            reported=EngineCapacity(
                num_gpu_blocks=derived.num_gpu_blocks,
                block_size=derived.block_size,
                kv_cache_size_tokens=derived.kv_cache_size_tokens,
                kv_cache_max_concurrency=derived.kv_cache_max_concurrency,
                max_model_len=derived.max_model_len,
            ),
            derived=derived,
            usage=KvUsage(usage, 10, 2),
        )
        for i in range(ENGINES)
    ]


def baseline_registry(kvcap_body: str) -> CollectorRegistry:
    """The same kvcap_* series as plain prometheus_client Gauge children."""
    registry = CollectorRegistry()
    for family in text_string_to_metric_families(kvcap_body):
        if not family.name.startswith("kvcap_") or family.type != "gauge":
            continue
        labels = sorted({k for s in family.samples for k in s.labels})
        gauge = Gauge(family.name, family.documentation, labels, registry=registry)
        for sample in family.samples:
            if labels:
                gauge.labels(**{k: sample.labels.get(k, "") for k in labels}).set(sample.value)
            else:
                gauge.set(sample.value)
    return registry


def latencies(
    port: int,
    gzip_: bool,
    before: Callable[[int], None] | None = None,
    pause_s: float = PAUSE_S,
) -> list[float]:
    """GET /metrics REQUESTS times (after 20 warm-up requests) from a client in a process of
    its own (benchmarks.scrape_client), as Prometheus scrapes; `before(i)` runs here,
    untimed, before request i (the cold path replaces the snapshot there).

    Every request, hot or cold, ours or the baseline's, waits PAUSE_S first: in production a
    poll and a scrape are independent events, while a GET sent the instant the publishing
    thread returns waits for the OS to schedule the server thread again (milliseconds on
    a busy 2-core machine), which is the machine, not the exporter. The pause costs every
    request the wake-up of an idle process (0.5-1 ms here), as a scrape of an idle sidecar
    pays it; `pause_s=0` (hot, back to back) is how the figures before the cold path were
    measured. Until 2026-12-02 the client ran in this process, on a thread of its own."""
    requests = REQUESTS + 20
    encoding = "gzip" if gzip_ else "plain"
    command = ["benchmarks.scrape_client", str(port), encoding, str(pause_s), str(requests)]
    client = subprocess.Popen(
        [sys.executable, "-m", *command],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert client.stdin is not None
    assert client.stdout is not None
    try:
        for number in range(requests):
            assert client.stdout.readline().strip() == str(number), "the client stopped"
            if before is not None:
                before(number)
            client.stdin.write("\n")
            client.stdin.flush()
        timings: list[float] = json.loads(client.stdout.readline())
        assert isinstance(timings, list), timings
        assert client.wait(10) == 0
    finally:
        client.kill()
        client.wait()
    return timings[20:]  # warm-up


def node_exporter_latencies(kvcap_body: str, gzip_: bool) -> list[float] | None:
    """Debian's prometheus-node-exporter serving the same kvcap_* series (textfile collector)."""
    binary = shutil.which("prometheus-node-exporter")
    if binary is None:
        return None
    with tempfile.TemporaryDirectory() as directory:
        lines = [
            line
            for line in kvcap_body.splitlines()
            if line.startswith(("kvcap_", "# HELP kvcap_", "# TYPE kvcap_"))
        ]
        Path(directory, "kvcap.prom").write_text("\n".join(lines) + "\n")
        port = free_port()
        process = subprocess.Popen(
            [
                binary,
                "--collector.disable-defaults",
                "--collector.textfile",
                f"--collector.textfile.directory={directory}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    time.sleep(0.05)
            return latencies(port, gzip_)
        finally:
            process.terminate()
            process.wait(5)


def polls(store: StateStore) -> Callable[[int], None]:
    """What one poll of the HTTP collector does: every engine again, new usage."""
    batches = [reports(usage=(i % 100) / 100) for i in range(100)]

    def poll(number: int) -> None:
        store.publish("vllm_http", TARGET, batches[number % len(batches)], duration_s=0.01)

    return poll


class _PollForwarder:
    """The poller's sink. Each poll does all of a real one's work on its own thread (fetch
    the 64-engine body, decode, parse, read the engines); what it publishes is the
    benchmark's next 64 Scout engines, so the series stay those of the cold rows and of
    the baseline (with the state rebuild and the render of the next body, as a poll does)."""

    def __init__(self, poll: Callable[[int], None]) -> None:
        self._poll = poll
        self.polls = 0
        self.failures: list[str] = []

    def register_target(self, collector: str, target: str) -> None:
        """Nothing to register: the forwarded engines are the benchmark's."""

    def publish(
        self, collector: str, target: str, reports: Sequence[EngineReport], **_: object
    ) -> None:
        if len(reports) != ENGINES:
            self.failures.append(f"{len(reports)} engines read, not {ENGINES}")
        self.polls += 1
        self._poll(self.polls)

    def fail(self, collector: str, target: str, reason: str, message: str, **_: object) -> None:
        self.failures.append(f"{reason}: {message}")

    def forget(self, collector: str, target: str) -> None:
        """Never reached: the stand-in keeps answering."""


@contextmanager
def vllm_polled(poll: Callable[[int], None]) -> Iterator[_PollForwarder]:
    """vllm_http's poller reading a 64-engine vLLM body (another process serves it) every
    POLL_INTERVAL_S, publishing through `poll`; checks on exit that it polled and never
    failed."""
    with tempfile.TemporaryDirectory() as directory:
        body = Path(directory, "metrics")
        body.write_text(wide_exposition(ENGINES))
        server = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.vllm_standin", str(body)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            assert server.stdout is not None
            url = server.stdout.readline().strip()
            settings = VllmHttpSettings(
                urls=(url,),
                poll_interval_s=POLL_INTERVAL_S,
                serve_args=parse_vllm_serve_args(f"qwen --data-parallel-size {ENGINES}"),
            )
            forwarder = _PollForwarder(poll)
            stop = threading.Event()
            poller = ServerPoller(url, settings, fetch, forwarder, stop)  # type: ignore[arg-type]
            thread = threading.Thread(target=poller.run, name="vllm-http bench", daemon=True)
            thread.start()
            try:
                yield forwarder
            finally:
                stop.set()
                thread.join(10)
            assert forwarder.polls > 0, "the poller never published"
            assert not forwarder.failures, forwarder.failures[:3]
        finally:
            server.terminate()
            server.wait(5)


def baseline_updates(registry: CollectorRegistry) -> Callable[[int], None]:
    """The baseline's cold path: its used-tokens gauges set anew before each scrape."""
    gauge = registry._names_to_collectors["kvcap_kv_cache_used_tokens"]
    children = list(gauge._metrics.values())  # type: ignore[attr-defined]

    def update(number: int) -> None:
        for child in children:
            child.set(number)

    return update


def ratio_row(name: str, ours: list[float], theirs: list[float], target: float) -> Row:
    return Row(
        f"{name}: median",
        median(ours) * 1e3,
        "ms",
        median(theirs) * 1e3,
        "prometheus_client Gauges",
        f">= {target:g}x faster",
        median(theirs) / median(ours) >= target,
    )


def p99_row(name: str, ours: list[float], theirs: list[float], limit_s: float) -> Row:
    return Row(
        f"{name}: p99",
        p99(ours) * 1e3,
        "ms",
        p99(theirs) * 1e3,
        "prometheus_client Gauges",
        f"< {limit_s * 1e3:g} ms",
        p99(ours) < limit_s,
    )


def publish_cpu_ms() -> tuple[float, float, dict[str, list[float]]]:
    """CPU ms of one publish of 64 engines: the state rebuild alone, and with the render
    of the next scrape (plain and gzip), as one poll a second costs it; and the CPU time of
    each cold body (this thread's, so other processes on the machine do not count)."""
    store = StateStore(priority=collector_priority())
    cache = build_exposition(store.snapshot)
    poll = polls(store)
    poll(0)
    cache.body()
    began = time.process_time()
    for number in range(PUBLISHES):
        poll(number + 1)
    publish = (time.process_time() - began) / PUBLISHES
    bodies: dict[str, list[float]] = {"plain": [], "gzip": []}
    began = time.process_time()
    for number in range(PUBLISHES):
        poll(number + 1)
        for kind, encoding in (("plain", None), ("gzip", "gzip")):
            started = time.thread_time()
            cache.body(accept_encoding=encoding)
            bodies[kind].append(time.thread_time() - started)
    return publish * 1e3, (time.process_time() - began) / PUBLISHES * 1e3, bodies


def check_bodies(port: int) -> tuple[str, int]:
    """The plain body, and that the gzip body holds the same text."""
    connection = http.client.HTTPConnection("127.0.0.1", port)
    connection.request("GET", "/metrics")
    body = connection.getresponse().read().decode()
    connection.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
    zipped = gzip.decompress(connection.getresponse().read()).decode()
    connection.close()
    kvcap = [line for line in body.splitlines() if not line.startswith(("process_", "# "))]
    unzipped = [line for line in zipped.splitlines() if not line.startswith(("process_", "# "))]
    assert kvcap == unzipped
    return body, sum(1 for line in kvcap if line.startswith("kvcap_"))


def rows() -> list[Row]:
    configure_logging("warn")
    set_switch_interval()  # as the daemon's main sets it: the poller's parse yields the lock
    store = StateStore(priority=collector_priority())
    poll = polls(store)
    poll(0)
    exporter = Exporter([], WebSettings("127.0.0.1:0"), store=store)
    exporter.start()
    port = int(exporter.server.url.rsplit(":", 1)[1])
    body, series = check_bodies(port)
    registry = baseline_registry(body)
    baseline_server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    baseline_port = baseline_server.server_address[1]
    result = []
    try:
        for gzip_ in (False, True):
            kind = "gzip" if gzip_ else "plain"
            theirs = latencies(baseline_port, gzip_, baseline_updates(registry))
            cold = latencies(port, gzip_, poll)
            hot = latencies(port, gzip_)
            back_to_back = latencies(port, gzip_, pause_s=0)
            with vllm_polled(poll) as forwarder:
                polled = latencies(port, gzip_, poll)
            name = f"/metrics {kind}, {ENGINES} engines ({series} series)"
            result.append(ratio_row(f"{name}, cold", cold, theirs, 20))
            result.append(p99_row(f"{name}, cold", cold, theirs, 0.002))
            busy = f"{name}, cold, {POLL_INTERVAL_S:g} s vllm_http poll running"
            result.append(ratio_row(busy, polled, theirs, 20))
            result.append(p99_row(busy, polled, theirs, 0.002))
            result.append(Row(f"{busy}: polls during the scrapes", forwarder.polls, ""))
            result.append(ratio_row(f"{name}, hot", hot, theirs, 20))
            result.append(p99_row(f"{name}, hot", hot, theirs, 0.002))
            result.append(
                Row(
                    f"{name}, hot, back to back (no pause): median",
                    median(back_to_back) * 1e3,
                    "ms",
                    target="report (0.47 ms before the cold path, 2026-11-30)",
                )
            )
            node = node_exporter_latencies(body, gzip_)
            if node is not None:
                result.append(
                    Row(
                        f"{name}, cold: median vs node_exporter",
                        median(cold) * 1e3,
                        "ms",
                        median(node) * 1e3,
                        "node_exporter textfile",
                        "not slower",
                        median(cold) <= median(node),
                    )
                )
    finally:
        baseline_server.shutdown()
        baseline_server.server_close()
        exporter.stop()
    publish, with_render, bodies = publish_cpu_ms()
    for kind, cpu in bodies.items():
        result.append(
            Row(
                f"cold /metrics {kind} body, CPU of the render: p99",
                p99(cpu) * 1e3,
                "ms",
                target="< 2 ms",
                passed=p99(cpu) < 0.002,
            )
        )
    result.append(Row(f"CPU per publish of {ENGINES} engines (state)", publish, "ms"))
    result.append(
        Row(
            f"CPU per publish of {ENGINES} engines + next scrape's render",
            with_render,
            "ms",
            target=f"report ({with_render / 10:.2f}% of a core at 1 poll/s)",
        )
    )
    rss = idle_rss_mib()
    result.append(
        Row("idle RSS of `kvcap-exporter serve`", rss, "MiB", target="<= 45 MiB", passed=rss <= 45)
    )
    return result


def idle_rss_mib() -> float:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "serve",
            "--web.listen-address",
            "127.0.0.1:0",
            "--handshake.listen",
            "tcp://127.0.0.1:0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(3)
        status = Path(f"/proc/{process.pid}/status").read_text()
        rss_kib = int(
            next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))
        )
        return rss_kib / 1024
    finally:
        process.terminate()
        process.wait(5)


def main() -> None:
    print_rows(rows())


if __name__ == "__main__":
    main()
