"""One SUB socket of the kv_events collector: a publisher's batches in order, its gaps
filled from vLLM's replay endpoint, its restarts and its connection state."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from exporter.collectors.kv_events_sequence import Step, classify, missing_from
from exporter.kv_events_wire import (
    BatchDecoder,
    MalformedBatch,
    parse_sequence,
    sequence_frame,
)
from exporter.prefix_cache import DEFAULT_MAX_BLOCKS, EngineResidency
from exporter.state import KvEventsEndpoint, StateSink

log = structlog.get_logger("kvcap.kv_events")

NAME = "kv_events"
_END_OF_REPLAY = -1


@dataclass(frozen=True, slots=True)
class KvEventsSettings:
    endpoints: tuple[KvEventsEndpoint, ...] = ()
    discover: bool = True  # also follow the endpoints other collectors report
    max_message_bytes: int = 64 * 2**20
    max_blocks: int = DEFAULT_MAX_BLOCKS
    replay_timeout_s: float = 2.0
    max_replay_batches: int = 100_000
    connect_timeout_s: float = 5.0
    # How often the residency is published and the engines' endpoints followed.
    discovery_interval_s: float = 1.0


class Subscription:
    """One SUB socket to one publisher, with its sequence and connection state."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        endpoint: KvEventsEndpoint,
        residency_of: Callable[[str], EngineResidency],
        settings: KvEventsSettings,
    ) -> None:
        self.endpoint = endpoint
        self.residency_of = residency_of
        self.settings = settings
        self.context = context
        self.socket = context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.MAXMSGSIZE, settings.max_message_bytes)
        self.socket.setsockopt(zmq.RCVHWM, 0)  # the publisher's hwm drops; a gap shows it
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.monitor = self.socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.socket.connect(endpoint.endpoint)
        self.created_at = time.monotonic()
        self.connected = False
        self.reported = False
        self.last_sequence: int | None = None
        self.engine: str | None = endpoint.engine
        self.decoder = BatchDecoder()

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=0)

    def residency(self, rank: int | None) -> EngineResidency:
        if self.engine is None:
            self.engine = str(rank or 0)
        return self.residency_of(self.engine)

    def on_monitor(self, sink: StateSink) -> None:
        event = recv_monitor_message(self.monitor)
        connected = event["event"] == zmq.EVENT_CONNECTED
        if connected == self.connected:
            return
        self.connected = connected
        self.reported = True
        if self.engine is not None:
            self.residency_of(self.engine).up = connected
        if connected:
            sink.publish(NAME, self.endpoint.endpoint, ())
        else:
            sink.fail(NAME, self.endpoint.endpoint, "disconnected", "the publisher went away")

    def on_message(self, sink: StateSink) -> None:
        frames = self.socket.recv_multipart()
        if len(frames) != 3:
            self._malformed(sink, f"a message has 3 frames, got {len(frames)}")
            return
        try:
            sequence = parse_sequence(frames[1])
            batch = self.decoder.decode(frames[2])
        except MalformedBatch as error:
            self._malformed(sink, str(error))
            return
        residency = self.residency(batch.data_parallel_rank)
        residency.up = True
        self._catch_up(residency, sequence)
        residency.apply(batch)
        self.last_sequence = sequence

    def _malformed(self, sink: StateSink, message: str) -> None:
        sink.reject(NAME, self.endpoint.endpoint, "malformed_batch", message)
        if self.engine is not None:
            residency = self.residency_of(self.engine)
            residency.drop("malformed_batch")
            residency.mark_approximate("a batch could not be read")

    def _catch_up(self, residency: EngineResidency, sequence: int) -> None:
        """Before applying batch `sequence`: handle a restart or a gap."""
        step = classify(self.last_sequence, sequence)
        # A new publisher: on this endpoint (its sequence went back), or the first one of
        # a new endpoint of an engine kvcap already followed (vLLM restarted elsewhere).
        if step is Step.RESTART or (step in (Step.START, Step.JOINED) and residency.pools):
            log.info(
                "publisher_restarted", engine=residency.engine, endpoint=self.endpoint.endpoint
            )
            residency.reset()
        start = missing_from(self.last_sequence, sequence)
        if start is None:
            return
        if step is Step.GAP:
            residency.gap()
        replayed = self._replay(start, sequence)
        for _, payload in replayed:
            try:
                residency.apply(self.decoder.decode(payload))
            except MalformedBatch:
                residency.drop("malformed_batch")
                residency.mark_approximate("a replayed batch could not be read")
        # The replay is contiguous and below `sequence`: it is complete when it has all.
        if len(replayed) < sequence - start:
            residency.drop("missed", sequence - start - len(replayed))
            residency.mark_approximate(
                "joined the stream after its start"
                if step is not Step.GAP
                else "batches were lost (sequence gap)"
            )

    def _replay(self, start: int, before: int) -> list[tuple[int, bytes]]:
        """Batches `start` .. `before - 1` from the replay endpoint, in order; as many
        as it still has (empty without a replay endpoint or on a timeout)."""
        if self.endpoint.replay_endpoint is None:
            return []
        try:
            return fetch_replay(
                self.context,
                self.endpoint.replay_endpoint,
                start=start,
                before=before,
                timeout_s=self.settings.replay_timeout_s,
                max_batches=self.settings.max_replay_batches,
            )
        except (zmq.ZMQError, MalformedBatch) as error:
            log.warning(
                "kv_events_replay_failed", endpoint=self.endpoint.replay_endpoint, error=str(error)
            )
            return []


def fetch_replay(
    context: zmq.Context[zmq.Socket[bytes]],
    endpoint: str,
    *,
    start: int,
    before: int,
    timeout_s: float,
    max_batches: int,
) -> list[tuple[int, bytes]]:
    """Ask vLLM's replay ROUTER for every batch from `start` on (it answers each as
    [b"", topic, seq, payload], then [b"", b"", -1, b""]); keep those before `before`."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(endpoint)
        dealer.send_multipart([b"", sequence_frame(start)])
        found: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout_s
        while len(found) < max_batches:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not dealer.poll(remaining_ms):
                break  # what came is kept: the rest counts as missed
            frames = dealer.recv_multipart()
            if len(frames) != 4:
                raise MalformedBatch(f"a replay message has 4 frames, got {len(frames)}")
            sequence = parse_sequence(frames[2])
            if sequence == _END_OF_REPLAY:
                break
            if start <= sequence < before and (not found or sequence == found[-1][0] + 1):
                found.append((sequence, frames[3]))
        return found
    finally:
        dealer.close(linger=0)
