"""`kvcap-exporter serve`: run the collectors, keep the state, serve the HTTP endpoints."""

from __future__ import annotations

import argparse
import contextlib
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import structlog

from exporter import __version__
from exporter.collectors import COLLECTORS, Collector, collector_priority, follow_engines
from exporter.errors import ConfigError
from exporter.exposition import build_exposition, build_routes
from exporter.flags import Flags, log_level
from exporter.logs import LEVELS, configure_logging
from exporter.state import StateStore
from exporter.web import CHECK_INTERVAL_S, DEFAULT_MAX_CONNECTIONS, WebCounters, WebServer

log = structlog.get_logger("kvcap.serve")

DEFAULT_LISTEN_ADDRESS = ":9470"
STOP_TIMEOUT_S = 2.0
# How long a thread that wants the interpreter lock waits before the running one is made
# to let go (Python's default is 5 ms). A poll of a 64-engine vLLM is ~10 ms of Python on
# the poller's thread; a scrape that lands in it takes the lock three or four times
# (request, render, send, the next read), and waited up to 5 ms at each. No single call of
# a poll holds the lock longer than ~0.2 ms (decoding or joining the 2.4 MiB body), so this
# bounds each wait. Threads that do not contend for the lock are not switched more often.
SWITCH_INTERVAL_S = 0.00025
# SIGHUP reloads run at most this often (the web config's own look at its files, too).
RELOAD_INTERVAL_S = CHECK_INTERVAL_S


def set_switch_interval() -> None:
    """SWITCH_INTERVAL_S for this whole process. The daemons' mains (`serve`, `demo`) call
    it as they set up the process, not `Exporter.start`: tests and benchmarks build an
    Exporter inside their own process, whose interpreter an object should not retune."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def add_common_arguments(flags: Flags, listen_address: str = DEFAULT_LISTEN_ADDRESS) -> None:
    web = flags.group("web")
    web.add(
        "--web.listen-address",
        metavar="ADDRESS",
        default=listen_address,
        help="address to serve on: [HOST]:PORT",
    )
    web.add(
        "--web.config.file",
        metavar="FILE",
        type=Path,
        help="exporter-toolkit web config (YAML, as node_exporter's): TLS and basic auth; "
        "re-read on change and on SIGHUP",
    )
    web.add(
        "--web.config.allow-downgrade",
        switch=True,
        default=False,
        help="accept a changed web config that turns basic auth off or weakens TLS client "
        "checks (off: refuse it and keep the old one)",
    )
    web.add(
        "--web.max-requests",
        metavar="CONNECTIONS",
        type=_non_negative_int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="most open HTTP connections, each on its own thread; 0: no limit",
    )
    logging = flags.group("logging")
    logging.add(
        "--log.level",
        metavar="LEVEL",
        type=log_level,
        default="info",
        help=f"least severe level logged: {', '.join(LEVELS)} (warning = warn)",
    )
    logging.add(
        "--log.format", choices=("logfmt", "json"), default="logfmt", help="log line format"
    )


def _non_negative_int(text: str) -> int:
    if not text.strip().isdigit() or len(text.strip()) > 9:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return int(text)


def add_parser(subparsers: Any) -> Flags:
    parser = subparsers.add_parser(
        "serve",
        help="run the exporter",
        description="Serve per-engine vLLM KV cache capacity metrics for Prometheus.",
    )
    flags = Flags(parser)
    add_common_arguments(flags)
    collectors = flags.group("collectors")
    for spec in COLLECTORS.values():
        collectors.add(
            f"--collector.{spec.name}",
            dest=f"collector_{spec.name}",
            switch=True,
            default=spec.default_enabled,
            help=spec.help,
        )
    for spec in COLLECTORS.values():
        spec.add_arguments(flags.group(spec.name))
    parser.set_defaults(handler=run, flags=flags)
    return flags


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


@dataclass(frozen=True, slots=True)
class WebSettings:
    """The `--web.*` flags, as the web server of `serve` and of `demo` takes them."""

    listen_address: str
    config_file: Path | None = None
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    allow_downgrade: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WebSettings:
        return cls(
            args.web_listen_address,
            args.web_config_file,
            max_connections=args.web_max_requests,
            allow_downgrade=args.web_config_allow_downgrade,
        )


class Exporter:
    """The running daemon: state, collectors and web server, started and stopped together."""

    def __init__(
        self,
        collectors: Sequence[Collector],
        web: WebSettings,
        store: StateStore | None = None,
        *,
        active_flags: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.store = store or StateStore(priority=collector_priority())
        self.collectors = list(collectors)
        self.web = web
        counters = WebCounters()
        cache = build_exposition(self.store.snapshot, counters)
        # Each new snapshot is rendered where it is made, so a scrape serves ready bytes.
        self.store.subscribe(cache.prepare)
        follow_engines(self.store, self.collectors)
        self.server = WebServer(
            web.listen_address,
            build_routes(self.store.snapshot, cache, active_flags),
            web_config_file=web.config_file,
            max_connections=web.max_connections,
            allow_downgrade=web.allow_downgrade,
            counters=counters,
        )

    def start(self) -> None:
        """Serve, then start the collectors. A failure leaves nothing running and raises a
        KvcapError naming the flag and the cause."""
        self.start_server()
        started: list[Collector] = []
        try:
            for collector in self.collectors:
                collector.start(self.store)
                started.append(collector)
        except BaseException:
            for collector in started:
                collector.stop(STOP_TIMEOUT_S / (len(started) + 1))
            self.server.stop(STOP_TIMEOUT_S)
            raise
        log.info(
            "exporter_started",
            version=__version__,
            url=self.server.url,
            collectors=[c.name for c in self.collectors],
        )

    def start_server(self) -> None:
        try:
            self.server.start()
        except ConfigError as error:
            raise ConfigError(f"{self.listen_flag(error)}: {error}") from None
        except OSError as error:  # the port is taken, or not ours to bind
            cause = (error.strerror or str(error)).lower()
            raise ConfigError(
                f"--web.listen-address {self.web.listen_address}: cannot listen: {cause}"
            ) from None

    def listen_flag(self, error: ConfigError) -> str:
        """The flag a web server start-up error is about."""
        return "--web.config.file" if "web config" in str(error) else "--web.listen-address"

    def stop(self) -> None:
        budget = STOP_TIMEOUT_S / (len(self.collectors) + 1)
        for collector in self.collectors:
            collector.stop(budget)
        self.server.stop(budget)
        log.info("exporter_stopped")


class StopSignals:
    """SIGTERM and SIGINT stop, SIGHUP asks for a web config reload. Installed before
    anything starts, so a signal that arrives during start-up still stops the process
    cleanly (SIGHUP's default action would kill it without a word, leaving the handshake
    socket file behind). Must be made on the main thread.

    The handlers take no lock: Python runs a handler on the main thread between two of its
    bytecodes, so a handler that set a threading.Event could wait for the Event's lock held
    by the very code it interrupted (Event.wait), for good: a storm of SIGHUPs did that,
    and the daemon no longer heard SIGTERM. They only count; the main thread is woken
    through signal.set_wakeup_fd, written to by the interpreter's C-level handler."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self._reloads_asked = 0
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        # A full buffer (a storm) already wakes the reader: no byte more is needed.
        signal.set_wakeup_fd(self._wake_writer.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGHUP, self._handle_hup)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signal.Signals(signum).name)

    def _handle_hup(self, signum: int, frame: FrameType | None) -> None:
        self._reloads_asked += 1

    def _sleep(self, timeout_s: float | None) -> None:
        """Until a signal arrives (or `timeout_s`); the handlers have run when it returns."""
        select.select([self._wake_reader], [], [], timeout_s)
        with contextlib.suppress(BlockingIOError):
            while self._wake_reader.recv(4096):
                pass

    def wait(
        self,
        on_reload: Callable[[], None] = lambda: None,
        *,
        reload_interval_s: float = RELOAD_INTERVAL_S,
    ) -> None:
        """Until SIGTERM or SIGINT; SIGHUPs meanwhile call `on_reload` (main thread).

        Reloads are coalesced: one runs at a time, and the SIGHUPs that arrive during it
        or within `reload_interval_s` after it start one more reload, no more, when that
        interval ends (a storm of 1,000 signals costs a reload a second and a log line
        or two each). SIGTERM is still seen at once while a reload waits."""
        handled = 0
        next_reload_at = 0.0
        while not self.received:
            pending = handled < self._reloads_asked
            self._sleep(max(0.0, next_reload_at - time.monotonic()) if pending else None)
            if self.received:
                break
            if handled < self._reloads_asked and time.monotonic() >= next_reload_at:
                signals, handled = self._reloads_asked - handled, self._reloads_asked
                log.info("exporter_reloading", signal="SIGHUP", signals=signals)
                on_reload()
                next_reload_at = time.monotonic() + reload_interval_s
        log.info("exporter_stopping", signal=self.received[0])


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    set_switch_interval()
    stop = StopSignals()
    web = WebSettings.from_args(args)
    exporter = Exporter(build_collectors(args), web, active_flags=list(args.flags.active(args)))
    exporter.start()  # raises with nothing left running: no "stopped" line for a failed start
    try:
        stop.wait(on_reload=exporter.server.reload_web_config)
    finally:
        exporter.stop()
    return 0
