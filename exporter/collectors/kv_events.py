"""Collector `kv_events`: subscribe to each engine's KV event publisher and keep what its
prefix cache holds (exporter/prefix_cache/residency.py), per group and medium; publish it
to the state as immutable records, once per tick, for the engines whose stream moved.

Endpoints come from --kv-events.endpoint, and from what the other collectors learned
(vLLM's /kv_event_sources, the handshake's ready response): the daemon hands each new
snapshot's engines to `engines_changed`, with the restarts the state noticed. A sequence
gap is filled from the engine's replay endpoint when it has one; else the residency is
marked approximate until an AllBlocksCleared or a restart.

Discovered endpoints are followed only for engines the state knows, one per engine: a new
endpoint replaces the engine's old subscription, and a forgotten engine's is closed. A
stale engine's is kept: libzmq reconnects by itself when the engine comes back (a
restarted vLLM publishes its first batches before its API answers a poll again), and the
state forgets a stale engine after its collector's forget-after. A socket that cannot be
made (no file descriptors left) is a counted error, tried again on a later tick; nothing a
publisher does ends the thread.
"""

from __future__ import annotations

import argparse
import resource
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import zmq

from exporter.collectors.kv_events_book import EngineHint, ResidencyBook, engine_hints
from exporter.collectors.kv_events_log import LimitedLog
from exporter.collectors.kv_events_settings import (
    LOGGER,
    NAME,
    KvEventsSettings,
    add_arguments,
    settings_from_args,
)
from exporter.collectors.kv_events_subscription import ReplaySlots, Subscription
from exporter.collectors.registry import CollectorSpec, register_collector
from exporter.state import KvEventsEndpoint, Snapshot, StateSink

_POLL_MS = 200
# Subscriptions logged per minute: every engine of a large deployment at start-up, not a
# line a second for an endpoint that changes on every heartbeat.
_SUBSCRIPTION_LINES = 64
# File descriptors a stream holds (the SUB's mailbox and TCP connection, the monitor's two
# mailboxes, a replay's DEALER and its connection while one is outstanding), and those
# left to the rest of the daemon (the HTTP server's 40 connections, the other collectors,
# libzmq's own): under a low RLIMIT_NOFILE kvcap follows fewer streams rather than leave
# Prometheus's scrape no descriptor to be accepted on.
_FDS_PER_SUBSCRIPTION = 6
_FDS_KEPT_FOR_OTHERS = 128


def subscription_room(max_subscriptions: int) -> int:
    """The streams this process may follow: the flag, within its descriptor limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_subscriptions
    room = (soft - _FDS_KEPT_FOR_OTHERS) // _FDS_PER_SUBSCRIPTION
    return max(1, min(max_subscriptions, room))


_Handlers = dict[Any, Callable[[StateSink], None]]


class KvEventsCollector:
    """One thread polls every subscription; a discovery tick follows the state."""

    name = NAME

    def __init__(
        self,
        settings: KvEventsSettings,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self.settings = settings
        self.log = LimitedLog(LOGGER)  # one line per cause per interval, per collector
        self.book = ResidencyBook(settings.max_blocks, settings.max_groups, self.log)
        self.context = context or zmq.Context.instance()
        self.replay_slots = ReplaySlots(settings.max_replays)
        self.max_subscriptions = subscription_room(settings.max_subscriptions)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._subscriptions: dict[str, Subscription] = {}
        # The endpoint followed for each discovered engine (the flags' are kept for good).
        self._discovered: dict[str, str] = {}
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
        next_tick = 0.0
        try:
            while not self._stop.is_set():
                try:
                    if time.monotonic() >= next_tick:
                        next_tick = time.monotonic() + self.settings.discovery_interval_s
                        self._tick(sink)
                    self._poll_once(sink)
                except Exception as error:
                    self._internal_error(sink, error)
                    self._stop.wait(_POLL_MS / 1000)
        finally:
            for subscription in self._subscriptions.values():
                subscription.close()

    def _internal_error(self, sink: StateSink, error: Exception) -> None:
        message = f"{type(error).__name__}: {error}"
        sink.reject(NAME, NAME, "internal_error", message)
        self.log.warning("kv_events_handling_failed", error=message)

    def _poll_once(self, sink: StateSink) -> None:
        if not self._subscriptions:
            self._stop.wait(_POLL_MS / 1000)
            return
        poller, handlers = self._poller()
        for socket, _ in poller.poll(_POLL_MS):
            try:
                handlers[socket](sink)
            except Exception as error:
                self._internal_error(sink, error)
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
        for endpoint in self.settings.endpoints:  # again if it could not be made before
            self._subscribe(endpoint, sink)
        if self.settings.discover:
            self._follow(hints, sink)
        self.book.apply_hints(hints)
        followed = {s.engine for s in self._subscriptions.values() if s.engine is not None}
        gone = self.book.forget_unfollowed(hints, followed)
        if gone:
            sink.remove_residency(NAME, gone)
        # Before the residency: a reader that sees it sees these counted.
        self.book.count_bound_hits(sink)
        sink.publish_residency(NAME, self.book.changed())
        for subscription in self._subscriptions.values():
            age = time.monotonic() - subscription.created_at
            if not subscription.reported and age > self.settings.connect_timeout_s:
                subscription.reported = True
                sink.fail(NAME, subscription.endpoint.endpoint, "not_connected", "no publisher")

    def _follow(self, hints: Mapping[str, EngineHint], sink: StateSink) -> None:
        """One subscription per known engine that names an endpoint; the others' closed
        (an engine whose endpoint moved, or that was forgotten)."""
        wanted = {
            engine: hint.kv_events for engine, hint in hints.items() if hint.kv_events is not None
        }
        for engine, followed in list(self._discovered.items()):
            still = wanted.get(engine)
            if still is None or still.endpoint != followed:
                del self._discovered[engine]
                self._unsubscribe(followed, sink)
        for engine, endpoint in wanted.items():
            if self._subscribe(endpoint, sink):
                self._discovered[engine] = endpoint.endpoint

    def _unsubscribe(self, endpoint: str, sink: StateSink) -> None:
        if any(e.endpoint == endpoint for e in self.settings.endpoints):
            return  # given by a flag: followed for good
        if endpoint in self._discovered.values():
            return  # still another engine's
        subscription = self._subscriptions.pop(endpoint, None)
        if subscription is not None:
            self.log.info("kv_events_unsubscribed", endpoint=endpoint, lines=_SUBSCRIPTION_LINES)
            subscription.close()
            sink.unregister_target(NAME, endpoint)

    def _subscribe(self, endpoint: KvEventsEndpoint, sink: StateSink) -> bool:
        """Follow `endpoint`; False when it cannot be (the cap, no descriptors left)."""
        current = self._subscriptions.get(endpoint.endpoint)
        if current is not None and current.endpoint == endpoint:
            return True
        if current is None and len(self._subscriptions) >= self.max_subscriptions:
            sink.reject(
                NAME,
                endpoint.endpoint,
                "too_many_subscriptions",
                f"{self.max_subscriptions} followed (--kv-events.max-subscriptions, nofile)",
            )
            self.log.warning("kv_events_too_many_subscriptions", endpoint=endpoint.endpoint)
            return False
        try:
            subscription = Subscription(
                self.context,
                endpoint,
                self.book.engine,
                self.settings,
                replay_slots=self.replay_slots,
                log=self.log,
            )
        except zmq.ZMQError as error:  # EMFILE: tried again on the next tick
            sink.reject(NAME, endpoint.endpoint, "subscribe_failed", str(error))
            self.log.warning(
                "kv_events_subscribe_failed", endpoint=endpoint.endpoint, error=str(error)
            )
            return False
        if current is not None:
            current.close()
        self.log.info(
            "kv_events_subscribing",
            endpoint=endpoint.endpoint,
            engine=endpoint.engine,
            lines=_SUBSCRIPTION_LINES,
        )
        sink.register_target(NAME, endpoint.endpoint)
        self._subscriptions[endpoint.endpoint] = subscription
        return True


def _build(args: argparse.Namespace) -> KvEventsCollector | None:
    settings = settings_from_args(args)
    return KvEventsCollector(settings) if settings is not None else None


register_collector(
    CollectorSpec(
        name=NAME,
        help="subscribe to vLLM's KV events: prefix-cache residency per engine and group",
        default_enabled=True,
        add_arguments=add_arguments,
        build=_build,
    )
)
