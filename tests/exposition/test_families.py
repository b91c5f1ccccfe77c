"""The metric contract: what /metrics contains, lint-clean, and documented."""

from __future__ import annotations

import gzip
import re
import subprocess
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families

from exporter.exposition import build_exposition
from exporter.state import OffloadTier, StateStore
from exporter.web import WebCounters
from tests.prefix_cache.helpers import recorded_views
from tests.state.helpers import reports
from tests.state.test_gpus import gpu
from tests.tools import require_tool

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def rich_store() -> StateStore:
    store = StateStore()
    # A 4 GiB CPU tier of 16-token blocks on the Gemma engines (vllm:kv_offload_config_info).
    cpu = OffloadTier(
        "cpu", capacity_tokens=1_048_576, capacity_blocks=65_536, capacity_bytes=2**32
    )
    gemma = [replace(r, offload=(cpu,)) for r in reports("gemma-3-27b-text-dp2-tp2")]
    store.publish("vllm_http", "http://a", gemma, duration_s=0.01)
    store.publish("handshake", "ipc://x", reports("qwen3-next-80b-a3b-dp2-tp2")[:1])
    store.fail("nvml", "local", "driver_not_loaded", "no driver")
    store.publish_gpus("nvml", "node", [gpu(i) for i in range(2)])
    store.publish_residency("kv_events", recorded_views())
    return store


def text_body(store: StateStore) -> str:
    cache = build_exposition(store.snapshot, WebCounters())
    return cache.body().content.decode()


def test_engine_values_are_per_engine_and_sum_in_promql_terms() -> None:
    families = {f.name: f for f in text_string_to_metric_families(text_body(rich_store()))}
    capacity = families["kvcap_kv_cache_capacity_tokens"].samples
    assert {(s.labels["engine"], s.value) for s in capacity} == {("0", 3530503.0), ("1", 597576.0)}
    models = {s.labels["engine"]: s.labels["model_name"] for s in capacity}
    assert models == {"0": "Qwen/Qwen3-Next-80B-A3B-Instruct", "1": "google/gemma-3-27b-it"}
    groups = families["kvcap_kv_cache_group_info"].samples
    assert {s.labels["kind"] for s in groups} == {"full_attention", "sliding_window", "mamba"}
    assert families["kvcap_collector_errors"].samples[0].labels == {
        "collector": "nvml",
        "reason": "driver_not_loaded",
    }


@pytest.mark.deploy
def test_promtool_check_metrics_is_clean(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    body = text_body(rich_store())
    run = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == ""
    assert run.stderr.strip() == ""


def test_openmetrics_and_gzip_variants_carry_the_same_samples() -> None:
    cache = build_exposition(rich_store().snapshot)
    text = cache.body().content.decode()
    om = cache.body(accept="application/openmetrics-text; version=1.0.0").content.decode()
    zipped = cache.body(accept_encoding="gzip, deflate")
    assert zipped.gzipped
    assert gzip.decompress(zipped.content).decode().startswith(text.split("process_")[0][:500])
    assert om.endswith("# EOF\n")
    assert om.count("# EOF") == 1

    def samples(families: Iterable[Any]) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        return {
            (s.name.removesuffix("_total"), tuple(sorted(s.labels.items())))
            for f in families
            for s in f.samples
            if s.name.startswith("kvcap_") and not s.name.endswith("_created")
        }

    openmetrics_families = parse_om(om)  # type: ignore[no-untyped-call]
    assert samples(text_string_to_metric_families(text)) == samples(openmetrics_families)


def test_rendering_happens_once_per_snapshot() -> None:
    store = rich_store()
    cache = build_exposition(store.snapshot, process=False)
    first = cache.body().content
    assert cache._current() is cache._current()
    store.publish("vllm_http", "http://a", reports()[:1])
    assert cache.body().content != first


def test_every_exported_metric_is_documented_and_every_documented_one_exported() -> None:
    names = {f.name for f in text_string_to_metric_families(text_body(rich_store()))}
    exported = {n for n in names if n.startswith("kvcap_")}
    documented = set(re.findall(r"^\| `(kvcap_[a-z_]+)`", DOCS.read_text(), re.MULTILINE))
    documented = {n.removesuffix("_total") for n in documented}
    assert exported == documented


def test_every_variant_renders_in_any_order() -> None:
    for accept in (None, "application/openmetrics-text; version=1.0.0"):
        cache = build_exposition(rich_store().snapshot)
        zipped = cache.body(accept=accept, accept_encoding="gzip")
        plain = cache.body(accept=accept)
        assert (
            gzip.decompress(zipped.content).split(b"# HELP process_")[0]
            == plain.content.split(b"# HELP process_")[0]
        )
