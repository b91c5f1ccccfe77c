"""Flags that set a settings field: the default is the field's, the value lands in the field."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exporter.cli import CommandLineParser
from exporter.collectors import (
    COLLECTORS,
    HandshakeSettings,
    KvEventsCollector,
    KvEventsSettings,
    NvmlCollector,
    NvmlSettings,
    VllmHttpCollector,
    VllmHttpSettings,
)
from exporter.collectors.handshake_settings import add_arguments, settings_from_args
from exporter.errors import UsageError
from exporter.flags import FieldFlag, Flags, duration, field_values, positive_int


@dataclass(frozen=True, slots=True)
class Polling:
    interval_s: float = 5.0
    retries: int = 3
    verbose: bool = False


POLLING_FLAGS = (
    FieldFlag("--poll.interval", "interval_s", "time between polls", type=duration),
    FieldFlag("--poll.retries", "retries", "tries per poll", metavar="N", type=positive_int),
    FieldFlag("--poll.verbose", "verbose", "say more", switch=True),
)


def polling_parser() -> tuple[CommandLineParser, Flags]:
    parser = CommandLineParser()
    flags = Flags(parser)
    flags.group("poll").add_fields(POLLING_FLAGS, Polling())
    return parser, flags


def test_field_flags_default_to_the_fields_and_set_them() -> None:
    parser, _ = polling_parser()
    assert Polling(**field_values(parser.parse_args([]), POLLING_FLAGS)) == Polling()
    given = parser.parse_args(["--poll.interval=250ms", "--poll.retries=7", "--poll.verbose"])
    assert Polling(**field_values(given, POLLING_FLAGS)) == Polling(0.25, 7, True)


def test_field_flags_help_shows_the_fields_default_and_twin() -> None:
    parser, _ = polling_parser()
    help_text = " ".join(parser.format_help().split())
    assert "time between polls (default 5s; env KVCAP_POLL_INTERVAL)" in help_text
    assert "tries per poll (default 3; env KVCAP_POLL_RETRIES)" in help_text
    assert "--poll.verbose, --no-poll.verbose" in help_text


def test_field_flags_twins_set_the_fields_and_are_checked() -> None:
    parser, flags = polling_parser()
    flags.apply_environment({"KVCAP_POLL_RETRIES": "9", "KVCAP_POLL_VERBOSE": "yes"})
    assert Polling(**field_values(parser.parse_args([]), POLLING_FLAGS)) == Polling(5.0, 9, True)
    with pytest.raises(UsageError, match="KVCAP_POLL_RETRIES: must be at least 1"):
        polling_parser()[1].apply_environment({"KVCAP_POLL_RETRIES": "0"})


def handshake_settings(*argv: str) -> HandshakeSettings:
    parser = CommandLineParser()
    add_arguments(Flags(parser).group("handshake"))
    return settings_from_args(parser.parse_args(list(argv)))


def kv_events_settings(*argv: str) -> KvEventsSettings:
    parser = CommandLineParser()
    COLLECTORS["kv_events"].add_arguments(Flags(parser).group("kv_events"))
    # An endpoint to follow, so that the collector is built with discovery off too.
    endpoint = "tcp://127.0.0.1:5"
    built = COLLECTORS["kv_events"].build(
        parser.parse_args([f"--kv-events.endpoint={endpoint}", *argv])
    )
    assert isinstance(built, KvEventsCollector)
    assert [given.endpoint for given in built.settings.endpoints] == [endpoint]
    return dataclasses.replace(built.settings, endpoints=())


def vllm_http_settings(*argv: str) -> VllmHttpSettings:
    parser = CommandLineParser()
    COLLECTORS["vllm_http"].add_arguments(Flags(parser).group("vllm_http"))
    # A server to poll, so that the collector is built; its stale window fixed at the
    # settings' own, not 3 of the poll intervals a row gives.
    url = "http://127.0.0.1:1"
    built = COLLECTORS["vllm_http"].build(
        parser.parse_args([f"--vllm.url={url}", "--vllm.stale-after=15s", *argv])
    )
    assert isinstance(built, VllmHttpCollector)
    assert built.settings.urls == (url,)
    return dataclasses.replace(built.settings, urls=())


def nvml_settings(*argv: str) -> NvmlSettings:
    parser = CommandLineParser()
    COLLECTORS["nvml"].add_arguments(Flags(parser).group("nvml"))
    # The devices given, so that this process's CUDA_VISIBLE_DEVICES is not read.
    built = COLLECTORS["nvml"].build(parser.parse_args(["--nvml.visible-devices=1,0", *argv]))
    assert isinstance(built, NvmlCollector)
    assert built.settings.visible_devices == ("1", "0")
    return dataclasses.replace(built.settings, visible_devices=None)


# The settings each collector's flags build, and its settings as constructed bare.
SETTINGS: dict[str, tuple[Callable[..., object], object]] = {
    "--handshake.": (handshake_settings, HandshakeSettings()),
    "--kv-events.": (kv_events_settings, KvEventsSettings()),
    "--no-kv-events.": (kv_events_settings, KvEventsSettings()),
    "--vllm.": (vllm_http_settings, VllmHttpSettings(urls=())),
    "--model.": (vllm_http_settings, VllmHttpSettings(urls=())),
    "--nvml.": (nvml_settings, NvmlSettings()),
}


@pytest.mark.parametrize("prefix", ["--handshake.", "--kv-events.", "--vllm.", "--nvml."])
def test_the_collectors_flags_default_to_their_settings(prefix: str) -> None:
    built, defaults = SETTINGS[prefix]
    assert built() == defaults


# Each flag, a value it is given, and the field of its collector's settings that value sets
# (a SIZE may be 0, yet a stream's rate is at least a byte a second).
GIVEN_FIELDS: tuple[tuple[str, str, Any], ...] = (
    ("--handshake.listen=tcp://127.0.0.1:5999", "endpoint", "tcp://127.0.0.1:5999"),
    ("--handshake.max-frame-size=1KiB", "max_frame_bytes", 1024),
    ("--handshake.receive-hwm=11", "receive_hwm", 11),
    ("--handshake.max-rate=12", "max_messages_per_s", 12.0),
    ("--handshake.stale-after=13s", "stale_after_s", 13.0),
    ("--handshake.socket-mode=0660", "socket_mode", 0o660),
    ("--handshake.forget-after=140s", "forget_after_s", 140.0),
    ("--handshake.max-engines=15", "max_engines", 15),
    ("--handshake.max-rate-per-engine=16", "max_messages_per_engine_per_s", 16.0),
    ("--handshake.max-groups=17", "max_groups_per_engine", 17),
    ("--handshake.max-workers=18", "max_workers_per_engine", 18),
    ("--handshake.max-series-rows=19", "max_series_rows", 19),
    ("--kv-events.max-message-size=1KiB", "max_message_bytes", 1024),
    ("--kv-events.max-stream-rate=2KiB", "max_stream_bytes_per_s", 2048),
    ("--kv-events.max-blocks=13", "max_blocks", 13),
    ("--kv-events.max-groups=14", "max_groups", 14),
    ("--kv-events.max-batch-events=15", "max_batch_events", 15),
    ("--kv-events.max-batch-hashes=16", "max_batch_hashes", 16),
    ("--kv-events.max-subscriptions=17", "max_subscriptions", 17),
    ("--kv-events.max-replays=18", "max_replays", 18),
    ("--kv-events.max-stream-rate=0", "max_stream_bytes_per_s", 1),
    ("--vllm.poll-interval=2s", "poll_interval_s", 2.0),
    ("--vllm.timeout=4s", "timeout_s", 4.0),
    ("--vllm.max-body-size=1KiB", "max_body_bytes", 1024),
    ("--vllm.forget-after=140s", "forget_after_s", 140.0),
    ("--vllm.max-engines=15", "max_engines", 15),
    ("--nvml.poll-interval=2s", "poll_interval_s", 2.0),
    ("--vllm.platform=cpu", "platform", "cpu"),
    ("--model.config=/models/m", "model_config", Path("/models/m")),
    ("--nvml.library=/opt/lib/libnvidia-ml.so.1", "library_path", "/opt/lib/libnvidia-ml.so.1"),
    ("--no-kv-events.discover", "discover", False),
)


@pytest.mark.parametrize(("flag", "field", "value"), GIVEN_FIELDS)
def test_a_collectors_flag_sets_its_own_field_and_no_other(
    flag: str, field: str, value: Any
) -> None:
    built, defaults = next(found for prefix, found in SETTINGS.items() if flag.startswith(prefix))
    assert built(flag) == dataclasses.replace(defaults, **{field: value})  # type: ignore[type-var]
