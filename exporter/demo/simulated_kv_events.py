"""The simulated deployment's KV event publishers: one per engine, on real ZMQ sockets.

Each engine publishes what vLLM 0.33's would for a steady stream of prompts: batches of
BlockStored events in vLLM's map shape (one per KV cache group of the demo's plan: Gemma
3's sliding-window groups, then its full-attention group) and, once its working set is full,
BlockRemoved events for the oldest blocks. Like vLLM it binds a PUB socket (the port is
the one it reports in /kv_event_sources) and a ROUTER replay socket that answers
`[b"", start]` with every buffered batch from `start`, then an end marker.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from typing import Any

import msgspec
import zmq

from exporter.kv_events_wire import parse_sequence, sequence_frame

_END_OF_REPLAY = sequence_frame(-1)
_REPLAY_BUFFER = 10_000
# Blocks an engine's full-attention group stores each step (a sliding-window group: a quarter).
BLOCKS_PER_STEP = 8
# (group index, kv_cache_spec_kind, sliding window) of each KV cache group.
KvGroup = tuple[int, str, int | None]


class ResidentBlocks:
    """The blocks one engine keeps resident in each KV cache group, and the events of each
    step that changes them (no sockets: benchmarks.kv_events_cost feeds them to a residency)."""

    def __init__(self, groups: tuple[KvGroup, ...], seed: int) -> None:
        self.groups = groups
        self.resident: dict[int, deque[int]] = {group: deque() for group, _, _ in groups}
        self.random = random.Random(seed)

    def step(self, blocks: int, working_set: int, block_size: int) -> list[dict[str, Any]]:
        """A step's events: `blocks` stored in the full-attention group (a quarter in a
        sliding-window one), after BlockRemoved events for the oldest past `working_set`."""
        events: list[dict[str, Any]] = []
        for group, kind, window in self.groups:
            resident = self.resident[group]
            # The sliding-window group keeps a quarter of the blocks the full group does.
            limit = working_set if window is None else working_set // 4
            count = blocks if window is None else max(1, blocks // 4)
            while len(resident) + count > limit:
                events.append(
                    {
                        "type": "BlockRemoved",
                        "block_hashes": [resident.popleft()],
                        "medium": "GPU",
                        "group_idx": group,
                    }
                )
            hashes = [self.random.getrandbits(64) for _ in range(count)]
            resident.extend(hashes)
            events.append(
                {
                    "type": "BlockStored",
                    "block_hashes": hashes,
                    "parent_block_hash": None,
                    "token_ids": [0] * (count * block_size),
                    "block_size": block_size,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "group_idx": group,
                    "kv_cache_spec_kind": kind,
                    **({"kv_cache_spec_sliding_window": window} if window else {}),
                }
            )
        return events


class _EnginePublisher:
    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        rank: int,
        seed: int,
        groups: tuple[KvGroup, ...],
    ) -> None:
        self.rank = rank
        self.pub = context.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:0")
        self.router = context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:0")
        self.sequence = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=_REPLAY_BUFFER)
        self.blocks = ResidentBlocks(groups, seed)

    def endpoint(self, socket: zmq.Socket[bytes]) -> str:
        return socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def source(self) -> dict[str, Any]:
        """This engine's entry of /kv_event_sources, as vLLM's frontend serves it."""
        return {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": self.endpoint(self.pub),
            "replay_endpoint": self.endpoint(self.router),
            "buffer_steps": _REPLAY_BUFFER,
            "hwm": 100_000,
            "max_queue_size": 100_000,
            "topic": "",
        }

    def step(self, blocks: int, working_set: int, block_size: int) -> None:
        events = self.blocks.step(blocks, working_set, block_size)
        payload = msgspec.msgpack.encode([time.time(), events, self.rank])
        frame = sequence_frame(self.sequence)
        self.pub.send_multipart([b"", frame, payload])
        self.buffer.append((self.sequence, payload))
        self.sequence += 1

    def serve_replay(self) -> None:
        while self.router.poll(0):
            frames = self.router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start_frame = frames
            start = parse_sequence(start_frame) if len(start_frame) == 8 else 0
            for sequence, payload in list(self.buffer):
                if sequence >= start:
                    self.router.send_multipart(
                        [client, b"", b"", sequence_frame(sequence), payload]
                    )
            self.router.send_multipart([client, b"", b"", _END_OF_REPLAY, b""])

    def close(self) -> None:
        self.pub.close(linger=0)
        self.router.close(linger=0)


class SimulatedKvEvents:
    """The publishers of all engines, driven by one thread every `step_s`."""

    def __init__(
        self,
        engines: int,
        *,
        block_size: int,
        groups: tuple[KvGroup, ...],
        step_s: float = 0.2,
        blocks_per_step: int = BLOCKS_PER_STEP,
        working_set: int = 512,
    ) -> None:
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._publishers = [
            _EnginePublisher(self._context, r, seed=r, groups=groups) for r in range(engines)
        ]
        self._block_size = block_size
        self._step_s = step_s
        self._blocks = blocks_per_step
        self._working_set = working_set
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="simulated-kv-events")

    def sources(self) -> dict[str, dict[str, Any]]:
        return {str(p.rank): p.source() for p in self._publishers}

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._step_s):
                for publisher in self._publishers:
                    publisher.serve_replay()
                    publisher.step(self._blocks, self._working_set, self._block_size)
        finally:
            for publisher in self._publishers:
                publisher.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        self._context.destroy(linger=0)
