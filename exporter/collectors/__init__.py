"""Collectors: each turns one outside interface into engine reports; they register themselves."""

from exporter.collectors import handshake, nvml, vllm_http  # noqa: F401 (importing registers them)
from exporter.collectors.registry import (
    COLLECTORS,
    Collector,
    CollectorSpec,
    collector_priority,
    register_collector,
)

__all__ = ["COLLECTORS", "Collector", "CollectorSpec", "collector_priority", "register_collector"]
