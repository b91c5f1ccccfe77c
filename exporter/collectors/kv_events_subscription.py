"""One SUB socket of the kv_events collector: a publisher's batches in order, its gaps
filled from vLLM's replay endpoint without stalling the other streams, its restarts and
its connection state (a SUB that libzmq dropped for good is opened again, with back-off)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from exporter.collectors.error_tally import ErrorTally
from exporter.collectors.kv_events_log import LimitedLog
from exporter.collectors.kv_events_replay import Replay
from exporter.collectors.kv_events_sequence import Step, classify, missing_from
from exporter.kv_events_wire import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_EVENTS,
    DEFAULT_MAX_HASHES,
    BatchDecoder,
    BatchLimits,
    MalformedBatch,
    parse_sequence,
)
from exporter.prefix_cache import DEFAULT_MAX_BLOCKS, DEFAULT_MAX_GROUPS, EngineResidency
from exporter.state import KvEventsEndpoint, StateSink

# A batch as received: libzmq's buffer, not copied (bytes where a test hands one over).
Payload = bytes | memoryview
NAME = "kv_events"
LOGGER = "kvcap.kv_events"
# Batches libzmq may queue for one stream before it stops reading it: the publisher's
# own high-water mark then drops, and the gap is replayed. The poll loop reads every
# stream as it comes (a replay never blocks it), so an honest stream (~100 batches a
# second at most) never fills it; a hostile one fills it with batches of up to MAXMSGSIZE
# each, all in the daemon's RSS: 1,000 batches of 270 KB were 128 MiB, 32 are 8 MiB.
SUBSCRIPTION_RCVHWM = 32
_READ_PER_TURN = 256
DEFAULT_MAX_SUBSCRIPTIONS = 128
DEFAULT_MAX_REPLAYS = 64
DEFAULT_MAX_STREAM_BYTES_PER_S = 8 * 2**20
# Connected and disconnected; and the attempts libzmq makes to reconnect on its own, which
# it never makes after a protocol error (a batch past MAXMSGSIZE): then kvcap reopens.
_MONITORED = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CONNECT_DELAYED
    | zmq.EVENT_CONNECT_RETRIED
)


@dataclass(frozen=True, slots=True)
class KvEventsSettings:
    endpoints: tuple[KvEventsEndpoint, ...] = ()
    discover: bool = True  # also follow the endpoints other collectors report
    max_message_bytes: int = DEFAULT_MAX_BATCH_BYTES
    max_batch_events: int = DEFAULT_MAX_EVENTS
    max_batch_hashes: int = DEFAULT_MAX_HASHES
    # Bytes of batches one stream may have applied per second (an engine of the simulated
    # deployment sends ~60 KB/s; vLLM's busiest, a few MB in a burst).
    max_stream_bytes_per_s: int = DEFAULT_MAX_STREAM_BYTES_PER_S
    max_blocks: int = DEFAULT_MAX_BLOCKS  # per engine while its pool is unknown
    max_groups: int = DEFAULT_MAX_GROUPS  # KV cache groups per engine
    # Streams followed at once (each holds 2 sockets and 4 file descriptors, 6 with a
    # replay) and replays outstanding at once; past them an endpoint waits, a gap is missed.
    max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS
    max_replays: int = DEFAULT_MAX_REPLAYS
    replay_timeout_s: float = 2.0
    max_replay_batches: int = 100_000
    # What one stream keeps of its live batches while its replay is outstanding; past
    # either bound the replay ends there and what it missed is counted.
    max_held_batches: int = 10_000
    max_held_bytes: int = 16 * 2**20
    connect_timeout_s: float = 5.0
    # A SUB libzmq dropped (a batch past MAXMSGSIZE is a protocol error, never reconnected)
    # is opened again after this, doubled on each try that does not connect, up to the max.
    reopen_after_s: float = 1.0
    max_reopen_after_s: float = 60.0
    # How often the residency is published and the engines' endpoints followed.
    discovery_interval_s: float = 1.0


@dataclass(slots=True)
class ReplaySlots:
    """Replays outstanding across every stream, against `max_replays`."""

    limit: int
    active: int = 0


class Subscription:
    """One SUB socket to one publisher, with its sequence and connection state, and the
    replay it waits for (its live batches are held meanwhile)."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        endpoint: KvEventsEndpoint,
        residency_of: Callable[[str], EngineResidency],
        settings: KvEventsSettings,
        *,
        tally: ErrorTally | None = None,
        replay_slots: ReplaySlots | None = None,
        log: LimitedLog | None = None,
    ) -> None:
        """Raises zmq.ZMQError (no file descriptors left) with nothing left open."""
        self.endpoint = endpoint
        self.residency_of = residency_of
        self.settings = settings
        self.context = context
        self.tally = tally or ErrorTally(NAME)
        self.log = log or LimitedLog(LOGGER)
        self.replay_slots = replay_slots or ReplaySlots(settings.max_replays)
        self.socket, self.monitor = self._open()
        self.created_at = time.monotonic()
        self.connected = False
        self.reported = False
        self.disconnected_at: float | None = None
        self.reopen_after_s = settings.reopen_after_s
        self.last_sequence: int | None = None
        self.engine: str | None = endpoint.engine
        self.decoder = BatchDecoder(
            BatchLimits(
                settings.max_message_bytes, settings.max_batch_events, settings.max_batch_hashes
            )
        )
        self.replay: Replay | None = None
        self.held: deque[tuple[int, Payload]] = deque()
        self.held_bytes = 0
        self.window_began = 0.0
        self.window_bytes = 0

    def _open(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        socket = self.context.socket(zmq.SUB)
        try:
            socket.setsockopt(zmq.MAXMSGSIZE, self.settings.max_message_bytes)
            socket.setsockopt(zmq.RCVHWM, SUBSCRIPTION_RCVHWM)
            socket.setsockopt(zmq.LINGER, 0)
            # libzmq's own reconnect every 100 ms, not backed off: a restarted vLLM publishes
            # its first batches as soon as it answers, and a later connect loses them (a
            # 5 s back-off lost a live engine's whole first request).
            socket.setsockopt(zmq.SUBSCRIBE, b"")
            monitor = socket.get_monitor_socket(_MONITORED)
        except zmq.ZMQError:
            socket.close(linger=0)
            raise
        try:
            socket.connect(self.endpoint.endpoint)
        except zmq.ZMQError:
            _close(socket, monitor)
            raise
        return socket, monitor

    def close(self) -> None:
        self._close_replay()
        _close(self.socket, self.monitor)

    def _close_replay(self) -> None:
        if self.replay is not None:
            self.replay.close()
            self.replay = None
            self.replay_slots.active -= 1

    def reopen_if_dropped(self, sink: StateSink, now: float) -> None:
        """libzmq does not reconnect a SUB it dropped for a protocol error (a batch past
        MAXMSGSIZE): past the back-off, open a new one (counted `resubscribed`)."""
        if self.connected or self.disconnected_at is None:
            return
        if now - self.disconnected_at < self.reopen_after_s:
            return
        try:
            socket, monitor = self._open()
        except zmq.ZMQError as error:
            self.tally.count("subscribe_failed", self.endpoint.endpoint, str(error))
            self.log.warning(
                "kv_events_subscribe_failed", endpoint=self.endpoint.endpoint, error=str(error)
            )
        else:
            _close(self.socket, self.monitor)
            self.socket, self.monitor = socket, monitor
            self.tally.count("resubscribed", self.endpoint.endpoint, "dropped, opened again")
            self.log.info("kv_events_resubscribed", endpoint=self.endpoint.endpoint)
        # Doubled until a connection holds (a publisher that keeps sending oversized
        # batches is tried once a minute at most).
        self.disconnected_at = now
        self.reopen_after_s = min(self.reopen_after_s * 2, self.settings.max_reopen_after_s)

    def residency(self, rank: int | None) -> EngineResidency:
        if self.engine is None:
            self.engine = str(rank or 0)
        return self.residency_of(self.engine)

    def on_monitor(self, sink: StateSink) -> None:
        event = recv_monitor_message(self.monitor)["event"]
        if event in (zmq.EVENT_CONNECT_DELAYED, zmq.EVENT_CONNECT_RETRIED):
            self.disconnected_at = None  # libzmq reconnects this one itself
            return
        connected = event == zmq.EVENT_CONNECTED
        if connected == self.connected:
            return
        self.connected = connected
        self.reported = True
        if connected:
            self.reopen_after_s = self.settings.reopen_after_s
        self.disconnected_at = None if connected else time.monotonic()
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
                # Not copied: a batch let go or refused costs only libzmq's own buffer.
                message = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            frames = [frame.buffer for frame in message]
            if self._over_rate(sum(frame.nbytes for frame in frames)):
                continue
            self._receive(sink, frames)

    def _over_rate(self, size: int) -> bool:
        """Past `max_stream_bytes_per_s` in this second: the batch is read and let go
        undecoded (the next one taken shows the gap: replayed, or counted as missed). A
        stream that sends faster than it can be applied would otherwise queue in libzmq,
        RCVHWM batches of up to MAXMSGSIZE each, all of it in the daemon's RSS."""
        now = time.monotonic()
        if now - self.window_began >= 1.0:
            self.window_began, self.window_bytes = now, 0
        first = self.window_bytes == 0  # one batch a second is always taken, whatever its size
        self.window_bytes += size
        if first or self.window_bytes <= self.settings.max_stream_bytes_per_s:
            return False
        self.tally.count("rate_limited", self.endpoint.endpoint, "--kv-events.max-stream-rate")
        self.log.warning("kv_events_rate_limited", endpoint=self.endpoint.endpoint)
        return True

    def _receive(self, sink: StateSink, frames: list[memoryview]) -> None:
        if len(frames) != 3:
            self._malformed(sink, f"a message has 3 frames, got {len(frames)}")
            return
        try:
            sequence = parse_sequence(frames[1].tobytes())
        except MalformedBatch as error:
            self._malformed(sink, str(error))
            return
        if self.replay is None:
            self._take(sink, sequence, frames[2])
            return
        self.held.append((sequence, frames[2]))
        self.held_bytes += frames[2].nbytes
        too_many = len(self.held) > self.settings.max_held_batches
        if too_many or self.held_bytes > self.settings.max_held_bytes:
            self.tally.count("replay_cut_short", self.replay.endpoint, "held batches past bound")
            self.log.warning(
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
        self.reopen_if_dropped(sink, now)
        if self.replay is not None and self.replay.expired(now):
            self.tally.count("replay_timeout", self.replay.endpoint, "no answer by the deadline")
            self.log.warning(
                "kv_events_replay_timed_out",
                endpoint=self.replay.endpoint,
                missing=self.replay.missing,
            )
            self._end_replay(sink)

    def _take(self, sink: StateSink, sequence: int, payload: Payload) -> None:
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
            self.held_bytes += _size(payload)
            return
        residency.apply(batch)
        self.last_sequence = sequence

    def _malformed(self, sink: StateSink, message: str) -> None:
        self.tally.count("malformed_batch", self.endpoint.endpoint, message)
        self.log.warning(
            "kv_events_malformed_batch", endpoint=self.endpoint.endpoint, error=message
        )
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
            self.log.info(
                "publisher_restarted", engine=residency.engine, endpoint=self.endpoint.endpoint
            )
            residency.reset()
        start = missing_from(self.last_sequence, sequence)
        if start is None:
            return False
        if step is Step.GAP:
            residency.gap()
        replay_endpoint = self.endpoint.replay_endpoint
        if replay_endpoint is not None and self.replay_slots.active >= self.replay_slots.limit:
            self.tally.count("too_many_replays", replay_endpoint, "--kv-events.max-replays reached")
            self.log.warning("kv_events_too_many_replays", endpoint=replay_endpoint)
        elif replay_endpoint is not None:
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
                self.replay_slots.active += 1
                return True
            except zmq.ZMQError as error:
                self.tally.count("replay_failed", replay_endpoint, str(error))
                self.log.warning(
                    "kv_events_replay_failed", endpoint=replay_endpoint, error=str(error)
                )
        self._missed(residency, sequence - start, step)
        return False

    def _missed(self, residency: EngineResidency, count: int, step: Step) -> None:
        residency.drop("missed", count)
        residency.mark_approximate(
            "batches were lost (sequence gap)"
            if step is Step.GAP
            else "joined the stream after its start"
        )

    def _apply_replayed(self, residency: EngineResidency, payload: Payload) -> None:
        try:
            residency.apply(self.decoder.decode(payload))
        except MalformedBatch as error:
            self.tally.count("malformed_batch", self.endpoint.endpoint, str(error))
            residency.drop("malformed_batch")
            residency.mark_approximate("a replayed batch could not be read")

    def _end_replay(self, sink: StateSink) -> None:
        """Close the replay, count what it missed, then apply the batches held behind it
        (one of which may start the next replay)."""
        replay = self.replay
        if replay is None:
            return
        self._close_replay()
        if replay.failure is not None:
            self.tally.count("replay_failed", replay.endpoint, replay.failure)
            self.log.warning(
                "kv_events_replay_failed", endpoint=replay.endpoint, error=replay.failure
            )
        if replay.missing:
            gap = self.last_sequence is not None and replay.start > 0
            self._missed(self.residency(None), replay.missing, Step.GAP if gap else Step.JOINED)
        self.last_sequence = replay.before - 1
        while self.held and self.replay is None:
            sequence, payload = self.held.popleft()
            self.held_bytes -= _size(payload)
            self._take(sink, sequence, payload)


def _close(socket: zmq.Socket[bytes], monitor: zmq.Socket[bytes]) -> None:
    socket.disable_monitor()
    monitor.close(linger=0)
    socket.close(linger=0)


def _size(payload: Payload) -> int:
    return payload.nbytes if isinstance(payload, memoryview) else len(payload)
