"""The window and engine-budget flags of the engine collectors: refused as usage errors, one
check and one wording for every collector that has them."""

from __future__ import annotations

import pytest

from exporter.cli import parse
from exporter.collectors import COLLECTORS, HandshakeCollector, HandshakeReceiver
from exporter.errors import UsageError
from exporter.state import StateStore

URL = "--vllm.url=http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("collector", "flags", "message"),
    [
        (
            "handshake",
            ["--handshake.max-engines=65537"],
            "--handshake.max-engines must be between 1 and 65536",
        ),
        (
            "handshake",
            ["--handshake.stale-after=10s", "--handshake.forget-after=10s"],
            "--handshake.stale-after and --handshake.forget-after must be positive, "
            "the stale window shorter than the forget window",
        ),
        ("vllm_http", [URL, "--vllm.max-engines=70000"], "--vllm.max-engines must be between 1"),
        (
            "vllm_http",
            [URL, "--vllm.stale-after=1m", "--vllm.forget-after=30s"],
            "--vllm.stale-after and --vllm.forget-after must be positive, "
            "the stale window shorter than the forget window",
        ),
        (
            # The default stale window (3 poll intervals) must fit the forget window too.
            "vllm_http",
            [URL, "--vllm.poll-interval=20s", "--vllm.forget-after=1m"],
            "--vllm.stale-after and --vllm.forget-after must be positive",
        ),
    ],
)
def test_a_window_or_budget_out_of_range_is_a_usage_error(
    collector: str, flags: list[str], message: str
) -> None:
    args = parse(["serve", *flags], {})
    with pytest.raises(UsageError) as refused:
        COLLECTORS[collector].build(args)
    assert str(refused.value).startswith(message)


def test_the_handshake_window_may_be_left_to_the_heartbeats() -> None:
    # No --handshake.stale-after: the plugin's heartbeat interval decides, so only the
    # forget window and the budget are checked; the admission limits are the settings'.
    args = parse(["serve", "--handshake.max-engines=65536", "--handshake.max-rate=7"], {})
    collector = COLLECTORS["handshake"].build(args)
    assert isinstance(collector, HandshakeCollector)
    collector.stop(0)  # never started: this closes its ZMQ context
    receiver = HandshakeReceiver("tcp://127.0.0.1:9", StateStore(), collector.settings)
    assert receiver.admission.limits is collector.settings
    assert collector.settings.max_engines == 65536
    assert collector.settings.max_messages_per_s == 7.0
    assert collector.settings.stale_after_s is None
