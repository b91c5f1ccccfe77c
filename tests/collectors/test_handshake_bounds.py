"""Issue 25's handshake attacks against the collector: bye tokens held per instance, engine
indices held by their live instance, per-engine rates, and the groups and workers budget.

Over real ZMQ sockets (the Listener of test_handshake_hostile); where the rule depends on
time (an instance leaves by going silent), the receiver runs with a clock the test moves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from exporter.collectors import HandshakeReceiver, HandshakeSettings
from exporter.collectors.handshake_settings import (
    DEFAULT_MAX_GROUPS,
    DEFAULT_MAX_SERIES_ROWS,
    DEFAULT_MAX_WORKERS,
)
from exporter.collectors.registry import DEFAULT_MAX_ENGINES
from exporter.handshake_wire import GroupExtra, ReadyExtras, bye_message, ready_v2_message
from exporter.state import StateStore
from tests.collectors.test_handshake import private_endpoint
from tests.collectors.test_handshake_hostile import TOKEN, Listener, ready_bytes
from tests.state.test_store import Clock

OTHER = "another-process-secret-32-chars!"
ENDPOINT = "ipc:///run/kvcap/handshake.sock"
GROUP = GroupExtra("FullAttentionSpec", 32, 16, 131072, 4 * 131072)


def with_groups(groups: int, workers: int = 1) -> ReadyExtras:
    return ReadyExtras(groups=[GROUP] * groups, bytes_per_block_per_worker=[131072] * workers)


@pytest.fixture
def listener(tmp_path: Path) -> Any:
    with Listener(private_endpoint(tmp_path)) as started:
        yield started


def instances(listener: Listener) -> dict[str, str | None]:
    return {view.engine: view.instance_id for view in listener.store.snapshot().engines}


def test_a_heartbeat_of_another_process_cannot_swap_the_bye_token(listener: Listener) -> None:
    listener.send(ready_v2_message(ready_bytes(0), 5.0, bye_token=TOKEN))
    listener.until(lambda: listener.engines() == ["0"])
    # The red team's attack: a heartbeat of the engine's instance (read from /metrics)
    # with a token of its own, or none, then a bye with that token, or none.
    listener.send(ready_v2_message(ready_bytes(0), 5.0, bye_token=OTHER))
    listener.send(ready_v2_message(ready_bytes(0), 5.0))
    listener.until(lambda: listener.errors("token_mismatch") == 2)
    listener.send(bye_message(0, "i0", OTHER))
    listener.send(bye_message(0, "i0"))
    listener.until(lambda: listener.errors("bye_refused") == 2)
    assert instances(listener) == {"0": "i0"}
    listener.send(bye_message(0, "i0", TOKEN))  # the engine's own bye still works
    listener.until(lambda: listener.engines() == [])


def test_another_instance_cannot_take_a_live_engine(listener: Listener) -> None:
    listener.send(ready_v2_message(ready_bytes(0), 5.0, bye_token=TOKEN))
    listener.until(lambda: listener.engines() == ["0"])
    for forged in range(20):  # a new instance id on every message, with or without a token
        token = OTHER if forged % 2 else None
        listener.send(ready_v2_message(ready_bytes(0, instance_id=f"x{forged}"), 5.0, None, token))
    listener.send(bye_message(0, "x1", OTHER))
    listener.until(
        lambda: listener.errors("instance_conflict") == 20 and listener.errors("bye_refused") == 1
    )
    assert instances(listener) == {"0": "i0"}
    listener.send(ready_v2_message(ready_bytes(0), 5.0, bye_token=TOKEN))  # still current
    listener.until(lambda: listener.store.snapshot().engines[0].updated_at_s > 0)
    assert listener.errors("token_mismatch") == 0


def test_an_instance_that_sent_no_token_never_gets_one(listener: Listener) -> None:
    listener.send(ready_v2_message(ready_bytes(0), 5.0))  # a v2 plugin from before the token
    listener.until(lambda: listener.engines() == ["0"])
    listener.send(ready_v2_message(ready_bytes(0), 5.0, bye_token=OTHER))
    listener.until(lambda: listener.errors("token_mismatch") == 1)
    listener.send(bye_message(0, "i0"))  # its tokenless bye is accepted, as before
    listener.until(lambda: listener.engines() == [])


def receiver(clock: Clock, **settings: Any) -> tuple[HandshakeReceiver, StateStore]:
    store = StateStore()
    return HandshakeReceiver(ENDPOINT, store, HandshakeSettings(**settings), clock), store


def test_an_instance_holds_its_engine_until_it_goes_stale_or_says_bye() -> None:
    clock = Clock()
    handshake, store = receiver(clock)
    with capture_logs():
        handshake.handle(ready_v2_message(ready_bytes(0), 1.0, bye_token=TOKEN))
        clock.now += 2.9  # within 3 intervals: live
        handshake.handle(ready_v2_message(ready_bytes(0, instance_id="new"), 1.0, None, OTHER))
        assert store.snapshot().errors == {("handshake", "instance_conflict"): 1}
        clock.now += 0.2  # silent past its stale window: it left, the restart is taken
        handshake.handle(ready_v2_message(ready_bytes(0, instance_id="new"), 1.0, None, OTHER))
        assert [v.instance_id for v in store.snapshot().engines] == ["new"]
        assert store.snapshot().restarts == {"0": 1}
        # A bye of the new instance needs the new token; then the index is free at once.
        handshake.handle(bye_message(0, "new", TOKEN))
        handshake.handle(bye_message(0, "new", OTHER))
        handshake.handle(ready_v2_message(ready_bytes(0, instance_id="third"), 1.0))
    assert [v.instance_id for v in store.snapshot().engines] == ["third"]
    assert store.snapshot().errors[("handshake", "bye_refused")] == 1


def test_a_forged_fast_heartbeat_holds_its_index_at_least_a_second() -> None:
    clock = Clock()
    handshake, store = receiver(clock)
    with capture_logs():
        handshake.handle(ready_v2_message(ready_bytes(5, instance_id="a"), 0.05))
        clock.now += 0.5  # past 3 of its 50 ms intervals, within the 1 s floor
        handshake.handle(ready_v2_message(ready_bytes(5, instance_id="b"), 0.05))
        assert store.snapshot().errors == {("handshake", "instance_conflict"): 1}
        clock.now += 0.6
        handshake.handle(ready_v2_message(ready_bytes(5, instance_id="b"), 0.05))
    assert [v.instance_id for v in store.snapshot().engines] == ["b"]


def test_one_engines_flood_leaves_the_others_their_heartbeats() -> None:
    clock = Clock()
    handshake, store = receiver(clock, max_messages_per_s=50.0)
    with capture_logs():
        for rank in range(8):
            handshake.handle(ready_v2_message(ready_bytes(rank), 5.0))
        for second in range(10):
            clock.now += 1.0
            for _ in range(300):  # engine 0's own instance, 300 a second
                handshake.handle(ready_v2_message(ready_bytes(0), 5.0))
            if second % 5 == 4:
                for rank in range(1, 8):
                    handshake.handle(ready_v2_message(ready_bytes(rank), 5.0))
            handshake.sweep()
    errors = store.snapshot().errors
    # 20 a second of engine 0 pass, the rest are its own engine's refusals.
    assert errors[("handshake", "engine_rate_limited")] == 3000 - 200
    assert ("handshake", "rate_limited") not in errors
    assert not any(view.stale for view in store.snapshot().engines)


def test_due_heartbeats_pass_a_spent_global_budget() -> None:
    clock = Clock()
    handshake, store = receiver(clock, max_messages_per_s=10.0)
    with capture_logs():
        for rank in range(40):  # 10 admitted, then the global budget is spent
            handshake.handle(ready_v2_message(ready_bytes(rank), 5.0))
        assert len(store.snapshot().engines) == 10
        for _ in range(30):  # a flood of 40 new engines a second never lets up
            clock.now += 1.0
            for rank in range(40, 80):
                handshake.handle(ready_v2_message(ready_bytes(rank), 5.0))
            if int(clock.now) % 5 == 0:
                for rank in range(10):
                    handshake.handle(ready_v2_message(ready_bytes(rank), 5.0))
            handshake.sweep()
    fresh = [view.engine for view in store.snapshot().engines if not view.stale]
    assert {str(rank) for rank in range(10)} <= set(fresh)


def test_groups_workers_and_their_sum_are_bounded(listener: Listener) -> None:
    assert (DEFAULT_MAX_ENGINES, DEFAULT_MAX_GROUPS, DEFAULT_MAX_WORKERS) == (256, 32, 256)
    assert DEFAULT_MAX_SERIES_ROWS == 2048
    listener.send(ready_v2_message(ready_bytes(0), 5.0, with_groups(33)))
    listener.send(ready_v2_message(ready_bytes(1), 5.0, with_groups(1, workers=257)))
    listener.until(
        lambda: listener.errors("too_many_groups") == 1 and listener.errors("too_many_workers") == 1
    )
    assert listener.engines() == []


def test_the_series_budget_refuses_whole_engines_and_frees_on_bye(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/kvcap/handshake.sock"
    with Listener(endpoint, max_series_rows=100) as listener:
        for rank in range(6):  # 32 groups + 1 worker each: three fit in 100
            listener.send(ready_v2_message(ready_bytes(rank), 5.0, with_groups(32), TOKEN))
        listener.until(lambda: listener.errors("series_budget") == 3)
        assert listener.engines() == ["0", "1", "2"]
        groups = [len(view.capacity.groups) for view in listener.store.snapshot().engines]
        assert groups == [32, 32, 32]  # never half applied
        # An engine that grows past the budget keeps what it had.
        listener.send(ready_v2_message(ready_bytes(2), 5.0, with_groups(32, workers=3), TOKEN))
        listener.until(lambda: listener.errors("series_budget") == 4)
        listener.send(bye_message(0, "i0", TOKEN))
        listener.send(ready_v2_message(ready_bytes(5), 5.0, with_groups(32), TOKEN))
        listener.until(lambda: listener.engines() == ["1", "2", "5"])


def test_the_held_instances_own_process_may_start_a_new_instance_at_once() -> None:
    clock = Clock()
    handshake, store = receiver(clock)
    with capture_logs():
        handshake.handle(ready_v2_message(ready_bytes(0), 5.0, bye_token=TOKEN))
        # Its token proves the process: its new instance needs no wait for the old to go stale.
        handshake.handle(ready_v2_message(ready_bytes(0, instance_id="next"), 5.0, None, TOKEN))
    assert [v.instance_id for v in store.snapshot().engines] == ["next"]
    assert store.snapshot().errors == {}
    assert store.snapshot().restarts == {"0": 1}


def test_devices_count_against_the_engine_and_the_budget(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/kvcap/handshake.sock"
    with Listener(endpoint, max_series_rows=600) as listener:
        many = ReadyExtras(devices=["GPU-" + "d" * 200] * 257)
        listener.send(ready_v2_message(ready_bytes(0), 5.0, many))
        listener.until(lambda: listener.errors("too_many_devices") == 1)
        node = ReadyExtras(devices=["GPU-" + "d" * 200] * 250)
        for rank in range(4):  # 250 rows each: two fit in 600
            listener.send(ready_v2_message(ready_bytes(rank), 5.0, node))
        listener.until(lambda: listener.errors("series_budget") == 2)
        assert listener.engines() == ["0", "1"]
