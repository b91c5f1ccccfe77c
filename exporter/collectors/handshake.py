"""Collector `handshake`: engine-core ready responses forwarded by kvcap's vLLM plugin over ZMQ.

The plugin (exporter/vllm_plugin.py) pushes vLLM's own ready-response bytes per engine at
startup and again every heartbeat interval, and a bye on clean shutdown. This is the only
collector that sees headless data-parallel nodes and it carries vLLM's exact per-engine
numbers. An engine not heard from within the stale window (a crashed or OOM-killed engine
sends no bye) is marked stale, and removed after the forget window.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import structlog
import zmq

from exporter.capacity import (
    PLATFORMS,
    EngineCapacity,
    GroupCapacity,
    blocks_for_bytes,
    kind_of_spec_type,
)
from exporter.collectors.error_tally import ErrorTally
from exporter.collectors.handshake_admission import (
    STALE_AFTER_HEARTBEATS,
    Admission,
    AdmissionLimits,
    Claim,
    Refused,
)
from exporter.collectors.handshake_ipc import (
    prepare_ipc_directory,
    remove_ipc_file,
    set_ipc_file_mode,
)
from exporter.collectors.handshake_offload import with_offload
from exporter.collectors.kv_events_endpoints import endpoints_from_sources
from exporter.collectors.registry import (
    CollectorSpec,
    check_engine_windows,
    check_max_engines,
    register_collector,
)
from exporter.errors import ConfigError
from exporter.flags import FlagGroup, duration, positive_int, positive_number, size
from exporter.handshake_wire import (
    BYE_TOPIC,
    READY_TOPIC,
    READY_V2_TOPIC,
    GroupExtra,
    ReadyResponse,
    ReceivedExtras,
    decode_bye,
    decode_extras,
    decode_heartbeat,
    decode_ready,
)
from exporter.merging import converted
from exporter.state import EngineReport, StateSink

log = structlog.get_logger("kvcap.handshake")

NAME = "handshake"
DEFAULT_ENDPOINT = "ipc:///tmp/kvcap/handshake.sock"
_POLL_MS = 100
# Messages handled between two liveness sweeps (and looks at the stop flag) at most.
_RECEIVE_BATCH = 1000
# Ten minutes: past KvcapEngineStale's `for: 5m` (so the alert fires and is seen) and past
# a vLLM restart of a large model (which returns under the same engine index), yet short
# enough that a dead engine's capacity leaves `sum by` within a few Prometheus windows.
DEFAULT_FORGET_AFTER_S = 600.0
# Data-parallel engines per pod are tens; 256 leaves room and bounds the series (issue 25:
# 1,024 forged engines of 256 groups each passed 1.5 GiB).
DEFAULT_MAX_ENGINES = 256
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
# The most frames a message of the wire contract has (ready v2 with extras).
MAX_FRAMES = 4


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


def engine_report(ready: ReadyResponse, extras: ReceivedExtras | None) -> EngineReport:
    """vLLM's own numbers for one engine, with the plugin's extras where it sent them."""
    groups = tuple(_group(g) for g in (extras.groups if extras else []))
    devices = tuple(extras.devices) if extras else ()
    world_size = ready.world_size
    local_rank = None
    if devices and world_size:
        # The engine process sees all of its node's GPUs; engines of a node are numbered
        # consecutively, so its place among them is its index modulo engines per node.
        engines_per_node = max(len(devices) // world_size, 1)
        local_rank = ready.data_parallel_rank % engines_per_node
    engine = str(ready.data_parallel_rank)
    # The sidecar shares the engine's pod: a wildcard publisher is reached on loopback.
    kv_events = endpoints_from_sources({engine: ready.kv_events_config}, "http://127.0.0.1")
    return EngineReport(
        engine=engine,
        kv_events=kv_events.get(engine),
        world_size=world_size,
        local_rank=local_rank,
        devices=devices,
        model_name=(extras.model_name if extras and extras.model_name else ""),
        instance_id=ready.instance_id,
        vllm_version=ready.vllm_version,
        platform=_platform(extras),
        reported=EngineCapacity(
            num_gpu_blocks=ready.num_gpu_blocks,
            block_size=ready.block_size,
            kv_cache_size_tokens=ready.kv_cache_size_tokens,
            kv_cache_max_concurrency=ready.kv_cache_max_concurrency,
            max_model_len=ready.max_model_len,
            cache_dtype=extras.cache_dtype if extras else None,
            groups=groups,
            bytes_per_block_per_worker=tuple(extras.bytes_per_block_per_worker) if extras else (),
        ),
    )


def _group(extra: GroupExtra) -> GroupCapacity:
    per_request = extra.max_memory_usage_bytes_per_request
    return GroupCapacity(
        kind=kind_of_spec_type(extra.spec_type),
        spec_type=extra.spec_type,
        num_layers=extra.num_layers,
        layer_names=(),
        block_size=extra.block_size,
        page_size_bytes=extra.page_size_bytes,
        blocks_per_request=blocks_for_bytes(per_request, extra.page_size_bytes)
        if per_request is not None and extra.page_size_bytes > 0
        else 0,
        max_memory_usage_bytes_per_request=per_request or 0,
        sliding_window=extra.sliding_window,
        attention_chunk_size=extra.attention_chunk_size,
    )


def _platform(extras: ReceivedExtras | None) -> str | None:
    """The engine's `device_config.device_type` as the plugin sent it, if a known one."""
    value = extras.settings.platform if extras else None
    return value if isinstance(value, str) and value in PLATFORMS else None


class HandshakeReceiver:
    """Decodes the messages of one endpoint into engine changes; every outcome is counted.

    It keeps no engines: the state owns them (and logs restarts, once). It keeps which
    instance holds each engine index, with its bye token and when it was last heard
    (`Admission`), and tells the state when one falls silent. Only well-formed messages
    are charged to the rate limits (a PULL socket cannot tell its peers apart), so a flood
    of junk is counted and dropped without crowding out real ready messages.
    """

    def __init__(
        self,
        endpoint: str,
        sink: StateSink,
        settings: HandshakeSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint = endpoint
        self.sink = sink
        self.settings = settings
        self.clock = clock
        # The admission limits are settings of the same names.
        self.admission = Admission(converted(settings, AdmissionLimits), clock)
        # Rejections wait here for `flush`: a flood is one state change per reason.
        self.tally = ErrorTally(NAME)

    def handle(self, frames: list[bytes]) -> None:
        """Apply one message and count its rejection in the state at once."""
        self.receive(frames)
        self.flush()

    def receive(self, frames: list[bytes]) -> None:
        """Apply one message; a rejection is tallied until the next `flush`."""
        reason, message = self._apply(frames)
        if reason is not None:
            self.tally.count(reason, self.endpoint, message)

    def flush(self) -> None:
        """Hand the tallied rejections to the state, one change per reason."""
        self.tally.flush(self.sink)

    def _apply(self, frames: list[bytes]) -> tuple[str | None, str]:
        """None when the message was applied, else (reason, message) of the rejection."""
        if any(len(frame) > self.settings.max_frame_bytes for frame in frames):
            return "frame_too_large", f"a frame over {self.settings.max_frame_bytes} bytes"
        topic = frames[0] if frames else b""
        kinds = {
            READY_V2_TOPIC: (self._ready_v2, (3, 4)),
            READY_TOPIC: (self._ready, (2, 3)),
            BYE_TOPIC: (self._bye, (2,)),
        }
        if topic not in kinds:
            return "unknown_topic", f"topic {topic[:40]!r}"
        apply, frame_counts = kinds[topic]
        if len(frames) not in frame_counts:
            return "wrong_frame_count", f"{len(frames)} frames for {topic!r}"
        try:
            rejection = apply(frames)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as error:
            return "malformed_frame", str(error)[:200] or type(error).__name__
        except Refused as refused:
            return refused.reason, str(refused)
        return rejection or (None, "")

    def _ready(self, frames: list[bytes]) -> tuple[str, str] | None:
        """v1, the previous plugin: sent once, so the engine has no liveness but its bye."""
        ready = decode_ready(frames[1])
        extras = decode_extras(frames[2]) if len(frames) == 3 else None
        return self._claim(ready, extras, None, None)

    def _ready_v2(self, frames: list[bytes]) -> tuple[str, str] | None:
        """v2: the ready response again every heartbeat interval."""
        ready = decode_ready(frames[1])
        heartbeat = decode_heartbeat(frames[2])
        extras = decode_extras(frames[3]) if len(frames) == 4 else None
        return self._claim(ready, extras, heartbeat.interval_s, heartbeat.bye_token)

    def _claim(
        self,
        ready: ReadyResponse,
        extras: ReceivedExtras | None,
        interval_s: float | None,
        bye_token: str | None,
    ) -> tuple[str, str] | None:
        """Admit the engine and apply its report; a bad offload setting is returned as
        (reason, message): the engine is applied without a tier."""
        engine = str(ready.data_parallel_rank)
        claim = Claim(
            engine=engine,
            instance_id=ready.instance_id,
            bye_token=bye_token,
            interval_s=interval_s,
            groups=len(extras.groups) if extras else 0,
            workers=len(extras.bytes_per_block_per_worker) if extras else 0,
            devices=len(extras.devices) if extras else 0,
        )
        # Admitted before the report is built: a refused message costs no GPU mapping.
        self.admission.admit_ready(claim)
        report, rejection = with_offload(engine_report(ready, extras), extras)
        self.sink.update_engine(NAME, self.endpoint, report)
        return rejection

    def _bye(self, frames: list[bytes]) -> None:
        bye = decode_bye(frames[1])
        engine = str(bye.engine_index)
        self.admission.admit_bye(engine, bye.instance_id, bye.bye_token)
        self.sink.remove_engine(NAME, self.endpoint, engine, bye.instance_id)

    def sweep(self) -> None:
        """Apply the liveness windows now: an engine silent past the stale window is marked
        stale in the state, one silent past the forget window removed from it."""
        now = self.clock()
        for engine, held in list(self.admission.held.items()):
            if held.interval_s is None:
                continue  # a v1 plugin's engine: no heartbeat, no liveness
            silent_s = now - held.heard_at_s
            if silent_s > self.settings.forget_after_s:
                self.admission.forget(engine)
                self.sink.remove_engine(NAME, self.endpoint, engine, held.instance_id)
                continue
            if silent_s > self.admission.stale_window_s(held) and not held.stale:
                held.stale = True
                self.sink.mark_engine_stale(NAME, self.endpoint, engine, held.instance_id)


class HandshakeCollector:
    """A ZMQ PULL socket bound at the endpoint, read on one thread."""

    name = NAME

    def __init__(
        self, settings: HandshakeSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.sweeps = 0  # liveness sweeps done: tests wait on it, never on time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._context = zmq.Context(io_threads=1)
        self._socket: zmq.Socket[bytes] | None = None
        self.receiver: HandshakeReceiver | None = None

    def start(self, sink: StateSink) -> None:
        endpoint = self.settings.endpoint
        prepare_ipc_directory(endpoint)
        socket = self._context.socket(zmq.PULL)
        socket.setsockopt(zmq.RCVHWM, self.settings.receive_hwm)
        # ZMQ drops the connection of a peer that sends a frame this large before buffering
        # it (the check is per frame); a frame just over the cap still arrives, is refused
        # and counted (frame_too_large).
        socket.setsockopt(zmq.MAXMSGSIZE, 4 * self.settings.max_frame_bytes + 1024)
        socket.setsockopt(zmq.LINGER, 0)
        # Only this user may connect: the socket file is created 0600 whatever the umask.
        umask = os.umask(0o077)
        try:
            socket.bind(endpoint)
            set_ipc_file_mode(endpoint, self.settings.socket_mode)
        except (zmq.ZMQError, OSError) as error:
            socket.close()
            raise ConfigError(f"--handshake.listen {endpoint}: {error}") from None
        finally:
            os.umask(umask)
        self._socket = socket
        self.receiver = HandshakeReceiver(endpoint, sink, self.settings, self.clock)
        sink.register_target(NAME, endpoint)
        # Nothing to wait for: an empty handshake is a valid answer (no engine started yet).
        sink.publish(NAME, endpoint, [])
        self._thread = threading.Thread(target=self._run, name="handshake", daemon=True)
        self._thread.start()
        log.info("handshake_listening", endpoint=endpoint)

    def _run(self) -> None:
        assert self._socket is not None
        assert self.receiver is not None
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(_POLL_MS) and not self._receive_all():
                return
            self.receiver.sweep()
            self.sweeps += 1

    def _receive_all(self) -> bool:
        """Handle the queued messages, at most a batch of them, and count the batch's
        rejections in the state; False when the socket is gone. A peer that sends faster
        than they are handled must not keep the thread from its liveness sweep and its
        stop flag."""
        assert self.receiver is not None
        try:
            return self._receive_batch(self.receiver)
        finally:
            self.receiver.flush()

    def _receive_batch(self, receiver: HandshakeReceiver) -> bool:
        assert self._socket is not None
        endpoint = receiver.endpoint
        for _ in range(_RECEIVE_BATCH):
            if self._stop.is_set():
                return True
            try:
                frames, count = _receive_frames(self._socket, self.settings.max_frame_bytes)
            except zmq.Again:
                return True
            except zmq.ZMQError:
                return False
            if count > MAX_FRAMES:
                receiver.tally.count("wrong_frame_count", endpoint, f"{count} frames")
                continue
            try:
                receiver.receive(frames)
            except Exception as error:  # a bug must not end the thread and its sweeps
                log.exception("collector_internal_error", endpoint=endpoint)
                message = f"{type(error).__name__}: {str(error)[:200]}"
                receiver.tally.count("internal_error", endpoint, message)
        return True

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._socket is not None:
            self._socket.close(linger=0)
            remove_ipc_file(self.settings.endpoint)
        self._context.term()


def _receive_frames(socket: zmq.Socket[bytes], max_frame_bytes: int) -> tuple[list[bytes], int]:
    """One message, frame by frame: at most MAX_FRAMES frames of at most `max_frame_bytes`
    are copied out of ZMQ; the rest are counted and dropped. Raises zmq.Again when none."""
    frame = socket.recv(zmq.NOBLOCK, copy=False)
    frames: list[bytes] = []
    count = 0
    while True:
        count += 1
        if count <= MAX_FRAMES:
            # An oversized frame is kept as a stand-in of its size only: the receiver
            # refuses the message for it without the bytes being copied.
            size = len(frame.buffer)
            frames.append(frame.bytes if size <= max_frame_bytes else b"\0" * (max_frame_bytes + 1))
        if not frame.more:
            return frames, count
        frame = socket.recv(copy=False)  # the rest of a message arrives with its first frame


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


def _add_arguments(group: FlagGroup) -> None:
    # In help order: the socket and what it accepts, the engines' lifetime, their budget.
    _add_socket_arguments(group)
    _add_engine_arguments(group)
    _add_budget_arguments(group)


def _add_socket_arguments(group: FlagGroup) -> None:
    """Where the plugin pushes to and the limits on what the socket accepts."""
    group.add(
        "--handshake.listen",
        metavar="ENDPOINT",
        default=DEFAULT_ENDPOINT,
        help="ZMQ endpoint the vLLM plugin pushes to: ipc://PATH (its directory "
        "is created 0700) or tcp://127.0.0.1:PORT",
    )
    group.add(
        "--handshake.max-frame-size",
        metavar="SIZE",
        type=size,
        default=64 * 2**10,
        default_text="64KiB",
        help="largest accepted frame; ZMQ drops a peer that sends a larger one",
    )
    group.add(
        "--handshake.receive-hwm",
        metavar="MESSAGES",
        type=positive_int,
        default=1000,
        help="ZMQ receive high-water mark: messages queued before ZMQ drops",
    )
    group.add(
        "--handshake.max-rate",
        metavar="PER_SECOND",
        type=positive_number,
        default=200.0,
        default_text="200",
        help="messages per second accepted before dropping",
    )


def _add_engine_arguments(group: FlagGroup) -> None:
    """When an engine is stale or removed, who may push (the ipc:// mode), how many are kept."""
    group.add(
        "--handshake.stale-after",
        metavar="DURATION",
        type=duration,
        default_text=f"{STALE_AFTER_HEARTBEATS} of the heartbeat intervals its plugin announces",
        help="time without a heartbeat after which an engine is stale",
    )
    group.add(
        "--handshake.socket-mode",
        metavar="MODE",
        type=_socket_mode,
        default=0o600,
        default_text="0600",
        help="mode of an ipc:// socket file (0600: kvcap's user and root may push; "
        "0660 also lets a vLLM of the same group in)",
    )
    group.add(
        "--handshake.forget-after",
        metavar="DURATION",
        type=duration,
        default=DEFAULT_FORGET_AFTER_S,
        default_text=f"{DEFAULT_FORGET_AFTER_S:g}s",
        help="time without a heartbeat after which an engine is removed",
    )


def _add_budget_arguments(group: FlagGroup) -> None:
    """How many engines, groups and workers are kept, and how fast one engine may talk."""
    group.add(
        "--handshake.max-engines",
        metavar="N",
        type=positive_int,
        default=DEFAULT_MAX_ENGINES,
        help="most engines known at once",
    )
    group.add(
        "--handshake.max-rate-per-engine",
        metavar="PER_SECOND",
        type=positive_number,
        default=DEFAULT_MAX_RATE_PER_ENGINE,
        default_text=f"{DEFAULT_MAX_RATE_PER_ENGINE:g}",
        help="messages per second of one engine accepted before dropping",
    )
    group.add(
        "--handshake.max-groups",
        metavar="N",
        type=positive_int,
        default=DEFAULT_MAX_GROUPS,
        help="most KV cache groups of one engine; an engine with more is refused",
    )
    group.add(
        "--handshake.max-workers",
        metavar="N",
        type=positive_int,
        default=DEFAULT_MAX_WORKERS,
        help="most workers (TP x PP), and most devices it sees, of one engine; an engine "
        "with more is refused",
    )
    group.add(
        "--handshake.max-series-rows",
        metavar="N",
        type=positive_int,
        default=DEFAULT_MAX_SERIES_ROWS,
        help="most KV cache groups, workers and devices over all engines (each a row of "
        "every per-group or per-worker family, or a string in /engines); an engine past it "
        "is refused",
    )


def _build(args: argparse.Namespace) -> HandshakeCollector:
    stale_after, forget_after = args.handshake_stale_after, args.handshake_forget_after
    check_max_engines("handshake", args.handshake_max_engines)
    check_engine_windows("handshake", stale_after, forget_after)
    return HandshakeCollector(
        HandshakeSettings(
            endpoint=args.handshake_listen,
            max_frame_bytes=args.handshake_max_frame_size,
            receive_hwm=args.handshake_receive_hwm,
            max_messages_per_s=args.handshake_max_rate,
            stale_after_s=stale_after,
            forget_after_s=forget_after,
            max_engines=args.handshake_max_engines,
            max_messages_per_engine_per_s=args.handshake_max_rate_per_engine,
            max_groups_per_engine=args.handshake_max_groups,
            max_workers_per_engine=args.handshake_max_workers,
            max_series_rows=args.handshake_max_series_rows,
            socket_mode=args.handshake_socket_mode,
        )
    )


register_collector(
    CollectorSpec(
        name=NAME,
        help="receive engine ready responses from kvcap's vLLM plugin over ZMQ",
        default_enabled=True,
        add_arguments=_add_arguments,
        build=_build,
        # vLLM's own numbers, exact and per engine: they win over what HTTP reads.
        priority=0,
    )
)
