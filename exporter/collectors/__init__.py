"""Collectors: each turns one outside interface into engine reports; they register themselves."""

from exporter.collectors import (  # noqa: F401 (importing registers them)
    handshake,
    kv_events,
    nvml,
    vllm_http,
)
from exporter.collectors.registry import (
    COLLECTORS,
    Collector,
    CollectorSpec,
    collector_priority,
    register_collector,
)

__all__ = ["COLLECTORS", "Collector", "CollectorSpec", "collector_priority", "register_collector"]
