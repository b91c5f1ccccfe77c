"""An engine process SIGKILLed (what the OOM killer does): no bye, its heartbeats just stop.

The engine is a real process running the real plugin against the vLLM stand-ins
(tests/plugin/standins.py); the sidecar is the real handshake collector on real time.
Deadlines are measured from the kill: the window plus SLACK for a loaded CI box.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.collectors import HandshakeCollector, HandshakeSettings
from exporter.handshake_wire import ENDPOINT_ENV, HEARTBEAT_INTERVAL_ENV
from exporter.state import StateStore
from tests.faults.harness import SLACK_S
from tests.support import wait_for

HEARTBEAT_S = 0.05
STALE_AFTER_S = 0.5
FORGET_AFTER_S = 1.5
PROJECT = Path(__file__).resolve().parents[2]

# One engine core process: the plugin registered and the engine ready, as vLLM runs them.
ENGINE = """
import sys, time
from exporter import vllm_plugin
from tests.plugin import standins

class Modules:
    def setitem(self, mapping, name, value):
        mapping[name] = value

core = standins.engine_core_module("llama-3.1-8b-dp2-tp1")
standins.install(Modules(), core)
vllm_plugin.register()
standins.engine(core, "llama-3.1-8b-dp2-tp1", engine_index=int(sys.argv[1]))._make_ready_response()
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def endpoint() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="kvcap-", dir="/tmp") as folder:
        yield f"ipc://{Path(folder) / 'handshake.sock'}"


def start_engine(endpoint: str, rank: int) -> subprocess.Popen[str]:
    env = {**os.environ, ENDPOINT_ENV: endpoint, HEARTBEAT_INTERVAL_ENV: str(HEARTBEAT_S)}
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE, str(rank)],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert engine.stdout is not None
    assert engine.stdout.readline() == "ready\n"
    return engine


def stale(store: StateStore) -> dict[str, bool]:
    return {view.engine: view.stale for view in store.snapshot().engines}


def test_a_killed_engine_goes_stale_then_leaves_and_its_neighbour_stays(endpoint: str) -> None:
    store = StateStore()
    settings = HandshakeSettings(
        endpoint=endpoint, stale_after_s=STALE_AFTER_S, forget_after_s=FORGET_AFTER_S
    )
    collector = HandshakeCollector(settings)
    collector.start(store)
    engines = [start_engine(endpoint, rank) for rank in (0, 1)]
    try:
        wait_for(lambda: stale(store) == {"0": False, "1": False}, 5.0, "both engines")
        # Twice the forget window alive: their heartbeats keep both fresh on real time.
        time.sleep(2 * FORGET_AFTER_S)
        assert stale(store) == {"0": False, "1": False}

        engines[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_for(
            lambda: stale(store) == {"0": False, "1": True},
            STALE_AFTER_S + SLACK_S,
            "engine 1 stale",
        )
        assert time.monotonic() - killed > STALE_AFTER_S - HEARTBEAT_S
        wait_for(
            lambda: stale(store) == {"0": False},
            max(0.0, killed + FORGET_AFTER_S + SLACK_S - time.monotonic()),
            "engine 1 removed",
        )
        assert time.monotonic() - killed > FORGET_AFTER_S - HEARTBEAT_S
    finally:
        for engine in engines:
            engine.kill()
            engine.wait(5)
            assert engine.stdout is not None
            engine.stdout.close()
        collector.stop(2.0)
