"""A simulated vLLM deployment on loopback: the outermost-edge fake used by the demo and tests.

It speaks vLLM 0.33's HTTP interfaces (/metrics, /v1/models, /version, /kv_event_sources)
for a data-parallel deployment, and publishes each engine's KV events on ZMQ
(simulated_kv_events.py). Its capacity numbers are what vLLM
would plan (from kvcap's capacity model, which reproduces vLLM's) and its load moves
over time so dashboards have something to show.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from exporter.capacity import CapacityResult, EngineSettings, derive_capacity
from exporter.demo.http_thread import ThreadedHttpServer
from exporter.demo.simulated_kv_events import KvGroup, SimulatedKvEvents

# vLLM's CPU tier pads each chunk to a memory page (SharedOffloadRegion).
PAGE_BYTES = 4096


def offload_tier(plan: CapacityResult, cpu_bytes: int) -> dict[str, int]:
    """A simulated CPU tier of `cpu_bytes`, one GPU block per chunk, in the shape vLLM PR
    #53902 reports: each chunk holds the block of every worker, page-aligned; each KV cache
    group takes its own chunks, a sliding-window group about its window's (the simulation's
    guess: window blocks + 1). Tokens: the best request length up to max_model_len (the
    lengths that end a chunk, and max_model_len itself)."""
    chunk_bytes = -(-sum(plan.capacity.bytes_per_block_per_worker) // PAGE_BYTES) * PAGE_BYTES
    chunks = cpu_bytes // chunk_bytes

    def per_request(length: int) -> int:
        total = 0
        for group in plan.capacity.groups:
            count = -(-length // group.block_size)
            if group.sliding_window is not None:
                count = min(count, -(-group.sliding_window // group.block_size) + 1)
            total += count
        return total

    longest = plan.capacity.max_model_len
    assert longest is not None  # a derivation knows every figure
    lengths = {longest - longest % g.block_size for g in plan.capacity.groups} | {longest}
    tokens = max(chunks * n // per_request(n) for n in lengths if n > 0)
    return {
        "num_chunks": chunks,
        "blocks_per_chunk": 1,
        "kv_bytes_per_chunk": chunk_bytes,
        "capacity_tokens_at_max_len": tokens,
    }


@dataclass
class SimulatedEngine:
    index: int
    phase: float  # offsets the load curve so engines differ


@dataclass
class SimulatedVllm:
    """One `vllm serve` API server with `data_parallel_size` engines behind it."""

    served_model_name: str
    model_path: str
    config: Mapping[str, Any]
    settings: EngineSettings
    data_parallel_size: int
    available_kv_bytes_per_worker: int
    version: str = "0.33.0"
    instance_id: str = "1764460800000000000"
    engines: dict[int, SimulatedEngine] = field(default_factory=dict)
    kv_events: bool = True  # publish KV events (and report them in /kv_event_sources)
    # Blocks each engine's full-attention group keeps resident (a sliding-window group a
    # quarter of it; at least 8, the blocks a step stores): what the benchmarks vary to
    # measure the cost of a resident block.
    kv_events_working_set: int = 512
    # `--kv-offloading-size` in GiB (CPU offloading, vLLM's native backend), or None.
    kv_offloading_size_gib: int | None = None
    _server: ThreadedHttpServer | None = None
    _publishers: SimulatedKvEvents | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.plan: CapacityResult = derive_capacity(
            self.config,
            self.settings,
            available_kv_bytes_per_worker=self.available_kv_bytes_per_worker,
        )
        for index in range(self.data_parallel_size):
            self.engines[index] = SimulatedEngine(index, phase=index * 1.7)

    @property
    def vllm_args(self) -> str:
        s = self.settings
        args = [
            self.model_path,
            "--served-model-name",
            self.served_model_name,
            "--tensor-parallel-size",
            str(s.tensor_parallel_size),
            "--data-parallel-size",
            str(self.data_parallel_size),
        ]
        if s.max_model_len is not None:
            args += ["--max-model-len", str(s.max_model_len)]
        if self.kv_offloading_size_gib is not None:
            args += ["--kv-offloading-size", str(self.kv_offloading_size_gib)]
        return " ".join(args)

    @property
    def kv_events_groups(self) -> tuple[KvGroup, ...]:
        """The plan's groups, in its order (vLLM's group_idx), named as vLLM names them."""
        return tuple(
            (index, group.kind, group.sliding_window)
            for index, group in enumerate(self.plan.capacity.groups)
        )

    @property
    def kv_events_block_size(self) -> int:
        return self.plan.capacity.block_size or 16

    def remove_engine(self, index: int) -> None:
        with self._lock:
            self.engines.pop(index, None)

    def usage(self, engine: SimulatedEngine, now: float) -> tuple[float, int, int]:
        """(kv cache usage ratio, running requests, waiting requests) at time `now`."""
        usage = 0.45 + 0.35 * math.sin(now / 20.0 + engine.phase)
        running = int(usage * (self.plan.capacity.kv_cache_max_concurrency or 0.0) * 1.5)
        waiting = max(0, int((usage - 0.7) * 40))
        return round(usage, 4), running, waiting

    def render_metrics(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        with self._lock:
            engines = sorted(self.engines.values(), key=lambda e: e.index)
        plan = self.plan
        # The frontend sums num_gpu_blocks over its engines; capacity labels are per engine.
        total_blocks = (plan.capacity.num_gpu_blocks or 0) * len(engines)
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
        ]
        loads = {e.index: self.usage(e, now) for e in engines}
        name = self.served_model_name
        for e in engines:
            lines.append(
                f'vllm:num_requests_running{{engine="{e.index}",model_name="{name}"}} '
                f"{float(loads[e.index][1])}"
            )
        lines += [
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
        ]
        for e in engines:
            lines.append(
                f'vllm:num_requests_waiting{{engine="{e.index}",model_name="{name}"}} '
                f"{float(loads[e.index][2])}"
            )
        lines += [
            "# HELP vllm:kv_cache_usage_perc KV-Cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
        ]
        for e in engines:
            lines.append(
                f'vllm:kv_cache_usage_perc{{engine="{e.index}",model_name="{name}"}} '
                f"{loads[e.index][0]}"
            )
        lines += [
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
        ]
        s = self.settings
        for e in engines:
            labels = {
                "block_size": str(plan.capacity.block_size),
                "cache_dtype": s.kv_cache_dtype,
                "enable_prefix_caching": "True",
                "engine": str(e.index),
                "gpu_memory_utilization": "0.92",
                "kv_cache_max_concurrency": repr(plan.capacity.kv_cache_max_concurrency),
                "kv_cache_size_tokens": str(plan.capacity.kv_cache_size_tokens),
                "num_gpu_blocks": str(total_blocks),
                "num_gpu_blocks_override": "None",
                "sliding_window": "None",
                "kv_offloading_backend": "native",
                "kv_offloading_size": str(self.kv_offloading_size_gib),
            }
            rendered = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            lines.append(f"vllm:cache_config_info{{{rendered}}} 1.0")
        lines += self._offload_lines(engines)
        return "\n".join(lines) + "\n"

    def _offload_lines(self, engines: list[SimulatedEngine]) -> list[str]:
        """vllm:kv_offload_config_info with the labels of vLLM PR #53902 (not released)."""
        if self.kv_offloading_size_gib is None:
            return []
        tier = offload_tier(self.plan, self.kv_offloading_size_gib << 30)
        lines = [
            "# HELP vllm:kv_offload_config_info Static configuration of the KV offload "
            "managers of this engine instance.",
            "# TYPE vllm:kv_offload_config_info gauge",
        ]
        for e in engines:
            labels = {f"cpu_{k}": str(v) for k, v in tier.items()}
            labels |= {"engine": str(e.index), "model_name": self.served_model_name}
            rendered = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            lines.append(f"vllm:kv_offload_config_info{{{rendered}}} 1.0")
        return lines

    def documents(self) -> dict[str, Any]:
        return {
            "/v1/models": {
                "object": "list",
                "data": [
                    {
                        "id": self.served_model_name,
                        "object": "model",
                        "created": 1764460800,
                        "owned_by": "vllm",
                        "root": self.model_path,
                        "parent": None,
                        "max_model_len": self.plan.capacity.max_model_len,
                        "permission": [],
                    }
                ],
            },
            "/version": {"version": self.version},
            "/kv_event_sources": self._publishers.sources() if self._publishers else {},
        }

    # --- HTTP -----------------------------------------------------------------------

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        simulation = self
        if self.kv_events and self._publishers is None:
            self._publishers = SimulatedKvEvents(
                self.data_parallel_size,
                block_size=self.kv_events_block_size,
                groups=self.kv_events_groups,
                working_set=self.kv_events_working_set,
            )
            self._publishers.start()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    body = simulation.render_metrics().encode()
                    content_type = "text/plain; version=0.0.4; charset=utf-8"
                elif self.path in simulation.documents():
                    body = json.dumps(simulation.documents()[self.path]).encode()
                    content_type = "application/json"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the demo prints its own summary."""

        self._server = ThreadedHttpServer((host, port), Handler)
        return self._server.start("simulated-vllm")

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return self._server.url

    def stop(self) -> None:
        if self._publishers is not None:
            self._publishers.stop()
            self._publishers = None
        if self._server is not None:
            self._server.stop()
            self._server = None
