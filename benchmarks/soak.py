"""`make soak`: a bounded soak (10 minutes by default) under churn.

The daemon runs as its own process against a simulated 16-engine vLLM API server that
is stopped and restarted (a flapping source) and loses and regains engines, while a
handshake peer restarts engines (new instance ids) and says bye, and NVML (the test
library of tests/nvml, 8 GPUs) loses a GPU now and then and changes memory. Passes when RSS grows
less than 5 MiB after warm-up, the thread count stays constant, the series count stays
bounded, and every source and engine has recovered at the end. SOAK_SECONDS changes the
duration.
Run: .venv/bin/python -m benchmarks.soak
"""

from __future__ import annotations

import http.client
import os
import tempfile
import time
from pathlib import Path

import zmq

from benchmarks.common import Row, print_rows
from benchmarks.daemon import proc_figures, scrape, start_daemon
from exporter.demo import simulated_deployment
from exporter.demo.simulated_vllm import SimulatedEngine, SimulatedVllm
from exporter.handshake_wire import ReadyExtras, bye_message, ready_message
from tools.handshake_data import ready_for_rank
from tools.nvml.build import build_fake_nvml
from tools.nvml.fake import FakeNvml, FakeNvmlConfig, eight_h200s
from tools.probe import free_port

GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST

ROOT = Path(__file__).resolve().parent.parent
ENGINES = 16
HANDSHAKE_ENGINES = range(100, 108)  # indices of their own, beside the HTTP engines


def metrics(port: int) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/metrics")
    body = connection.getresponse().read().decode()
    connection.close()
    return body


def series(body: str) -> int:
    return sum(1 for line in body.splitlines() if line.startswith("kvcap_"))


def rows() -> list[Row]:
    seconds = float(os.environ.get("SOAK_SECONDS", "600"))
    warmup = min(60.0, seconds / 5)
    with tempfile.TemporaryDirectory() as directory:
        simulation = simulated_deployment(Path(directory) / "gemma", data_parallel_size=ENGINES)
        simulation.start()
        sim_port = int(simulation.url.rsplit(":", 1)[1])
        port, handshake_port = free_port(), free_port()
        nvml = FakeNvml(build_fake_nvml(Path(directory)), Path(directory) / "nvml.conf")
        healthy = eight_h200s()
        nvml.write(healthy)
        daemon = start_daemon(
            port,
            *("--vllm.url", simulation.url, "--vllm.poll-interval", "1"),
            *("--vllm.stale-after", "2", "--vllm.args", simulation.vllm_args),
            *("--handshake.listen", f"tcp://127.0.0.1:{handshake_port}"),
            *("--nvml.poll-interval", "1"),
            env=nvml.environment(),
        )
        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(f"tcp://127.0.0.1:{handshake_port}")
        samples: list[tuple[float, float, int, int]] = []
        try:
            while not scrape(port):
                time.sleep(0.05)
            began = time.monotonic()
            tick = 0
            while time.monotonic() - began < seconds:
                tick += 1
                churn(
                    tick,
                    simulation=simulation,
                    sim_port=sim_port,
                    push=push,
                    nvml=nvml,
                    healthy=healthy,
                )
                if tick % 10 == 0:
                    rss, _, threads = proc_figures(daemon.pid)
                    samples.append((time.monotonic() - began, rss, threads, series(metrics(port))))
                time.sleep(1)
            # Calm: everything back, then give the sources a poll to recover.
            for index in range(ENGINES):
                simulation.engines.setdefault(index, SimulatedEngine(index, phase=index * 1.7))
            nvml.write(healthy)
            time.sleep(5)
            final = metrics(port)
        finally:
            push.close()
            context.term()
            daemon.terminate()
            daemon.wait(5)
            simulation.stop()
    return verdict(seconds, warmup, samples, final)


def churn(
    tick: int,
    *,
    simulation: SimulatedVllm,
    sim_port: int,
    push: zmq.Socket[bytes],
    nvml: FakeNvml,
    healthy: FakeNvmlConfig,
) -> None:
    """One second of trouble: engine restarts and byes, a flapping API server, engines
    vanishing and returning, a lost GPU and moving GPU memory."""
    rank = HANDSHAKE_ENGINES[tick % len(HANDSHAKE_ENGINES)]
    push.send_multipart(
        ready_message(ready_for_rank(rank, str(tick)), ReadyExtras(model_name="soak"))
    )
    if tick % 5 == 0:
        push.send_multipart(bye_message(rank, str(tick)))
    if tick % 7 == 0:  # the API server goes away for two polls, then comes back
        simulation.stop()
        time.sleep(2)
        simulation.start(port=sim_port)
    if tick % 4 == 0:  # an engine vanishes, another comes back
        gone = tick % ENGINES
        simulation.remove_engine(gone)
        back = (gone + ENGINES // 2) % ENGINES
        simulation.engines[back] = SimulatedEngine(back, phase=back * 1.7)
    if tick % 6 == 0:  # a GPU is lost for a second
        nvml.write(healthy.with_gpu(tick % 8, error=GPU_IS_LOST))
    elif tick % 6 == 1:
        nvml.write(healthy.with_gpu(tick % 8, used=(100 + tick % 20) * 2**30))


def verdict(
    seconds: float, warmup: float, samples: list[tuple[float, float, int, int]], final: str
) -> list[Row]:
    steady = [s for s in samples if s[0] >= warmup] or samples
    growth = max(s[1] for s in steady) - steady[0][1]
    threads = {s[2] for s in steady}
    most_series = max(s[3] for s in samples)
    lines = final.splitlines()
    down = [x for x in lines if x.startswith("kvcap_collector_up{") and x.endswith(" 0.0")]
    stale = [x for x in lines if x.startswith("kvcap_engine_stale{") and x.endswith(" 1.0")]
    gpus = sum(1 for x in lines if x.startswith("kvcap_gpu_info{"))
    name = f"soak {seconds:.0f} s"
    return [
        Row(
            f"{name}: RSS growth after warm-up", growth, "MiB", target="< 5 MiB", passed=growth < 5
        ),
        Row(
            f"{name}: thread counts seen after warm-up",
            len(threads),
            "",
            target="1 (constant)",
            passed=len(threads) == 1,
        ),
        Row(
            f"{name}: most kvcap series seen",
            most_series,
            "",
            target="<= 3000 (bounded)",
            passed=most_series <= 3000,
        ),
        Row(
            f"{name}: sources down or engines stale at the end",
            len(down) + len(stale),
            "",
            target="0",
            passed=not down and not stale,
        ),
        Row(f"{name}: GPUs reported at the end", gpus, "", target="8", passed=gpus == 8),
    ]


def main() -> None:
    print_rows(rows())


if __name__ == "__main__":
    main()
