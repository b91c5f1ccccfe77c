"""The state store: merging sources, staleness, restarts and vanished engines."""

from __future__ import annotations

from dataclasses import replace

from structlog.testing import capture_logs

from exporter.capacity import EngineCapacity
from exporter.collectors import collector_priority
from exporter.state import EngineReport, PoolView, ResidencyView, StateStore
from tests.state.helpers import deployment, reports


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_publish_makes_engines_visible_with_vllms_numbers() -> None:
    store = StateStore()
    store.publish("vllm_http", "http://a", reports())
    snapshot = store.snapshot()
    assert [v.engine for v in snapshot.engines] == ["0", "1"]
    expected = deployment("gemma-3-27b-text-dp2-tp2")["engines"][0]
    view = snapshot.engines[0]
    assert view.capacity_source == "reported"
    assert view.capacity.kv_cache_size_tokens == expected["kv_cache_size_tokens"]
    assert view.derived_kv_cache_size_tokens == expected["kv_cache_size_tokens"]
    assert view.capacity_mismatch is False
    assert view.used_tokens == expected["used_tokens_expected"]
    assert len(view.capacity.groups) == 7


def test_snapshots_are_immutable_versions() -> None:
    store = StateStore()
    first = store.snapshot()
    store.publish("vllm_http", "http://a", reports())
    second = store.snapshot()
    assert second.version > first.version
    assert first.engines == ()


def test_failure_keeps_last_good_data_marked_stale_and_recovers() -> None:
    clock = Clock()
    store = StateStore(clock)
    store.publish("vllm_http", "http://a", reports())
    clock.now += 5
    store.fail("vllm_http", "http://a", "connection_refused", "refused")
    store.fail("vllm_http", "http://a", "connection_refused", "refused")
    snapshot = store.snapshot()
    assert all(v.stale for v in snapshot.engines)
    assert snapshot.engines[0].capacity.kv_cache_size_tokens is not None
    assert snapshot.errors[("vllm_http", "connection_refused")] == 2
    assert snapshot.collectors[0].up is False
    assert snapshot.collectors[0].last_success_s == 1000.0
    store.publish("vllm_http", "http://a", reports())
    snapshot = store.snapshot()
    assert not any(v.stale for v in snapshot.engines)
    assert snapshot.collectors[0].up


def test_vanished_engine_is_dropped_and_restart_replaces_instance() -> None:
    store = StateStore()
    store.publish("vllm_http", "http://a", reports())
    store.publish("vllm_http", "http://a", reports()[:1])
    assert [v.engine for v in store.snapshot().engines] == ["0"]
    store.publish("vllm_http", "http://a", reports(instance_id="2"))
    assert {v.instance_id for v in store.snapshot().engines} == {"2"}


def test_engines_come_and_go_one_at_a_time() -> None:
    store = StateStore()
    for report in reports():
        store.update_engine("handshake", "ipc://x", report)
    assert [v.engine for v in store.snapshot().engines] == ["0", "1"]
    # The word of another instance of the engine removes nothing.
    store.remove_engine("handshake", "ipc://x", "1", "an older instance")
    assert [v.engine for v in store.snapshot().engines] == ["0", "1"]
    store.remove_engine("handshake", "ipc://x", "1", "1")
    assert [v.engine for v in store.snapshot().engines] == ["0"]
    store.remove_engine("handshake", "ipc://unknown", "0", "1")
    assert [v.engine for v in store.snapshot().engines] == ["0"]


def test_a_restart_seen_by_two_collectors_is_logged_once() -> None:
    store = StateStore(priority=collector_priority())
    store.publish("vllm_http", "http://a", reports())
    for report in reports():
        store.update_engine("handshake", "ipc://x", report)
    restarted = replace(
        reports(instance_id="2")[0],
        reported=replace(reports()[0].reported, num_gpu_blocks=999),  # type: ignore[type-var]
    )
    with capture_logs() as logs:
        store.update_engine("handshake", "ipc://x", restarted)
        # The HTTP collector sees the new block count a poll later.
        http = [replace(r, instance_id=None) for r in reports()]
        http[0] = replace(http[0], reported=restarted.reported)
        store.publish("vllm_http", "http://a", http)
        store.publish("vllm_http", "http://a", http)
    events = [(e["event"], e.get("engine")) for e in logs]
    assert events == [("engine_restarted", "0")]
    assert store.snapshot().engines[0].instance_id == "2"


def test_priority_is_the_collectors_registration_not_the_states() -> None:
    http = [
        replace(r, reported=EngineCapacity(kv_cache_size_tokens=1, num_gpu_blocks=2))
        for r in reports()
    ]
    for priority, tokens in (({"vllm_http": 0, "handshake": 1}, 1), (collector_priority(), None)):
        store = StateStore(priority=priority)
        store.publish("vllm_http", "http://a", http)
        store.publish("handshake", "ipc://x", reports())
        view = store.snapshot().engines[0]
        expected = tokens or reports()[0].reported.kv_cache_size_tokens  # type: ignore[union-attr]
        assert view.capacity.kv_cache_size_tokens == expected


def test_handshake_values_win_over_http_ones_for_the_same_engine() -> None:
    store = StateStore(priority=collector_priority())
    http = [
        replace(r, reported=EngineCapacity(kv_cache_size_tokens=1, num_gpu_blocks=2))
        for r in reports()
    ]
    store.publish("vllm_http", "http://a", http)
    store.publish("handshake", "ipc://x", reports())
    views = store.snapshot().engines
    assert len(views) == 2
    assert views[0].collectors == ("handshake", "vllm_http")
    assert views[0].capacity.kv_cache_size_tokens == reports()[0].reported.kv_cache_size_tokens  # type: ignore[union-attr]


def test_mismatch_between_reported_and_derived_is_flagged() -> None:
    store = StateStore()
    wrong = [
        replace(r, reported=replace(r.reported, kv_cache_size_tokens=123))  # type: ignore[type-var]
        for r in reports()
    ]
    store.publish("vllm_http", "http://a", wrong)
    view = store.snapshot().engines[0]
    assert view.capacity.kv_cache_size_tokens == 123
    assert view.capacity_mismatch is True


def test_derived_only_engine_uses_derived_numbers() -> None:
    store = StateStore()
    derived_only = [
        EngineReport(engine=r.engine, model_name=r.model_name, derived=r.derived) for r in reports()
    ]
    store.publish("vllm_http", "http://a", derived_only)
    view = store.snapshot().engines[0]
    assert view.capacity_source == "derived"
    assert view.capacity_mismatch is None
    assert view.capacity.kv_cache_size_tokens == reports()[0].derived.kv_cache_size_tokens  # type: ignore[union-attr]


def test_readiness_waits_for_every_registered_target() -> None:
    store = StateStore()
    store.register_target("vllm_http", "http://a")
    store.register_target("vllm_http", "http://b")
    assert not store.snapshot().ready
    store.publish("vllm_http", "http://a", reports())
    assert not store.snapshot().ready
    store.fail("vllm_http", "http://b", "timeout", "slow")
    assert store.snapshot().ready


def test_engines_sort_numerically() -> None:
    store = StateStore()
    many = [replace(reports()[0], engine=str(i)) for i in (10, 2, 1)]
    store.publish("vllm_http", "http://a", many)
    assert [v.engine for v in store.snapshot().engines] == ["1", "2", "10"]


def test_listeners_hear_of_each_change_of_the_data_not_of_rejected_input() -> None:
    store = StateStore()
    heard: list[int] = []
    store.subscribe(lambda: heard.append(store.snapshot().version))
    engines = reports("gemma-3-27b-text-dp2-tp2")
    store.register_target("vllm_http", "http://a")  # a status only: nothing to render yet
    store.publish("vllm_http", "http://a", engines)
    store.update_engine("handshake", "ipc://x", engines[0])
    store.remove_engine("handshake", "ipc://x", "9", None)  # no such engine: no change
    with capture_logs():
        store.reject("handshake", "ipc://x", "malformed_frame", "garbage")
        store.fail("vllm_http", "http://a", "timeout", "slow")
    store.publish_gpus("nvml", "node", [])
    assert len(heard) == 4
    # Each heard the snapshot its change made, in order.
    assert heard == sorted(heard)
    assert heard[-1] == store.snapshot().version


def test_a_rejected_input_replaces_only_the_counts_of_the_snapshot() -> None:
    store = StateStore()
    store.publish("vllm_http", "http://a", reports("gemma-3-27b-text-dp2-tp2"))
    before = store.snapshot()
    with capture_logs():
        store.reject("handshake", "ipc://x", "malformed_frame", "garbage")
        store.reject("handshake", "ipc://x", "malformed_frame", "garbage", count=3)
    after = store.snapshot()
    assert after.version == before.version + 2
    assert after.errors == {("handshake", "malformed_frame"): 4}
    assert before.errors == {}  # the old snapshot is not changed
    assert after.engines is before.engines
    assert after.collectors is before.collectors
    assert after.headroom_tokens is before.headroom_tokens


def residency(engine: str, resident: int) -> ResidencyView:
    pool = PoolView(0, "GPU", resident, 16, "full_attention", resident, 0, (0,) * 14, 0.0)
    return ResidencyView(engine, (pool,), 100, False, None, 0, resident, {}, 0, True)


def test_residency_records_join_the_snapshot_and_idle_engines_keep_theirs() -> None:
    store = StateStore()
    heard: list[int] = []
    store.subscribe(lambda: heard.append(store.snapshot().version))
    first, second = residency("10", 3), residency("2", 5)
    store.publish_residency("kv_events", [first, second])
    assert store.snapshot().residency == (second, first)  # in engine order
    moved = residency("10", 4)
    store.publish_residency("kv_events", [moved])
    found = store.snapshot().residency
    assert found[0] is second  # the same record: a renderer keeps its bytes
    assert found[1] is moved
    assert len(heard) == 2
    store.publish_residency("kv_events", [])  # nothing moved: no new snapshot
    assert len(heard) == 2


def test_the_store_counts_each_engine_restart_once_whichever_collector_sees_it() -> None:
    store = StateStore(priority=collector_priority())
    one = reports()[0]
    with capture_logs():
        store.publish("handshake", "ipc://h", [replace(one, instance_id="a")])
        assert store.snapshot().restarts == {}
        store.publish("handshake", "ipc://h", [replace(one, instance_id="b")])
        store.publish("vllm_http", "http://a", [replace(one, instance_id="b")])
    assert store.snapshot().restarts == {one.engine: 1}


def test_a_view_merges_every_field_of_the_reports_first_known_first() -> None:
    store = StateStore(priority={"handshake": 0, "vllm_http": 1})
    base = reports()[0]
    store.publish(
        "handshake", "ipc://h", [replace(base, model_name="", platform=None, local_rank=0)]
    )
    store.publish(
        "vllm_http", "http://a", [replace(base, model_name="m", platform="cuda", local_rank=3)]
    )
    (view,) = [v for v in store.snapshot().engines if v.engine == base.engine]
    assert view.model_name == "m"  # "" is unknown
    assert view.platform == "cuda"
    assert view.local_rank == 0  # 0 is known: the best collector's
    assert view.collectors == ("handshake", "vllm_http")
