"""`kvcap-exporter demo`: the exporter against a simulated data-parallel vLLM deployment."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from importlib import resources
from typing import Any, TextIO

from exporter.capacity import EngineSettings, derive_capacity
from exporter.demo.simulated_vllm import SimulatedVllm
from exporter.logs import configure_logging
from exporter.serve import Exporter, add_common_arguments, wait_for_signal
from exporter.state import EngineReport, KvUsage, ReportedCapacity, StateSink

DEMO_MODEL = "gemma-3-27b-text"
DEMO_SERVED_NAME = "google/gemma-3-27b-it"


def example_config(name: str) -> dict[str, Any]:
    text = resources.files("exporter.examples").joinpath(f"{name}.json").read_text("utf-8")
    config: dict[str, Any] = json.loads(text)
    return config


def simulated_deployment() -> SimulatedVllm:
    """Gemma 3 27B (sliding window + full attention), TP 2, data-parallel 2."""
    return SimulatedVllm(
        served_model_name=DEMO_SERVED_NAME,
        model_path=f"/models/{DEMO_MODEL}",
        config=example_config(DEMO_MODEL),
        settings=EngineSettings(tensor_parallel_size=2),
        data_parallel_size=2,
        available_kv_bytes_per_worker=44_000_000_000,
    )


class SimulationFeed:
    """Feeds the simulated engines straight into the state (until the HTTP source lands)."""

    name = "simulated"

    def __init__(self, simulation: SimulatedVllm, interval_s: float = 1.0) -> None:
        self.simulation = simulation
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, sink: StateSink) -> None:
        sink.register_target(self.name, self.simulation.url)
        self._thread = threading.Thread(
            target=self._run, args=(sink,), daemon=True, name="simulation-feed"
        )
        self._thread.start()

    def _run(self, sink: StateSink) -> None:
        while True:
            sink.publish(self.name, self.simulation.url, self.reports())
            if self._stop.wait(self.interval_s):
                return

    def reports(self) -> list[EngineReport]:
        sim, plan = self.simulation, self.simulation.plan
        derived = derive_capacity(sim.config, sim.settings, num_gpu_blocks=plan.num_gpu_blocks)
        reports = []
        for engine in list(sim.engines.values()):
            usage, running, waiting = sim.usage(engine, __import__("time").time())
            reports.append(
                EngineReport(
                    engine=str(engine.index),
                    model_name=sim.served_model_name,
                    instance_id=sim.instance_id,
                    vllm_version=sim.version,
                    reported=ReportedCapacity(
                        num_gpu_blocks=plan.num_gpu_blocks,
                        block_size=plan.block_size,
                        kv_cache_size_tokens=plan.kv_cache_size_tokens,
                        max_concurrency=plan.max_concurrency,
                        max_model_len=plan.max_model_len,
                    ),
                    derived=derived,
                    usage=KvUsage(usage, running, waiting),
                )
            )
        return reports

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the exporter against a built-in simulated vLLM deployment"
    )
    add_common_arguments(parser)
    parser.set_defaults(handler=run, web_listen_address="127.0.0.1:9470")


def summary(exporter: Exporter, simulation: SimulatedVllm) -> str:
    plan = simulation.plan
    lines = [
        f"kvcap demo: simulated vLLM {simulation.version} at {simulation.url}",
        f"  model {simulation.served_model_name}: data-parallel {simulation.data_parallel_size}"
        f" x TP {simulation.settings.tensor_parallel_size}",
        f"  per engine: {plan.kv_cache_size_tokens:,} tokens, {plan.max_concurrency:.2f}x "
        f"concurrency at {plan.max_model_len:,} tokens, {plan.num_gpu_blocks:,} blocks of "
        f"{plan.block_size}",
        f"  (vLLM's cache_config_info says num_gpu_blocks="
        f"{plan.num_gpu_blocks * len(simulation.engines)}: the sum over engines)",
        "",
        f"scrape:  {exporter.server.url}/metrics",
        f"engines: {exporter.server.url}/engines",
        "PromQL:  sum by (model_name) (kvcap_kv_cache_capacity_tokens)",
        "Ctrl-C to stop.",
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    configure_logging(args.log_level, args.log_format)
    simulation = simulated_deployment()
    simulation.start()
    exporter = Exporter([SimulationFeed(simulation)], args.web_listen_address, args.web_config_file)
    exporter.start()
    out.write(summary(exporter, simulation))
    out.flush()
    try:
        wait_for_signal()
    finally:
        exporter.stop()
        simulation.stop()
    return 0
