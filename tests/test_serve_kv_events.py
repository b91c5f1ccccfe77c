"""The daemon with the kv_events collector: /metrics and /engines over real HTTP, fed by a
publisher on real ZMQ sockets sending a live vLLM 0.32.0's recorded batches."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors import KvEventsCollector, KvEventsSettings
from exporter.demo import demo_running
from exporter.serve import Exporter, WebSettings
from exporter.state import KvEventsEndpoint
from tests.collectors.test_kv_events import wait_for
from tests.kv_events_data import SHARED_PREFIX, frames
from tests.kv_events_publisher import StandInPublisher
from tests.tools import require_tool


@pytest.mark.process
def test_residency_is_scraped_per_engine_and_group() -> None:
    publisher = StandInPublisher()
    collector = KvEventsCollector(
        KvEventsSettings(endpoints=(KvEventsEndpoint(publisher.endpoint, None, "0"),))
    )
    exporter = Exporter([collector], WebSettings("127.0.0.1:0"))
    exporter.start()
    try:
        publisher.wait_for_subscriber()
        for sequence, (_, _, payload) in enumerate(frames(SHARED_PREFIX)):
            publisher.publish(sequence, payload)

        def scrape() -> str:
            with urllib.request.urlopen(f"{exporter.server.url}/metrics", timeout=5) as r:
                return str(r.read().decode())

        def metrics(body: str | None = None) -> dict[str, list[tuple[dict[str, str], float]]]:
            found: dict[str, list[tuple[dict[str, str], float]]] = {}
            for family in text_string_to_metric_families(body or scrape()):
                for sample in family.samples:
                    found.setdefault(sample.name, []).append((sample.labels, sample.value))
            return found

        def resident() -> float:
            samples = metrics().get("kvcap_prefix_cache_resident_blocks", [])
            return samples[0][1] if samples else 0

        wait_for(lambda: resident() == 26, "26 resident blocks on /metrics")
        body = scrape()
        found = metrics(body)
        labels, _ = found["kvcap_prefix_cache_resident_blocks"][0]
        assert labels == {"engine": "0", "group": "0", "medium": "GPU"}
        assert found["kvcap_prefix_cache_resident_tokens"][0][1] == 26 * 32
        assert found["kvcap_kv_events_up"][0] == ({"engine": "0"}, 1.0)
        assert found["kvcap_prefix_cache_approximate"][0][1] == 0
        promtool = require_tool("promtool")
        lint = subprocess.run(
            [promtool, "check", "metrics"], input=body, capture_output=True, text=True, check=False
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr

        with urllib.request.urlopen(f"{exporter.server.url}/engines", timeout=5) as response:
            document = json.load(response)
        (only,) = document["prefix_cache_only"]  # no other collector knows engine 0
        assert only["engine"] == "0"
        (group,) = only["prefix_cache"]["groups"]
        assert group["resident_blocks"] == 26
        assert group["kind"] == "full_attention"
    finally:
        exporter.stop()
        publisher.close()


def test_the_demo_publishes_kv_events_that_kvcap_follows_exactly(tmp_path: Path) -> None:
    """The simulated deployment's publishers (vLLM's wire protocol, replay included): kvcap
    finds them in /kv_event_sources, joins late and replays from 0, so it is exact. Each
    of the plan's KV cache groups publishes under its index and kind (group 0 of Gemma 3 is
    a sliding-window group, not full attention)."""
    with demo_running(tmp_path, poll_interval_s=0.2) as (simulation, exporter):
        planned = {i: group.kind for i, group in enumerate(simulation.plan.capacity.groups)}

        def residency() -> dict[tuple[str, str], float]:
            with urllib.request.urlopen(f"{exporter.server.url}/metrics", timeout=5) as r:
                body = r.read().decode()
            return {
                (s.labels["engine"], s.labels["group"]): s.value
                for f in text_string_to_metric_families(body)
                if f.name == "kvcap_prefix_cache_resident_blocks"
                for s in f.samples
            }

        wait_for(lambda: len(residency()) == 2 * len(planned), "two engines x each group")
        with urllib.request.urlopen(f"{exporter.server.url}/engines", timeout=5) as response:
            engines = json.load(response)["engines"]
        for engine in engines:
            assert engine["prefix_cache"]["approximate"] is False, engine["prefix_cache"]
            kinds = {g["group"]: g["kind"] for g in engine["prefix_cache"]["groups"]}
            assert kinds == planned
            assert kinds[0] == "sliding_window"
