"""The vllm_http source against recorded vLLM expositions of 0.10.2 to 0.33, over real HTTP."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from exporter.capacity import EngineSettings, derive_capacity
from exporter.collectors import (
    ServerDocuments,
    ServerPoller,
    VllmHttpSettings,
    discover_serve_args,
    fetch,
    vllm_http,
    vllm_processes,
)
from exporter.collectors.parsing import parse_vllm_serve_args, to_engine_settings
from exporter.demo import example_config, simulated_deployment
from exporter.errors import ConfigError
from exporter.state import KvUsage, StateStore
from tests.collectors.recorded_vllm import Playback, serve
from tests.conftest import GOLDEN
from tests.support import cli_command

EXPOSITIONS = GOLDEN / "expositions"
FIXTURES = sorted(p for p in [*EXPOSITIONS.glob("*.json"), *EXPOSITIONS.glob("releases/*/*.json")])


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def exposition_of(path: Path, fixture: dict[str, Any]) -> bytes:
    name = fixture.get("exposition_file") or path.with_suffix(".txt").name
    return (path.parent / Path(name).name).read_bytes()


def poll(url: str, settings: VllmHttpSettings, store: StateStore) -> ServerPoller:
    poller = ServerPoller(url, settings, fetch, store, threading.Event())
    poller.poll_once()
    return poller


def settings_for(url: str, fixture: dict[str, Any], path: Path, **extra: Any) -> VllmHttpSettings:
    return VllmHttpSettings(
        urls=(url,),
        timeout_s=1.0,
        serve_args=parse_vllm_serve_args(fixture["vllm_args"]),
        model_config=(path.parent / fixture["model_config_dir"]).resolve(),
        **extra,
    )


def _release_plan(fixture: dict[str, Any], path: Path) -> Callable[[int], int | None]:
    """The capacity the fixture's own release plans for a block count, where the fixture's
    figures are 0.33's copied (None: they are the release's own)."""
    if not any("vLLM 0.33.0's plan copied" in note for note in fixture.get("faked", [])):
        return lambda blocks: None
    config = json.loads((path.parent / fixture["model_config_dir"] / "config.json").read_text())
    settings = to_engine_settings(parse_vllm_serve_args(fixture["vllm_args"]))

    def plan(blocks: int) -> int:
        release = replace(
            settings,
            max_model_len=fixture["engines"][0]["max_model_len"],
            vllm_version=fixture["version"]["version"],
        )
        return derive_capacity(config, release, num_gpu_blocks=blocks).figures.kv_cache_size_tokens

    return plan


@pytest.mark.parametrize("path", FIXTURES, ids=[str(p.relative_to(EXPOSITIONS)) for p in FIXTURES])
def test_every_per_engine_gauge_matches_the_recording(path: Path) -> None:
    fixture = load(path)
    playback = Playback(
        metrics=exposition_of(path, fixture),
        documents={
            "/v1/models": fixture["v1_models"],
            "/version": fixture["version"],
            "/kv_event_sources": fixture.get("kv_event_sources") or {},
        },
    )
    store = StateStore()
    with serve(playback) as url:
        poll(url, settings_for(url, fixture, path), store)
    snapshot = store.snapshot()
    assert snapshot.collectors[0].up, snapshot.collectors[0].last_error
    views = {v.engine: v for v in snapshot.engines}
    assert set(views) == {str(e["engine"]) for e in fixture["engines"]}
    reports_capacity = bool(fixture["capacity_reported"])
    planned = _release_plan(fixture, path)
    for engine in fixture["engines"]:
        view = views[str(engine["engine"])]
        # The recordings of older releases carry vLLM 0.33's per-engine figures (their
        # `faked` notes); kvcap derives as the release itself plans (docs/capacity.md 6).
        derived = planned(engine["num_gpu_blocks"]) or engine["kv_cache_size_tokens"]
        assert view.model_name == fixture["served_model_name"]
        assert view.capacity.num_gpu_blocks == engine["num_gpu_blocks"]
        exported = engine["kv_cache_size_tokens"] if reports_capacity else derived
        assert view.capacity.kv_cache_size_tokens == exported
        if reports_capacity or derived == engine["kv_cache_size_tokens"]:
            assert view.capacity.kv_cache_max_concurrency == pytest.approx(
                engine["max_concurrency"], rel=1e-12
            )
        assert view.capacity.max_model_len == engine["max_model_len"]
        assert view.derived_kv_cache_size_tokens == derived
        assert view.capacity_source == ("reported" if reports_capacity else "derived")
        mismatch = derived != engine["kv_cache_size_tokens"]
        assert view.capacity_mismatch is (mismatch if reports_capacity else None)
        assert view.usage == KvUsage(
            engine["kv_cache_usage"], engine["num_requests_running"], engine["num_requests_waiting"]
        )
        assert view.used_tokens == pytest.approx(engine["kv_cache_usage"] * exported)
        assert len(view.capacity.groups) == len(engine["groups"])
        assert view.vllm_version == fixture["version"]["version"]


@pytest.mark.parametrize("data_parallel_size", [1, 2, 4])
def test_data_parallel_engines_each_get_their_own_blocks(
    tmp_path: Path, data_parallel_size: int
) -> None:
    simulation = simulated_deployment(tmp_path / "gemma", data_parallel_size=data_parallel_size)
    url = simulation.start()
    try:
        store = StateStore()
        settings = VllmHttpSettings(
            urls=(url,), serve_args=parse_vllm_serve_args(simulation.vllm_args)
        )
        poll(url, settings, store)
    finally:
        simulation.stop()
    views = store.snapshot().engines
    assert [v.engine for v in views] == [str(i) for i in range(data_parallel_size)]
    for view in views:
        # The label says plan x DP; each engine holds the plan's blocks.
        assert view.capacity.num_gpu_blocks == simulation.plan.capacity.num_gpu_blocks
        assert view.capacity.kv_cache_size_tokens == simulation.plan.capacity.kv_cache_size_tokens
        assert view.capacity_mismatch is False


LLAMA = EXPOSITIONS / "llama-3.1-8b-dp2-tp1.vllm-0.33.json"


@pytest.mark.parametrize(
    ("fault", "reason", "extra"),
    [
        ("404", "http_4xx", {}),
        ("500", "http_5xx", {}),
        ("slow", "timeout", {}),
        ("truncated", "truncated", {}),
        ("gzip_corrupt", "gzip_corrupt", {}),
        ("garbage", "malformed_exposition", {}),
        (None, "body_too_large", {"max_body_bytes": 1024}),
    ],
)
def test_faults_are_counted_keep_last_good_data_and_recover(
    fault: str | None, reason: str, extra: dict[str, Any]
) -> None:
    fixture = load(LLAMA)
    playback = Playback(
        metrics=exposition_of(LLAMA, fixture), documents={"/v1/models": fixture["v1_models"]}
    )
    store = StateStore()
    with serve(playback) as url:
        good = settings_for(url, fixture, LLAMA, stale_after_s=0.0)
        poller = poll(url, good, store)
        before = store.snapshot().engines
        assert len(before) == 2
        playback.fault = fault
        poller.settings = settings_for(url, fixture, LLAMA, stale_after_s=0.0, **extra)
        poller.poll_once()
        snapshot = store.snapshot()
        assert snapshot.errors == {("vllm_http", reason): 1}
        assert not snapshot.collectors[0].up
        assert [v.capacity.kv_cache_size_tokens for v in snapshot.engines] == [
            v.capacity.kv_cache_size_tokens for v in before
        ]
        assert all(v.stale for v in snapshot.engines)
        playback.fault = None
        poller.settings = good
        poller.poll_once()
    recovered = store.snapshot()
    assert recovered.collectors[0].up
    assert not any(v.stale for v in recovered.engines)


def test_gzip_bodies_are_accepted() -> None:
    fixture = load(LLAMA)
    playback = Playback(metrics=exposition_of(LLAMA, fixture), fault="gzip")
    store = StateStore()
    with serve(playback) as url:
        poll(url, settings_for(url, fixture, LLAMA), store)
    assert len(store.snapshot().engines) == 2


class CountedStop(threading.Event):
    """The poller's stop event, recording each wait between polls; set after `polls` waits."""

    def __init__(self, polls: int) -> None:
        super().__init__()
        self.polls = polls
        self.waits_s: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits_s.append(timeout)
        if len(self.waits_s) >= self.polls:
            self.set()
        return self.is_set()


def test_connection_refused_is_counted_and_retried_every_poll_interval() -> None:
    with serve(Playback(metrics=b"")) as url:
        pass  # the port is closed again now
    store = StateStore()
    stop = CountedStop(polls=4)
    ServerPoller(url, VllmHttpSettings(urls=(url,), poll_interval_s=5.0), fetch, store, stop).run()
    assert store.snapshot().errors == {("vllm_http", "connection_refused"): 4}
    # No backoff: a restarted vLLM is seen within one poll interval, however long it was away.
    assert stop.waits_s == [5.0] * 4


def test_stale_only_after_the_ttl() -> None:
    fixture = load(LLAMA)
    playback = Playback(metrics=exposition_of(LLAMA, fixture))
    store = StateStore()
    with serve(playback) as url:
        poller = poll(url, settings_for(url, fixture, LLAMA, stale_after_s=60.0), store)
        playback.fault = "500"
        poller.poll_once()
    assert not any(v.stale for v in store.snapshot().engines)


def test_absurd_label_values_are_rejected_not_exported() -> None:
    fixture = load(LLAMA)
    metrics = exposition_of(LLAMA, fixture).replace(
        b'model_name="meta-llama/Llama-3.1-8B-Instruct"', b'model_name="' + b"x" * 5000 + b'"'
    )
    store = StateStore()
    with serve(Playback(metrics=metrics)) as url:
        poll(url, settings_for(url, fixture, LLAMA), store)
    assert store.snapshot().errors == {("vllm_http", "malformed_exposition"): 1}
    assert store.snapshot().engines == ()


@pytest.mark.parametrize(
    "family",
    [b"vllm:prefix_cache_hits_total", b"vllm:num_preemptions_total", b"vllm:iteration_tokens"],
)
def test_a_malformed_line_of_a_family_kvcap_does_not_read_leaves_the_poll_successful(
    family: bytes,
) -> None:
    fixture = load(LLAMA)
    broken = family + b'{engine="0",model_name="m" 5.0 garbage\n'
    metrics = broken + exposition_of(LLAMA, fixture)
    store = StateStore()
    with serve(Playback(metrics=metrics)) as url:
        poll(url, settings_for(url, fixture, LLAMA), store)
    assert store.snapshot().errors == {}
    assert len(store.snapshot().engines) == len(fixture["engines"])
    assert all(status.up for status in store.snapshot().collectors)


@pytest.mark.parametrize(
    "document",
    [b"[" * 100_000 + b"]" * 100_000, b'{"data": [{"id": 1' + b"0" * 5000 + b"}]}", b"{"],
    ids=["deep", "long-int", "truncated"],
)
def test_a_bad_v1_models_document_is_ignored_not_fatal(document: bytes) -> None:
    fixture = load(LLAMA)
    store = StateStore()
    playback = Playback(exposition_of(LLAMA, fixture), documents={"/v1/models": document})
    with serve(playback) as url:
        poll(url, settings_for(url, fixture, LLAMA), store)
    # /v1/models is optional: the engines come from /metrics as without it.
    assert store.snapshot().errors == {}
    assert len(store.snapshot().engines) == len(fixture["engines"])


def test_without_settings_the_reported_capacity_is_still_exported() -> None:
    path = EXPOSITIONS / "qwen3-next-80b-a3b-dp2-tp2.vllm-0.33.json"
    fixture = load(path)
    store = StateStore()
    with serve(Playback(metrics=exposition_of(path, fixture))) as url:
        poll(url, VllmHttpSettings(urls=(url,)), store)
    view = store.snapshot().engines[0]
    assert view.capacity.kv_cache_size_tokens == fixture["engines"][0]["kv_cache_size_tokens"]
    assert view.derived_kv_cache_size_tokens is None
    assert view.derivation_error is not None


GEMMA_ARGS = "/models/gemma -tp 2"
GEMMA_BODY = (
    b'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",'
    b'num_gpu_blocks="134276"} 1.0\n'
)


@pytest.mark.parametrize(
    ("model_config", "message"),
    [
        ("missing", "cannot read {tmp}/missing: No such file or directory"),
        ("", "cannot read {tmp}/config.json: Is a directory"),
    ],
    ids=["missing", "config.json-a-directory"],
)
def test_an_unreadable_model_config_is_named_in_the_derivation_error(
    tmp_path: Path, model_config: str, message: str
) -> None:
    """--model.config given but unreadable: the reason says so, it does not ask for the flag."""
    (tmp_path / "config.json").mkdir()
    store = StateStore()
    with serve(Playback(metrics=GEMMA_BODY)) as url:
        settings = VllmHttpSettings(
            urls=(url,),
            serve_args=parse_vllm_serve_args(GEMMA_ARGS),
            model_config=tmp_path / model_config,
        )
        poll(url, settings, store)
    view = store.snapshot().engines[0]
    assert view.capacity.num_gpu_blocks == 134276
    assert view.derived_kv_cache_size_tokens is None
    assert view.derivation_error == message.format(tmp=tmp_path)


def test_the_model_config_is_read_again_only_when_it_changes(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(example_config("gemma-3-27b-text")))
    settings = VllmHttpSettings(urls=("http://unused",), model_config=tmp_path)
    poller = ServerPoller("http://unused", settings, fetch, StateStore(), threading.Event())
    documents = ServerDocuments(metrics="")
    engine = EngineSettings(tensor_parallel_size=2, max_model_len=4096)
    gemma = poller.deriver(documents, None)
    assert gemma is not None
    # Gemma 3 has sliding-window layers, Llama 3.1 none.
    assert {g.kind for g in gemma(engine, 20_000).capacity.groups} == {
        "full_attention",
        "sliding_window",
    }
    # Unchanged: the same deriver, with the derivations it has cached.
    assert poller.deriver(documents, None) is gemma
    # Rewritten with the same content (a new inode and times): still the same deriver.
    same = tmp_path / "config.json.same"
    same.write_text(config.read_text())
    same.rename(config)
    with capture_logs() as logs:
        assert poller.deriver(documents, None) is gemma
    assert logs == []
    # Replaced (a new file renamed over it): read again.
    replacement = tmp_path / "config.json.new"
    replacement.write_text(json.dumps(example_config("llama-3.1-8b")))
    replacement.rename(config)
    llama = poller.deriver(documents, None)
    assert llama is not None
    assert llama is not gemma
    assert {g.kind for g in llama(engine, 20_000).capacity.groups} == {"full_attention"}
    # Unreadable: every derivation fails, saying why.
    config.unlink()
    unreadable = poller.deriver(documents, None)
    assert unreadable is not None
    with pytest.raises(ConfigError, match=re.escape(f"cannot read {config}: No such file")):
        unreadable(engine, 20_000)
    assert poller.deriver(documents, None) is unreadable


def test_a_derivation_problem_is_logged_once_while_it_lasts_and_again_when_it_returns() -> None:
    playback = Playback(metrics=GEMMA_BODY)  # no --model.config: nothing to derive from
    with serve(playback) as url, capture_logs() as logs:
        poller = poll(url, VllmHttpSettings(urls=(url,)), StateStore())
        poller.poll_once()
        playback.metrics = b""  # no engine, no problem: forgotten
        poller.poll_once()
        playback.metrics = GEMMA_BODY
        poller.poll_once()
        poller.poll_once()
    problems = [log["error"] for log in logs if log["event"] == "capacity_not_derived"]
    no_config = "no model config.json (give --model.config or serve a local model path)"
    assert problems == [no_config] * 2


def test_serve_args_are_discovered_in_a_shared_process_namespace(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "cmdline").write_bytes(b"/pause\0")
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cmdline").write_bytes(
        b"/usr/bin/python3\0-m\0vllm.entrypoints.openai.api_server\0--model\0/models/x\0"
        b"--tensor-parallel-size\0004\0--max-model-len\00032768\0"
    )
    (tmp_path / "self").mkdir()
    found = discover_serve_args(tmp_path)
    assert found is not None
    assert found.model == "/models/x"
    assert found.tensor_parallel_size == 4
    assert found.max_model_len == 32768
    assert discover_serve_args(tmp_path / "missing") is None


def _vllm_process(proc: Path, pid: int, *flags: str) -> None:
    (proc / str(pid)).mkdir(parents=True)
    argv = ["vllm", "serve", *flags]
    (proc / str(pid) / "cmdline").write_bytes(b"\0".join(w.encode() for w in argv) + b"\0")


def test_of_several_vllm_servers_the_one_on_the_urls_port_is_discovered(tmp_path: Path) -> None:
    _vllm_process(tmp_path, 7, "/models/a", "--max-model-len", "1024")  # port 8000
    _vllm_process(tmp_path, 9, "/models/b", "--port", "8002", "--port", "8001")  # the last
    models = [getattr(discover_serve_args(tmp_path, port=p), "model", None) for p in (8000, 8001)]
    assert models == ["/models/a", "/models/b"]
    # No server on the port: with two, another's settings would derive wrong figures.
    assert discover_serve_args(tmp_path, port=9000) is None
    alone = tmp_path / "alone"
    _vllm_process(alone, 7, "/models/a", "--port", "8001")
    # The only vLLM, reached through another port (a proxy, a port mapping).
    found = discover_serve_args(alone, port=80)
    assert found is not None
    assert found.model == "/models/a"


def test_a_poller_discovers_the_server_its_url_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _vllm_process(tmp_path, 7, "/models/a")
    _vllm_process(tmp_path, 9, "/models/b", "--port=8001")
    # This folder stands in for /proc; the port is what the poller passes.
    monkeypatch.setattr(
        vllm_http, "discover_serve_args", partial(vllm_processes.discover_serve_args, tmp_path)
    )
    found = {}
    for url in ("http://127.0.0.1:8001", "http://localhost:8000/"):
        settings = VllmHttpSettings(urls=(url,))
        poller = ServerPoller(url, settings, fetch, StateStore(), threading.Event())
        found[url] = getattr(poller.serve_args(), "model", None)
    assert found == {"http://127.0.0.1:8001": "/models/b", "http://localhost:8000/": "/models/a"}


@pytest.mark.process
def test_the_cli_and_the_sidecar_plan_an_old_release_alike() -> None:
    """`capacity --vllm-version 0.23.0` gives what the sidecar derives for a 0.23.0 engine:
    the group-aware capacity, and that release's two log lines."""
    path = EXPOSITIONS / "releases" / "0.23.0" / "gemma-3-27b-text-dp2-tp2.json"
    fixture = load(path)
    playback = Playback(
        metrics=exposition_of(path, fixture),
        documents={"/v1/models": fixture["v1_models"], "/version": fixture["version"]},
    )
    store = StateStore()
    with serve(playback) as url:
        poll(url, settings_for(url, fixture, path), store)
    view = store.snapshot().engines[0]
    engine = fixture["engines"][0]
    run = subprocess.run(
        cli_command(
            "capacity",
            "--vllm-version",
            "0.23.0",
            "--json",
            "--",
            "vllm",
            "serve",
            str(path.parent / fixture["model_config_dir"]),
            "-tp",
            "2",
            "--max-model-len",
            str(engine["max_model_len"]),
            "--num-gpu-blocks",
            str(engine["num_gpu_blocks"]),
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    cli = json.loads(run.stdout)["result"]
    assert view.derived_kv_cache_size_tokens == cli["kv_cache_size_tokens"]
    assert view.log_lines == tuple(cli["log_lines"])
    assert len(cli["log_lines"]) == 2
    # From 0.20.1 the logged figure is the group-aware capacity.
    assert cli["logged_kv_cache_size_tokens"] == cli["kv_cache_size_tokens"]
    assert view.log_note is cli["log_note"] is None


def test_each_engine_gets_the_kv_event_publisher_vllm_reports_for_its_rank() -> None:
    fixture = load(LLAMA)
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "replay_endpoint": None}
    playback = Playback(
        metrics=exposition_of(LLAMA, fixture),
        documents={
            "/v1/models": fixture["v1_models"],
            "/version": fixture["version"],
            # As vLLM serves it with DP 2: each rank's endpoint offset by its rank.
            "/kv_event_sources": {
                "0": {**config, "endpoint": "tcp://*:5557"},
                "1": {**config, "endpoint": "tcp://*:5558"},
            },
        },
    )
    store = StateStore()
    with serve(playback) as url:
        poll(url, settings_for(url, fixture, LLAMA), store)
    endpoints = {v.engine: v.kv_events for v in store.snapshot().engines}
    assert {e: p.endpoint if p else None for e, p in endpoints.items()} == {
        "0": "tcp://127.0.0.1:5557",
        "1": "tcp://127.0.0.1:5558",
    }
