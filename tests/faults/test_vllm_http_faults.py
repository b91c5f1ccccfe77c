"""The vllm_http source against a simulated vLLM that dies, restarts and changes under it.

The whole daemon runs (Exporter: sources, state, web server) and every check reads
/metrics as Prometheus would. Polls every POLL_INTERVAL_S; data is stale after 3 polls.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from exporter.capacity import derive_capacity
from exporter.collectors import ServerPoller, VllmHttpCollector, VllmHttpSettings, fetch
from exporter.collectors.parsing import parse_vllm_serve_args
from exporter.demo import example_config, http_collector, simulated_deployment
from exporter.demo.simulated_vllm import SimulatedVllm
from exporter.serve import Exporter
from exporter.state import StateStore
from tests.collectors.recorded_vllm import Playback, serve
from tests.faults.harness import (
    POLL_INTERVAL_S,
    SLACK_S,
    engines_document,
    running_exporter,
    scrape_until,
)
from tests.support import Scrape, scrape, wait_for

STALE_AFTER_S = 3 * POLL_INTERVAL_S
ONE_POLL_S = POLL_INTERVAL_S + SLACK_S
ERRORS = "kvcap_collector_errors_total"
NETWORK_REASONS = {"connection_refused", "connection_reset", "network"}


@dataclass
class Deployment:
    """A simulated DP=2 vLLM and the exporter polling it."""

    simulation: SimulatedVllm
    exporter: Exporter
    port: int
    model_dir: Path

    @property
    def url(self) -> str:
        return self.exporter.server.url

    def scrape(self) -> Scrape:
        return scrape(self.url)

    def until(self, predicate: Callable[[Scrape], bool], timeout_s: float, what: str) -> Scrape:
        metrics, _ = scrape_until(self.url, predicate, timeout_s, what)
        return metrics

    def kill(self) -> None:
        self.simulation.stop()

    def restart(self) -> None:
        self.simulation.start(port=self.port)


def source_for(simulation: SimulatedVllm, model_config: Path | None = None) -> VllmHttpCollector:
    source = http_collector(simulation, poll_interval_s=POLL_INTERVAL_S)
    return VllmHttpCollector(replace(source.settings, timeout_s=1.0, model_config=model_config))


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    simulation = simulated_deployment(tmp_path / "gemma-3-27b-text", data_parallel_size=2)
    simulation.start()
    port = int(simulation.url.rsplit(":", 1)[1])
    with running_exporter([source_for(simulation)]) as exporter:
        running = Deployment(simulation, exporter, port, tmp_path / "gemma-3-27b-text")
        wait_for(lambda: fresh(running.scrape(), 2), 5.0, "the first good poll")
        yield running
    simulation.stop()


def fresh(metrics: Scrape, engines: int) -> bool:
    """`engines` engines, none stale, and the source up."""
    stale = metrics.by_engine("kvcap_engine_stale")
    return (
        len(stale) == engines
        and not any(stale.values())
        and metrics.value("kvcap_collector_up", collector="vllm_http") == 1
    )


def errors(metrics: Scrape) -> float:
    """Failed reads of a server that is not there: refused, or reset when killed mid-poll."""
    return sum(
        value
        for labels, value in metrics.samples.get(ERRORS, [])
        if labels["collector"] == "vllm_http" and labels["reason"] in NETWORK_REASONS
    )


# --- the server killed and restarted ----------------------------------------------------


def test_a_killed_vllm_is_down_within_one_poll_and_stale_after_the_ttl(
    deployment: Deployment,
) -> None:
    before = deployment.scrape()
    capacity = before.by_engine("kvcap_kv_cache_capacity_tokens")
    with capture_logs() as logs:
        deployment.kill()
        killed = time.monotonic()
        down = deployment.until(
            lambda m: m.value("kvcap_collector_up", collector="vllm_http") == 0,
            ONE_POLL_S,
            "source down after the kill",
        )
        # The error is counted, the last good data stays, not yet stale within the TTL.
        assert errors(down) >= 1
        assert down.by_engine("kvcap_kv_cache_capacity_tokens") == capacity
        if time.monotonic() - killed < STALE_AFTER_S - SLACK_S:
            assert not any(down.by_engine("kvcap_engine_stale").values())
        # Stale once a failed poll finds the last good read older than the TTL: the first
        # poll after the TTL has passed, one poll interval (no backoff) after it at most.
        stale = deployment.until(
            lambda m: all(m.by_engine("kvcap_engine_stale").values()),
            STALE_AFTER_S + ONE_POLL_S,
            "engines stale",
        )
    assert stale.by_engine("kvcap_kv_cache_capacity_tokens") == capacity
    assert stale.value("kvcap_collector_all_targets_up", collector="vllm_http") == 0
    # One log line for the state change, not one per failed poll.
    assert [e["event"] for e in logs if e["event"] == "collector_failed"] == ["collector_failed"]
    assert errors(stale) >= 3


def kill_until_failures(deployment: Deployment, failures: int) -> Scrape:
    """Kill the server and wait for its `failures`-th failed poll; the scrape showing it."""
    deployment.kill()
    return deployment.until(lambda m: errors(m) >= failures, 5.0, f"{failures} failed polls")


def recovered(deployment: Deployment, capacity: dict[str, float]) -> Scrape | None:
    metrics = deployment.scrape()
    if fresh(metrics, 2) and metrics.by_engine("kvcap_kv_cache_capacity_tokens") == capacity:
        return metrics
    return None


def test_a_restarted_vllm_is_fresh_within_one_poll_interval(deployment: Deployment) -> None:
    """However many polls failed, the next one comes a poll interval later (no backoff),
    and the first good read restores everything."""
    capacity = deployment.scrape().by_engine("kvcap_kv_cache_capacity_tokens")
    with capture_logs() as logs:
        down = kill_until_failures(deployment, failures=3)
        deployment.restart()
        metrics = wait_for(
            lambda: recovered(deployment, capacity), ONE_POLL_S, "fresh after the restart"
        )
    # Errors are counters: the restart does not reset them.
    assert errors(metrics) >= errors(down)
    assert [e for e in logs if e["event"] == "collector_recovered"]


# --- engines restarting behind a running server ------------------------------------------


def test_engine_restarts_and_removals_are_picked_up_within_one_poll(
    deployment: Deployment,
) -> None:
    simulation = deployment.simulation
    before = deployment.scrape().by_engine("kvcap_kv_cache_blocks")
    # The engines restart with less memory for the KV cache: a new block count.
    plan = derive_capacity(
        simulation.config, simulation.settings, available_kv_bytes_per_worker=30_000_000_000
    )
    assert plan.capacity.num_gpu_blocks not in before.values()
    with capture_logs() as logs:
        simulation.plan = plan
        metrics = deployment.until(
            lambda m: (
                set(m.by_engine("kvcap_kv_cache_blocks").values()) == {plan.capacity.num_gpu_blocks}
            ),
            ONE_POLL_S,
            "the new block count",
        )
        assert set(metrics.by_engine("kvcap_kv_cache_capacity_tokens").values()) == {
            plan.capacity.kv_cache_size_tokens
        }
        assert set(metrics.by_engine("kvcap_kv_cache_derived_capacity_tokens").values()) == {
            plan.capacity.kv_cache_size_tokens
        }
        assert set(metrics.by_engine("kvcap_kv_cache_capacity_mismatch").values()) == {0}
        # Engine 1 goes away (its DP rank was scaled down).
        simulation.remove_engine(1)
        wait_for(
            lambda: set(deployment.scrape().by_engine("kvcap_engine_stale")) == {"0"},
            ONE_POLL_S,
            "engine 1 removed",
        )
    restarts = [e for e in logs if e["event"] == "engine_restarted"]
    assert sorted(e["engine"] for e in restarts) == ["0", "1"]
    assert {e["num_gpu_blocks"] for e in restarts} == {plan.capacity.num_gpu_blocks}
    assert [e["engine"] for e in logs if e["event"] == "engine_vanished"] == ["1"]


# --- the model's config.json unreadable --------------------------------------------------


def make_unreadable(config: Path, how: str) -> None:
    if how == "deleted":
        config.rename(config.with_suffix(".away"))
    elif how == "symlink-loop":
        # Unreadable for root too (a mode-000 file is not): opening it fails with ELOOP.
        config.rename(config.with_suffix(".away"))
        config.symlink_to(config.name)
    else:  # a directory where the file was: read_text fails with IsADirectoryError
        config.rename(config.with_suffix(".away"))
        config.mkdir()


def make_readable(config: Path, how: str) -> None:
    if how == "symlink-loop":
        config.unlink()
    if how == "directory":
        config.rmdir()
    config.with_suffix(".away").rename(config)


UNREADABLE = [
    "deleted",
    "symlink-loop",
    "directory",
]


@dataclass
class ModelConfigSetup:
    """A simulated vLLM and a vllm_http source given --model.config (read from disk)."""

    simulation: SimulatedVllm
    source: VllmHttpCollector
    port: int
    model_dir: Path

    @property
    def config(self) -> Path:
        return self.model_dir / "config.json"

    @contextmanager
    def running(self) -> Iterator[Deployment]:
        with running_exporter([self.source]) as exporter:
            yield Deployment(self.simulation, exporter, self.port, self.model_dir)


@pytest.fixture
def model_config_setup(tmp_path: Path) -> Iterator[ModelConfigSetup]:
    model_dir = tmp_path / "gemma-3-27b-text"
    simulation = simulated_deployment(model_dir, data_parallel_size=2)
    simulation.start()
    port = int(simulation.url.rsplit(":", 1)[1])
    yield ModelConfigSetup(
        simulation, source_for(simulation, model_config=model_dir), port, model_dir
    )
    simulation.stop()


def derived(metrics: Scrape) -> dict[str, float]:
    return metrics.by_engine("kvcap_kv_cache_derived_capacity_tokens")


def derivation_failed(metrics: Scrape) -> dict[str, float]:
    return metrics.by_engine("kvcap_kv_cache_derivation_failed")


@pytest.mark.parametrize("how", UNREADABLE)
def test_a_model_config_unreadable_at_start_is_read_within_one_poll_once_readable(
    model_config_setup: ModelConfigSetup, how: str
) -> None:
    config = model_config_setup.config
    make_unreadable(config, how)
    with capture_logs() as logs, model_config_setup.running() as deployment:
        metrics = deployment.until(lambda m: fresh(m, 2), 5.0, "the first good poll")
        # vLLM's own numbers are exported; the derived ones are absent, with a reason.
        reported = metrics.by_engine("kvcap_kv_cache_capacity_tokens")
        assert set(reported.values()) == {deployment.simulation.plan.capacity.kv_cache_size_tokens}
        assert derived(metrics) == {}
        # The reason names the file that cannot be read, not a missing --model.config.
        document = engines_document(deployment.url)
        assert all(str(config) in engine["derivation_error"] for engine in document["engines"])
        time.sleep(2 * POLL_INTERVAL_S)  # a few more polls: still one log line
        # This test's server only: a poller of the test before may still be winding down.
        # Counted before the repair, which is not atomic for a directory (rmdir, then
        # rename): a poll in between sees another problem (no file), logged once too.
        warnings = [
            e
            for e in logs
            if e["event"] == "model_config_unreadable"
            and e.get("target") == model_config_setup.simulation.url
        ]
        make_readable(config, how)
        metrics = deployment.until(lambda m: bool(derived(m)), ONE_POLL_S, "derived capacity")
    assert derived(metrics) == reported
    assert metrics.by_engine("kvcap_kv_cache_capacity_tokens") == reported
    assert set(metrics.by_engine("kvcap_kv_cache_capacity_mismatch").values()) == {0}
    assert len(warnings) == 1
    assert str(config) in warnings[0]["error"]


@pytest.mark.parametrize("how", UNREADABLE)
def test_a_model_config_that_becomes_unreadable_drops_the_derived_capacity(
    model_config_setup: ModelConfigSetup, how: str
) -> None:
    config = model_config_setup.config
    with capture_logs() as logs, model_config_setup.running() as deployment:
        metrics = deployment.until(lambda m: bool(derived(m)) and fresh(m, 2), 5.0, "derived")
        reported = metrics.by_engine("kvcap_kv_cache_capacity_tokens")
        make_unreadable(config, how)
        try:
            metrics = deployment.until(
                lambda m: not derived(m), ONE_POLL_S, "derived capacity gone"
            )
            # vLLM's own numbers stay, fresh; each engine says why nothing is derived.
            assert fresh(metrics, 2)
            assert metrics.by_engine("kvcap_kv_cache_capacity_tokens") == reported
            document = engines_document(deployment.url)
            assert all(str(config) in e["derivation_error"] for e in document["engines"])
            assert set(derivation_failed(metrics).values()) == {1}
            time.sleep(2 * POLL_INTERVAL_S)  # a few more polls: still one log line
        finally:
            make_readable(config, how)
        metrics = deployment.until(lambda m: bool(derived(m)), ONE_POLL_S, "derived back")
        assert derived(metrics) == reported
        assert set(derivation_failed(metrics).values()) == {0}
        document = engines_document(deployment.url)
        assert not any(engine["derivation_error"] for engine in document["engines"])
    # One line per problem, not one per poll, and not again as a derivation failure. The
    # test changes the file in two steps (a rename, then the directory or link), so a poll
    # may also see the file missing in between: a second problem, with its own line.
    problems = ("model_config_unreadable", "capacity_not_derived")
    warnings = [e for e in logs if e["event"] in problems]
    assert {e["event"] for e in warnings} == {"model_config_unreadable"}
    errors = [e["error"] for e in warnings]
    assert len(errors) == len(set(errors)) <= 3, errors
    assert all(str(config) in error for error in errors)
    assert [e for e in logs if e["event"] == "model_config_read"]


def test_a_model_replaced_in_place_is_derived_from_its_new_config(
    model_config_setup: ModelConfigSetup,
) -> None:
    simulation = model_config_setup.simulation
    with model_config_setup.running() as deployment:
        wait_for(lambda: derived(deployment.scrape()), 5.0, "derived")
        # The volume now holds Llama 3.1 8B, and the engines restart serving it.
        llama = example_config("llama-3.1-8b")
        (deployment.model_dir / "config.json").write_text(json.dumps(llama))
        simulation.config = llama
        simulation.plan = derive_capacity(
            llama, simulation.settings, available_kv_bytes_per_worker=30_000_000_000
        )
        metrics = deployment.until(
            lambda m: set(derived(m).values()) == {simulation.plan.capacity.kv_cache_size_tokens},
            ONE_POLL_S + 1.0,
            "derived from the new config",
        )
    assert set(metrics.by_engine("kvcap_kv_cache_capacity_mismatch").values()) == {0}


# --- answers that once ended the poller thread --------------------------------------------
# The poller thread runs poll_once() in a loop; an exception out of it would end the thread
# and the source would silently stop updating. Each test polls once, synchronously.


def poll_once(url: str, settings: VllmHttpSettings, store: StateStore) -> None:
    ServerPoller(url, settings, fetch, store, threading.Event()).poll_once()


GEMMA_BODY = (
    'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",'
    'num_gpu_blocks="134276"} 1.0\n'
)


def test_a_config_json_the_capacity_model_crashes_on_leaves_the_poller_running(
    tmp_path: Path,
) -> None:
    config = {**example_config("gemma-3-27b-text"), "num_key_value_heads": 0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    store = StateStore()
    with serve(Playback(GEMMA_BODY.encode())) as url:
        settings = VllmHttpSettings(
            urls=(url,),
            serve_args=parse_vllm_serve_args("/models/gemma -tp 2"),
            model_config=tmp_path,
        )
        poll_once(url, settings, store)
    view = store.snapshot().engines[0]
    assert view.capacity.num_gpu_blocks == 134276
    assert view.derivation_error


@pytest.mark.parametrize(
    ("body", "models"),
    [
        pytest.param(
            'vllm:num_requests_running{engine="\u00b2"} 1\n',
            {},
            id="engine-superscript-two",
        ),
        pytest.param(
            GEMMA_BODY,
            {"data": [{"id": "m", "max_model_len": 0}]},
            id="v1-models-max-model-len-0",
        ),
    ],
)
def test_a_bad_server_answer_is_counted_not_fatal(
    tmp_path: Path, body: str, models: dict[str, Any]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(example_config("gemma-3-27b-text")))
    store = StateStore()
    with serve(Playback(body.encode(), documents={"/v1/models": models})) as url:
        settings = VllmHttpSettings(
            urls=(url,),
            serve_args=parse_vllm_serve_args("/models/gemma -tp 2"),
            model_config=tmp_path,
        )
        poll_once(url, settings, store)
    snapshot = store.snapshot()
    # Either refused as malformed (or as a label out of bounds) and counted, or read with
    # the problem shown per engine.
    refused = sum(
        snapshot.errors.get(("vllm_http", r), 0) for r in ("malformed_exposition", "bad_label")
    )
    assert refused == 1 or (snapshot.collectors[0].up and snapshot.engines)


def test_a_lone_surrogate_in_v1_models_breaks_no_scrape() -> None:
    body = b'vllm:num_requests_running{engine="0"} 1\n'
    store = StateStore()
    with serve(Playback(body, documents={"/v1/models": {"data": [{"id": "m\ud800"}]}})) as url:
        source = VllmHttpCollector(VllmHttpSettings(urls=(url,), poll_interval_s=POLL_INTERVAL_S))
        with capture_logs(), running_exporter([source], store=store) as exporter:
            wait_for(lambda: store.snapshot().engines, 5.0, "the engine")
            assert scrape(exporter.server.url).status == 200
