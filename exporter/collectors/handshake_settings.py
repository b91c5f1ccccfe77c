"""The handshake collector's settings: their defaults, their --handshake.* flags, and the
settings a command line gives."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from exporter.collectors.registry import (
    DEFAULT_FORGET_AFTER_S,
    DEFAULT_MAX_ENGINES,
    check_engine_windows,
    check_max_engines,
)
from exporter.flags import (
    FieldFlag,
    FlagGroup,
    duration,
    field_values,
    positive_int,
    positive_number,
    size,
)

DEFAULT_ENDPOINT = "ipc:///tmp/kvcap/handshake.sock"
# One lost or late heartbeat is not a dead engine, three in a row are (the default stale
# window, in heartbeat intervals of the engine).
STALE_AFTER_HEARTBEATS = 3
# One engine heartbeating at the plugin's shortest interval (50 ms) sends 20 a second.
DEFAULT_MAX_RATE_PER_ENGINE = 20.0
# vLLM makes a few KV cache groups per model (8 at most among the recorded ones: Gemma 3,
# Jamba, Qwen3-Next), one per attention kind and layer count ratio.
DEFAULT_MAX_GROUPS = 32
# Workers (TP x PP) of one engine: 8 GPUs x 16 pipeline stages is 128; and the devices
# it sees (CUDA_VISIBLE_DEVICES: a node's GPUs, or MIG instances).
DEFAULT_MAX_WORKERS = 256
# Groups, workers and devices over every engine: each is a row of every per-group or
# per-worker family, or a string in /engines. 64 engines of 8 groups, 8 workers and 8
# devices use 1,536; 2,048 rows of 256-character model names are a 3 MiB /metrics, a
# 1.1 MiB /engines served in 0.2 s and 64 MiB peak RSS.
DEFAULT_MAX_SERIES_ROWS = 2048


@dataclass(frozen=True, slots=True)
class HandshakeSettings:
    endpoint: str = DEFAULT_ENDPOINT
    # A ready response is about 1 KiB, its extras a few KiB; ZMQ refuses a larger frame
    # before buffering it (ZMQ_MAXMSGSIZE is checked frame by frame).
    max_frame_bytes: int = 64 * 2**10
    receive_hwm: int = 1000
    # More messages than this per second are dropped (and counted): engines send one
    # ready response each per heartbeat interval, so a flood is a bug or an attack.
    max_messages_per_s: float = 200.0
    # Silence after which an engine is stale; None: STALE_AFTER_HEARTBEATS of the interval
    # its plugin announces. Engines of a v1 plugin (no heartbeat) never go stale by time.
    stale_after_s: float | None = None
    # Silence after which an engine is removed from the state (and so from /metrics).
    forget_after_s: float = DEFAULT_FORGET_AFTER_S
    # Engines known at once; a ready message for one more is refused.
    max_engines: int = DEFAULT_MAX_ENGINES
    # Messages per second of one engine, besides the global `max_messages_per_s`.
    max_messages_per_engine_per_s: float = DEFAULT_MAX_RATE_PER_ENGINE
    # KV cache groups and workers (and devices) of one engine, and all of them over every
    # engine.
    max_groups_per_engine: int = DEFAULT_MAX_GROUPS
    max_workers_per_engine: int = DEFAULT_MAX_WORKERS
    max_series_rows: int = DEFAULT_MAX_SERIES_ROWS
    # Mode of the ipc:// socket file: only this user (and root) may connect by default.
    socket_mode: int = 0o600


def _socket_mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an octal mode such as 0600, got {text!r}") from None
    if mode not in (0o600, 0o660):
        raise argparse.ArgumentTypeError(
            "0600 or 0660: read and write for the owner, maybe the group"
        )
    return mode


# In help order: the socket and what it accepts; when an engine is stale or removed and who
# may push (the ipc:// mode); how many engines, groups and workers are kept and how fast one
# engine may talk.
_FLAGS = (
    FieldFlag(
        "--handshake.listen",
        "endpoint",
        "ZMQ endpoint the vLLM plugin pushes to: ipc://PATH (its directory "
        "is created 0700) or tcp://127.0.0.1:PORT",
        metavar="ENDPOINT",
    ),
    FieldFlag(
        "--handshake.max-frame-size",
        "max_frame_bytes",
        "largest accepted frame; ZMQ drops a peer that sends a larger one",
        metavar="SIZE",
        type=size,
        default_text="64KiB",
    ),
    FieldFlag(
        "--handshake.receive-hwm",
        "receive_hwm",
        "ZMQ receive high-water mark: messages queued before ZMQ drops",
        metavar="MESSAGES",
        type=positive_int,
    ),
    FieldFlag(
        "--handshake.max-rate",
        "max_messages_per_s",
        "messages per second accepted before dropping",
        metavar="PER_SECOND",
        type=positive_number,
        default_text="200",
    ),
    FieldFlag(
        "--handshake.stale-after",
        "stale_after_s",
        "time without a heartbeat after which an engine is stale",
        metavar="DURATION",
        type=duration,
        default_text=f"{STALE_AFTER_HEARTBEATS} of the heartbeat intervals its plugin announces",
    ),
    FieldFlag(
        "--handshake.socket-mode",
        "socket_mode",
        "mode of an ipc:// socket file (0600: kvcap's user and root may push; "
        "0660 also lets a vLLM of the same group in)",
        metavar="MODE",
        type=_socket_mode,
        default_text="0600",
    ),
    FieldFlag(
        "--handshake.forget-after",
        "forget_after_s",
        "time without a heartbeat after which an engine is removed",
        metavar="DURATION",
        type=duration,
        default_text=f"{DEFAULT_FORGET_AFTER_S:g}s",
    ),
    FieldFlag(
        "--handshake.max-engines",
        "max_engines",
        "most engines known at once",
        metavar="N",
        type=positive_int,
    ),
    FieldFlag(
        "--handshake.max-rate-per-engine",
        "max_messages_per_engine_per_s",
        "messages per second of one engine accepted before dropping",
        metavar="PER_SECOND",
        type=positive_number,
        default_text=f"{DEFAULT_MAX_RATE_PER_ENGINE:g}",
    ),
    FieldFlag(
        "--handshake.max-groups",
        "max_groups_per_engine",
        "most KV cache groups of one engine; an engine with more is refused",
        metavar="N",
        type=positive_int,
    ),
    FieldFlag(
        "--handshake.max-workers",
        "max_workers_per_engine",
        "most workers (TP x PP), and most devices it sees, of one engine; an engine "
        "with more is refused",
        metavar="N",
        type=positive_int,
    ),
    FieldFlag(
        "--handshake.max-series-rows",
        "max_series_rows",
        "most KV cache groups, workers and devices over all engines (each a row of "
        "every per-group or per-worker family, or a string in /engines); an engine past it "
        "is refused",
        metavar="N",
        type=positive_int,
    ),
)


def add_arguments(group: FlagGroup) -> None:
    group.add_fields(_FLAGS, HandshakeSettings())


def settings_from_args(args: argparse.Namespace) -> HandshakeSettings:
    """The settings `kvcap-exporter serve`'s --handshake.* flags give; raises UsageError on
    windows or an engine budget out of range."""
    fields = field_values(args, _FLAGS)
    check_max_engines("handshake", fields["max_engines"])
    check_engine_windows("handshake", fields["stale_after_s"], fields["forget_after_s"])
    return HandshakeSettings(**fields)
