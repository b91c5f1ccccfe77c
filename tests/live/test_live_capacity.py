"""Against live vLLM engines: kvcap's per-engine figures equal what each engine printed and reports.

The ground truth is the engine's own start-up log line ("CPU KV cache size: N tokens,
Maximum concurrency for L tokens per request: X.XXx") and its `vllm:cache_config_info`
labels; kvcap's `vllm_http` sidecar and its `handshake` sidecar (fed by the plugin inside
the same engines) must both show them exactly, and kvcap's own derivation must agree.
"""

from __future__ import annotations

import re

from tests.live.conftest import Deployment
from tests.support import parse
from tools.live.server import LoggedCapacity
from tools.live.sidecar import Sidecar

_GROUP_SIZES = re.compile(r"kv cache group sizes \(([\d, ]+)\)")


def logged_by_engine(deployment: Deployment) -> dict[str, LoggedCapacity]:
    """Each engine's start-up line, keyed as vLLM's `engine` label ("EngineCore_DP1" -> "1")."""
    logged = deployment.server.logged_capacity()
    by_engine = {c.process.rpartition("_DP")[2] if "_DP" in c.process else "0": c for c in logged}
    assert len(by_engine) == deployment.data_parallel_size, logged
    return by_engine


def cache_config_info(deployment: Deployment) -> dict[str, dict[str, str]]:
    samples = parse(deployment.server.metrics())["vllm:cache_config_info"]
    return {labels["engine"]: labels for labels, _ in samples}


def test_vllm_reports_what_it_logged(deployment: Deployment) -> None:
    # The premise of every other test here: the log line and the labels are the same numbers.
    info = cache_config_info(deployment)
    for engine, logged in logged_by_engine(deployment).items():
        assert int(info[engine]["kv_cache_size_tokens"]) == logged.kv_cache_size_tokens
        assert round(float(info[engine]["kv_cache_max_concurrency"]), 2) == logged.max_concurrency
        assert logged.max_model_len == deployment.server.max_model_len


def assert_engine_figures(sidecar: Sidecar, deployment: Deployment) -> None:
    scrape = sidecar.scrape()
    info = cache_config_info(deployment)
    dp = deployment.data_parallel_size
    for engine, logged in logged_by_engine(deployment).items():
        labels = info[engine]
        expected = {
            "kvcap_kv_cache_capacity_tokens": logged.kv_cache_size_tokens,
            "kvcap_kv_cache_max_concurrency": float(labels["kv_cache_max_concurrency"]),
            # vLLM's num_gpu_blocks label is the sum over the DP engines.
            "kvcap_kv_cache_blocks": int(labels["num_gpu_blocks"]) // dp,
            "kvcap_kv_cache_block_size_tokens": int(labels["block_size"]),
            "kvcap_max_model_len_tokens": deployment.server.max_model_len,
            "kvcap_engine_stale": 0,
        }
        actual = {name: scrape.value(name, engine=engine) for name in expected}
        assert actual == expected, f"engine {engine}\n{sidecar.tail()}"
        # The KV memory each worker was given (VLLM_CPU_KVCACHE_SPACE, 1 GiB).
        assert scrape.value("kvcap_kv_cache_bytes", engine=engine) == 1 << 30


def test_http_sidecar_shows_each_engines_figures(deployment: Deployment) -> None:
    assert_engine_figures(deployment.http, deployment)


def test_handshake_sidecar_shows_each_engines_figures(deployment: Deployment) -> None:
    assert_engine_figures(deployment.handshake, deployment)


def test_derived_capacity_equals_reported(deployment: Deployment) -> None:
    # The vllm_http sidecar reads the model's config.json and derives as that release plans.
    scrape = deployment.http.scrape()
    for engine, logged in logged_by_engine(deployment).items():
        derived = scrape.value("kvcap_kv_cache_derived_capacity_tokens", engine=engine)
        assert derived == logged.kv_cache_size_tokens, deployment.http.tail()
        assert scrape.value("kvcap_kv_cache_capacity_mismatch", engine=engine) == 0


def kv_groups(sidecar: Sidecar) -> dict[str, list[tuple[str, str, float, float]]]:
    """Per engine: each group's (kind, block size, layers, blocks per request), in order."""
    scrape = sidecar.scrape()
    groups: dict[str, list[tuple[str, str, float, float]]] = {}
    for labels in sorted(scrape.labels("kvcap_kv_cache_group_info"), key=lambda x: int(x["group"])):
        where = {"engine": labels["engine"], "group": labels["group"]}
        layers = scrape.value("kvcap_kv_cache_group_layers", **where)
        per_request = scrape.value("kvcap_kv_cache_group_blocks_per_request", **where)
        assert layers is not None
        assert per_request is not None
        groups.setdefault(labels["engine"], []).append(
            (labels["kind"], labels["block_size"], layers, per_request)
        )
    return groups


def test_both_sources_show_the_groups_vllm_logged(deployment: Deployment) -> None:
    from_plugin = kv_groups(deployment.handshake)
    assert kv_groups(deployment.http) == from_plugin
    logged_sizes = _GROUP_SIZES.findall(deployment.server.log())
    for engine, groups in from_plugin.items():
        assert groups, engine
        # vLLM prints each engine's group block sizes for hybrids only.
        block_sizes = ", ".join(block_size for _, block_size, _, _ in groups)
        assert all(sizes == block_sizes for sizes in logged_sizes), (engine, logged_sizes)
