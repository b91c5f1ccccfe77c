"""Collector `kv_events`: subscribe to each engine's KV event publisher and keep what its
prefix cache holds (exporter/prefix_cache/residency.py), per group and medium; publish it
to the state as immutable records, once per tick, for the engines whose stream moved.

Endpoints come from --kv-events.endpoint, and from what the other collectors learned
(vLLM's /kv_event_sources, the handshake's ready response): the daemon hands each new
snapshot's engines to `engines_changed`, with the restarts the state noticed. A sequence
gap is filled from the engine's replay endpoint when it has one; else the residency is
marked approximate until an AllBlocksCleared or a restart.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
import zmq

from exporter.collectors.kv_events_endpoints import parse_endpoint_flag
from exporter.collectors.kv_events_subscription import NAME, KvEventsSettings, Subscription
from exporter.collectors.registry import CollectorSpec, register_collector
from exporter.flags import FlagGroup, positive_int, size
from exporter.prefix_cache import DEFAULT_MAX_BLOCKS, EngineResidency
from exporter.state import KvEventsEndpoint, ResidencyView, Snapshot, StateSink

log = structlog.get_logger("kvcap.kv_events")

_POLL_MS = 200
_Handlers = dict[Any, Callable[[StateSink], None]]


@dataclass(frozen=True, slots=True)
class EngineHint:
    """What the engine state knows about one engine that the residency needs."""

    num_gpu_blocks: int | None
    restarts: int  # restarts the state noticed so far
    kv_events: KvEventsEndpoint | None


def engine_hints(snapshot: Snapshot) -> dict[str, EngineHint]:
    return {
        view.engine: EngineHint(
            view.capacity.num_gpu_blocks, snapshot.restarts.get(view.engine, 0), view.kv_events
        )
        for view in snapshot.engines
    }


class ResidencyBook:
    """Every engine's residency, by engine label; the collector's thread alone uses it."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self._max_blocks = max_blocks
        self._engines: dict[str, EngineResidency] = {}
        self._restarts: dict[str, int] = {}

    def engine(self, engine: str) -> EngineResidency:
        found = self._engines.get(engine)
        if found is None:
            found = self._engines[engine] = EngineResidency(engine, self._max_blocks)
        return found

    def changed(self) -> list[ResidencyView]:
        """The records of the engines that moved since the last call."""
        return [e.view() for e in self._engines.values() if e.changed]

    def apply_hints(self, hints: Mapping[str, EngineHint]) -> None:
        """Pool sizes bound the sets; a restart the state noticed empties the cache."""
        for engine, residency in self._engines.items():
            hint = hints.get(engine)
            if hint is None:
                continue
            residency.set_pool_blocks(hint.num_gpu_blocks)
            before = self._restarts.get(engine)
            self._restarts[engine] = hint.restarts
            if before is not None and hint.restarts > before:
                log.info("engine_restarted_residency_cleared", engine=engine)
                residency.reset()


class KvEventsCollector:
    """One thread polls every subscription; a discovery tick follows the state."""

    name = NAME

    def __init__(
        self,
        settings: KvEventsSettings,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self.settings = settings
        self.book = ResidencyBook(settings.max_blocks)
        self.context = context or zmq.Context.instance()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._subscriptions: dict[str, Subscription] = {}
        # The poller of the sockets polled last, by their ids (the poller holds the sockets,
        # so no id is reused while it is kept).
        self._polled: tuple[tuple[tuple[int, int], ...], zmq.Poller, _Handlers] | None = None
        # The engines of the latest snapshot, handed over by the daemon on any thread and
        # read on the collector's tick (one reference swap: no lock).
        self._engines: Snapshot | None = None

    def engines_changed(self, snapshot: Snapshot) -> None:
        """What the other collectors know of the engines (pool sizes, endpoints) and the
        restarts the state noticed."""
        self._engines = snapshot

    def start(self, sink: StateSink) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(sink,), name="kv-events", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self, sink: StateSink) -> None:
        for endpoint in self.settings.endpoints:
            self._subscribe(endpoint, sink)
        next_tick = 0.0
        try:
            while not self._stop.is_set():
                if time.monotonic() >= next_tick:
                    self._tick(sink)
                    next_tick = time.monotonic() + self.settings.discovery_interval_s
                self._poll_once(sink)
        finally:
            for subscription in self._subscriptions.values():
                subscription.close()

    def _poll_once(self, sink: StateSink) -> None:
        if not self._subscriptions:
            self._stop.wait(_POLL_MS / 1000)
            return
        poller, handlers = self._poller()
        for socket, _ in poller.poll(_POLL_MS):
            try:
                handlers[socket](sink)
            except Exception as error:  # never let one bad message end the collector
                log.exception("kv_events_handling_failed", error=str(error))
                sink.reject(NAME, "kv_events", "internal_error", str(error))
        now = time.monotonic()
        for subscription in list(self._subscriptions.values()):
            subscription.expire(sink, now)

    def _poller(self) -> tuple[zmq.Poller, _Handlers]:
        """One poller over every SUB, monitor and outstanding replay socket, rebuilt only
        when that set changed (a poll per batch must not re-register 130 sockets)."""
        key = tuple(
            (id(s.socket), id(s.replay.socket) if s.replay is not None else 0)
            for s in self._subscriptions.values()
        )
        if self._polled is not None and self._polled[0] == key:
            return self._polled[1], self._polled[2]
        poller = zmq.Poller()
        handlers: _Handlers = {}
        for subscription in self._subscriptions.values():
            sockets: list[tuple[Any, Callable[[StateSink], None]]] = [
                (subscription.socket, subscription.on_message),
                (subscription.monitor, subscription.on_monitor),
            ]
            if subscription.replay is not None:
                sockets.append((subscription.replay.socket, subscription.on_replay))
            for socket, handler in sockets:
                poller.register(socket, zmq.POLLIN)
                handlers[socket] = handler
        self._polled = (key, poller, handlers)
        return poller, handlers

    def _tick(self, sink: StateSink) -> None:
        engines = self._engines
        hints = engine_hints(engines) if engines is not None else {}
        if self.settings.discover:
            for hint in hints.values():
                if hint.kv_events is not None:
                    self._subscribe(hint.kv_events, sink)
        self.book.apply_hints(hints)
        sink.publish_residency(NAME, self.book.changed())
        for subscription in self._subscriptions.values():
            age = time.monotonic() - subscription.created_at
            if not subscription.reported and age > self.settings.connect_timeout_s:
                subscription.reported = True
                sink.fail(NAME, subscription.endpoint.endpoint, "not_connected", "no publisher")

    def _subscribe(self, endpoint: KvEventsEndpoint, sink: StateSink) -> None:
        current = self._subscriptions.get(endpoint.endpoint)
        if current is not None and current.endpoint == endpoint:
            return
        if current is not None:
            current.close()
        log.info("kv_events_subscribing", endpoint=endpoint.endpoint, engine=endpoint.engine)
        sink.register_target(NAME, endpoint.endpoint)
        self._subscriptions[endpoint.endpoint] = Subscription(
            self.context, endpoint, self.book.engine, self.settings
        )


def _add_arguments(group: FlagGroup) -> None:
    group.add(
        "--kv-events.endpoint",
        repeatable=True,
        default=[],
        metavar="[ENGINE=]ENDPOINT[+REPLAY]",
        help="a vLLM KV event publisher to subscribe to (repeatable; comma-separated in the "
        "environment), e.g. 0=tcp://127.0.0.1:5557+tcp://127.0.0.1:5558; vLLM must bind it "
        "(tcp://*:PORT)",
    )
    group.add(
        "--kv-events.discover",
        switch=True,
        default=True,
        help="also subscribe to the endpoints vLLM reports (/kv_event_sources, handshake)",
    )
    group.add(
        "--kv-events.max-message-size",
        metavar="SIZE",
        type=size,
        default=64 * 2**20,
        default_text="64MiB",
        help="largest accepted event batch",
    )
    group.add(
        "--kv-events.max-blocks",
        metavar="BLOCKS",
        type=positive_int,
        default=DEFAULT_MAX_BLOCKS,
        help="most blocks tracked per group and medium while the pool size is unknown",
    )


def _build(args: argparse.Namespace) -> KvEventsCollector | None:
    endpoints = tuple(parse_endpoint_flag(value) for value in args.kv_events_endpoint)
    discover = args.kv_events_discover and bool(
        getattr(args, "vllm_url", None) or getattr(args, "collector_handshake", False)
    )
    if not endpoints and not discover:
        return None
    return KvEventsCollector(
        KvEventsSettings(
            endpoints=endpoints,
            discover=args.kv_events_discover,
            max_message_bytes=args.kv_events_max_message_size,
            max_blocks=max(1, args.kv_events_max_blocks),
        )
    )


register_collector(
    CollectorSpec(
        name=NAME,
        help="subscribe to vLLM's KV events: prefix-cache residency per engine and group",
        default_enabled=True,
        add_arguments=_add_arguments,
        build=_build,
    )
)
