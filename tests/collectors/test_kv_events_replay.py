"""The kv_events collector's replays on real ZMQ sockets: one engine's replay that answers
late or never holds up only that engine's stream, ends at its deadline or its bounds, and
the batches held behind it are applied afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from exporter.state import KvEventsEndpoint, StateStore
from tests.collectors.test_kv_events import (
    STREAM,
    events_in,
    reference,
    running,
    totals,
    view,
    wait_for,
)
from tests.kv_events_publisher import StandInPublisher

JOINED_AT = 12  # the batches before it were sent before kvcap subscribed


@pytest.fixture
def stuck() -> Iterator[StandInPublisher]:
    """A publisher whose replay endpoint takes requests and never answers."""
    found = StandInPublisher(answer_replays=False)
    yield found
    found.close()


def events_of(store: StateStore, engine: str) -> int:
    found = view(store, engine)
    return 0 if found is None else found.events_received_total


def join_mid_stream(publisher: StandInPublisher, live: int = len(STREAM)) -> None:
    """The stream from its start, of which kvcap receives the batches from JOINED_AT on."""
    for sequence, payload in enumerate(STREAM[:live]):
        publisher.publish(sequence, payload, send=sequence >= JOINED_AT)


def test_a_replay_that_never_answers_stalls_only_its_own_engine(
    stuck: StandInPublisher,
) -> None:
    honest = StandInPublisher()
    collector, store = running(
        KvEventsEndpoint(stuck.endpoint, stuck.replay_endpoint, "0"),
        KvEventsEndpoint(honest.endpoint, honest.replay_endpoint, "1"),
        replay_timeout_s=120.0,
    )
    try:
        stuck.wait_for_subscriber()
        honest.wait_for_subscriber()
        join_mid_stream(stuck)
        wait_for(lambda: stuck.replays == [0], "engine 0's replay request")
        # Engine 1's whole stream is applied while engine 0's replay is outstanding
        # (its deadline is 120 s away; this waits at most 15).
        for sequence, payload in enumerate(STREAM):
            honest.publish(sequence, payload)
        wait_for(lambda: events_of(store, "1") >= events_in(STREAM), "engine 1's events")
        current = view(store, "1")
        assert current is not None
        assert totals(current) == reference(STREAM)
        assert not current.approximate
        # Engine 0 still waits for its replay: its live batches are held, none applied.
        assert events_of(store, "0") == 0
        assert stuck.replays == [0]
    finally:
        collector.stop(2)
        honest.close()


@pytest.mark.parametrize(
    ("timeout_s", "max_held"),
    [
        pytest.param(0.5, 10_000, id="deadline"),
        # 30 live batches against a bound of 5: the replay ends long before its deadline.
        pytest.param(120.0, 5, id="held-batches"),
    ],
)
def test_a_replay_ended_by_its_deadline_or_its_held_batches_counts_what_it_missed(
    stuck: StandInPublisher, timeout_s: float, max_held: int
) -> None:
    collector, store = running(
        KvEventsEndpoint(stuck.endpoint, stuck.replay_endpoint, "0"),
        replay_timeout_s=timeout_s,
        max_held_batches=max_held,
    )
    try:
        stuck.wait_for_subscriber()
        join_mid_stream(stuck)
        live = STREAM[JOINED_AT:]
        wait_for(lambda: events_of(store, "0") >= events_in(live), "the held batches")
        found = view(store, "0")
        assert found is not None
        if max_held > len(live):
            # Ended by its deadline: the request went out (the stand-in notes it on its own
            # thread, maybe after the replay ended).
            wait_for(lambda: stuck.replays == [0], "engine 0's replay request")
        else:
            # Cut short by the held batches, possibly before the request left the socket.
            assert stuck.replays in ([], [0])
        # The held batches are applied in order once the replay ends.
        assert totals(found) == reference(live)
        assert found.dropped_total["missed"] == JOINED_AT
        assert found.approximate_reason == "joined the stream after its start"
    finally:
        collector.stop(2)


def test_a_replayed_batch_past_the_message_size_is_refused() -> None:
    publisher = StandInPublisher()
    collector, store = running(
        KvEventsEndpoint(publisher.endpoint, publisher.replay_endpoint, "0"),
        replay_timeout_s=1.0,
        max_message_bytes=64 * 1024,
    )
    try:
        publisher.wait_for_subscriber()
        # Batch 0 of the replay is 1 MiB: libzmq drops the replay connection at its header,
        # so nothing of the replay is read; the live batches (under 64 KiB) are applied.
        publisher.publish(0, b"\x00" * 2**20, send=False)
        for sequence, payload in enumerate(STREAM[1:], start=1):
            publisher.publish(sequence, payload, send=sequence >= JOINED_AT)
        live = STREAM[JOINED_AT:]
        wait_for(lambda: events_of(store, "0") >= events_in(live), "the live batches")
        found = view(store, "0")
        assert found is not None
        assert publisher.replays == [0]
        assert totals(found) == reference(live)
        assert found.dropped_total["missed"] == JOINED_AT
        assert "malformed_batch" not in found.dropped_total
    finally:
        collector.stop(2)
        publisher.close()
