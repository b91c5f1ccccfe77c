"""The kv_events collector on real ZMQ sockets: order, gaps, replay, restarts, discovery.

The publisher is tests/kv_events_publisher.py (vLLM's protocol, checked live in
tests/live); the batches are the ones a live vLLM 0.32.0 sent (tests/fixtures/kv_events).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from exporter.capacity import EngineCapacity
from exporter.collectors import KvEventsCollector, KvEventsSettings, follow_engines
from exporter.kv_events_wire import decode_batch
from exporter.prefix_cache import EngineResidency
from exporter.state import EngineReport, KvEventsEndpoint, ResidencyView, StateStore
from tests import support
from tests.kv_events_data import EVICTIONS, SHARED_PREFIX, frames
from tests.kv_events_publisher import StandInPublisher

STREAM = [payload for name in (SHARED_PREFIX, EVICTIONS) for _, _, payload in frames(name)]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    """The suite's wait_for, with the patience these streams need."""
    support.wait_for(condition, timeout_s, what, interval_s=0.02)


@pytest.fixture
def publisher() -> Iterator[StandInPublisher]:
    found = StandInPublisher()
    yield found
    found.close()


def running(
    *endpoints: KvEventsEndpoint, **settings: object
) -> tuple[KvEventsCollector, StateStore]:
    """A collector of `endpoints` (discovery every 0.05 s), started on a store of its own."""
    store = StateStore()
    collector = KvEventsCollector(
        KvEventsSettings(endpoints=endpoints, discovery_interval_s=0.05, **settings)  # type: ignore[arg-type]
    )
    started(collector, store)
    return collector, store


@contextmanager
def subscribed(
    publisher: StandInPublisher, *, replay: bool = False, **settings: object
) -> Iterator[StateStore]:
    """The store of a collector subscribed to `publisher` as engine 0 (to its replay endpoint
    too when `replay`); the collector is stopped afterwards."""
    endpoint = KvEventsEndpoint(
        publisher.endpoint, publisher.replay_endpoint if replay else None, "0"
    )
    collector, store = running(endpoint, **settings)
    try:
        publisher.wait_for_subscriber()
        yield store
    finally:
        collector.stop(2)


def started(collector: KvEventsCollector, store: StateStore) -> None:
    """Wired to the store as the daemon wires it."""
    follow_engines(store, [collector])
    collector.start(store)


def view(store: StateStore, engine: str = "0") -> ResidencyView | None:
    """The residency the collector last published into the state."""
    return next((v for v in store.snapshot().residency if v.engine == engine), None)


def received(store: StateStore, count: int) -> Callable[[], bool]:
    def check() -> bool:
        found = view(store)
        return found is not None and found.events_received_total >= count

    return check


def events_in(payloads: list[bytes]) -> int:
    return sum(len(decode_batch(p).events) for p in payloads)


def reference(payloads: list[bytes]) -> tuple[int, int, int]:
    """(resident, stored, removed) of applying `payloads` in order, without the collector."""
    residency = EngineResidency("0")
    for payload in payloads:
        residency.apply(decode_batch(payload))
    (pool,) = residency.view().pools
    return pool.resident_blocks, pool.stored_total, pool.removed_total


def totals(found: ResidencyView) -> tuple[int, int, int]:
    (pool,) = found.pools
    return pool.resident_blocks, pool.stored_total, pool.removed_total


def test_an_in_order_stream_is_applied_exactly(publisher: StandInPublisher) -> None:
    with subscribed(publisher) as store:
        for sequence, payload in enumerate(STREAM):
            publisher.publish(sequence, payload)
        wait_for(received(store, events_in(STREAM)), "every event")
        found = view(store)
        assert found is not None
        assert totals(found) == reference(STREAM)
        assert not found.approximate
        assert found.up
        status = next(s for s in store.snapshot().collectors if s.collector == "kv_events")
        assert status.up


def test_a_gap_is_filled_from_the_replay_endpoint(publisher: StandInPublisher) -> None:
    with subscribed(publisher, replay=True) as store:
        for sequence, payload in enumerate(STREAM):
            publisher.publish(sequence, payload, send=sequence not in (20, 21, 22))
        wait_for(received(store, events_in(STREAM)), "every event, replayed ones too")
        found = view(store)
        assert found is not None
        assert publisher.replays == [20]
        assert found.gaps_total == 1
        assert totals(found) == reference(STREAM)
        assert not found.approximate
        assert "missed" not in found.dropped_total


def test_a_gap_without_replay_is_counted_and_marked_approximate(
    publisher: StandInPublisher,
) -> None:
    with subscribed(publisher) as store:
        sent = [p for s, p in enumerate(STREAM) if s not in (20, 21, 22)]
        for sequence, payload in enumerate(STREAM):
            publisher.publish(sequence, payload, send=sequence not in (20, 21, 22))
        wait_for(received(store, events_in(sent)), "the events sent")
        found = view(store)
        assert found is not None
        assert found.gaps_total == 1
        assert found.dropped_total["missed"] == 3
        assert found.approximate
        assert found.approximate_reason == "batches were lost (sequence gap)"


def test_a_sidecar_joining_mid_stream_replays_from_the_start(
    publisher: StandInPublisher,
) -> None:
    for sequence, payload in enumerate(STREAM[:12]):
        publisher.publish(sequence, payload, send=False)  # sent before kvcap started
    with subscribed(publisher, replay=True) as store:
        for sequence, payload in enumerate(STREAM[12:], start=12):
            publisher.publish(sequence, payload)
        wait_for(received(store, events_in(STREAM)), "every event")
        found = view(store)
        assert found is not None
        assert publisher.replays == [0]
        assert totals(found) == reference(STREAM)
        assert not found.approximate


def test_joining_mid_stream_without_replay_is_approximate(publisher: StandInPublisher) -> None:
    with subscribed(publisher) as store:
        for sequence, payload in enumerate(STREAM[12:], start=12):
            publisher.publish(sequence, payload)
        wait_for(received(store, events_in(STREAM[12:])), "the events sent")
        found = view(store)
        assert found is not None
        assert found.approximate_reason == "joined the stream after its start"
        assert found.dropped_total["missed"] == 12


def test_a_new_publisher_starts_the_residency_from_zero(publisher: StandInPublisher) -> None:
    with subscribed(publisher) as store:
        for sequence, payload in enumerate(STREAM[:12]):
            publisher.publish(sequence, payload)
        wait_for(received(store, events_in(STREAM[:12])), "the first run's events")
        publisher.publish(0, STREAM[0])  # the engine restarted: its sequence starts again
        wait_for(received(store, events_in(STREAM[:12]) + events_in(STREAM[:1])), "restart")
        found = view(store)
        assert found is not None
        assert found.cleared_total == 1
        assert totals(found)[0] == reference(STREAM[:1])[0] == 4
        assert not found.approximate


def test_malformed_messages_are_counted_and_the_stream_goes_on(
    publisher: StandInPublisher,
) -> None:
    with subscribed(publisher) as store:
        publisher.publish(0, STREAM[0])
        publisher.pub.send_multipart([b"", b"\x00" * 8, b"\xc1 not msgpack"])
        publisher.pub.send_multipart([b"one frame"])
        publisher.publish(1, STREAM[1])
        wait_for(received(store, events_in(STREAM[:2])), "the good events")
        found = view(store)
        assert found is not None
        assert found.dropped_total["malformed_batch"] == 2
        assert found.approximate
        errors = store.snapshot().errors
        assert errors[("kv_events", "malformed_batch")] == 2


def test_endpoints_pool_size_and_restarts_come_from_the_engine_state(
    publisher: StandInPublisher,
) -> None:
    store = StateStore()
    endpoint = KvEventsEndpoint(publisher.endpoint, publisher.replay_endpoint, "0")

    def report(instance: str) -> EngineReport:
        return EngineReport(
            engine="0",
            model_name="m",
            instance_id=instance,
            reported=EngineCapacity(num_gpu_blocks=40),
            kv_events=endpoint,
        )

    store.publish("handshake", "ipc://h", [report("a")])
    collector = KvEventsCollector(KvEventsSettings(discovery_interval_s=0.05))
    started(collector, store)
    try:
        publisher.wait_for_subscriber()
        for sequence, payload in enumerate(STREAM[:12]):
            publisher.publish(sequence, payload)
        wait_for(received(store, events_in(STREAM[:12])), "the events")
        wait_for(lambda: view(store).pool_blocks == 40, "the pool size")  # type: ignore[union-attr]
        store.publish("handshake", "ipc://h", [report("b")])
        wait_for(lambda: view(store).cleared_total == 1, "the restart")  # type: ignore[union-attr]
        found = view(store)
        assert found is not None
        assert totals(found)[0] == 0
    finally:
        collector.stop(2)


def test_an_engine_publishing_on_a_new_endpoint_starts_from_zero(
    publisher: StandInPublisher,
) -> None:
    moved = StandInPublisher(replay=False)
    collector, store = running(
        KvEventsEndpoint(publisher.endpoint, None, "0"), KvEventsEndpoint(moved.endpoint, None, "0")
    )
    try:
        publisher.wait_for_subscriber()
        moved.wait_for_subscriber()
        for sequence, payload in enumerate(STREAM[:12]):
            publisher.publish(sequence, payload)
        wait_for(received(store, events_in(STREAM[:12])), "the first publisher's events")
        moved.publish(0, STREAM[0])  # vLLM restarted with another port
        wait_for(received(store, events_in(STREAM[:13])), "the new publisher's batch")
        found = view(store)
        assert found is not None
        assert found.cleared_total == 1
        assert totals(found)[0] == 4
    finally:
        collector.stop(2)
        moved.close()


def test_a_batch_past_the_message_size_is_refused_and_the_publisher_reported_down(
    publisher: StandInPublisher,
) -> None:
    with subscribed(publisher, max_message_bytes=64 * 1024) as store:
        publisher.publish(0, STREAM[0])
        wait_for(received(store, events_in(STREAM[:1])), "the first batch")
        # 1 MiB against 64 KiB: libzmq drops the connection at its header (for good: a
        # protocol error is not reconnected), so none of it is read.
        publisher.publish(1, b"\x00" * 2**20)
        wait_for(lambda: not view(store).up, "the publisher reported down")  # type: ignore[union-attr]
        assert store.snapshot().errors[("kv_events", "disconnected")] == 1
        found = view(store)
        assert found is not None
        assert totals(found) == reference(STREAM[:1])
