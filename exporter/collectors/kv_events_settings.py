"""The kv_events collector's settings: its name, and what its flags set, with their
defaults in one place (the wire's and the residency's bounds are theirs)."""

from __future__ import annotations

from dataclasses import dataclass

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
