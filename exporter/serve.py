"""`kvcap-exporter serve`: run the sources, keep the state, serve the HTTP endpoints."""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import structlog

from exporter import __version__
from exporter.exposition import ExpositionCache
from exporter.exposition.app import build_routes
from exporter.logs import LEVELS, configure_logging
from exporter.sources.registry import SOURCES, Source
from exporter.state import StateStore
from exporter.web import WebServer

log = structlog.get_logger("kvcap.serve")

DEFAULT_LISTEN_ADDRESS = ":9470"
STOP_TIMEOUT_S = 2.0


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    web = parser.add_argument_group("web")
    web.add_argument(
        "--web.listen-address",
        dest="web_listen_address",
        default=DEFAULT_LISTEN_ADDRESS,
        help="address to serve on (default :9470)",
    )
    web.add_argument(
        "--web.config.file",
        dest="web_config_file",
        type=Path,
        help="exporter-toolkit web config: TLS and basic auth",
    )
    logging = parser.add_argument_group("logging")
    logging.add_argument("--log.level", dest="log_level", choices=LEVELS, default="info")
    logging.add_argument(
        "--log.format", dest="log_format", choices=("logfmt", "json"), default="logfmt"
    )


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the exporter",
        description="Serve per-engine vLLM KV cache capacity metrics for Prometheus.",
    )
    add_common_arguments(parser)
    collectors = parser.add_argument_group("collectors")
    for spec in SOURCES.values():
        collectors.add_argument(
            f"--collector.{spec.name}",
            dest=f"collector_{spec.name}",
            action=argparse.BooleanOptionalAction,
            default=spec.default_enabled,
            help=f"{spec.help} (default {'on' if spec.default_enabled else 'off'})",
        )
        spec.add_arguments(parser.add_argument_group(spec.name))
    parser.set_defaults(handler=run)


def build_sources(args: argparse.Namespace) -> list[Source]:
    sources = []
    for spec in SOURCES.values():
        if not getattr(args, f"collector_{spec.name}", spec.default_enabled):
            continue
        source = spec.build(args)
        if source is None:
            log.info("collector has nothing to read", collector=spec.name)
        else:
            sources.append(source)
    return sources


class Exporter:
    """The running daemon: state, sources and web server, started and stopped together."""

    def __init__(
        self,
        sources: Sequence[Source],
        listen_address: str,
        web_config_file: Path | None = None,
        store: StateStore | None = None,
    ) -> None:
        self.store = store or StateStore()
        self.sources = list(sources)
        cache = ExpositionCache(self.store.snapshot)
        self.server = WebServer(
            listen_address,
            build_routes(self.store.snapshot, cache),
            web_config_file=web_config_file,
        )

    def start(self) -> None:
        self.server.start()
        for source in self.sources:
            source.start(self.store)
        log.info(
            "kvcap exporter started",
            version=__version__,
            url=self.server.url,
            collectors=[s.name for s in self.sources],
        )

    def stop(self) -> None:
        budget = STOP_TIMEOUT_S / (len(self.sources) + 1)
        for source in self.sources:
            source.stop(budget)
        self.server.stop(budget)
        log.info("kvcap exporter stopped")


class StopSignals:
    """SIGTERM and SIGINT set an event. Install before anything starts, so a signal that
    arrives during start-up still stops the process cleanly."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.received: list[str] = []
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only set the event: a handler that logged could deadlock on the logger's lock,
        # which the interrupted main thread may be holding.
        self.received.append(signal.Signals(signum).name)
        self.event.set()

    def wait(self) -> None:
        self.event.wait()
        log.info("stopping", signal=self.received[0] if self.received else None)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    stop = StopSignals()
    exporter = Exporter(build_sources(args), args.web_listen_address, args.web_config_file)
    try:
        exporter.start()
        stop.wait()
    finally:
        exporter.stop()
    return 0
