"""Where kvcap connects for KV events: flags, /kv_event_sources, the handshake, wildcards."""

from __future__ import annotations

import argparse

import pytest

from exporter.collectors import (
    COLLECTORS,
    KvEventsCollector,
    connectable,
    endpoints_from_sources,
    engine_report,
    parse_endpoint_flag,
)
from exporter.errors import ConfigError
from exporter.flags import Flags
from exporter.handshake_wire import decode_ready, encode
from exporter.state import KvEventsEndpoint
from tests.kv_events_data import SHARED_PREFIX, load


@pytest.mark.parametrize(
    ("endpoint", "host", "expected"),
    [
        ("tcp://*:5557", "127.0.0.1", "tcp://127.0.0.1:5557"),
        ("tcp://0.0.0.0:5558", "10.0.0.7", "tcp://10.0.0.7:5558"),
        ("tcp://[::]:5557", "::1", "tcp://[::1]:5557"),
        ("tcp://10.1.2.3:5557", "127.0.0.1", "tcp://10.1.2.3:5557"),  # vLLM's node ip (tcp://*:0)
        ("ipc:///run/vllm/kv.sock", "127.0.0.1", "ipc:///run/vllm/kv.sock"),
    ],
)
def test_a_wildcard_host_becomes_the_engine_host(endpoint: str, host: str, expected: str) -> None:
    assert connectable(endpoint, host) == expected


def test_the_flag_takes_an_engine_and_a_replay_endpoint() -> None:
    assert parse_endpoint_flag("tcp://127.0.0.1:5557") == KvEventsEndpoint("tcp://127.0.0.1:5557")
    assert parse_endpoint_flag("1=tcp://*:5558+tcp://*:5560") == KvEventsEndpoint(
        "tcp://127.0.0.1:5558", "tcp://127.0.0.1:5560", "1"
    )


@pytest.mark.parametrize("value", ["", "0=", "x=tcp://a:1", "http://a:1", "tcp://a:1+udp://b"])
def test_a_bad_flag_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError):
        parse_endpoint_flag(value)


def test_kv_event_sources_as_a_live_vllm_serves_it() -> None:
    sources = load(SHARED_PREFIX)["kv_event_sources"]  # recorded from vLLM 0.32.0
    assert sources["0"]["endpoint"] == "tcp://*:18317"
    found = endpoints_from_sources(sources, "http://10.0.0.7:8000")
    assert found == {
        "0": KvEventsEndpoint("tcp://10.0.0.7:18317", "tcp://10.0.0.7:18318", "0"),
    }


def test_dp_ranks_and_disabled_publishers() -> None:
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "replay_endpoint": None}
    found = endpoints_from_sources(
        {
            "0": {**config, "endpoint": "tcp://*:5557"},
            "1": {**config, "endpoint": "tcp://*:5558"},
            "2": {**config, "publisher": "null", "endpoint": "tcp://*:5559"},
            "3": {**config, "enable_kv_cache_events": False, "endpoint": "tcp://*:5560"},
            "x": {**config, "endpoint": "tcp://*:5561"},
            "4": "not a config",
        },
        "http://127.0.0.1:8000",
    )
    assert sorted(found) == ["0", "1"]
    assert found["1"].endpoint == "tcp://127.0.0.1:5558"
    assert endpoints_from_sources(None, "http://a") == {}


def test_the_handshake_carries_the_publisher_of_its_engine() -> None:
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5558",
        "replay_endpoint": "tcp://*:5560",
    }
    ready = {
        "max_model_len": 512,
        "num_gpu_blocks": 40,
        "data_parallel_rank": 1,
        "kv_events_config": config,
    }
    report = engine_report(decode_ready(encode(ready)), None)
    assert report.kv_events == KvEventsEndpoint("tcp://127.0.0.1:5558", "tcp://127.0.0.1:5560", "1")
    odd = engine_report(decode_ready(encode({**ready, "kv_events_config": [1, 2]})), None)
    assert odd.kv_events is None


def build(*flags: str) -> KvEventsCollector | None:
    parser = argparse.ArgumentParser()
    for spec in COLLECTORS.values():
        parser.add_argument(
            f"--collector.{spec.name}",
            dest=f"collector_{spec.name}",
            action=argparse.BooleanOptionalAction,
            default=spec.default_enabled,
        )
        spec.add_arguments(Flags(parser).group(spec.name))
    built = COLLECTORS["kv_events"].build(parser.parse_args(list(flags)))
    assert built is None or isinstance(built, KvEventsCollector)
    return built


def test_the_collector_runs_when_it_has_endpoints_to_follow() -> None:
    assert build() is not None  # the handshake collector is on by default: it may report some
    assert build("--no-collector.handshake") is None
    assert build("--no-collector.handshake", "--vllm.url", "http://127.0.0.1:8000") is not None
    given = build("--no-collector.handshake", "--kv-events.endpoint", "0=tcp://*:5557")
    assert given is not None
    assert given.settings.endpoints == (KvEventsEndpoint("tcp://127.0.0.1:5557", None, "0"),)
