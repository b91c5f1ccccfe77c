"""One SUB socket of the kv_events collector: a publisher's batches in order, its gaps
filled from vLLM's replay endpoint without stalling the other streams, its restarts and
its connection state."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from exporter.collectors.kv_events_replay import Replay
from exporter.collectors.kv_events_sequence import Step, classify, missing_from
from exporter.kv_events_wire import BatchDecoder, MalformedBatch, parse_sequence
from exporter.prefix_cache import DEFAULT_MAX_BLOCKS, EngineResidency
from exporter.state import KvEventsEndpoint, StateSink

log = structlog.get_logger("kvcap.kv_events")

NAME = "kv_events"
# Batches libzmq may queue for one stream before it stops reading it: the publisher's
# own high-water mark then drops, and the gap is replayed. The poll loop reads every
# stream as it comes (a replay never blocks it), so this only bounds a stalled daemon.
SUBSCRIPTION_RCVHWM = 1_000
_READ_PER_TURN = 256


@dataclass(frozen=True, slots=True)
class KvEventsSettings:
    endpoints: tuple[KvEventsEndpoint, ...] = ()
    discover: bool = True  # also follow the endpoints other collectors report
    max_message_bytes: int = 64 * 2**20
    max_blocks: int = DEFAULT_MAX_BLOCKS
    replay_timeout_s: float = 2.0
    max_replay_batches: int = 100_000
    # What one stream keeps of its live batches while its replay is outstanding; past
    # either bound the replay ends there and what it missed is counted.
    max_held_batches: int = 10_000
    max_held_bytes: int = 16 * 2**20
    connect_timeout_s: float = 5.0
    # How often the residency is published and the engines' endpoints followed.
    discovery_interval_s: float = 1.0


class Subscription:
    """One SUB socket to one publisher, with its sequence and connection state, and the
    replay it waits for (its live batches are held meanwhile)."""

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
        self.socket.setsockopt(zmq.RCVHWM, SUBSCRIPTION_RCVHWM)
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
        self.replay: Replay | None = None
        self.held: deque[tuple[int, bytes]] = deque()
        self.held_bytes = 0

    def close(self) -> None:
        if self.replay is not None:
            self.replay.close()
            self.replay = None
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
        """Take every batch that has arrived (up to a bound, so streams take turns)."""
        for _ in range(_READ_PER_TURN):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._receive(sink, frames)

    def _receive(self, sink: StateSink, frames: list[bytes]) -> None:
        if len(frames) != 3:
            self._malformed(sink, f"a message has 3 frames, got {len(frames)}")
            return
        try:
            sequence = parse_sequence(frames[1])
        except MalformedBatch as error:
            self._malformed(sink, str(error))
            return
        if self.replay is None:
            self._take(sink, sequence, frames[2])
            return
        self.held.append((sequence, frames[2]))
        self.held_bytes += len(frames[2])
        too_many = len(self.held) > self.settings.max_held_batches
        if too_many or self.held_bytes > self.settings.max_held_bytes:
            log.warning(
                "kv_events_replay_cut_short", endpoint=self.replay.endpoint, held=len(self.held)
            )
            self._end_replay(sink)

    def on_replay(self, sink: StateSink) -> None:
        """Apply what the replay endpoint sent so far; at its end, the held batches."""
        replay = self.replay
        if replay is None:
            return
        payloads = replay.receive()
        if payloads:
            residency = self.residency(None)
            for payload in payloads:
                self._apply_replayed(residency, payload)
        if replay.done:
            self._end_replay(sink)

    def expire(self, sink: StateSink, now: float) -> None:
        """End a replay past its deadline: what it did not bring counts as missed."""
        if self.replay is not None and self.replay.expired(now):
            log.warning(
                "kv_events_replay_timed_out",
                endpoint=self.replay.endpoint,
                missing=self.replay.missing,
            )
            self._end_replay(sink)

    def _take(self, sink: StateSink, sequence: int, payload: bytes) -> None:
        """Apply one live batch, or hold it behind the replay its gap starts."""
        try:
            batch = self.decoder.decode(payload)
        except MalformedBatch as error:
            self._malformed(sink, str(error))
            return
        residency = self.residency(batch.data_parallel_rank)
        residency.up = True
        if self._catch_up(residency, sequence):
            self.held.appendleft((sequence, payload))  # applied once the replay ends
            self.held_bytes += len(payload)
            return
        residency.apply(batch)
        self.last_sequence = sequence

    def _malformed(self, sink: StateSink, message: str) -> None:
        sink.reject(NAME, self.endpoint.endpoint, "malformed_batch", message)
        if self.engine is not None:
            residency = self.residency_of(self.engine)
            residency.drop("malformed_batch")
            residency.mark_approximate("a batch could not be read")

    def _catch_up(self, residency: EngineResidency, sequence: int) -> bool:
        """Before applying batch `sequence`: handle a restart or a gap; True when a
        replay was asked for (the batch then waits for it)."""
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
            return False
        if step is Step.GAP:
            residency.gap()
        replay_endpoint = self.endpoint.replay_endpoint
        if replay_endpoint is not None:
            try:
                self.replay = Replay(
                    self.context,
                    replay_endpoint,
                    start=start,
                    before=sequence,
                    timeout_s=self.settings.replay_timeout_s,
                    max_batches=self.settings.max_replay_batches,
                    max_message_bytes=self.settings.max_message_bytes,
                )
                return True
            except zmq.ZMQError as error:
                log.warning("kv_events_replay_failed", endpoint=replay_endpoint, error=str(error))
        self._missed(residency, sequence - start, step)
        return False

    def _missed(self, residency: EngineResidency, count: int, step: Step) -> None:
        residency.drop("missed", count)
        residency.mark_approximate(
            "batches were lost (sequence gap)"
            if step is Step.GAP
            else "joined the stream after its start"
        )

    def _apply_replayed(self, residency: EngineResidency, payload: bytes) -> None:
        try:
            residency.apply(self.decoder.decode(payload))
        except MalformedBatch:
            residency.drop("malformed_batch")
            residency.mark_approximate("a replayed batch could not be read")

    def _end_replay(self, sink: StateSink) -> None:
        """Close the replay, count what it missed, then apply the batches held behind it
        (one of which may start the next replay)."""
        replay = self.replay
        if replay is None:
            return
        self.replay = None
        replay.close()
        if replay.failure is not None:
            log.warning("kv_events_replay_failed", endpoint=replay.endpoint, error=replay.failure)
        if replay.missing:
            gap = self.last_sequence is not None and replay.start > 0
            self._missed(self.residency(None), replay.missing, Step.GAP if gap else Step.JOINED)
        self.last_sequence = replay.before - 1
        while self.held and self.replay is None:
            sequence, payload = self.held.popleft()
            self.held_bytes -= len(payload)
            self._take(sink, sequence, payload)
