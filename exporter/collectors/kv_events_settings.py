"""The kv_events collector's settings: its name, what its flags set, with their defaults in
one place (the wire's and the residency's bounds are theirs), its --kv-events.* flags, and
the settings a command line gives."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from exporter.collectors.kv_events_endpoints import parse_endpoint_flag
from exporter.flags import FieldFlag, FlagGroup, field_values, positive_int, size
from exporter.kv_events_wire import DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_EVENTS, DEFAULT_MAX_HASHES
from exporter.prefix_cache import DEFAULT_MAX_BLOCKS, DEFAULT_MAX_GROUPS
from exporter.state import KvEventsEndpoint

NAME = "kv_events"
LOGGER = "kvcap.kv_events"
DEFAULT_MAX_SUBSCRIPTIONS = 128
DEFAULT_MAX_REPLAYS = 64
DEFAULT_MAX_STREAM_BYTES_PER_S = 8 * 2**20


@dataclass(frozen=True, slots=True)
class KvEventsSettings:
    endpoints: tuple[KvEventsEndpoint, ...] = ()
    discover: bool = True  # also follow the endpoints other collectors report
    max_message_bytes: int = DEFAULT_MAX_BATCH_BYTES
    max_batch_events: int = DEFAULT_MAX_EVENTS
    max_batch_hashes: int = DEFAULT_MAX_HASHES
    # Bytes of batches one stream may have applied per second (an engine of the simulated
    # deployment sends ~60 KB/s; vLLM's busiest, a few MB in a burst).
    max_stream_bytes_per_s: int = DEFAULT_MAX_STREAM_BYTES_PER_S
    max_blocks: int = DEFAULT_MAX_BLOCKS  # per engine while its pool is unknown
    max_groups: int = DEFAULT_MAX_GROUPS  # KV cache groups per engine
    # Streams followed at once (each holds 2 sockets and 4 file descriptors, 6 with a
    # replay) and replays outstanding at once; past them an endpoint waits, a gap is missed.
    max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS
    max_replays: int = DEFAULT_MAX_REPLAYS
    replay_timeout_s: float = 2.0
    max_replay_batches: int = 100_000
    # What one stream keeps of its live batches while its replay is outstanding; past
    # either bound the replay ends there and what it missed is counted.
    max_held_batches: int = 10_000
    max_held_bytes: int = 16 * 2**20
    connect_timeout_s: float = 5.0
    # A SUB libzmq dropped (a batch past MAXMSGSIZE is a protocol error, never reconnected)
    # is opened again after this, doubled on each try that does not connect, up to the max.
    reopen_after_s: float = 1.0
    max_reopen_after_s: float = 60.0
    # How often the residency is published and the engines' endpoints followed.
    discovery_interval_s: float = 1.0


# In help order after --kv-events.endpoint (a list, parsed apart).
_FLAGS = (
    FieldFlag(
        "--kv-events.discover",
        "discover",
        "also subscribe to the endpoints vLLM reports (/kv_event_sources, handshake)",
        switch=True,
    ),
    FieldFlag(
        "--kv-events.max-message-size",
        "max_message_bytes",
        "largest accepted event batch (libzmq drops a publisher that sends a bigger "
        "one; kvcap subscribes again after a back-off)",
        metavar="SIZE",
        type=size,
        default_text="16MiB",
    ),
    FieldFlag(
        "--kv-events.max-stream-rate",
        "max_stream_bytes_per_s",
        "most bytes of batches applied per second and stream; past it batches are let "
        "go undecoded and the gap is replayed or counted",
        metavar="SIZE",
        type=size,
        default_text="8MiB",
    ),
    FieldFlag(
        "--kv-events.max-blocks",
        "max_blocks",
        "most blocks tracked per engine, all groups and media together, while its pool "
        "size (num_gpu_blocks) is unknown; once known, each medium holds at most its pool",
        metavar="BLOCKS",
        type=positive_int,
    ),
    FieldFlag(
        "--kv-events.max-groups",
        "max_groups",
        "most KV cache groups tracked per engine (each group and medium is ~20 series)",
        metavar="GROUPS",
        type=positive_int,
    ),
    FieldFlag(
        "--kv-events.max-batch-events",
        "max_batch_events",
        "most events in one batch (refused at the batch's header, before decoding)",
        metavar="EVENTS",
        type=positive_int,
    ),
    FieldFlag(
        "--kv-events.max-batch-hashes",
        "max_batch_hashes",
        "most block hashes in one batch, all its events together",
        metavar="HASHES",
        type=positive_int,
    ),
    FieldFlag(
        "--kv-events.max-subscriptions",
        "max_subscriptions",
        "most KV event publishers followed at once (each takes 4 to 6 file descriptors)",
        metavar="STREAMS",
        type=positive_int,
    ),
    FieldFlag(
        "--kv-events.max-replays",
        "max_replays",
        "most replay requests outstanding at once; past it a gap counts as missed",
        metavar="REPLAYS",
        type=positive_int,
    ),
)


def add_arguments(group: FlagGroup) -> None:
    group.add(
        "--kv-events.endpoint",
        repeatable=True,
        default=[],
        metavar="[ENGINE=]ENDPOINT[+REPLAY]",
        help="a vLLM KV event publisher to subscribe to (repeatable; comma-separated in the "
        "environment), e.g. 0=tcp://127.0.0.1:5557+tcp://127.0.0.1:5558; vLLM must bind it "
        "(tcp://*:PORT)",
    )
    group.add_fields(_FLAGS, KvEventsSettings())


def settings_from_args(args: argparse.Namespace) -> KvEventsSettings | None:
    """The settings `kvcap-exporter serve`'s --kv-events.* flags give; None with no endpoint
    given and none to discover (no --vllm.url, no handshake collector)."""
    endpoints = tuple(parse_endpoint_flag(value) for value in args.kv_events_endpoint)
    fields = field_values(args, _FLAGS)
    discover = fields["discover"] and bool(
        getattr(args, "vllm_url", None) or getattr(args, "collector_handshake", False)
    )
    if not endpoints and not discover:
        return None
    # positive_int flags (and their twins) are 1 or more; a SIZE may be 0.
    fields["max_stream_bytes_per_s"] = max(1, fields["max_stream_bytes_per_s"])
    return KvEventsSettings(endpoints=endpoints, **fields)
