"""A real Prometheus scraping a live vLLM and the kvcap sidecar beside it: documented recipes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tests.integration.prometheus import Prometheus
from tests.live.conftest import Deployment
from tools.live.models import VOCAB_SIZE
from tools.live.sidecar import wait_for

# docs/metrics.md's used-tokens recipe, joined as a pod's two targets are.
USED_TOKENS = """
vllm:kv_cache_usage_perc
  * on (namespace, pod, engine) group_left
  max by (namespace, pod, engine) (kvcap_kv_cache_capacity_tokens)
"""


def _values(prometheus: Prometheus, promql: str, at: float | None = None) -> dict[str, float]:
    return {
        r["metric"].get("engine", r["metric"].get("model_name", "")): float(r["value"][1])
        for r in prometheus.query(promql, at)
    }


def _targets(prometheus: Prometheus) -> str:
    """What Prometheus saw of its targets, for a failure's message."""
    seen = {
        name: {r["metric"]["instance"]: r["value"][1] for r in prometheus.query(name)}
        for name in ("up", "scrape_duration_seconds")
    }
    usage = prometheus.query("vllm:kv_cache_usage_perc")
    return f"Prometheus: {seen}, vllm:kv_cache_usage_perc: {usage}\n"


def test_used_tokens_recipe_and_sums_while_a_completion_runs(
    deployment: Deployment, tmp_path: Path
) -> None:
    targets = [deployment.server.url, deployment.http.url]
    pod = {"namespace": "live", "pod": "vllm-0"}
    with Prometheus(tmp_path, [t.removeprefix("http://") for t in targets], labels=pod) as prom:
        prom.wait_until(
            lambda: len(prom.query("up == 1")) == 2, "Prometheus scraping vLLM and kvcap", 30
        )
        # Long prompts and generations on every engine keep KV blocks in use for seconds;
        # new ones are sent until Prometheus has seen usage (a tiny model is quick).
        prompt = [(7 * i) % (VOCAB_SIZE - 3) + 3 for i in range(1024)]
        done = threading.Event()

        def keep_busy() -> None:
            while not done.is_set():
                deployment.server.complete(prompt, 1000)

        load = [
            threading.Thread(target=keep_busy, daemon=True)
            for _ in range(2 * deployment.data_parallel_size)
        ]
        for thread in load:
            thread.start()
        try:
            used = wait_for(
                lambda: {e: v for e, v in _values(prom, USED_TOKENS).items() if v > 0},
                120,
                "the used-tokens recipe returning data while completions run",
                lambda: _targets(prom) + deployment.server.tail(),
            )
        finally:
            done.set()
            for thread in load:
                thread.join(timeout=300)
        assert set(used) <= {str(e) for e in range(deployment.data_parallel_size)}

        # Both queries at one instant: a scrape that failed meanwhile (a 1 s scrape timeout
        # on a loaded 2-core machine) writes staleness markers, and "now" would then show
        # nothing, or a sum of other samples than the per-engine query's.
        def capacity_at_one_instant() -> tuple[dict[str, float], list[dict[str, Any]]] | None:
            at = time.time()
            capacity = _values(prom, "kvcap_kv_cache_capacity_tokens", at)
            if len(capacity) != deployment.data_parallel_size:
                return None
            return capacity, prom.query("sum by (model_name) (kvcap_kv_cache_capacity_tokens)", at)

        capacity, by_model = wait_for(
            capacity_at_one_instant,
            30,
            f"kvcap_kv_cache_capacity_tokens of {deployment.data_parallel_size} engine(s)",
            lambda: _targets(prom) + deployment.http.tail(),
        )
        assert [r["metric"]["model_name"] for r in by_model] == [str(deployment.server.model_dir)]
        assert float(by_model[0]["value"][1]) == sum(capacity.values())
