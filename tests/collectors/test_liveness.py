"""Engine liveness: handshake heartbeats over real ZMQ sockets, and vllm_http's forget window.

The handshake collector runs on its own thread with a clock the test moves: "three
heartbeats missed" is a clock step, never a sleep, and the test waits for its next sweeps.
"""

from __future__ import annotations

import argparse
import itertools
import threading
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from exporter.cli import CommandLineParser
from exporter.collectors import (
    HandshakeCollector,
    HandshakeSettings,
    fetch,
    vllm_http,
    vllm_http_settings,
)
from exporter.collectors.handshake_settings import add_arguments, settings_from_args
from exporter.errors import ConfigError
from exporter.exposition import build_exposition
from exporter.flags import Flags
from exporter.handshake_wire import (
    READY_V2_TOPIC,
    ReadyExtras,
    bye_message,
    encode,
    ready_message,
    ready_v2_message,
)
from exporter.state import Snapshot, StateStore
from tests.collectors.recorded_vllm import Playback, serve
from tests.collectors.test_handshake import Listener, private_endpoint
from tests.collectors.test_vllm_http import LLAMA, exposition_of, load
from tools.handshake_data import ready_for_rank

EXTRAS = ReadyExtras(model_name="llama")


class ManualClock:
    """time.monotonic for the source, moved only by the test."""

    def __init__(self) -> None:
        self.now_s = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now_s

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now_s += seconds


class LiveListener(Listener):
    """The test_handshake Listener with a manual clock and a way to wait for sweeps."""

    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        super().__init__(private_endpoint(tmp_path), **settings)
        self.clock = ManualClock()
        unstarted = self.source
        unstarted.stop(0.0)  # never started: this only ends its ZMQ context
        self.source = HandshakeCollector(unstarted.settings, clock=self.clock)
        # A store clock that only counts: every update of an engine is visibly newer.
        ticks = itertools.count()
        self.store = StateStore(clock=lambda: float(next(ticks)))

    def __enter__(self) -> LiveListener:
        super().__enter__()
        return self

    def beat(self, rank: int, interval_s: float = 1.0, instance_id: str = "1") -> None:
        """A heartbeat (the v2 ready message), in the state before this returns."""
        before = updated_at(self.store.snapshot(), rank)
        self.send(ready_v2_message(ready_for_rank(rank, instance_id), interval_s, EXTRAS))
        self.wait_for(lambda s: updated_at(s, rank) > before)

    def swept(self) -> Snapshot:
        """The state after two more liveness sweeps: whatever the clock says has happened."""
        target = self.source.sweeps + 2
        deadline = time.monotonic() + 5
        while self.source.sweeps < target:
            assert time.monotonic() < deadline, "the source stopped sweeping"
            time.sleep(0.005)
        return self.store.snapshot()

    def metrics(self) -> dict[str, dict[str, float]]:
        """kvcap_engine_stale and kvcap_kv_cache_capacity_tokens by engine, from /metrics."""
        body = build_exposition(self.store.snapshot, process=False).body().content
        wanted = {"kvcap_engine_stale", "kvcap_kv_cache_capacity_tokens"}
        found: dict[str, dict[str, float]] = {name: {} for name in wanted}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name in wanted:
                    found[sample.name][sample.labels["engine"]] = sample.value
        return found


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveListener]:
    with LiveListener(tmp_path, forget_after_s=60.0) as started:
        yield started


def updated_at(snapshot: Snapshot, rank: int) -> float:
    return next((v.updated_at_s for v in snapshot.engines if v.engine == str(rank)), -1.0)


def stale_by_engine(snapshot: Snapshot) -> dict[str, bool]:
    return {v.engine: v.stale for v in snapshot.engines}


def events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


def test_a_silent_engine_goes_stale_then_leaves_metrics_and_comes_back(
    live: LiveListener,
) -> None:
    with capture_logs() as logs:
        live.beat(0)
        live.beat(1)
        live.wait_for(lambda s: len(s.engines) == 2)
        live.clock.advance(2.9)  # under 3 intervals of 1 s
        assert stale_by_engine(live.swept()) == {"0": False, "1": False}

        live.beat(1)  # engine 1 keeps beating; engine 0 died (SIGKILL: no bye)
        live.clock.advance(0.2)
        live.wait_for(lambda s: stale_by_engine(s) == {"0": True, "1": False})
        metrics = live.metrics()
        assert metrics["kvcap_engine_stale"] == {"0": 1.0, "1": 0.0}
        assert set(metrics["kvcap_kv_cache_capacity_tokens"]) == {"0", "1"}  # last good kept
        assert live.store.snapshot().collectors[0].up  # the collector is fine; an engine not

        live.clock.advance(57.0)  # engine 0: 60.1 s silent, past --handshake.forget-after
        live.wait_for(lambda s: [v.engine for v in s.engines] == ["1"])
        metrics = live.metrics()
        assert metrics["kvcap_engine_stale"] == {"1": 1.0}  # 57.2 s silent: stale, kept
        assert set(metrics["kvcap_kv_cache_capacity_tokens"]) == {"1"}

        live.beat(0, instance_id="2")  # vLLM started again
        live.beat(1)
        live.wait_for(lambda s: stale_by_engine(s) == {"0": False, "1": False})
        assert [v.instance_id for v in live.store.snapshot().engines] == ["2", "1"]
    assert [e["engine"] for e in events(logs, "engine_stale")] == ["0", "1"]
    assert [e["engine"] for e in events(logs, "engine_vanished")] == ["0"]
    assert [(e["engine"], e["instance_id"]) for e in events(logs, "engine_restarted")] == [
        ("0", "2")
    ]
    assert [e["engine"] for e in events(logs, "engine_heard_again")] == ["1"]
    assert [e["engine"] for e in events(logs, "engine_added")] == ["0", "1"]


def test_a_restart_within_the_window_is_logged_once(live: LiveListener) -> None:
    with capture_logs() as logs:
        live.beat(0)
        live.wait_for(lambda s: len(s.engines) == 1)
        live.clock.advance(5)
        live.wait_for(lambda s: stale_by_engine(s) == {"0": True})
        live.beat(0, instance_id="2")
        live.wait_for(lambda s: stale_by_engine(s) == {"0": False})
        for _ in range(3):  # its heartbeats are no restarts
            live.beat(0, instance_id="2")
    assert [e["instance_id"] for e in events(logs, "engine_restarted")] == ["2"]
    assert [e["engine"] for e in events(logs, "engine_heard_again")] == ["0"]


def test_the_stale_window_follows_the_announced_interval(live: LiveListener) -> None:
    live.beat(0, interval_s=10.0)
    live.beat(1, interval_s=0.5)
    live.wait_for(lambda s: len(s.engines) == 2)
    live.clock.advance(2.0)  # 4 intervals of engine 1, a fifth of one of engine 0
    live.wait_for(lambda s: stale_by_engine(s) == {"0": False, "1": True})
    live.clock.advance(29.0)
    live.wait_for(lambda s: stale_by_engine(s) == {"0": True, "1": True})


def test_handshake_stale_after_overrides_the_announced_interval(tmp_path: Path) -> None:
    with LiveListener(tmp_path, stale_after_s=30.0, forget_after_s=90.0) as live:
        live.beat(0, interval_s=1.0)
        live.wait_for(lambda s: len(s.engines) == 1)
        live.clock.advance(29.0)
        assert stale_by_engine(live.swept()) == {"0": False}
        live.clock.advance(2.0)
        live.wait_for(lambda s: stale_by_engine(s) == {"0": True})
        live.clock.advance(60.0)
        live.wait_for(lambda s: s.engines == ())


def test_a_v1_plugin_is_accepted_and_leaves_only_by_its_bye(live: LiveListener) -> None:
    """The previous plugin sends `kvcap.ready.v1` once and no heartbeat: its engine has
    no time-based liveness, so it is never marked stale nor forgotten for its silence."""
    live.send(ready_message(ready_for_rank(0), EXTRAS))
    live.beat(1)
    live.wait_for(lambda s: len(s.engines) == 2)
    live.clock.advance(100_000.0)
    live.wait_for(lambda s: [v.engine for v in s.engines] == ["0"])
    assert stale_by_engine(live.swept()) == {"0": False}
    assert live.store.snapshot().engines[0].model_name == "llama"
    live.send(bye_message(0, "1"))
    live.wait_for(lambda s: s.engines == ())


def test_a_bye_ends_a_v2_engine_at_once(live: LiveListener) -> None:
    live.beat(0)
    live.wait_for(lambda s: len(s.engines) == 1)
    live.send(bye_message(0, "1"))
    live.wait_for(lambda s: s.engines == ())
    live.clock.advance(100.0)
    assert live.swept().engines == ()


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([READY_V2_TOPIC, ready_for_rank(0), encode({"interval_s": 0})], "malformed_frame"),
        ([READY_V2_TOPIC, ready_for_rank(0), encode({"interval_s": -1.0})], "malformed_frame"),
        (
            [READY_V2_TOPIC, ready_for_rank(0), encode({"interval_s": float("nan")})],
            "malformed_frame",
        ),
        ([READY_V2_TOPIC, ready_for_rank(0), encode({"interval_s": 1e9})], "malformed_frame"),
        ([READY_V2_TOPIC, ready_for_rank(0), encode({"interval_s": "5"})], "malformed_frame"),
        ([READY_V2_TOPIC, ready_for_rank(0), encode({})], "malformed_frame"),
        ([READY_V2_TOPIC, ready_for_rank(0)], "wrong_frame_count"),
        (
            [READY_V2_TOPIC, ready_for_rank(0), encode({"interval_s": 1}), b"\x80", b""],
            "wrong_frame_count",
        ),
        (
            [READY_V2_TOPIC, ready_for_rank(0), encode({"interval_s": 1}), b"\xc1"],
            "malformed_frame",
        ),
    ],
)
def test_bad_heartbeat_frames_are_counted_and_change_nothing(
    live: LiveListener, frames: list[bytes], reason: str
) -> None:
    live.beat(1)
    live.wait_for(lambda s: len(s.engines) == 1)
    live.send(frames)
    live.wait_for(lambda s: s.errors.get(("handshake", reason)) == 1)
    assert [v.engine for v in live.store.snapshot().engines] == ["1"]


def handshake_args(**flags: Any) -> argparse.Namespace:
    parser = CommandLineParser()  # a bad value is a UsageError (a ConfigError), as in kvcap
    add_arguments(Flags(parser).group("handshake"))
    return parser.parse_args([f"--handshake.{k.replace('_', '-')}={v}" for k, v in flags.items()])


def handshake_settings(**flags: Any) -> HandshakeSettings:
    return settings_from_args(handshake_args(**flags))


def test_handshake_liveness_flags() -> None:
    settings = handshake_settings()
    assert (settings.stale_after_s, settings.forget_after_s) == (None, 600.0)
    settings = handshake_settings(stale_after=2, forget_after=9)
    assert (settings.stale_after_s, settings.forget_after_s) == (2.0, 9.0)
    for bad in ({"stale_after": 9, "forget_after": 9}, {"forget_after": 0}, {"stale_after": -1}):
        # Zero and negative durations are refused by the flag's type, the rest by _build.
        with pytest.raises(ConfigError, match=r"--handshake\.(stale|forget)-after"):
            handshake_settings(**bad)


def vllm_args(*flags: str) -> argparse.Namespace:
    parser = CommandLineParser()
    vllm_http_settings.add_arguments(Flags(parser).group("vllm_http"))
    return parser.parse_args(["--vllm.url=http://127.0.0.1:1", *flags])


def test_vllm_forget_flag() -> None:
    source = vllm_http._build(vllm_args())
    assert source is not None
    assert (source.settings.stale_after_s, source.settings.forget_after_s) == (15.0, 600.0)
    source = vllm_http._build(vllm_args("--vllm.forget-after=30", "--vllm.poll-interval=1"))
    assert source is not None
    assert (source.settings.stale_after_s, source.settings.forget_after_s) == (3.0, 30.0)
    for bad in (["--vllm.forget-after=15"], ["--vllm.stale-after=40", "--vllm.forget-after=30"]):
        with pytest.raises(ConfigError, match=r"--vllm\.stale-after and --vllm\.forget-after"):
            vllm_http._build(vllm_args(*bad))


def test_vllm_http_engines_of_a_gone_server_are_forgotten_and_return() -> None:
    fixture = load(LLAMA)
    playback = Playback(metrics=exposition_of(LLAMA, fixture))
    store = StateStore()
    with serve(playback) as url:
        settings = vllm_http_settings.VllmHttpSettings(
            urls=(url,), stale_after_s=15, forget_after_s=600
        )
        poller = vllm_http.ServerPoller(url, settings, fetch, store, threading.Event())
        poller.poll_once()
        assert [v.engine for v in store.snapshot().engines] == ["0", "1"]
        playback.fault = "500"  # the API server is gone (its engine core died)
        with capture_logs() as logs:
            poller.last_success -= 20  # 20 s since the last good read
            poller.poll_once()
            assert [v.stale for v in store.snapshot().engines] == [True, True]
            poller.last_success -= 590  # 610 s
            poller.poll_once()
            assert store.snapshot().engines == ()
            poller.poll_once()
        assert sorted(e["engine"] for e in events(logs, "engine_vanished")) == ["0", "1"]
        assert store.snapshot().errors == {("vllm_http", "http_5xx"): 3}
        assert not store.snapshot().collectors[0].up

        playback.fault = None  # vLLM started again
        poller.poll_once()
    assert [(v.engine, v.stale) for v in store.snapshot().engines] == [("0", False), ("1", False)]
    assert not poller.forgotten
