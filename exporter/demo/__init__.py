"""`kvcap-exporter demo`: the exporter against a simulated data-parallel vLLM deployment."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from exporter.capacity import EngineSettings
from exporter.collectors import (
    KvEventsCollector,
    KvEventsSettings,
    VllmHttpCollector,
    VllmHttpSettings,
)
from exporter.collectors.parsing import parse_vllm_serve_args
from exporter.demo.simulated_vllm import SimulatedVllm
from exporter.flags import Flags
from exporter.logs import configure_logging
from exporter.serve import (
    Exporter,
    StopSignals,
    WebSettings,
    add_common_arguments,
    set_switch_interval,
)

DEMO_MODEL = "gemma-3-27b-text"
# Where a demo started from code (tests, benchmarks) serves: a free port on loopback.
LOOPBACK_ANY_PORT = WebSettings("127.0.0.1:0")
DEMO_SERVED_NAME = "google/gemma-3-27b-it"


def example_config(name: str) -> dict[str, Any]:
    text = resources.files("exporter.examples").joinpath(f"{name}.json").read_text("utf-8")
    config: dict[str, Any] = json.loads(text)
    return config


def simulated_deployment(model_dir: Path, data_parallel_size: int = 2) -> SimulatedVllm:
    """Gemma 3 27B (sliding window + full attention), TP 2, data-parallel 2, with a 64 GiB
    CPU offload tier per engine (`--kv-offloading-size 64`).

    `model_dir` receives the model's config.json, as a volume shared by the vLLM and
    kvcap containers would hold it; /v1/models reports it as the model's `root`.
    """
    model_dir.mkdir(parents=True, exist_ok=True)
    config = example_config(DEMO_MODEL)
    (model_dir / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return SimulatedVllm(
        served_model_name=DEMO_SERVED_NAME,
        model_path=str(model_dir),
        config=config,
        settings=EngineSettings(tensor_parallel_size=2),
        data_parallel_size=data_parallel_size,
        available_kv_bytes_per_worker=44_000_000_000,
        kv_offloading_size_gib=64,
    )


def http_collector(simulation: SimulatedVllm, poll_interval_s: float = 1.0) -> VllmHttpCollector:
    """The real `vllm_http` collector, pointed at the simulated API server."""
    return VllmHttpCollector(
        VllmHttpSettings(
            urls=(simulation.url,),
            poll_interval_s=poll_interval_s,
            stale_after_s=3 * poll_interval_s,
            serve_args=parse_vllm_serve_args(simulation.vllm_args),
        )
    )


@contextmanager
def demo_running(
    models: Path,
    web: WebSettings = LOOPBACK_ANY_PORT,
    poll_interval_s: float = 1.0,
    active_flags: Sequence[tuple[str, str]] = (),
) -> Iterator[tuple[SimulatedVllm, Exporter]]:
    """The simulated deployment (its config.json under `models`) and an exporter polling it
    through the real vllm_http collector; both stopped on exit. `/` lists `active_flags`."""
    simulation = simulated_deployment(models / DEMO_MODEL)
    simulation.start()
    try:
        # The kv_events collector finds the publishers in /kv_event_sources.
        kv_events = KvEventsCollector(KvEventsSettings(discovery_interval_s=poll_interval_s))
        exporter = Exporter(
            [http_collector(simulation, poll_interval_s), kv_events],
            web,
            active_flags=active_flags,
        )
        try:
            exporter.start()
            yield simulation, exporter
        finally:
            exporter.stop()
    finally:
        simulation.stop()


def add_parser(subparsers: Any) -> Flags:
    parser = subparsers.add_parser(
        "demo", help="run the exporter against a built-in simulated vLLM deployment"
    )
    flags = Flags(parser)
    add_common_arguments(flags, listen_address="127.0.0.1:9470")
    parser.set_defaults(handler=run, flags=flags)
    return flags


def summary(exporter: Exporter, simulation: SimulatedVllm) -> str:
    plan = simulation.plan
    capacity = plan.capacity
    blocks = capacity.num_gpu_blocks or 0
    lines = [
        f"kvcap demo: simulated vLLM {simulation.version} at {simulation.url}",
        f"  model {simulation.served_model_name}: data-parallel {simulation.data_parallel_size}"
        f" x TP {simulation.settings.tensor_parallel_size}",
        f"  per engine: {capacity.kv_cache_size_tokens:,} tokens, "
        f"{capacity.kv_cache_max_concurrency:.2f}x concurrency at {capacity.max_model_len:,} "
        f"tokens, {blocks:,} blocks of {capacity.block_size}",
        f"  (vLLM's cache_config_info says num_gpu_blocks="
        f"{blocks * len(simulation.engines)}: the sum over engines)",
        "",
        f"scrape:  {exporter.server.url}/metrics",
        f"engines: {exporter.server.url}/engines",
        "PromQL:  sum by (model_name) (kvcap_kv_cache_capacity_tokens)",
        "Ctrl-C to stop.",
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    configure_logging(args.log_level, args.log_format)
    set_switch_interval()
    stop = StopSignals()
    with (
        tempfile.TemporaryDirectory(prefix="kvcap-demo-") as models,
        demo_running(
            Path(models),
            WebSettings.from_args(args),
            active_flags=list(args.flags.active(args)),
        ) as running,
    ):
        simulation, exporter = running
        out.write(summary(exporter, simulation))
        out.flush()
        stop.wait(on_reload=exporter.server.reload_web_config)
    return 0
