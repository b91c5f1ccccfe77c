"""Collectors: each turns one outside interface into engine reports; they register themselves.

The collectors load (and register) on the first name taken from this package, not when a
subpackage such as `exporter.collectors.parsing` is imported: `kvcap-exporter capacity`
reads a command line with it and needs neither ZMQ nor NVML nor the HTTP poller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.lazy_names import lazy_getattr

if TYPE_CHECKING:
    from exporter.collectors import (  # noqa: F401 (importing registers them)
        handshake,
        kv_events,
        nvml,
        vllm_http,
    )
    from exporter.collectors.handshake import (
        HandshakeCollector,
        HandshakeReceiver,
        engine_report,
    )
    from exporter.collectors.handshake_settings import HandshakeSettings
    from exporter.collectors.http_fetch import FetchError, fetch
    from exporter.collectors.kv_events import KvEventsCollector
    from exporter.collectors.kv_events_endpoints import (
        connectable,
        endpoints_from_sources,
        parse_endpoint_flag,
    )
    from exporter.collectors.kv_events_sequence import Step, classify, missing_from
    from exporter.collectors.kv_events_settings import KvEventsSettings
    from exporter.collectors.nvml import NvmlCollector, NvmlPoller, NvmlSettings
    from exporter.collectors.nvml_reader import NvmlSession, load_library, parse_visible_devices
    from exporter.collectors.registry import (
        COLLECTORS,
        Collector,
        CollectorSpec,
        EngineFollower,
        collector_priority,
        follow_engines,
        register_collector,
    )
    from exporter.collectors.settings_check import (
        engine_mismatches,
        expected_engines,
        server_mismatches,
    )
    from exporter.collectors.vllm_http import ServerPoller, VllmHttpCollector
    from exporter.collectors.vllm_http_reports import (
        VERSION_UNKNOWN,
        Deriver,
        ServerDocuments,
        ServerReading,
        cached_deriver,
        choose_platform,
        read_server,
    )
    from exporter.collectors.vllm_http_settings import VllmHttpSettings
    from exporter.collectors.vllm_processes import discover_serve_args


# Which module each public name comes from; the collector modules register on import.
_NAMES: dict[str, tuple[str, ...]] = {
    "exporter.collectors.handshake": (
        "HandshakeCollector",
        "HandshakeReceiver",
        "engine_report",
    ),
    "exporter.collectors.handshake_settings": ("HandshakeSettings",),
    "exporter.collectors.http_fetch": ("FetchError", "fetch"),
    "exporter.collectors.kv_events": ("KvEventsCollector",),
    "exporter.collectors.kv_events_endpoints": (
        "connectable",
        "endpoints_from_sources",
        "parse_endpoint_flag",
    ),
    "exporter.collectors.kv_events_sequence": ("Step", "classify", "missing_from"),
    "exporter.collectors.kv_events_subscription": ("KvEventsSettings",),
    "exporter.collectors.nvml": ("NvmlCollector", "NvmlPoller", "NvmlSettings"),
    "exporter.collectors.nvml_reader": ("NvmlSession", "load_library", "parse_visible_devices"),
    "exporter.collectors.registry": (
        "COLLECTORS",
        "Collector",
        "CollectorSpec",
        "EngineFollower",
        "collector_priority",
        "follow_engines",
        "register_collector",
    ),
    "exporter.collectors.settings_check": (
        "engine_mismatches",
        "expected_engines",
        "server_mismatches",
    ),
    "exporter.collectors.vllm_http": ("ServerPoller", "VllmHttpCollector"),
    "exporter.collectors.vllm_http_reports": (
        "VERSION_UNKNOWN",
        "Deriver",
        "ServerDocuments",
        "ServerReading",
        "cached_deriver",
        "choose_platform",
        "read_server",
    ),
    "exporter.collectors.vllm_http_settings": ("VllmHttpSettings",),
    "exporter.collectors.vllm_processes": ("discover_serve_args",),
}
# Every collector loads with the first name: importing one registers only that one.
__getattr__ = lazy_getattr(__name__, _NAMES, load_all=True)

__all__ = [
    "COLLECTORS",
    "VERSION_UNKNOWN",
    "Collector",
    "CollectorSpec",
    "Deriver",
    "EngineFollower",
    "FetchError",
    "HandshakeCollector",
    "HandshakeReceiver",
    "HandshakeSettings",
    "KvEventsCollector",
    "KvEventsSettings",
    "NvmlCollector",
    "NvmlPoller",
    "NvmlSession",
    "NvmlSettings",
    "ServerDocuments",
    "ServerPoller",
    "ServerReading",
    "Step",
    "VllmHttpCollector",
    "VllmHttpSettings",
    "cached_deriver",
    "choose_platform",
    "classify",
    "collector_priority",
    "connectable",
    "discover_serve_args",
    "endpoints_from_sources",
    "engine_mismatches",
    "engine_report",
    "expected_engines",
    "fetch",
    "follow_engines",
    "load_library",
    "missing_from",
    "parse_endpoint_flag",
    "parse_visible_devices",
    "read_server",
    "register_collector",
    "server_mismatches",
]
