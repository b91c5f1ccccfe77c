"""The handshake source over real ZMQ sockets, fed vLLM 0.33's own ready-response bytes."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest
import zmq
from structlog.testing import capture_logs

from exporter.collectors import HandshakeCollector, HandshakeReceiver, HandshakeSettings
from exporter.handshake_wire import (
    BYE_TOPIC,
    READY_TOPIC,
    bye_message,
    encode,
    ready_message,
)
from exporter.state import StateStore
from tests import support
from tests.conftest import GOLDEN
from tools.handshake_data import ready_for_rank, recorded_extras

HANDSHAKE = GOLDEN / "handshake"
DEPLOYMENTS = sorted(HANDSHAKE.glob("*.json"))
# A tenth of the default poll interval: a push, with room for a busy machine.
PUSHED_WITHIN_S = 0.5


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def private_endpoint(folder: Path) -> str:
    """An ipc:// endpoint under a test's own folder (kvcap creates the kvcap/ below it)."""
    return f"ipc://{folder}/kvcap/handshake.sock"


class Listener:
    """A HandshakeCollector on an endpoint, and a PUSH socket connected to it."""

    def __init__(self, endpoint: str, **settings: Any) -> None:
        self.store = StateStore()
        self.endpoint = endpoint
        self.source = HandshakeCollector(HandshakeSettings(endpoint=self.endpoint, **settings))
        self.context = zmq.Context()
        self.push = self.context.socket(zmq.PUSH)

    def __enter__(self) -> Self:
        self.source.start(self.store)
        self.push.connect(self.endpoint)
        return self

    def __exit__(self, *exc: object) -> None:
        self.push.close(linger=0)
        self.context.term()
        self.source.stop(2.0)

    def send(self, frames: list[bytes]) -> None:
        self.push.send_multipart(frames)

    def wait_for(self, predicate: Any, timeout_s: float = 5.0) -> None:
        support.wait_for(
            lambda: predicate(self.store.snapshot()),
            timeout_s,
            "the state in the expected shape",
            lambda: str(self.store.snapshot().engines),
        )


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    with Listener(private_endpoint(tmp_path)) as started:
        yield started


@pytest.mark.parametrize("path", DEPLOYMENTS, ids=[p.stem for p in DEPLOYMENTS])
def test_vllm_ready_bytes_become_engines(listener: Listener, path: Path) -> None:
    deployment = load(path)
    for frame, engine in zip(deployment["frames"], deployment["engines"], strict=True):
        ready = (HANDSHAKE / frame["file"]).read_bytes()
        listener.send(ready_message(ready, recorded_extras(deployment, engine)))
    listener.wait_for(lambda s: len(s.engines) == len(deployment["engines"]))
    views = {v.engine: v for v in listener.store.snapshot().engines}
    for engine in deployment["engines"]:
        view = views[str(engine["engine"])]
        assert view.collectors == ("handshake",)
        assert view.capacity_source == "reported"
        assert view.capacity.num_gpu_blocks == engine["num_gpu_blocks"]
        assert view.capacity.block_size == engine["block_size"]
        assert view.capacity.kv_cache_size_tokens == engine["kv_cache_size_tokens"]
        assert view.capacity.kv_cache_max_concurrency == engine["max_concurrency"]
        assert view.capacity.max_model_len == engine["max_model_len"]
        assert view.instance_id == deployment["instance_id"]
        assert view.vllm_version == "0.33.0"
        assert view.model_name == deployment["served_model_name"]
        assert [g.spec_type for g in view.capacity.groups] == [
            g["spec_type"] for g in engine["groups"]
        ]
        assert {g.blocks_per_request for g in view.capacity.groups} == {
            -(-g["max_memory_usage_bytes_per_request"] // g["page_size_bytes"])
            for g in engine["groups"]
        }
        assert view.capacity.kv_cache_bytes_per_worker[0] == (
            engine["bytes_per_block_per_worker"] * engine["num_gpu_blocks"]
        )


def test_data_parallel_4_in_any_order_then_restart_and_bye(listener: Listener) -> None:
    ranks = [3, 0, 2, 1]
    random.Random(7).shuffle(ranks)
    for rank in ranks:
        listener.send(ready_message(ready_for_rank(rank)))
    listener.wait_for(lambda s: [v.engine for v in s.engines] == ["0", "1", "2", "3"])

    listener.send(ready_message(ready_for_rank(2, instance_id="2")))
    listener.wait_for(lambda s: s.engines[2].instance_id == "2")
    assert [v.instance_id for v in listener.store.snapshot().engines] == ["1", "1", "2", "1"]

    listener.send(bye_message(2, "1"))  # a late bye of the old instance changes nothing
    listener.send(bye_message(3, "1"))
    listener.wait_for(lambda s: [v.engine for v in s.engines] == ["0", "1", "2"])
    listener.send(bye_message(2, "2"))
    listener.wait_for(lambda s: [v.engine for v in s.engines] == ["0", "1"])


def test_the_state_is_updated_on_receipt_not_on_a_poll(listener: Listener) -> None:
    # Pushed, not polled: every message is in the state far sooner than a poll would read it
    # (every 5 s by default). How soon is a benchmark's question (benchmarks/handshake.py), not a
    # unit test's: a timed bound here only measures the machine's load.
    delays = []
    for rank in range(20):
        sent = time.monotonic()
        listener.send(ready_message(ready_for_rank(rank)))
        listener.wait_for(lambda s, r=rank: len(s.engines) == r + 1)
        delays.append(time.monotonic() - sent)
    assert max(delays) < PUSHED_WITHIN_S


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([b"kvcap.other.v1", b""], "unknown_topic"),
        ([READY_TOPIC], "wrong_frame_count"),
        ([READY_TOPIC, b"", b"", b""], "wrong_frame_count"),
        ([READY_TOPIC, b"\x85\xa3abc"], "malformed_frame"),
        ([READY_TOPIC, encode({"max_model_len": "long"})], "malformed_frame"),
        ([BYE_TOPIC, encode({"engine_index": -1.5})], "malformed_frame"),
        ([READY_TOPIC, b"\xdd\xff\xff\xff\xff"], "malformed_frame"),
        ([READY_TOPIC, b"x" * (64 * 2**10 + 1)], "frame_too_large"),
    ],
)
def test_bad_frames_are_counted_and_change_nothing(
    listener: Listener, frames: list[bytes], reason: str
) -> None:
    listener.send(ready_message(ready_for_rank(0)))
    listener.wait_for(lambda s: len(s.engines) == 1)
    listener.send(frames)
    listener.wait_for(lambda s: s.errors.get(("handshake", reason)) == 1)
    snapshot = listener.store.snapshot()
    assert [v.engine for v in snapshot.engines] == ["0"]
    assert snapshot.collectors[0].up


def test_message_floods_are_dropped_and_counted(tmp_path: Path) -> None:
    with Listener(private_endpoint(tmp_path), max_messages_per_s=10.0) as listener:
        for rank in range(50):
            listener.send(ready_message(ready_for_rank(rank)))
        listener.wait_for(
            lambda s: len(s.engines) + s.errors.get(("handshake", "rate_limited"), 0) == 50
        )
        assert len(listener.store.snapshot().engines) <= 11


def test_a_bug_in_handling_one_message_is_counted_and_the_thread_goes_on(
    listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception the receiver does not expect (a bug, not bad input) ended the
    receiving thread: no sweeps, no engines after it. Now it is one `internal_error` and
    the next message is applied."""
    deployment = load(DEPLOYMENTS[0])
    frame, engine = deployment["frames"][0], deployment["engines"][0]
    message = ready_message(
        (HANDSHAKE / frame["file"]).read_bytes(), recorded_extras(deployment, engine)
    )
    assert listener.source.receiver is not None
    receiver = listener.source.receiver
    receive = receiver.receive
    calls: list[int] = []

    def failing_once(frames: list[bytes]) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        receive(frames)

    monkeypatch.setattr(receiver, "receive", failing_once)
    listener.send(message)
    listener.wait_for(lambda s: s.errors.get(("handshake", "internal_error")) == 1)
    listener.send(message)
    listener.wait_for(lambda s: len(s.engines) == 1)


def test_a_batch_of_rejections_is_one_state_change_per_reason() -> None:
    """Each count the state takes is a new snapshot: the collector tallies a batch's
    rejections and hands each reason's total over once, whole."""
    store = StateStore()
    receiver = HandshakeReceiver("ipc://batch", store, HandshakeSettings())
    version = store.snapshot().version
    with capture_logs() as logs:
        for _ in range(1000):
            receiver.receive([b"junk"])
            receiver.receive([READY_TOPIC, b"\x85\xa3abc"])
        assert store.snapshot().version == version  # nothing handed over yet
        receiver.flush()
    snapshot = store.snapshot()
    assert snapshot.errors == {
        ("handshake", "unknown_topic"): 1000,
        ("handshake", "malformed_frame"): 1000,
    }
    assert snapshot.version == version + 2
    assert [line["reason"] for line in logs if line["event"] == "input_rejected"] == [
        "unknown_topic",
        "malformed_frame",
    ]
