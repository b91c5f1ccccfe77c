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
from exporter.collectors.handshake_admission import Admission, Claim, Refused
from exporter.collectors.handshake_ipc import (
    prepare_ipc_directory,
    remove_ipc_file,
    set_ipc_file_mode,
)
from exporter.collectors.handshake_offload import with_offload
from exporter.collectors.handshake_settings import (
    HandshakeSettings,
    add_arguments,
    settings_from_args,
)
from exporter.collectors.kv_events_endpoints import endpoints_from_sources
from exporter.collectors.registry import CollectorSpec, register_collector
from exporter.errors import ConfigError
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
from exporter.state import EngineReport, StateSink

log = structlog.get_logger("kvcap.handshake")

NAME = "handshake"
_POLL_MS = 100
# Messages handled between two liveness sweeps (and looks at the stop flag) at most.
_RECEIVE_BATCH = 1000
# The most frames a message of the wire contract has (ready v2 with extras).
MAX_FRAMES = 4


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
        self.admission = Admission(settings, clock)
        # Rejections wait here for `flush`: a flood is one state change per reason.
        self.tally = ErrorTally(NAME)

    def handle(self, frames: list[bytes]) -> None:
        """Apply one message and count its rejection in the state at once."""
        self.receive(frames)
        self.flush()

    def receive(self, frames: list[bytes]) -> None:
        """Apply one message; a rejection is tallied until the next `flush`."""
        try:
            rejection = self._apply(frames)
        except Refused as refused:
            rejection = refused.reason, str(refused)
        if rejection is not None:
            reason, message = rejection
            self.tally.count(reason, self.endpoint, message)

    def flush(self) -> None:
        """Hand the tallied rejections to the state, one change per reason."""
        self.tally.flush(self.sink)

    def _apply(self, frames: list[bytes]) -> tuple[str, str] | None:
        """Apply one message, or raise Refused and change nothing; a message applied with
        a rejection (a bad offload setting) returns it as (reason, message)."""
        if any(len(frame) > self.settings.max_frame_bytes for frame in frames):
            raise Refused("frame_too_large", f"a frame over {self.settings.max_frame_bytes} bytes")
        topic = frames[0] if frames else b""
        kinds = {
            READY_V2_TOPIC: (self._ready_v2, (3, 4)),
            READY_TOPIC: (self._ready, (2, 3)),
            BYE_TOPIC: (self._bye, (2,)),
        }
        if topic not in kinds:
            raise Refused("unknown_topic", f"topic {topic[:40]!r}")
        apply, frame_counts = kinds[topic]
        if len(frames) not in frame_counts:
            raise Refused("wrong_frame_count", f"{len(frames)} frames for {topic!r}")
        try:
            return apply(frames)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as error:
            raise Refused("malformed_frame", str(error)[:200] or type(error).__name__) from None

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
        forgotten, stale = self.admission.sweep()
        for engine, held in forgotten:
            self.sink.remove_engine(NAME, self.endpoint, engine, held.instance_id)
        for engine, held in stale:
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


def _build(args: argparse.Namespace) -> HandshakeCollector:
    return HandshakeCollector(settings_from_args(args))


register_collector(
    CollectorSpec(
        name=NAME,
        help="receive engine ready responses from kvcap's vLLM plugin over ZMQ",
        default_enabled=True,
        add_arguments=add_arguments,
        build=_build,
        # vLLM's own numbers, exact and per engine: they win over what HTTP reads.
        priority=0,
    )
)
