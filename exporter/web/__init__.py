"""The exporter's HTTP side: a small GET/HEAD server with exporter-toolkit's TLS and basic auth."""

from exporter.web.auth import BasicAuth
from exporter.web.config import TlsConfig, WebConfig, load_web_config
from exporter.web.messages import Handler, Request, Response
from exporter.web.server import WebServer

__all__ = [
    "BasicAuth",
    "Handler",
    "Request",
    "Response",
    "TlsConfig",
    "WebConfig",
    "WebServer",
    "load_web_config",
]
