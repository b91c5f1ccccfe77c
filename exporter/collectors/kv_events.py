"""Collector `kv_events`: subscribe to each engine's KV event publisher and keep what its
prefix cache holds (exporter/prefix_cache/residency.py), per group and medium.

Endpoints come from --kv-events.endpoint, and from what the other collectors learned
(vLLM's /kv_event_sources, the handshake's ready response), read from the state. A
sequence gap is filled from the engine's replay endpoint when it has one; else the
residency is marked approximate until an AllBlocksCleared or a restart.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import structlog
import zmq

from exporter.collectors.kv_events_endpoints import parse_endpoint_flag
from exporter.collectors.kv_events_subscription import NAME, Subscription
from exporter.collectors.registry import CollectorSpec, register_collector
from exporter.flags import FlagGroup, positive_int, size
from exporter.prefix_cache import DEFAULT_MAX_BLOCKS, EngineResidency, ResidencyView
from exporter.state import KvEventsEndpoint, Snapshot, StateSink

log = structlog.get_logger("kvcap.kv_events")

_POLL_MS = 200


@dataclass(frozen=True, slots=True)
class KvEventsSettings:
    endpoints: tuple[KvEventsEndpoint, ...] = ()
    discover: bool = True  # also follow the endpoints other collectors report
    max_message_bytes: int = 64 * 2**20
    max_blocks: int = DEFAULT_MAX_BLOCKS
    replay_timeout_s: float = 2.0
    max_replay_batches: int = 100_000
    connect_timeout_s: float = 5.0
    discovery_interval_s: float = 1.0


@dataclass(frozen=True, slots=True)
class EngineHint:
    """What the engine state knows about one engine that the residency needs."""

    num_gpu_blocks: int | None
    instance_id: str | None
    kv_events: KvEventsEndpoint | None


@runtime_checkable
class SnapshotReader(Protocol):
    """The state's read side (StateStore has it): pool sizes, restarts, endpoints."""

    def snapshot(self) -> Snapshot: ...


def engine_hints(snapshot: Snapshot) -> dict[str, EngineHint]:
    return {
        view.engine: EngineHint(view.capacity.num_gpu_blocks, view.instance_id, view.kv_events)
        for view in snapshot.engines
    }


class ResidencyBook:
    """Every engine's residency, by engine label; read by the exposition each scrape."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self._max_blocks = max_blocks
        self._lock = threading.Lock()
        self._engines: dict[str, EngineResidency] = {}
        self._instances: dict[str, str] = {}

    def engine(self, engine: str) -> EngineResidency:
        with self._lock:
            found = self._engines.get(engine)
            if found is None:
                found = self._engines[engine] = EngineResidency(engine, self._max_blocks)
            return found

    def views(self) -> list[ResidencyView]:
        with self._lock:
            engines = list(self._engines.values())
        return [e.view() for e in engines]

    def apply_hints(self, hints: Mapping[str, EngineHint]) -> None:
        """Pool sizes bound the sets; a new instance_id is a restart: the cache is gone."""
        with self._lock:
            engines = dict(self._engines)
        for engine, residency in engines.items():
            hint = hints.get(engine)
            if hint is None:
                continue
            residency.pool_blocks = hint.num_gpu_blocks
            if hint.instance_id is None:
                continue
            before = self._instances.get(engine)
            self._instances[engine] = hint.instance_id
            if before is not None and before != hint.instance_id:
                log.info("engine_restarted_residency_cleared", engine=engine)
                residency.reset()


class KvEventsCollector:
    """One thread polls every subscription; a discovery tick follows the state."""

    name = NAME

    def __init__(
        self,
        settings: KvEventsSettings,
        book: ResidencyBook | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self.settings = settings
        self.book = book or ResidencyBook(settings.max_blocks)
        self.context = context or zmq.Context.instance()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._subscriptions: dict[str, Subscription] = {}
        self._hints: Callable[[], Mapping[str, EngineHint]] = dict

    def start(self, sink: StateSink) -> None:
        if isinstance(sink, SnapshotReader):
            reader = sink
            self._hints = lambda: engine_hints(reader.snapshot())
        self._thread = threading.Thread(
            target=self._run, args=(sink,), name="kv-events", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def views(self) -> list[ResidencyView]:
        return self.book.views()

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
        poller = zmq.Poller()
        handlers: dict[Any, Callable[[StateSink], None]] = {}
        for subscription in self._subscriptions.values():
            poller.register(subscription.socket, zmq.POLLIN)
            poller.register(subscription.monitor, zmq.POLLIN)
            handlers[subscription.socket] = subscription.on_message
            handlers[subscription.monitor] = subscription.on_monitor
        for socket, _ in poller.poll(_POLL_MS):
            try:
                handlers[socket](sink)
            except Exception as error:  # never let one bad message end the collector
                log.exception("kv_events_handling_failed", error=str(error))
                sink.reject(NAME, "kv_events", "internal_error", str(error))

    def _tick(self, sink: StateSink) -> None:
        hints = self._hints()
        if self.settings.discover:
            for hint in hints.values():
                if hint.kv_events is not None:
                    self._subscribe(hint.kv_events, sink)
        self.book.apply_hints(hints)
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
            self.context, endpoint, self.book, self.settings
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


def residency_views(collectors: Iterable[object]) -> Callable[[], list[ResidencyView]]:
    """The residency readers of the running kv_events collectors, for the exposition."""
    running = [c for c in collectors if isinstance(c, KvEventsCollector)]
    return lambda: [view for c in running for view in c.views()]


register_collector(
    CollectorSpec(
        name=NAME,
        help="subscribe to vLLM's KV events: prefix-cache residency per engine and group",
        default_enabled=True,
        add_arguments=_add_arguments,
        build=_build,
    )
)
