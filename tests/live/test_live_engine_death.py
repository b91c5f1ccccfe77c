"""Live engines that die and come back: kvcap stops counting them, then learns them again.

An engine core SIGKILLed (what the OOM killer does) sends no bye; the whole server stopped
does. Either way, within one poll interval plus the liveness window both sidecars mark the
engines stale and then drop them, so `sum by` no longer counts them; a restarted vLLM's
engines return fresh under a new `instance_id`, logged once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from tests.live.conftest import start_deployment
from tools.live.server import VllmServer
from tools.live.sidecar import Sidecar, wait_for
from tools.live.vllm_install import LIVE_RELEASES

HEARTBEAT_S = 0.5
POLL_S = 0.5
STALE_AFTER_S = 1.5
FORGET_AFTER_S = 5.0
# Thread hand-offs, a scrape and a poll on 2 busy cores.
SLACK_S = 3.0
ENGINES = ("0", "1")


def stale(sidecar: Sidecar) -> dict[str, float]:
    return sidecar.scrape().by_engine("kvcap_engine_stale")


def instance_ids(sidecar: Sidecar) -> dict[str, str]:
    return {
        labels["engine"]: labels["instance_id"]
        for labels in sidecar.scrape().labels("kvcap_engine_info")
    }


class EngineWatch:
    """Scrapes a sidecar every 0.1 s in a thread from the moment it is made, noting when
    `engines` were first all marked stale and when they were first all gone from /metrics.

    Watching from before the event, both sidecars at once, is what a slow exit cannot
    defeat: vLLM's HTTP endpoints stop answering seconds before its process is gone, and
    the stale window is only the few seconds between stale-after and forget-after.
    """

    def __init__(self, sidecar: Sidecar, engines: tuple[str, ...] = ENGINES) -> None:
        self.sidecar, self.engines = sidecar, engines
        self.stale_at: float | None = None  # every one marked stale
        self.left_at: float | None = None  # every one marked stale or gone
        self.dropped_at: float | None = None  # every one gone
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.is_set() and self.dropped_at is None:
            scrape = self.sidecar.scrape()
            now = time.monotonic()
            shown = scrape.by_engine("kvcap_engine_stale")
            if self.stale_at is None and all(shown.get(e) == 1 for e in self.engines):
                self.stale_at = now
            if self.left_at is None and all(shown.get(e, 1) == 1 for e in self.engines):
                self.left_at = now
            if not set(self.engines) & set(scrape.by_engine("kvcap_kv_cache_capacity_tokens")):
                self.dropped_at = now
            time.sleep(0.1)

    def assert_stale_then_dropped(
        self, stale_by: float, dropped_by: float, *, said_bye: bool = False
    ) -> None:
        """Marked stale by `stale_by` (monotonic), gone by `dropped_by`. An engine that said
        bye may leave at once, without being seen stale first."""
        self._thread.join(timeout=max(0.0, dropped_by - time.monotonic()))
        self._done.set()
        self._thread.join()
        what = f"engines {self.engines} of {self.sidecar.url}"
        context = f"stale at {self.stale_at}, dropped at {self.dropped_at}\n{self.sidecar.tail()}"
        assert self.dropped_at is not None, f"{what} not dropped by {dropped_by}: {context}"
        marked = self.left_at if said_bye else self.stale_at
        assert marked is not None, f"{what} never marked stale: {context}"
        assert marked <= stale_by, f"{what} marked stale after {stale_by}: {context}"


def logged(sidecar: Sidecar, event: str) -> dict[str, int]:
    """How often the sidecar logged `event`, per engine."""
    counts: dict[str, int] = {}
    for line in sidecar.log_events():
        if line.get("event") == event:
            counts[str(line.get("engine"))] = counts.get(str(line.get("engine")), 0) + 1
    return counts


def wait_fresh(sidecar: Sidecar, server: VllmServer) -> dict[str, str]:
    wait_for(
        lambda: stale(sidecar) == dict.fromkeys(ENGINES, 0.0),
        60,
        "both engines fresh",
        lambda: sidecar.tail() + "\n--- vLLM ---\n" + server.tail(),
    )
    return instance_ids(sidecar)


def test_engines_killed_restarted_and_stopped(tmp_path: Path) -> None:
    server, http, handshake = start_deployment(
        LIVE_RELEASES[0],
        "llama",
        2,
        tmp_path,
        http_args=[f"--vllm.stale-after={STALE_AFTER_S}", f"--vllm.forget-after={FORGET_AFTER_S}"],
        handshake_args=[
            f"--handshake.stale-after={STALE_AFTER_S}",
            f"--handshake.forget-after={FORGET_AFTER_S}",
        ],
        vllm_env={"KVCAP_HEARTBEAT_INTERVAL": str(HEARTBEAT_S)},
    )
    restarted = VllmServer(
        server.python,
        server.model_dir,
        tmp_path,
        args=server.args,
        env=server.env,
        port=server.port,
    )
    try:
        first = {s: wait_fresh(s, server) for s in (http, handshake)}

        # 1. The engine core of DP rank 1 SIGKILLed: no bye; vLLM's API server then exits.
        killed_at = time.monotonic()
        rank_1, http_gone = EngineWatch(handshake, ("1",)), EngineWatch(http)
        os.kill(server.engine_core_pids()[-1], signal.SIGKILL)
        rank_1.assert_stale_then_dropped(
            killed_at + STALE_AFTER_S + SLACK_S, killed_at + FORGET_AFTER_S + SLACK_S
        )
        engine_0 = EngineWatch(handshake, ("0",))
        wait_for(
            lambda: server.process and server.process.poll() is not None,
            60,
            "vLLM exiting after its engine core died",
            server.tail,
        )
        # The HTTP endpoints answer until the API server is gone (at the latest, when its
        # process has exited). Engine 0 went with it, with or without a bye.
        exited_at = time.monotonic()
        http_gone.assert_stale_then_dropped(
            exited_at + POLL_S + STALE_AFTER_S + SLACK_S, exited_at + FORGET_AFTER_S + SLACK_S
        )
        engine_0.assert_stale_then_dropped(
            exited_at + STALE_AFTER_S + SLACK_S, exited_at + FORGET_AFTER_S + SLACK_S, said_bye=True
        )
        server.stop()

        # 2. vLLM started again on the same port: fresh engines, logged once each. The plugin
        # tells the new instance_id (vLLM's HTTP endpoints do not).
        restarted.start()
        second = {s: wait_fresh(s, restarted) for s in (http, handshake)}
        assert all(second[handshake][e] != first[handshake][e] for e in ENGINES)
        assert logged(handshake, "engine_restarted") == {"0": 1, "1": 1}
        assert logged(http, "engine_added") == {"0": 2, "1": 2}

        # 3. The whole server stopped cleanly: the plugin says bye, the HTTP endpoints vanish.
        # The stop returns once every process of vLLM has gone: count from then.
        bye, http_gone = EngineWatch(handshake), EngineWatch(http)
        restarted.stop()
        stopped_at = time.monotonic()
        bye.assert_stale_then_dropped(
            stopped_at + STALE_AFTER_S + SLACK_S,
            stopped_at + FORGET_AFTER_S + SLACK_S,
            said_bye=True,
        )
        http_gone.assert_stale_then_dropped(
            stopped_at + POLL_S + STALE_AFTER_S + SLACK_S, stopped_at + FORGET_AFTER_S + SLACK_S
        )
    finally:
        server.stop()
        restarted.stop()
        http.stop()
        handshake.stop()
