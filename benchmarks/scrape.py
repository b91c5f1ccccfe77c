"""End-to-end /metrics latency: kvcap against plain prometheus_client, same series, same run.

Deployment: 64 engines, each with 4 KV cache groups and 8 workers (GPUs, TP=8), Llama 4
Scout. Baseline: the same series as prometheus_client `Gauge` children, served by
prometheus_client's own HTTP server. Both are fetched over loopback with a keep-alive
client, plain and gzip (Prometheus asks for gzip). Also: idle RSS of `kvcap-exporter serve`.
Also: the same series served by Debian's prometheus-node-exporter (textfile collector).
Run: .venv/bin/python -m benchmarks.scrape
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import Row, median, p99, print_rows
from exporter.capacity import EngineCapacity, EngineSettings, derive_capacity
from exporter.logs import configure_logging
from exporter.serve import Exporter
from exporter.state import EngineReport, KvUsage, StateStore

ENGINES = 64
REQUESTS = 400
ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests/fixtures/golden/vllm-0.33-capacity.jsonl"


def scout_config() -> dict[str, object]:
    for line in GOLDEN.read_text().splitlines():
        record = json.loads(line)
        if record["model"] == "llama-4-scout-text":
            config: dict[str, object] = record["hf_config"]
            return config
    raise LookupError("llama-4-scout-text")


def reports() -> list[EngineReport]:
    derived = derive_capacity(
        scout_config(),
        EngineSettings(tensor_parallel_size=8, max_model_len=131072),
        available_kv_bytes_per_worker=40 * 2**30,
    )
    assert len(derived.groups) == 4
    assert len(derived.bytes_per_block_per_worker) == 8
    base = EngineReport(
        engine="0",
        model_name="meta-llama/Llama-4-Scout-17B-16E-Instruct",
        instance_id="1",
        vllm_version="0.33.0",
        reported=EngineCapacity(
            num_gpu_blocks=derived.num_gpu_blocks,
            block_size=derived.block_size,
            kv_cache_size_tokens=derived.kv_cache_size_tokens,
            kv_cache_max_concurrency=derived.max_concurrency,
            max_model_len=derived.max_model_len,
        ),
        derived=derived.capacity,
        usage=KvUsage(0.5, 10, 2),
    )
    return [replace(base, engine=str(i)) for i in range(ENGINES)]


def baseline_registry(kvcap_body: str) -> CollectorRegistry:
    """The same kvcap_* series as plain prometheus_client Gauge children."""
    registry = CollectorRegistry()
    for family in text_string_to_metric_families(kvcap_body):
        if not family.name.startswith("kvcap_") or family.type != "gauge":
            continue
        labels = sorted({k for s in family.samples for k in s.labels})
        gauge = Gauge(family.name, family.documentation, labels, registry=registry)
        for sample in family.samples:
            gauge.labels(**{k: sample.labels.get(k, "") for k in labels}).set(sample.value)
    return registry


def latencies(port: int, gzip_: bool) -> list[float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Accept-Encoding": "gzip"} if gzip_ else {}
    timings = []
    for _ in range(REQUESTS + 20):
        start = time.perf_counter()
        connection.request("GET", "/metrics", headers=headers)
        response = connection.getresponse()
        response.read()
        timings.append(time.perf_counter() - start)
        assert response.status == 200
    connection.close()
    return timings[20:]  # warm-up


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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


def rows() -> list[Row]:
    configure_logging("warn")
    store = StateStore()
    store.publish("handshake", "ipc:///run/kvcap/handshake", reports())
    exporter = Exporter([], "127.0.0.1:0", store=store)
    exporter.start()
    port = int(exporter.server.url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port)
    connection.request("GET", "/metrics")
    body = connection.getresponse().read().decode()
    connection.close()
    series = sum(1 for line in body.splitlines() if line.startswith("kvcap_"))
    registry = baseline_registry(body)
    baseline_server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    baseline_port = baseline_server.server_address[1]
    result = []
    try:
        for gzip_ in (False, True):
            kind = "gzip" if gzip_ else "plain"
            ours = latencies(port, gzip_)
            theirs = latencies(baseline_port, gzip_)
            node = node_exporter_latencies(body, gzip_)
            name = f"/metrics {kind}, {ENGINES} engines ({series} series)"
            result.append(
                Row(
                    f"{name}: median",
                    median(ours) * 1e3,
                    "ms",
                    median(theirs) * 1e3,
                    "prometheus_client Gauges",
                    ">= 10x faster",
                    median(theirs) / median(ours) >= 10,
                )
            )
            result.append(
                Row(
                    f"{name}: p99",
                    p99(ours) * 1e3,
                    "ms",
                    p99(theirs) * 1e3,
                    "prometheus_client Gauges",
                    "< 2 ms",
                    p99(ours) < 0.002,
                )
            )
            if node is not None:
                result.append(
                    Row(
                        f"{name}: median vs node_exporter",
                        median(ours) * 1e3,
                        "ms",
                        median(node) * 1e3,
                        "node_exporter textfile",
                        "not slower",
                        median(ours) <= median(node),
                    )
                )
    finally:
        baseline_server.shutdown()
        baseline_server.server_close()
        exporter.stop()
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
