"""Live engines that die and come back: kvcap stops counting them, then learns them again.

An engine core SIGKILLed (what the OOM killer does) sends no bye; the whole server stopped
does. Either way, within one poll interval plus the liveness window both sidecars mark the
engines stale and then drop them, so `sum by` no longer counts them; a restarted vLLM's
engines return fresh under a new `instance_id`, logged once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.live.conftest import start_deployment
from tests.live.server import VllmServer
from tests.live.sidecar import Sidecar, wait_for
from tests.live.vllm_install import LIVE_RELEASES

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


def assert_marked_stale_then_dropped(
    sidecar: Sidecar,
    since: float,
    stale_within_s: float,
    engines: tuple[str, ...] = ENGINES,
    *,
    said_bye: bool = False,
) -> None:
    """`engines` stale within `stale_within_s` of `since`, gone `FORGET_AFTER_S` after it.

    An engine that said bye may leave at once, without being seen stale first.
    """

    def marked() -> bool:
        shown = stale(sidecar)
        if said_bye:
            return all(shown.get(e, 1) == 1 for e in engines)
        return all(shown.get(e) == 1 for e in engines)

    def dropped() -> bool:
        shown = sidecar.scrape().by_engine("kvcap_kv_cache_capacity_tokens")
        return not set(engines) & set(shown)

    left = since + stale_within_s + SLACK_S - time.monotonic()
    wait_for(marked, max(0.0, left), f"engines {engines} marked stale", sidecar.tail)
    left = since + FORGET_AFTER_S + SLACK_S - time.monotonic()
    wait_for(dropped, max(0.0, left), f"engines {engines} dropped from /metrics", sidecar.tail)


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
        os.kill(server.engine_core_pids()[-1], signal.SIGKILL)
        assert_marked_stale_then_dropped(handshake, killed_at, STALE_AFTER_S, ("1",))
        wait_for(
            lambda: server.process and server.process.poll() is not None,
            60,
            "vLLM exiting after its engine core died",
            server.tail,
        )
        # The HTTP endpoints answer until the API server is gone: count from then. Engine 0
        # went with it, with or without a bye.
        exited_at = time.monotonic()
        assert_marked_stale_then_dropped(http, exited_at, POLL_S + STALE_AFTER_S)
        assert_marked_stale_then_dropped(handshake, exited_at, STALE_AFTER_S, said_bye=True)
        server.stop()

        # 2. vLLM started again on the same port: fresh engines, logged once each. The plugin
        # tells the new instance_id (vLLM's HTTP endpoints do not).
        restarted.start()
        second = {s: wait_fresh(s, restarted) for s in (http, handshake)}
        assert all(second[handshake][e] != first[handshake][e] for e in ENGINES)
        assert logged(handshake, "engine_restarted") == {"0": 1, "1": 1}
        assert logged(http, "engine_added") == {"0": 2, "1": 2}

        # 3. The whole server stopped cleanly: the plugin says bye, the HTTP endpoints vanish.
        stopped_at = time.monotonic()
        restarted.stop()
        assert_marked_stale_then_dropped(handshake, stopped_at, STALE_AFTER_S, said_bye=True)
        assert_marked_stale_then_dropped(http, stopped_at, POLL_S + STALE_AFTER_S)
    finally:
        server.stop()
        restarted.stop()
        http.stop()
        handshake.stop()
