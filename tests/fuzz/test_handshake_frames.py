"""Handshake messages: any list of frames is counted and never breaks the receiver or state.

HandshakeReceiver.handle runs on the handshake thread; an exception there ends the thread
and with it every later engine start. Inputs: arbitrary frames, vLLM 0.33's own ready
bytes (tests/fixtures/golden/handshake) and the plugin's extras mutated byte by byte,
msgpack of the right field names with wrong values, and byes for any engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from exporter.collectors import HandshakeReceiver, HandshakeSettings
from exporter.exposition import build_exposition
from exporter.handshake_wire import (
    BYE_TOPIC,
    READY_TOPIC,
    GroupExtra,
    ReadyExtras,
    decode_ready,
    encode,
)
from exporter.state import StateStore
from tests.conftest import GOLDEN, fuzz_budget
from tests.fuzz.mutations import (
    HOSTILE_NUMBERS,
    garbage,
    handshake_frames,
    mutated,
    mutated_bytes,
)
from tools.handshake_data import recorded_extras

HANDSHAKE = GOLDEN / "handshake"
ENDPOINT = "ipc:///run/kvcap/handshake.sock"


def _real_messages() -> list[tuple[bytes, bytes]]:
    """(vLLM's ready bytes, the plugin's extras bytes) of every recorded engine."""
    messages = []
    for path in sorted(HANDSHAKE.glob("*.json")):
        deployment = json.loads(path.read_text(encoding="utf-8"))
        for frame, engine in zip(deployment["frames"], deployment["engines"], strict=True):
            extras = recorded_extras(
                deployment, engine, devices=[str(i) for i in range(engine["world_size"])]
            )
            ready = (HANDSHAKE / frame["file"]).read_bytes()
            messages.append((ready, encode(extras)))
    return messages


REAL = _real_messages()
READY_FIELDS = tuple(msgspec.msgpack.decode(REAL[0][0]))
# Above this many workers per engine the state maps workers to GPUs one by one for
# minutes (see test_a_huge_world_size_is_refused); the property test stays under it.
MAX_FUZZED_WORLD_SIZE = 4096


def pack(value: Any) -> bytes:
    """msgpack of `value`, or of nil where msgpack cannot hold it (ints past 64 bits)."""
    try:
        return encode(value)
    except (OverflowError, TypeError):
        return encode(None)


ready_values = st.one_of(
    st.sampled_from(HOSTILE_NUMBERS),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from(["", "0", "\u00b2", "x" * 100]),
    garbage,
)


@st.composite
def ready_fields(draw: st.DrawFn) -> bytes:
    """A real ready response re-encoded with some fields changed, dropped or added."""
    ready, _ = draw(st.sampled_from(REAL))
    fields = msgspec.msgpack.decode(ready)
    changed = draw(mutated(fields, keys=READY_FIELDS, values=ready_values))
    return pack(changed)


@st.composite
def extras_fields(draw: st.DrawFn) -> bytes:
    _, extras = draw(st.sampled_from(REAL))
    fields = msgspec.msgpack.decode(extras)
    keys = (*ReadyExtras.__struct_fields__, *GroupExtra.__struct_fields__)
    return pack(draw(mutated(fields, keys=keys, values=ready_values)))


topics = st.sampled_from([READY_TOPIC, BYE_TOPIC, b"kvcap.ready.v2", b""]) | st.binary(max_size=16)
real_ready = st.sampled_from(REAL).map(lambda message: message[0])
real_extras = st.sampled_from(REAL).map(lambda message: message[1])

messages = st.one_of(
    # Anything at all.
    st.lists(st.binary(max_size=64), max_size=5),
    st.lists(topics | st.binary(max_size=32), max_size=5),
    # A ready message, its bytes or its fields broken.
    st.tuples(
        st.just(READY_TOPIC),
        real_ready.flatmap(mutated_bytes) | ready_fields() | real_ready,
        st.none() | real_extras.flatmap(mutated_bytes) | extras_fields() | real_extras,
    ).map(lambda t: [t[0], t[1]] if t[2] is None else list(t)),
    # A bye for any engine and instance.
    st.tuples(
        st.just(BYE_TOPIC),
        st.fixed_dictionaries({"engine_index": ready_values, "instance_id": ready_values}).map(pack)
        | st.binary(max_size=16),
    ).map(list),
    # Valid messages, so the state has engines to break.
    real_ready.map(lambda ready: [READY_TOPIC, ready]),
    # Deep nesting (msgspec's recursion limit), in any frame of any topic.
    st.tuples(
        topics,
        st.integers(min_value=1, max_value=3000).map(lambda depth: b"\x91" * depth + b"\xc0"),
        st.none() | real_extras,
    ).map(lambda t: [t[0], t[1]] if t[2] is None else list(t)),
)


def world_size_of(frames: list[bytes]) -> int:
    if len(frames) < 2 or frames[0] != READY_TOPIC:
        return 0
    try:
        return decode_ready(frames[1]).world_size or 0
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return 0


def rejected(store: StateStore) -> int:
    """Messages the handshake collector rejected, as kvcap_collector_errors_total counts them."""
    return sum(store.snapshot().errors.values())


def check_state(store: StateStore) -> None:
    snapshot = store.snapshot()
    assert {collector for collector, _ in snapshot.errors} <= {"handshake"}
    assert {reason for _, reason in snapshot.errors} <= {
        "unknown_topic",
        "wrong_frame_count",
        "malformed_frame",
        "frame_too_large",
        "rate_limited",
        # The admission's refusals: the fuzz names engines and instances at random.
        "engine_rate_limited",
        "instance_conflict",
        "token_mismatch",
        "bye_refused",
    }
    for view in snapshot.engines:
        assert view.engine == str(int(view.engine))
        assert type(view.capacity.num_gpu_blocks) is int
        assert type(view.capacity.max_model_len) is int
        assert view.collectors == ("handshake",)
        assert view.capacity_source in ("reported", None)


def render(store: StateStore) -> None:
    """The state after the messages renders to a body Prometheus' parser reads."""
    text = build_exposition(store.snapshot, process=False).body().content.decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert isinstance(sample.value, float)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(batch=st.lists(messages, min_size=1, max_size=12))
def test_any_frames_are_counted_and_never_break_the_state(batch: list[list[bytes]]) -> None:
    assume(all(world_size_of(frames) <= MAX_FUZZED_WORLD_SIZE for frames in batch))
    store = StateStore()
    receiver = HandshakeReceiver(ENDPOINT, store, HandshakeSettings(max_messages_per_s=1e9))
    store.register_target("handshake", ENDPOINT)
    store.publish("handshake", ENDPOINT, [])
    with capture_logs():
        for frames in batch:
            receiver.handle(frames)
            check_state(store)
    render(store)


@given(frames=messages)
def test_a_rejected_message_changes_no_engine(frames: list[bytes]) -> None:
    """Whatever is rejected leaves the engines exactly as they were."""
    assume(world_size_of(frames) <= MAX_FUZZED_WORLD_SIZE)
    store = StateStore()
    receiver = HandshakeReceiver(ENDPOINT, store, HandshakeSettings(max_messages_per_s=1e9))
    with capture_logs():
        for ready, extras in REAL[:2]:
            receiver.handle([READY_TOPIC, ready, extras])
        before = store.snapshot().engines
        receiver.handle(frames)
    if rejected(store):
        assert store.snapshot().engines == before


def test_every_recorded_engine_is_accepted() -> None:
    store = StateStore()
    receiver = HandshakeReceiver(ENDPOINT, store, HandshakeSettings(max_messages_per_s=1e9))
    with capture_logs():
        for ready, extras in REAL:
            receiver.handle([READY_TOPIC, ready, extras])
    assert rejected(store) == 0
    ranks = {decode_ready(ready).data_parallel_rank for ready, _ in REAL}
    assert {view.engine for view in store.snapshot().engines} == {str(rank) for rank in ranks}
    check_state(store)
    render(store)


# --- the bugs the fuzzer found, minimal inputs ------------------------------------------

MINIMAL_READY = {"max_model_len": 4096, "num_gpu_blocks": 1000, "data_parallel_rank": 0}


NESTED = b"\x91" * 5000 + b"\xc0"  # 5000 one-element arrays around a nil: 5 kB


@pytest.mark.parametrize(
    "frames",
    [
        # In the extras: {"settings": {"a": [[[...]]]}}.
        [READY_TOPIC, encode(MINIMAL_READY), b"\x81\xa8settings\x81\xa1a" + NESTED],
        # In the ready response: a fourth, unknown field "z" (fixmap of 3 made a fixmap of 4).
        [READY_TOPIC, b"\x84" + encode(MINIMAL_READY)[1:] + b"\xa1z" + NESTED],
    ],
    ids=["extras-settings", "ready-unknown-field"],
)
def test_deeply_nested_msgpack(frames: list[bytes]) -> None:
    store = StateStore()
    receiver = HandshakeReceiver(ENDPOINT, store, HandshakeSettings())
    receiver.handle(frames)
    assert store.snapshot().errors == {("handshake", "malformed_frame"): 1}


def test_a_field_kvcap_does_not_read_cannot_fail_the_frame() -> None:
    """Unread fields are skipped undecoded, whatever they hold."""
    store = StateStore()
    receiver = HandshakeReceiver(ENDPOINT, store, HandshakeSettings())
    unread = {"tensor_parallel_size": 0, "dtype": ["not", "a", "str"], "max_num_seqs": -1}
    with capture_logs():
        receiver.handle([READY_TOPIC, encode(MINIMAL_READY | unread)])
    assert store.snapshot().errors == {}
    assert [view.engine for view in store.snapshot().engines] == ["0"]


@pytest.mark.parametrize(
    "changes",
    [{"world_size": 2**40}, {"data_parallel_rank": 2**40}],
    ids=["world-size", "rank"],
)
@pytest.mark.process
def test_an_absurd_parallel_size_is_refused(changes: dict[str, int]) -> None:
    # In a child process: were it walked worker by worker, the loop would hold the store's
    # lock and a CPU for hours, and a thread cannot be stopped.
    code = (
        "from exporter.handshake_wire import READY_TOPIC, encode\n"
        "from exporter.collectors.handshake import HandshakeReceiver, HandshakeSettings\n"
        "from exporter.state import StateStore\n"
        f"ready = encode({{**{MINIMAL_READY!r}, **{changes!r}}})\n"
        "store = StateStore()\n"
        f"receiver = HandshakeReceiver({ENDPOINT!r}, store, HandshakeSettings())\n"
        "receiver.handle([READY_TOPIC, ready])\n"
        "snapshot = store.snapshot()\n"
        "errors = dict(snapshot.errors)\n"
        "print(repr((sum(errors.values()), errors, len(snapshot.engines))))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], timeout=10, check=True, capture_output=True, text=True
    )
    # The last line; the log lines come before it.
    assert run.stdout.splitlines()[-1] == repr((1, {("handshake", "malformed_frame"): 1}, 0))


@pytest.mark.fuzz
def test_fuzz_frames_no_crash_no_corruption_every_one_counted() -> None:
    """100,000 mutated frames under `make fuzz`, 10,000 in every other run."""
    count = fuzz_budget(10_000, 100_000)
    store = StateStore()
    receiver = HandshakeReceiver("ipc://fuzz", store, HandshakeSettings(max_messages_per_s=1e9))
    for frames in handshake_frames(seed=1, count=count):
        receiver.handle(frames)
    assert sum(store.snapshot().errors.values()) > count // 2
    # Only well-formed engines made it into the state, each under its own index. (A bit
    # flip can turn a valid message into another valid one: that is not corruption.)
    for view in store.snapshot().engines:
        assert view.engine == str(int(view.engine))
        assert isinstance(view.capacity.num_gpu_blocks, int)
        assert isinstance(view.capacity.max_model_len, int)
