"""Engine change logs are a few lines per event and interval; the restart counter keeps all."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from exporter.exposition import build_exposition
from exporter.state import StateStore
from exporter.state.log_limit import INTERVAL_S, LINES_PER_INTERVAL, LogLimit
from tests.state.helpers import reports
from tests.state.test_store import Clock


def test_lines_past_the_budget_are_left_out_and_counted_on_the_next_window() -> None:
    clock = Clock()
    limit = LogLimit(lines=3, interval_s=10.0, clock=clock)
    assert [limit.allow("restart") for _ in range(5)] == [0, 0, 0, None, None]
    assert limit.allow("added") == 0  # each event has its own budget
    clock.now += 10.0
    assert limit.allow("restart") == 2  # the first line of the next window says so
    assert limit.allow("restart") == 0


def test_emit_writes_within_the_budget_a_call_gives_and_says_what_it_left_out() -> None:
    clock = Clock()
    limit = LogLimit(lines=1, interval_s=10.0, clock=clock)
    written: list[tuple[str, dict[str, object]]] = []

    def write(event: str, **fields: object) -> None:
        written.append((event, fields))

    for engine in range(4):
        limit.emit(write, "subscribing", lines=2, engine=engine)
    clock.now += 10.0
    limit.emit(write, "subscribing", engine=9)
    assert written == [
        ("subscribing", {"engine": 0}),
        ("subscribing", {"engine": 1}),
        ("subscribing", {"engine": 9, "suppressed": 2}),
    ]


def test_a_restart_storm_is_logged_in_a_few_lines_and_counted_whole() -> None:
    store = StateStore()
    engine = reports()[0]
    with capture_logs() as logs:
        for instance in range(200):  # 200 restarts of one engine, within one interval
            store.update_engine("handshake", "ipc://x", replace(engine, instance_id=str(instance)))
    restarted = [entry for entry in logs if entry["event"] == "engine_restarted"]
    assert len(restarted) == LINES_PER_INTERVAL
    assert INTERVAL_S == 10.0
    assert store.snapshot().restarts == {engine.engine: 199}
    body = build_exposition(store.snapshot, process=False).body().content.decode()
    samples = [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == "kvcap_engine_restarts_total"
    ]
    assert samples == [({"engine": engine.engine, "model_name": engine.model_name}, 199.0)]
