"""The exporter's HTTP side: a small GET/HEAD server with exporter-toolkit's TLS and basic auth."""

from exporter.web.address import resolve_listen_address, split_host_port, url_host
from exporter.web.auth import BasicAuth, FairSlots
from exporter.web.config import (
    BCRYPT_HASH,
    GO_CIPHER_SUITES,
    TlsConfig,
    WebConfig,
    build_ssl_context,
    parse_web_config,
    read_web_config_file,
)
from exporter.web.counters import REJECT_REASONS, RELOAD_ERROR_REASONS, WebCounters
from exporter.web.head import MAX_HEAD_BYTES, BadHead, HeadReader, HeadTimeout, parse_head
from exporter.web.messages import Handler, Request, Response
from exporter.web.reload import CHECK_INTERVAL_S, ServingState, WebConfigWatcher
from exporter.web.server import DEFAULT_MAX_CONNECTIONS, WebServer

__all__ = [
    "BCRYPT_HASH",
    "CHECK_INTERVAL_S",
    "DEFAULT_MAX_CONNECTIONS",
    "GO_CIPHER_SUITES",
    "MAX_HEAD_BYTES",
    "REJECT_REASONS",
    "RELOAD_ERROR_REASONS",
    "BadHead",
    "BasicAuth",
    "FairSlots",
    "Handler",
    "HeadReader",
    "HeadTimeout",
    "Request",
    "Response",
    "ServingState",
    "TlsConfig",
    "WebConfig",
    "WebConfigWatcher",
    "WebCounters",
    "WebServer",
    "build_ssl_context",
    "parse_head",
    "parse_web_config",
    "read_web_config_file",
    "resolve_listen_address",
    "split_host_port",
    "url_host",
]
