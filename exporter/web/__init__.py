"""The exporter's HTTP side: a small GET/HEAD server with exporter-toolkit's TLS and basic auth."""

from exporter.web.auth import BasicAuth
from exporter.web.config import TlsConfig, WebConfig
from exporter.web.counters import REJECT_REASONS, RELOAD_ERROR_REASONS, WebCounters
from exporter.web.messages import Handler, Request, Response
from exporter.web.reload import ServingState, WebConfigWatcher
from exporter.web.server import DEFAULT_MAX_CONNECTIONS, WebServer

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "REJECT_REASONS",
    "RELOAD_ERROR_REASONS",
    "BasicAuth",
    "Handler",
    "Request",
    "Response",
    "ServingState",
    "TlsConfig",
    "WebConfig",
    "WebConfigWatcher",
    "WebCounters",
    "WebServer",
]
