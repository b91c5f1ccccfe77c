"""Hostile KV event publishers against the kv_events collector on real ZMQ sockets (issue
25): every attack is counted by reason, logged once, bounded, and an honest engine beside
the hostile one stays current. The daemon in its own process: tests/faults."""

from __future__ import annotations

import time
from collections.abc import Iterator

import msgspec
import pytest
import zmq
from structlog.testing import capture_logs

from exporter.capacity import EngineCapacity
from exporter.collectors import KvEventsCollector, KvEventsSettings
from exporter.state import EngineReport, KvEventsEndpoint, StateStore
from tests.collectors.test_kv_events import (
    STREAM,
    events_in,
    reference,
    running,
    started,
    totals,
    view,
    wait_for,
)
from tests.kv_events_publisher import StandInPublisher


def nested(depth: int) -> bytes:
    """A batch whose one event nests `depth` arrays in its token ids."""
    head = msgspec.msgpack.encode([1.0, [["BlockStored", [1], None]]])
    # [ts, [event]]: the event's array header says 3 items; make it 4, the 4th nested.
    return head.replace(b"\x93\xabBlockStored", b"\x94\xabBlockStored") + b"\x91" * depth + b"\xc0"


def nil_events(count: int) -> bytes:
    """[ts, [nil x count]]: one byte an event, an array header of 32 bits."""
    return (
        b"\x92\xcb"
        + msgspec.msgpack.encode(1.0)[1:]
        + b"\xdd"
        + count.to_bytes(4, "big")
        + (b"\xc0" * count)
    )


def errors(store: StateStore, reason: str) -> int:
    return store.snapshot().errors.get(("kv_events", reason), 0)


@pytest.fixture
def hostile() -> Iterator[StandInPublisher]:
    found = StandInPublisher(replay=False)
    yield found
    found.close()


@pytest.fixture
def honest() -> Iterator[StandInPublisher]:
    found = StandInPublisher()
    yield found
    found.close()


def beside_honest(
    hostile: StandInPublisher, honest: StandInPublisher, **settings: object
) -> tuple[KvEventsCollector, StateStore]:
    collector, store = running(
        KvEventsEndpoint(hostile.endpoint, hostile.replay_endpoint, "0"),
        KvEventsEndpoint(honest.endpoint, honest.replay_endpoint, "1"),
        **settings,
    )
    hostile.wait_for_subscriber()
    honest.wait_for_subscriber()
    return collector, store


def honest_stream_applied(honest: StandInPublisher, store: StateStore) -> None:
    for sequence, payload in enumerate(STREAM):
        honest.publish(sequence, payload)
    wait_for(
        lambda: (
            (v := view(store, "1")) is not None and v.events_received_total >= events_in(STREAM)
        ),
        "the honest engine's stream",
    )
    current = view(store, "1")
    assert current is not None
    assert totals(current) == reference(STREAM)
    assert not current.approximate


@pytest.mark.parametrize(
    ("payload", "what"),
    [
        (nested(100_000), "nested deeper than"),
        (nil_events(3_000_000), "length <= 65536"),  # 3 MiB: refused at the array's header
        (msgspec.msgpack.encode([-1e308, [{"type": "AllBlocksCleared"}]]), ">= 0.0"),
        (msgspec.msgpack.encode([1e308, [{"type": "AllBlocksCleared"}]]), "<= 1099511627776"),
        (
            msgspec.msgpack.encode(
                [1.0, [{"type": "BlockRemoved", "block_hashes": list(range(60_000))}] * 10]
            ),
            "more than 524288 block hashes",
        ),
    ],
    ids=["nested-100k", "3M-nil-events", "ts-minus-1e308", "ts-1e308", "600k-hashes"],
)
def test_a_hostile_batch_is_one_malformed_batch_logged_once_without_traceback(
    hostile: StandInPublisher, honest: StandInPublisher, payload: bytes, what: str
) -> None:
    with capture_logs() as logs:
        collector, store = beside_honest(hostile, honest, max_stream_bytes_per_s=2**30)
        try:
            for sequence in range(20):
                hostile.publish(sequence, payload)
            wait_for(lambda: errors(store, "malformed_batch") == 20, "20 malformed batches")
            honest_stream_applied(honest, store)
            found = view(store, "0")
            assert found is not None
            assert found.dropped_total == {"malformed_batch": 20}
            assert all(p.lifetime_sum_s < float("inf") for p in found.pools)
        finally:
            collector.stop(2)
    malformed = [e for e in logs if e["event"] == "kv_events_malformed_batch"]
    assert len(malformed) == 1  # once per cause per interval
    assert what in malformed[0]["error"]
    assert not [e for e in logs if "exc_info" in e or e["log_level"] == "error"]
    assert errors(store, "internal_error") == 0


def test_a_stream_past_its_rate_is_let_go_undecoded_and_counted(
    hostile: StandInPublisher, honest: StandInPublisher
) -> None:
    """A stream sending faster than it can be applied would queue in libzmq: past
    --kv-events.max-stream-rate its batches are read and let go, the gap counted."""
    collector, store = beside_honest(hostile, honest, max_stream_bytes_per_s=2**20)
    try:
        for sequence in range(10):
            hostile.publish(sequence, nil_events(600_000))  # 600 KB, refused when decoded
        wait_for(lambda: errors(store, "rate_limited") >= 7, "batches let go")
        honest_stream_applied(honest, store)
        assert 1 <= errors(store, "malformed_batch") <= 3
    finally:
        collector.stop(2)


def test_a_gap_on_every_batch_with_a_silent_replay_never_stalls_the_honest_engine(
    honest: StandInPublisher,
) -> None:
    """The issue's figure: an honest engine applied 11 of 115 batches (2 s per gap on the
    one receiving thread). Replays are polled beside the streams: it applies all of them."""
    stuck = StandInPublisher(answer_replays=False)
    try:
        collector, store = beside_honest(stuck, honest, replay_timeout_s=0.3, max_replays=4)
        try:
            # Every other number skipped: each batch reveals a gap.
            for sequence in range(0, 230, 2):
                stuck.publish(sequence, STREAM[0])
            honest_stream_applied(honest, store)
            wait_for(lambda: errors(store, "replay_timeout") >= 1, "a replay's deadline")
        finally:
            collector.stop(2)
    finally:
        stuck.close()


def test_a_new_publisher_port_on_every_heartbeat_keeps_one_subscription(
    honest: StandInPublisher,
) -> None:
    """One subscription per engine: a new endpoint replaces the old one (closed, its target
    gone from the state); a stale or forgotten engine's subscription is closed."""
    store = StateStore()
    collector = KvEventsCollector(KvEventsSettings(discovery_interval_s=0.02))
    started(collector, store)

    def heartbeat(endpoint: str, *, engine: str = "0") -> None:
        report = EngineReport(
            engine=engine,
            model_name="m",
            instance_id="a",
            reported=EngineCapacity(num_gpu_blocks=100),
            kv_events=KvEventsEndpoint(endpoint, None, engine),
        )
        store.publish("handshake", "ipc://h", [report])

    try:
        for port in range(30_000, 30_040):
            heartbeat(f"tcp://127.0.0.1:{port}")
            time.sleep(0.03)
        heartbeat(honest.endpoint)
        honest.wait_for_subscriber()
        wait_for(lambda: list(collector._subscriptions) == [honest.endpoint], "one subscription")
        targets = [s.target for s in store.snapshot().collectors if s.collector == "kv_events"]
        assert targets == [honest.endpoint]
        honest.publish(0, STREAM[0])
        wait_for(lambda: view(store) is not None, "the engine's residency")
        store.forget("handshake", "ipc://h")  # the engine forgotten
        wait_for(lambda: not collector._subscriptions, "the subscription closed")
        wait_for(lambda: view(store) is None, "its residency series gone")
    finally:
        collector.stop(2)


def test_subscriptions_are_capped() -> None:
    endpoints = tuple(KvEventsEndpoint(f"tcp://127.0.0.1:{31_000 + i}") for i in range(8))
    store = StateStore()
    collector = KvEventsCollector(
        KvEventsSettings(endpoints=endpoints, discovery_interval_s=0.02, max_subscriptions=5)
    )
    started(collector, store)
    try:
        wait_for(lambda: errors(store, "too_many_subscriptions") >= 3, "the cap")
        assert list(collector._subscriptions) == [e.endpoint for e in endpoints[:5]]
    finally:
        collector.stop(2)


def test_socket_exhaustion_is_a_counted_error_never_the_end_of_the_thread() -> None:
    """400 forged engines ended the thread at 342 subscriptions (`Too many open files`).
    A context that allows 10 sockets stands in for the exhausted process (the daemon
    under a lowered RLIMIT_NOFILE: tests/faults/test_hostile_kv_events.py)."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    context.set(zmq.MAX_SOCKETS, 10)
    endpoints = tuple(KvEventsEndpoint(f"tcp://127.0.0.1:{31_000 + i}") for i in range(40))
    store = StateStore()
    collector = KvEventsCollector(
        KvEventsSettings(endpoints=endpoints, discovery_interval_s=0.02), context
    )
    with capture_logs() as logs:
        started(collector, store)
        try:
            wait_for(lambda: errors(store, "subscribe_failed") >= 40, "failed subscriptions")
            assert collector._thread is not None
            assert collector._thread.is_alive()
            assert 1 <= len(collector._subscriptions) <= 4  # a SUB and 2 monitor sockets each
        finally:
            collector.stop(2)
            context.destroy(linger=0)
    failed = [e for e in logs if e["event"] == "kv_events_subscribe_failed"]
    assert len(failed) == 1
    assert errors(store, "internal_error") == 0


def test_a_sub_dropped_for_an_oversized_batch_is_opened_again(
    hostile: StandInPublisher,
) -> None:
    collector, store = running(
        KvEventsEndpoint(hostile.endpoint, None, "0"),
        max_message_bytes=64 * 1024,
        reopen_after_s=0.2,
    )
    try:
        hostile.wait_for_subscriber()
        hostile.publish(0, STREAM[0])
        wait_for(lambda: view(store) is not None and view(store).up, "connected")  # type: ignore[union-attr]
        hostile.publish(1, b"\x00" * 2**20)  # libzmq drops the connection, for good
        wait_for(lambda: errors(store, "resubscribed") == 1, "the SUB opened again")
        # XPUB may fold the new subscription into the old one's: publish until it arrives.
        deadline = time.monotonic() + 10
        sequence = 2
        while view(store).events_received_total < events_in(STREAM[:2]):  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no batch after the SUB was opened again"
            hostile.publish(sequence, STREAM[1])
            sequence += 1
            time.sleep(0.05)
        assert view(store).up  # type: ignore[union-attr]
    finally:
        collector.stop(2)


def test_concurrent_replays_are_capped() -> None:
    stuck = [StandInPublisher(answer_replays=False) for _ in range(3)]
    collector, store = running(
        *(KvEventsEndpoint(p.endpoint, p.replay_endpoint, str(i)) for i, p in enumerate(stuck)),
        replay_timeout_s=60.0,
        max_replays=2,
    )
    try:
        for publisher in stuck:
            publisher.wait_for_subscriber()
            publisher.publish(5, STREAM[0])  # joined mid-stream: a replay from 0
        wait_for(lambda: errors(store, "too_many_replays") == 1, "the replay cap")
        assert collector.replay_slots.active == 2
        # The two replays taken reach their publishers' threads a moment after the slots.
        wait_for(lambda: sum(len(p.replays) for p in stuck) == 2, "two replays asked")
        assert collector.replay_slots.active == 2
    finally:
        collector.stop(2)
        for publisher in stuck:
            publisher.close()


def test_the_residency_bounds_hit_are_counted(hostile: StandInPublisher) -> None:
    collector, store = running(
        KvEventsEndpoint(hostile.endpoint, None, "0"), max_blocks=1_000, max_groups=4
    )
    try:
        hostile.wait_for_subscriber()
        for sequence in range(10):
            events = [
                {
                    "type": "BlockStored",
                    "block_hashes": list(range(sequence * 500, sequence * 500 + 500)),
                    "group_idx": sequence,
                    "medium": medium,
                }
                for medium in ("GPU", "CPU", "STORAGE", "DISK", "TAPE")
            ]
            hostile.publish(sequence, msgspec.msgpack.encode([1.0, events]))
        wait_for(lambda: errors(store, "too_many_groups") > 0, "the group cap")
        wait_for(lambda: view(store).events_received_total == 50, "every batch")  # type: ignore[union-attr]
        found = view(store)
        assert found is not None
        assert sum(p.resident_blocks for p in found.pools) == 1_000
        assert len({p.group for p in found.pools}) == 4
        assert errors(store, "too_many_media") > 0
        assert errors(store, "pool_overflow") > 0
    finally:
        collector.stop(2)
