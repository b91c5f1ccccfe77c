"""The state's side of engine liveness: stale engines, forgotten targets, returning ones."""

from __future__ import annotations

from dataclasses import replace

from structlog.testing import capture_logs

from exporter.collectors import collector_priority
from exporter.state import StateStore
from exporter.state import store as store_module
from tests.state.helpers import reports

HANDSHAKE = ("handshake", "ipc:///run/kvcap/handshake.sock")
HTTP = ("vllm_http", "http://a")


def handshake_store() -> StateStore:
    store = StateStore(priority=collector_priority())
    store.publish(*HANDSHAKE, [])  # as the collector does when it starts listening
    for report in reports():
        store.update_engine(*HANDSHAKE, replace(report, instance_id="a"))
    return store


def test_a_silent_engine_is_stale_alone_and_fresh_when_heard_again() -> None:
    store = handshake_store()
    with capture_logs() as logs:
        store.mark_engine_stale(*HANDSHAKE, "0", "old-instance")  # not this engine: ignored
        assert [v.stale for v in store.snapshot().engines] == [False, False]
        store.mark_engine_stale(*HANDSHAKE, "0", "a")
        store.mark_engine_stale(*HANDSHAKE, "0", "a")
        assert [v.stale for v in store.snapshot().engines] == [True, False]
        assert store.snapshot().collectors[0].up
        store.update_engine(*HANDSHAKE, replace(reports()[0], instance_id="a"))
        assert [v.stale for v in store.snapshot().engines] == [False, False]
    assert [e["event"] for e in logs] == ["engine_stale", "engine_heard_again"]


def test_an_engine_stale_in_one_collector_is_fresh_while_another_reads_it() -> None:
    store = handshake_store()
    store.publish(*HTTP, reports())
    store.mark_engine_stale(*HANDSHAKE, "1", "a")
    assert [v.stale for v in store.snapshot().engines] == [False, False]
    store.fail(*HTTP, "timeout", "no answer")
    assert [v.stale for v in store.snapshot().engines] == [False, True]


def test_forget_drops_a_targets_engines_and_keeps_its_status() -> None:
    store = StateStore()
    store.publish(*HTTP, reports())
    store.fail(*HTTP, "connection_refused", "gone")
    with capture_logs() as logs:
        store.forget(*HTTP)
        store.forget(*HTTP)
    snapshot = store.snapshot()
    assert snapshot.engines == ()
    assert not snapshot.collectors[0].up
    assert snapshot.errors == {("vllm_http", "connection_refused"): 1}
    assert sorted(e["engine"] for e in logs if e["event"] == "engine_vanished") == ["0", "1"]
    store.publish(*HTTP, reports())
    assert [(v.engine, v.stale) for v in store.snapshot().engines] == [("0", False), ("1", False)]


def test_an_engine_back_under_a_new_instance_is_a_restart_once() -> None:
    store = handshake_store()
    store.remove_engine(*HANDSHAKE, "0", "a")  # forgotten (or its bye)
    store.remove_engine(*HANDSHAKE, "1", "a")
    with capture_logs() as logs:
        store.update_engine(*HANDSHAKE, replace(reports()[0], instance_id="b"))
        store.update_engine(*HANDSHAKE, replace(reports()[0], instance_id="b"))
        store.update_engine(*HANDSHAKE, replace(reports()[1], instance_id="a"))  # same one
    assert [(e["event"], e["engine"]) for e in logs] == [
        ("engine_restarted", "0"),
        ("engine_added", "1"),
    ]


def test_the_memory_of_departed_engines_is_bounded() -> None:
    store = StateStore()
    template = replace(reports()[0], instance_id="a")
    count = store_module._MAX_DEPARTED + 10
    store.publish(*HTTP, [replace(template, engine=str(i)) for i in range(count)])
    store.publish(*HTTP, [])
    assert len(store._departed) == store_module._MAX_DEPARTED
