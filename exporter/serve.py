"""`kvcap-exporter serve`: run the collectors, keep the state, serve the HTTP endpoints."""

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
from exporter.collectors import COLLECTORS, Collector, collector_priority
from exporter.exposition import ExpositionCache
from exporter.exposition.app import build_routes
from exporter.logs import LEVELS, configure_logging
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
    for spec in COLLECTORS.values():
        collectors.add_argument(
            f"--collector.{spec.name}",
            dest=f"collector_{spec.name}",
            action=argparse.BooleanOptionalAction,
            default=spec.default_enabled,
            help=f"{spec.help} (default {'on' if spec.default_enabled else 'off'})",
        )
        spec.add_arguments(parser.add_argument_group(spec.name))
    parser.set_defaults(handler=run)


def build_collectors(args: argparse.Namespace) -> list[Collector]:
    collectors = []
    for spec in COLLECTORS.values():
        if not getattr(args, f"collector_{spec.name}", spec.default_enabled):
            continue
        collector = spec.build(args)
        if collector is None:
            log.info("collector_has_nothing_to_read", collector=spec.name)
        else:
            collectors.append(collector)
    return collectors


class Exporter:
    """The running daemon: state, collectors and web server, started and stopped together."""

    def __init__(
        self,
        collectors: Sequence[Collector],
        listen_address: str,
        web_config_file: Path | None = None,
        store: StateStore | None = None,
    ) -> None:
        self.store = store or StateStore(priority=collector_priority())
        self.collectors = list(collectors)
        cache = ExpositionCache(self.store.snapshot)
        self.server = WebServer(
            listen_address,
            build_routes(self.store.snapshot, cache),
            web_config_file=web_config_file,
        )

    def start(self) -> None:
        self.server.start()
        for collector in self.collectors:
            collector.start(self.store)
        log.info(
            "exporter_started",
            version=__version__,
            url=self.server.url,
            collectors=[c.name for c in self.collectors],
        )

    def stop(self) -> None:
        budget = STOP_TIMEOUT_S / (len(self.collectors) + 1)
        for collector in self.collectors:
            collector.stop(budget)
        self.server.stop(budget)
        log.info("exporter_stopped")


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
        log.info("exporter_stopping", signal=self.received[0] if self.received else None)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    stop = StopSignals()
    exporter = Exporter(build_collectors(args), args.web_listen_address, args.web_config_file)
    try:
        exporter.start()
        stop.wait()
    finally:
        exporter.stop()
    return 0
