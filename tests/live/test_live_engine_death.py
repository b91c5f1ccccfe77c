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


def assert_marked_stale_then_dropped(sidecar: Sidecar, since: float, stale_within_s: float) -> None:
    """Every engine stale within `stale_within_s` of `since`, gone within the forget window."""
    wait_for(
        lambda: all(v == 1 for v in stale(sidecar).values()) or not stale(sidecar),
        max(0.0, since + stale_within_s + SLACK_S - time.monotonic()),
        "engines marked stale",
        sidecar.tail,
    )
    wait_for(
        lambda: not sidecar.scrape().by_engine("kvcap_kv_cache_capacity_tokens"),
        max(0.0, since + FORGET_AFTER_S + SLACK_S - time.monotonic()),
        "engines dropped from /metrics",
        sidecar.tail,
    )


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
        assert_marked_stale_then_dropped(handshake, killed_at, STALE_AFTER_S)
        wait_for(
            lambda: server.process and server.process.poll() is not None,
            60,
            "vLLM exiting after its engine core died",
            server.tail,
        )
        assert_marked_stale_then_dropped(http, killed_at, 60 + POLL_S + STALE_AFTER_S)
        server.stop()

        # 2. vLLM started again on the same port: fresh engines under a new instance_id.
        restarted.start()
        second = {s: wait_fresh(s, restarted) for s in (http, handshake)}
        for sidecar in (http, handshake):
            assert set(second[sidecar]) == set(ENGINES)
            assert all(second[sidecar][e] != first[sidecar][e] for e in ENGINES)
            appeared = [
                event
                for event in sidecar.log_events()
                if event.get("instance_id") in set(second[sidecar].values())
                and "restart" in str(event.get("event"))
            ]
            assert len(appeared) <= len(ENGINES), appeared

        # 3. The whole server stopped cleanly: the plugin says bye, the HTTP endpoints vanish.
        stopped_at = time.monotonic()
        restarted.stop()
        assert_marked_stale_then_dropped(handshake, stopped_at, STALE_AFTER_S)
        assert_marked_stale_then_dropped(http, stopped_at, POLL_S + STALE_AFTER_S)
    finally:
        server.stop()
        restarted.stop()
        http.stop()
        handshake.stop()
