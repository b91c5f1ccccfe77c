"""A real Prometheus scraping a live vLLM and the kvcap sidecar beside it: documented recipes."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.integration.prometheus import Prometheus
from tests.live.conftest import Deployment
from tests.live.models import VOCAB_SIZE
from tests.live.sidecar import wait_for

# docs/metrics.md's used-tokens recipe, joined as a pod's two targets are.
USED_TOKENS = """
vllm:kv_cache_usage_perc
  * on (namespace, pod, engine) group_left
  max by (namespace, pod, engine) (kvcap_kv_cache_capacity_tokens)
"""


def _values(prometheus: Prometheus, promql: str) -> dict[str, float]:
    return {
        r["metric"].get("engine", r["metric"].get("model_name", "")): float(r["value"][1])
        for r in prometheus.query(promql)
    }


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
                deployment.server.tail,
            )
        finally:
            done.set()
            for thread in load:
                thread.join(timeout=300)
        assert set(used) <= {str(e) for e in range(deployment.data_parallel_size)}

        capacity = _values(prom, "kvcap_kv_cache_capacity_tokens")
        assert len(capacity) == deployment.data_parallel_size
        by_model = prom.query("sum by (model_name) (kvcap_kv_cache_capacity_tokens)")
        assert [r["metric"]["model_name"] for r in by_model] == [str(deployment.server.model_dir)]
        assert float(by_model[0]["value"][1]) == sum(capacity.values())
