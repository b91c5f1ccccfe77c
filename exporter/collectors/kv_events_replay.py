"""One replay request of the kv_events collector: a DEALER to vLLM's replay ROUTER, read
without blocking on the collector's one poll loop beside every SUB socket, so an engine that
answers slowly (or never) holds up only its own stream.

vLLM answers `[b"", start]` with `[b"", topic, seq, payload]` for every batch it still has
from `start` on, then `[b"", b"", -1, b""]`; it does so between engine steps, so an answer
can take a step or more. The request ends at the batch before the one that revealed the
gap, at the end marker, at its deadline, or at its batch limit, whichever comes first.
"""

from __future__ import annotations

import time

import zmq

from exporter.kv_events_wire import MalformedBatch, parse_sequence, sequence_frame

_END_OF_REPLAY = -1
# Replayed batches libzmq may queue for one request before it stops reading the socket:
# TCP then holds the rest back, and vLLM's replay ROUTER queues a whole replay on its side
# (its SNDHWM is 2 x buffer_steps + 2), so nothing is lost; the loop drains them as they
# come. Each may be up to MAXMSGSIZE, all in the daemon's RSS: 32, not 1,000.
REPLAY_RCVHWM = 32
# Messages read per readiness of the socket, so one long replay shares the loop.
_READ_PER_TURN = 256


class Replay:
    """Batches `start` .. `before - 1` of one stream, asked of its replay endpoint."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        *,
        start: int,
        before: int,
        timeout_s: float,
        max_batches: int,
        max_message_bytes: int,
    ) -> None:
        self.endpoint = endpoint
        self.start = start
        self.before = before
        self.next = start  # the next sequence the stream needs
        self.deadline = time.monotonic() + timeout_s
        self.max_batches = max_batches
        self.received = 0
        self.done = False
        self.failure: str | None = None
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self.socket.setsockopt(zmq.RCVHWM, REPLAY_RCVHWM)
        try:
            self.socket.connect(endpoint)
            self.socket.send_multipart([b"", sequence_frame(start)], zmq.NOBLOCK)
        except zmq.ZMQError:
            self.socket.close(linger=0)
            raise

    @property
    def missing(self) -> int:
        """Batches of the range not replayed (so far)."""
        return self.before - self.next

    def receive(self) -> list[bytes]:
        """The replayed payloads that continue the stream, in order, of what has arrived."""
        found: list[bytes] = []
        for _ in range(_READ_PER_TURN):
            if self.done:
                break
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self.received += 1
            try:
                if len(frames) != 4:
                    raise MalformedBatch(f"a replay message has 4 frames, got {len(frames)}")
                sequence = parse_sequence(frames[2])
            except MalformedBatch as error:
                self.failure = str(error)
                self.done = True
                break
            if sequence == _END_OF_REPLAY:
                self.done = True
                break
            # Earlier or repeated batches are skipped; a hole ends what can be used.
            if sequence == self.next and sequence < self.before:
                found.append(frames[3])
                self.next += 1
            self.done = self.next >= self.before or self.received >= self.max_batches
        return found

    def expired(self, now: float) -> bool:
        return now >= self.deadline

    def close(self) -> None:
        self.socket.close(linger=0)
