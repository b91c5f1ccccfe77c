"""The state store: merging sources, staleness, restarts and vanished engines."""

from __future__ import annotations

from dataclasses import replace

from exporter.state import EngineReport, ReportedCapacity, StateStore
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
    assert view.kv_cache_size_tokens == expected["kv_cache_size_tokens"]
    assert view.derived_kv_cache_size_tokens == expected["kv_cache_size_tokens"]
    assert view.capacity_mismatch is False
    assert view.used_tokens == expected["used_tokens_expected"]
    assert len(view.groups) == 7


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
    assert snapshot.engines[0].kv_cache_size_tokens is not None
    assert snapshot.errors[("vllm_http", "connection_refused")] == 2
    assert snapshot.sources[0].up is False
    assert snapshot.sources[0].last_success_s == 1000.0
    store.publish("vllm_http", "http://a", reports())
    snapshot = store.snapshot()
    assert not any(v.stale for v in snapshot.engines)
    assert snapshot.sources[0].up


def test_vanished_engine_is_dropped_and_restart_replaces_instance() -> None:
    store = StateStore()
    store.publish("vllm_http", "http://a", reports())
    store.publish("vllm_http", "http://a", reports()[:1])
    assert [v.engine for v in store.snapshot().engines] == ["0"]
    store.publish("vllm_http", "http://a", reports(instance_id="2"))
    assert {v.instance_id for v in store.snapshot().engines} == {"2"}


def test_forget_removes_one_engine_or_all() -> None:
    store = StateStore()
    store.publish("handshake", "ipc://x", reports())
    store.forget("handshake", "ipc://x", "1")
    assert [v.engine for v in store.snapshot().engines] == ["0"]
    store.forget("handshake", "ipc://x")
    assert store.snapshot().engines == ()


def test_handshake_values_win_over_http_ones_for_the_same_engine() -> None:
    store = StateStore()
    http = [
        replace(r, reported=ReportedCapacity(kv_cache_size_tokens=1, num_gpu_blocks=2))
        for r in reports()
    ]
    store.publish("vllm_http", "http://a", http)
    store.publish("handshake", "ipc://x", reports())
    views = store.snapshot().engines
    assert len(views) == 2
    assert views[0].sources == ("handshake", "vllm_http")
    assert views[0].kv_cache_size_tokens == reports()[0].reported.kv_cache_size_tokens  # type: ignore[union-attr]


def test_mismatch_between_reported_and_derived_is_flagged() -> None:
    store = StateStore()
    wrong = [
        replace(r, reported=replace(r.reported, kv_cache_size_tokens=123))  # type: ignore[type-var]
        for r in reports()
    ]
    store.publish("vllm_http", "http://a", wrong)
    view = store.snapshot().engines[0]
    assert view.kv_cache_size_tokens == 123
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
    assert view.kv_cache_size_tokens == reports()[0].derived.kv_cache_size_tokens  # type: ignore[union-attr]


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
