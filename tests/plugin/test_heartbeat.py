"""The plugin's heartbeat: the ready message re-sent every KVCAP_HEARTBEAT_INTERVAL seconds.

Against the STAND-INS for vLLM 0.33 (tests/plugin/standins.py) and real ZMQ sockets; the
last test puts the real handshake source on the other end and restarts it.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from exporter import vllm_plugin
from exporter.collectors import HandshakeCollector, HandshakeSettings
from exporter.handshake_wire import (
    BYE_TOPIC,
    ENDPOINT_ENV,
    HEARTBEAT_INTERVAL_ENV,
    READY_V2_TOPIC,
    ReadyExtras,
    decode_bye,
    decode_heartbeat,
    decode_ready,
)
from exporter.state import Snapshot, StateStore
from tests import support
from tests.plugin import standins
from tests.plugin.conftest import Sidecar
from tests.plugin.test_vllm_plugin import LLAMA, installed, plugin_warnings

# Fast enough that a test sees several beats, slow enough for 2 shared cores.
FAST_S = "0.05"


@pytest.fixture
def core(monkeypatch: pytest.MonkeyPatch, sidecar: Sidecar) -> Any:
    """vLLM's engine core stand-ins with the plugin registered to the sidecar, beating
    every FAST_S seconds."""
    core = installed(monkeypatch)
    monkeypatch.setenv(HEARTBEAT_INTERVAL_ENV, FAST_S)
    vllm_plugin.register()
    return core


def sent_extras(frame: bytes) -> ReadyExtras:
    """Everything the plugin put in the extras frame (the sidecar decodes less)."""
    return msgspec.msgpack.decode(frame, type=ReadyExtras)


def test_the_heartbeat_resends_the_ready_message_byte_for_byte(core: Any, sidecar: Sidecar) -> None:
    engine = standins.engine(core, LLAMA, engine_index=1)
    engine._make_ready_response()

    first = sidecar.receive()
    assert first is not None
    assert first[0] == READY_V2_TOPIC
    assert decode_heartbeat(first[2]).interval_s == 0.05
    assert decode_ready(first[1]).data_parallel_rank == 1
    beats = [sidecar.receive() for _ in range(3)]
    assert beats == [first] * 3  # the ready response itself, not a ping
    assert len(engine.calls.ready_responses) == 1  # vLLM made it once; the plugin re-sends


def test_no_heartbeat_follows_the_bye(core: Any, sidecar: Sidecar) -> None:
    engine = standins.engine(core, LLAMA)
    response = engine._make_ready_response()
    for _ in range(3):
        assert sidecar.receive() is not None

    engine.shutdown()

    topics = []
    while (frames := sidecar.receive(timeout_ms=300)) is not None:  # 6 intervals of silence
        topics.append(frames[0])
        if frames[0] == BYE_TOPIC:
            assert decode_bye(frames[1]).instance_id == response.instance_id
    assert topics[-1] == BYE_TOPIC
    assert topics.count(BYE_TOPIC) == 1
    assert vllm_plugin.state.heartbeats == {}


def test_the_atexit_hook_stops_the_heartbeat_too(core: Any, sidecar: Sidecar) -> None:
    standins.engine(core, LLAMA)._make_ready_response()
    assert sidecar.receive() is not None
    vllm_plugin._send_pending_byes_and_close()
    topics = []
    while (frames := sidecar.receive(timeout_ms=300)) is not None:
        topics.append(frames[0])
    assert topics[-1] == BYE_TOPIC
    thread = vllm_plugin.state.heartbeat_thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive()


@pytest.mark.parametrize("value", ["0", "-1", "0.01", "nan", "inf", "5s", "7200"])
def test_a_bad_interval_warns_once_and_keeps_the_default(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    sidecar: Sidecar,
    value: str,
) -> None:
    core = installed(monkeypatch)
    monkeypatch.setenv(HEARTBEAT_INTERVAL_ENV, value)
    vllm_plugin.register()
    vllm_plugin.register()
    assert plugin_warnings(caplog) == [
        f"kvcap plugin: KVCAP_HEARTBEAT_INTERVAL={value!r} is not a number of seconds "
        "from 0.05 to 3600; using 5"
    ]
    standins.engine(core, LLAMA)._make_ready_response()
    frames = sidecar.receive()
    assert frames is not None
    assert decode_heartbeat(frames[2]).interval_s == 5.0


def test_unset_interval_is_5_seconds(monkeypatch: pytest.MonkeyPatch, sidecar: Sidecar) -> None:
    core = installed(monkeypatch)
    monkeypatch.delenv(HEARTBEAT_INTERVAL_ENV)
    vllm_plugin.register()
    standins.engine(core, LLAMA)._make_ready_response()
    frames = sidecar.receive()
    assert frames is not None
    assert decode_heartbeat(frames[2]).interval_s == 5.0


def beat_as_a_forked_engine(core: Any) -> None:
    """Engine 1 in a forked child; exits 3 when the child sent anything for engine 0."""
    sent_for: set[int] = set()
    send = vllm_plugin.state.send

    def recording_send(frames: list[bytes]) -> None:
        if frames[0] == READY_V2_TOPIC:
            sent_for.add(decode_ready(frames[1]).data_parallel_rank)
        send(frames)

    vllm_plugin.state.send = recording_send  # type: ignore[method-assign]
    engine = standins.engine(core, LLAMA, engine_index=1)
    engine._make_ready_response()
    time.sleep(0.3)  # six heartbeats of this child
    engine.shutdown()
    os._exit(0 if sent_for == {1} else 3)


@pytest.mark.process
def test_a_forked_engine_beats_only_for_itself(core: Any, sidecar: Sidecar) -> None:
    """The parent beats for engine 0 while the forked child runs engine 1: each process
    sends only its own engine's heartbeats, and the child's bye ends the child's."""
    standins.engine(core, LLAMA, engine_index=0)._make_ready_response()
    child = multiprocessing.get_context("fork").Process(
        target=beat_as_a_forked_engine, args=(core,)
    )
    child.start()
    child.join(10)
    assert child.exitcode == 0
    senders: dict[int, set[int]] = {}
    while (frames := sidecar.receive(timeout_ms=300)) is not None:
        if frames[0] == READY_V2_TOPIC:
            rank = decode_ready(frames[1]).data_parallel_rank
            senders.setdefault(rank, set()).add(sent_extras(frames[3]).pid or 0)
        if len(senders.get(0, ())) and len(senders.get(1, ())) and frames[0] == BYE_TOPIC:
            break
    assert senders == {0: {os.getpid()}, 1: {child.pid}}


def wait_for(store: StateStore, predicate: Callable[[Snapshot], bool]) -> Snapshot:
    def reached() -> Snapshot | None:
        snapshot = store.snapshot()
        return snapshot if predicate(snapshot) else None

    return support.wait_for(reached, 10, "the state", lambda: str(store.snapshot().engines))


def test_a_restarted_sidecar_learns_the_engines_from_the_next_heartbeat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM keeps running (its ready response was made once, long ago); the sidecar is
    restarted on the same endpoint and has every engine again from their heartbeats."""
    with tempfile.TemporaryDirectory(prefix="kvcap-", dir="/tmp") as folder:
        endpoint = f"ipc://{Path(folder) / 'handshake.sock'}"
        monkeypatch.setenv(ENDPOINT_ENV, endpoint)
        monkeypatch.setenv(HEARTBEAT_INTERVAL_ENV, "0.1")
        core = installed(monkeypatch)
        vllm_plugin.register()
        first_store = StateStore()
        first = HandshakeCollector(HandshakeSettings(endpoint=endpoint))
        first.start(first_store)
        engines = [standins.engine(core, LLAMA, engine_index=i) for i in (0, 1)]
        for engine in engines:
            engine._make_ready_response()
        wait_for(first_store, lambda s: [v.engine for v in s.engines] == ["0", "1"])
        first.stop(2.0)

        second_store = StateStore()
        second = HandshakeCollector(HandshakeSettings(endpoint=endpoint))
        second.start(second_store)
        try:
            learned = wait_for(second_store, lambda s: [v.engine for v in s.engines] == ["0", "1"])
        finally:
            second.stop(2.0)
        want = standins.golden(LLAMA)["engines"]
        assert [v.capacity.num_gpu_blocks for v in learned.engines] == [
            e["num_gpu_blocks"] for e in want
        ]
        assert not any(v.stale for v in learned.engines)
        assert [len(e.calls.ready_responses) for e in engines] == [1, 1]
