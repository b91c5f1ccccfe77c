"""A stand-in for vLLM's KV event publisher on real ZMQ sockets, for collector tests.

It speaks vLLM's wire protocol (checked against a live vLLM in tests/live): PUB frames
[topic, 8-byte sequence, payload]; a ROUTER replay endpoint that answers [b"", start] with
[b"", topic, seq, payload] for every buffered batch from `start`, then [b"", b"", -1, b""].
Its PUB is an XPUB so a test can wait for the subscriber's subscription instead of
sleeping (ZMQ drops what a PUB sends before the subscription arrives).
"""

from __future__ import annotations

import threading

import zmq

from exporter.kv_events_wire import parse_sequence, sequence_frame


class StandInPublisher:
    def __init__(self, *, replay: bool = True, answer_replays: bool = True) -> None:
        self.context = zmq.Context()
        self.pub = self.context.socket(zmq.XPUB)
        self.pub.bind("tcp://127.0.0.1:0")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_endpoint: str | None = None
        self.replays: list[int] = []
        # False: the replay endpoint takes requests and never answers (a stuck engine).
        self.answer_replays = answer_replays
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if replay:
            self.router = self.context.socket(zmq.ROUTER)
            self.router.bind("tcp://127.0.0.1:0")
            self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
            self._thread = threading.Thread(target=self._serve_replay, daemon=True)
            self._thread.start()

    def wait_for_subscriber(self, timeout_s: float = 10.0) -> None:
        if not self.pub.poll(int(timeout_s * 1000)):
            raise TimeoutError("no subscriber came")
        self.pub.recv()  # the subscription message

    def publish(self, sequence: int, payload: bytes, *, send: bool = True) -> None:
        """Buffer a batch for replay and, unless `send` is False (a lost batch), send it."""
        self.buffer.append((sequence, payload))
        if send:
            self.pub.send_multipart([b"", sequence_frame(sequence), payload])

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            client, _, start_frame = self.router.recv_multipart()
            start = parse_sequence(start_frame)
            self.replays.append(start)
            if not self.answer_replays:
                continue
            for sequence, payload in list(self.buffer):
                if sequence >= start:
                    self.router.send_multipart(
                        [client, b"", b"", sequence_frame(sequence), payload]
                    )
            self.router.send_multipart([client, b"", b"", sequence_frame(-1), b""])

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        self.context.destroy(linger=0)
