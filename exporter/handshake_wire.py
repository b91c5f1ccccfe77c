"""The handshake wire contract between kvcap's vLLM plugin and the sidecar.

ZMQ PUSH (plugin, connect) -> PULL (sidecar, bind). Multipart messages:

    [b"kvcap.ready.v2", <vLLM's own msgpack bytes of EngineCoreReadyResponse>, <Heartbeat>,
     <ReadyExtras>]
    [b"kvcap.bye.v1", <Bye>]

The Heartbeat of a plugin of this version carries `bye_token`, a secret of the engine's
process; its Bye repeats it, and the sidecar removes an engine on a bye only when the token
matches the one the engine's instance sent first (a later heartbeat cannot change it: see
exporter/collectors/handshake_admission.py). So a bye carrying an `instance_id` read from
/metrics removes nothing. The token is never exported. A plugin that sends no token (v1,
or v2 from before it) has its byes accepted as before.

Every field is bounded on the wire (strings, list lengths, numbers past anything vLLM
produces, no NaN or negative counts): a value out of bounds makes the frame malformed.

A plugin of this version sends the ready v2 message when the engine is ready and again
every heartbeat interval, so the sidecar can tell a silent (dead) engine from a live one
and a restarted sidecar learns every engine within one interval. The previous plugin sent
`[b"kvcap.ready.v1", <ready>, <ReadyExtras>]` once and no heartbeat; the sidecar still
accepts it (`ready_message`), and such an engine leaves only by its bye.

The ready response is decoded with a tolerant Struct: vLLM 0.22 to 0.33 encode the
dataclass as a map of every field; unknown fields are ignored, newer optional ones may be
missing. The extras frame (optional) carries what the ready response lacks.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

READY_TOPIC = b"kvcap.ready.v1"  # the previous plugin's: sent once, no heartbeat
READY_V2_TOPIC = b"kvcap.ready.v2"
BYE_TOPIC = b"kvcap.bye.v1"
# Bounds that no deployment reaches but that keep a hostile frame from making kvcap loop
# over a worker or rank count (the GPU mapping walks every worker of an engine).
MAX_PARALLEL = 2**16
ParallelSize = Annotated[int, msgspec.Meta(ge=1, le=MAX_PARALLEL)]
Rank = Annotated[int, msgspec.Meta(ge=0, lt=MAX_PARALLEL)]
ENDPOINT_ENV = "KVCAP_HANDSHAKE_ENDPOINT"
HEARTBEAT_INTERVAL_ENV = "KVCAP_HEARTBEAT_INTERVAL"
DEFAULT_HEARTBEAT_INTERVAL_S = 5.0
# An interval outside these is refused by the plugin (it warns and keeps the default) and
# by the sidecar (malformed frame): faster would flood --handshake.max-rate, slower makes
# liveness meaningless.
MIN_HEARTBEAT_INTERVAL_S = 0.05
MAX_HEARTBEAT_INTERVAL_S = 3600.0
HeartbeatInterval = Annotated[
    float, msgspec.Meta(ge=MIN_HEARTBEAT_INTERVAL_S, le=MAX_HEARTBEAT_INTERVAL_S)
]
MAX_TEXT_CHARS = 256
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_CHARS)]
# 2**48: past any block, token, byte or layer count of a real engine, far from int64's end.
_LARGEST = 2**48
Count = Annotated[int, msgspec.Meta(ge=0, le=_LARGEST)]
Positive = Annotated[int, msgspec.Meta(ge=1, le=_LARGEST)]
Concurrency = Annotated[float, msgspec.Meta(ge=0, le=_LARGEST)]  # NaN fails both bounds
ByeToken = Annotated[str, msgspec.Meta(min_length=16, max_length=128)]


class ReadyResponse(msgspec.Struct, frozen=True):
    """The fields of vLLM's EngineCoreReadyResponse that kvcap reads. The others (dtype,
    the other parallel sizes, scheduler limits, ...) are skipped undecoded: a field nobody
    reads cannot fail a frame."""

    max_model_len: Positive
    num_gpu_blocks: Count
    data_parallel_rank: Rank
    block_size: Positive | None = None
    vllm_version: Text | None = None
    world_size: ParallelSize | None = None
    instance_id: Text | None = None
    kv_cache_size_tokens: Count | None = None
    kv_cache_max_concurrency: Concurrency | None = None
    # vLLM's resolved KVEventsConfig (a map) when it publishes KV events; read leniently
    # by the kv_events collector, so an odd value cannot fail the ready response.
    kv_events_config: Any = None


class GroupExtra(msgspec.Struct, frozen=True):
    """One KV cache group of the engine's scheduler config, as the plugin saw it."""

    spec_type: Text
    num_layers: Count
    block_size: Positive
    page_size_bytes: Count
    max_memory_usage_bytes_per_request: Count | None = None
    sliding_window: Count | None = None
    attention_chunk_size: Count | None = None


class ReadyExtras(msgspec.Struct, frozen=True):
    """What the plugin adds to the ready response (every field optional)."""

    groups: Annotated[list[GroupExtra], msgspec.Meta(max_length=256)] = []
    bytes_per_block_per_worker: Annotated[list[Count], msgspec.Meta(max_length=MAX_PARALLEL)] = []
    # The engine process's CUDA_VISIBLE_DEVICES entries (indices or UUIDs), in worker order.
    devices: Annotated[list[Text], msgspec.Meta(max_length=4096)] = []
    # The plugin's process: tells a forked child's messages from its parent's.
    pid: Count | None = None
    model_name: Text | None = None
    cache_dtype: Text | None = None
    settings: Annotated[dict[Text, Any], msgspec.Meta(max_length=64)] = {}


class ExtrasSettings(msgspec.Struct, frozen=True):
    """The engine settings the sidecar reads. Any type here: the collector checks each, so
    a bad offload setting costs the engine its offload tier, not its ready message
    (exporter/collectors/handshake_offload.py)."""

    platform: Any = None
    tensor_parallel_size: Any = None
    # The offload tier (a plugin before it sends none of these: no tier): the cache
    # config's `kv_offloading_size` (GiB) and `kv_offloading_backend`, and of the
    # `kv_transfer_config` vLLM resolved them into its `kv_connector` and three keys of
    # its `kv_connector_extra_config`.
    kv_offloading_size: Any = None
    kv_offloading_backend: Any = None
    kv_connector: Any = None
    kv_connector_cpu_bytes_to_use: Any = None
    kv_connector_block_size: Any = None
    kv_connector_blocks_per_chunk: Any = None


class ReceivedExtras(msgspec.Struct, frozen=True):
    """The fields of ReadyExtras the sidecar reads; pid and the other settings are skipped
    undecoded."""

    groups: Annotated[list[GroupExtra], msgspec.Meta(max_length=256)] = []
    bytes_per_block_per_worker: Annotated[list[Count], msgspec.Meta(max_length=MAX_PARALLEL)] = []
    devices: Annotated[list[Text], msgspec.Meta(max_length=4096)] = []
    model_name: Text | None = None
    cache_dtype: Text | None = None
    settings: ExtrasSettings = ExtrasSettings()


class Heartbeat(msgspec.Struct, frozen=True):
    """How often the plugin re-sends this ready message: the sidecar's liveness clock."""

    interval_s: HeartbeatInterval
    bye_token: ByeToken | None = None  # the process's secret its byes repeat


class Bye(msgspec.Struct, frozen=True):
    engine_index: Rank
    instance_id: Text | None = None
    bye_token: ByeToken | None = None


_ready_decoder = msgspec.msgpack.Decoder(ReadyResponse)
_extras_decoder = msgspec.msgpack.Decoder(ReceivedExtras)
_bye_decoder = msgspec.msgpack.Decoder(Bye)
_heartbeat_decoder = msgspec.msgpack.Decoder(Heartbeat)
_encoder = msgspec.msgpack.Encoder()


def decode_ready(payload: bytes) -> ReadyResponse:
    return _ready_decoder.decode(payload)


def decode_extras(payload: bytes) -> ReceivedExtras:
    return _extras_decoder.decode(payload)


def decode_bye(payload: bytes) -> Bye:
    return _bye_decoder.decode(payload)


def decode_heartbeat(payload: bytes) -> Heartbeat:
    return _heartbeat_decoder.decode(payload)


def encode(value: object) -> bytes:
    return _encoder.encode(value)


def ready_message(ready: bytes, extras: ReadyExtras | None = None) -> list[bytes]:
    """The previous plugin's ready message (v1): what a not yet upgraded vLLM image sends."""
    frames = [READY_TOPIC, ready]
    if extras is not None:
        frames.append(encode(extras))
    return frames


def ready_v2_message(
    ready: bytes,
    interval_s: float,
    extras: ReadyExtras | None = None,
    bye_token: str | None = None,
) -> list[bytes]:
    """The ready message this plugin sends at ready time and every `interval_s` after."""
    frames = [READY_V2_TOPIC, ready, encode(Heartbeat(interval_s, bye_token))]
    if extras is not None:
        frames.append(encode(extras))
    return frames


def bye_message(
    engine_index: int, instance_id: str | None, bye_token: str | None = None
) -> list[bytes]:
    return [BYE_TOPIC, encode(Bye(engine_index, instance_id, bye_token))]
