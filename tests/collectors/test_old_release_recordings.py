"""The CLI and the sidecar on recordings of vLLM 0.18.1 engines: the same numbers, 0.18.1's own.

`tests/fixtures/golden/expositions/releases/0.18.1/` holds the HTTP surface of 0.18.1
engines on vLLM's CPU platform, made by 0.18.1's own code (scripts/release_exposition.py,
README there): its metrics, its handshake sum and each engine's plan, computed by 0.18.1's
planning functions. The sidecar polls the recording over real HTTP; `kvcap-exporter
capacity --vllm-version 0.18.1` plans the same `vllm serve` command line from the KV memory
the engines had; both must give 0.18.1's own block counts, capacity, concurrency and log.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors.parsing import parse_vllm_serve_args
from exporter.exposition import build_exposition
from exporter.state import EngineView
from tests.collectors.recorded_vllm import Playback, polled_once
from tests.conftest import GOLDEN
from tests.support import cli_command

RELEASE = "0.18.1"
RECORDINGS = sorted((GOLDEN / "expositions" / "releases" / RELEASE).glob("*.json"))
LOGGED = re.compile(r"^GPU KV cache size: ([\d,]+) tokens$")


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def sidecar(path: Path, fixture: dict[str, Any]) -> tuple[dict[str, EngineView], str]:
    """The vllm_http source's engines after one poll of the served recording (platform
    "auto", the sidecar's default), and kvcap's /metrics text rendered from them."""
    playback = Playback(
        metrics=(path.parent / fixture["exposition_file"]).read_bytes(),
        documents={"/v1/models": fixture["v1_models"], "/version": fixture["version"]},
    )
    store = polled_once(
        playback,
        timeout_s=5.0,
        serve_args=parse_vllm_serve_args(fixture["vllm_args"]),
        model_config=(path.parent / fixture["model_config_dir"]).resolve(),
    )
    snapshot = store.snapshot()
    assert snapshot.collectors[0].up, snapshot.collectors[0].last_error
    text = build_exposition(store.snapshot, process=False).body().content.decode()
    return {view.engine: view for view in snapshot.engines}, text


def cli(path: Path, fixture: dict[str, Any], memory: int) -> dict[str, Any]:
    """`kvcap-exporter capacity` on the recording's own `vllm serve` command line (the model
    folder is the recording's config), with the KV memory each engine had."""
    words = shlex.split(fixture["vllm_args"])
    words[0] = str((path.parent / fixture["model_config_dir"]).resolve())
    run = subprocess.run(
        cli_command(
            "capacity",
            "--vllm-version",
            fixture["version"]["version"],
            "--platform",
            "cpu",
            "--json",
            "--",
            "vllm",
            "serve",
            *words,
            "--kv-cache-memory-bytes",
            str(memory),
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    result: dict[str, Any] = json.loads(run.stdout)["result"]
    return result


def exported(text: str, family: str) -> dict[str, float]:
    [found] = [f for f in text_string_to_metric_families(text) if f.name == family]
    return {sample.labels["engine"]: sample.value for sample in found.samples}


def logged_figure(lines: list[str]) -> int:
    """The token count of 0.18.1's own "GPU KV cache size: N tokens" line."""
    [figure] = [int(m.group(1).replace(",", "")) for m in map(LOGGED.match, lines) if m]
    return figure


def test_the_recordings_are_0_18_1_engines_of_both_kinds() -> None:
    fixtures = [load(path) for path in RECORDINGS]
    assert {f["vllm_release"] for f in fixtures} == {f["version"]["version"] for f in fixtures}
    assert {f["vllm_release"] for f in fixtures} == {RELEASE}
    # Data parallel (the label sums the engines) and a log figure that is not the
    # group-aware capacity (0.18.1's log is group-unaware: Gemma 3's sliding layers).
    assert any(len(f["engines"]) > 1 for f in fixtures)
    assert any(
        logged_figure(e["log_lines"]) != e["kv_cache_size_tokens"]
        for f in fixtures
        for e in f["engines"]
    )


@pytest.mark.process
@pytest.mark.parametrize("path", RECORDINGS, ids=lambda path: path.stem)
def test_the_cli_and_the_sidecar_give_0_18_1s_own_numbers(path: Path) -> None:
    fixture = load(path)
    views, text = sidecar(path, fixture)
    assert set(views) == {str(engine["engine"]) for engine in fixture["engines"]}
    capacity_gauge = exported(text, "kvcap_kv_cache_capacity_tokens")
    concurrency_gauge = exported(text, "kvcap_kv_cache_max_concurrency")
    for engine in fixture["engines"]:
        view = views[str(engine["engine"])]
        planned = cli(path, fixture, engine["available_kv_bytes"])
        own_logged = logged_figure(engine["log_lines"])
        # kvcap plans the engine's memory into 0.18.1's own block count and block size.
        assert (planned["num_gpu_blocks"], planned["block_size"]) == (
            engine["num_gpu_blocks"],
            engine["block_size"],
        )
        assert view.capacity.num_gpu_blocks == engine["num_gpu_blocks"]
        # The recorded command line is the one the engines ran: nothing to warn about.
        assert (view.derivation_error, view.settings_warnings, view.approximate) == (
            None,
            (),
            False,
        )
        assert (view.vllm_version, view.platform, planned["platform"]) == (RELEASE, "cpu", "cpu")
        # The group-aware capacity: int(max_concurrency x max_model_len) with 0.18.1's own
        # get_max_concurrency_for_kv_cache_config.
        tokens = engine["kv_cache_size_tokens"]
        assert view.derived_kv_cache_size_tokens == planned["kv_cache_size_tokens"] == tokens
        assert view.capacity.kv_cache_size_tokens == tokens
        assert capacity_gauge[str(engine["engine"])] == tokens
        concurrency = engine["max_concurrency"]
        assert planned["max_concurrency"] == pytest.approx(concurrency, rel=1e-12)
        assert view.capacity.kv_cache_max_concurrency == pytest.approx(concurrency, rel=1e-12)
        assert concurrency_gauge[str(engine["engine"])] == pytest.approx(concurrency, rel=1e-12)
        # 0.18.1's own log lines, its wording and figures, and why they differ.
        assert view.log_lines == tuple(planned["log_lines"]) == tuple(engine["log_lines"])
        assert planned["logged_kv_cache_size_tokens"] == own_logged
        assert view.log_note == planned["log_note"]
        assert (planned["log_note"] is None) is (own_logged == tokens)
