"""kvcap's vLLM general plugin: pushes each engine's ready response to the sidecar over ZMQ.

vLLM calls `register()` once per process (frontend, engine core, workers) for every entry
point of the `vllm.general_plugins` group. Unless `KVCAP_HANDSHAKE_ENDPOINT` is set it
returns at once. Otherwise it wraps three methods of `vllm.v1.engine.core` (vLLM 0.33):

- `EngineCore._initialize_kv_caches(vllm_config)`: it returns the scheduler's
  `KVCacheConfig`; the wrapper keeps its groups (spec class, layers, block and page size,
  window or chunk, bytes per request) and bytes per block on the engine instance.
- `EngineCoreProc._make_ready_response()`: called once, in the engine's input thread, after
  KV init. The wrapper re-encodes the response exactly as vLLM does for its frontend
  (`msgspec.msgpack.encode`) and pushes it with the extras the response lacks; a daemon
  thread re-sends that same message every `KVCAP_HEARTBEAT_INTERVAL` seconds (default 5),
  the heartbeat by which the sidecar knows the engine is alive.
- `EngineCoreProc.shutdown()`: stops the engine's heartbeat and pushes its bye once (an
  atexit hook covers a process that never calls it).

These are private methods, so every hook is guarded: a missing target or a failure inside
the plugin's own code logs one warning and the plugin steps aside; vLLM's call always
proceeds and its return value is returned unchanged. The patches are made on the classes:
methods are looked up at call time, so an engine process started by fork inherits them,
and one started by spawn gets them from the `load_general_plugins()` at the top of
`EngineCore.__init__`, before KV init. Sends never block: one PUSH socket per process,
a small send high-water mark, NOBLOCK sends, and a dropped message is only counted.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import logging
import math
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from exporter.handshake_wire import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    ENDPOINT_ENV,
    HEARTBEAT_INTERVAL_ENV,
    MAX_HEARTBEAT_INTERVAL_S,
    MIN_HEARTBEAT_INTERVAL_S,
    GroupExtra,
    ReadyExtras,
    bye_message,
    ready_v2_message,
)

log = logging.getLogger("kvcap.plugin")

_SEND_HWM = 16
_LINGER_MS = 200
# The marker on our wrappers, holding the wrapped original: a second register() skips them.
_ORIGINAL = "__kvcap_original__"
# Settings copied into the extras: name -> (vllm_config attribute, attribute).
_SETTINGS = {
    "tensor_parallel_size": ("parallel_config", "tensor_parallel_size"),
    "pipeline_parallel_size": ("parallel_config", "pipeline_parallel_size"),
    "max_model_len": ("model_config", "max_model_len"),
    "block_size": ("cache_config", "block_size"),
    "kv_cache_dtype": ("cache_config", "cache_dtype"),
    "max_num_batched_tokens": ("scheduler_config", "max_num_batched_tokens"),
    "enable_prefix_caching": ("cache_config", "enable_prefix_caching"),
    "num_gpu_blocks_override": ("cache_config", "num_gpu_blocks_override"),
    # "cuda" or "cpu": the platform the engine plans for.
    "platform": ("device_config", "device_type"),
    # The offload tier as configured (vLLM 0.27 and later; None when off).
    "kv_offloading_size": ("cache_config", "kv_offloading_size"),
    "kv_offloading_backend": ("cache_config", "kv_offloading_backend"),
}
# Of `vllm_config.kv_transfer_config.kv_connector_extra_config`, what sizes a native tier
# (`cpu_bytes_to_use`, which vLLM's post-init sets from kv_offloading_size) and cuts it into
# chunks; sent as `kv_connector_<key>`, scalars only (the wire takes no nested settings).
_CONNECTOR_EXTRA_KEYS = ("cpu_bytes_to_use", "block_size", "blocks_per_chunk")


@dataclass
class ProcessState:
    """This process's PUSH socket, its counters, the byes still owed and the warnings given."""

    endpoint: str = ""
    context: Any = None
    socket: Any = None
    pid: int = 0
    sent: int = 0
    dropped: int = 0
    unusable: bool = False  # the endpoint was refused: every later message is dropped
    pending_byes: dict[int, list[bytes]] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    # Sockets inherited through fork: their I/O thread is gone, so they are kept, never used.
    inherited: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    # engine -> (the pid that owns it, its ready message): what the heartbeat re-sends. The
    # pid keeps a forked child from beating for its parent's engines.
    heartbeats: dict[int, tuple[int, list[bytes]]] = field(default_factory=dict)
    # Held around every heartbeat and bye, so that no heartbeat follows an engine's bye
    # (it would bring the engine back into the sidecar's state).
    heartbeat_lock: threading.Lock = field(default_factory=threading.Lock)
    heartbeat_thread: threading.Thread | None = None
    heartbeat_stop: threading.Event = field(default_factory=threading.Event)
    # The secret this process's byes repeat (handshake_wire): one per process, so no other
    # process can say bye for its engines. Never logged.
    bye_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    def send(self, frames: list[bytes]) -> None:
        import zmq  # noqa: PLC0415 - lazy: a process where the plugin is off never loads pyzmq

        with self.lock:
            if self.unusable:
                self.dropped += 1
                return
            try:
                socket = self._connected(zmq)
            except zmq.ZMQError:  # a bad endpoint: the caller's guard warns, once
                self.dropped += 1
                self.unusable = True
                raise
            try:
                socket.send_multipart(frames, flags=zmq.NOBLOCK)
            except zmq.ZMQError:  # zmq.Again (queue full) included: the sidecar is away
                self.dropped += 1
                return
            self.sent += 1

    def start_heartbeats(self) -> None:
        """One heartbeat thread per process. A forked child starts its own: the parent's
        thread does not survive the fork (the child sees it as not alive)."""
        with self.heartbeat_lock:
            thread = self.heartbeat_thread
            if thread is not None and thread.is_alive() and not self.heartbeat_stop.is_set():
                return
            self.heartbeat_stop = threading.Event()
            thread = threading.Thread(
                target=self._beat_until, args=(self.heartbeat_stop,), name="kvcap-heartbeat"
            )
            thread.daemon = True
            self.heartbeat_thread = thread
        thread.start()

    def beat(self) -> None:
        """Re-send the ready message of every engine of this process."""
        pid = os.getpid()
        with self.heartbeat_lock:
            for owner, frames in list(self.heartbeats.values()):
                if owner == pid:
                    self.send(frames)

    def _beat_until(self, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat_interval_s):
            with _guarded("sending a heartbeat"):
                self.beat()

    def stop_heartbeat(self, engine: int) -> None:
        """Stop the engine's heartbeat and send its bye, if one is owed; under the
        heartbeat lock, so no heartbeat can follow it."""
        with self.heartbeat_lock:
            self.heartbeats.pop(engine, None)
            bye = self.pending_byes.pop(engine, None)
            if bye is not None:
                self.send(bye)

    def close(self) -> None:
        self.heartbeat_stop.set()
        with self.lock:
            # A socket inherited through fork is left alone (see `inherited`).
            if self.socket is not None and self.pid == os.getpid():
                self.socket.close(linger=_LINGER_MS)
                self.context.term()
                self.socket = self.context = None

    def _connected(self, zmq: Any) -> Any:
        if self.socket is not None and self.pid == os.getpid():
            return self.socket
        if self.socket is not None:
            self.inherited.append((self.context, self.socket))
        context = zmq.Context(io_threads=1)
        socket = context.socket(zmq.PUSH)
        socket.setsockopt(zmq.SNDHWM, _SEND_HWM)
        socket.setsockopt(zmq.LINGER, _LINGER_MS)
        try:
            # Asynchronous: a sidecar that starts later still gets what is queued.
            socket.connect(self.endpoint)
        except zmq.ZMQError:
            socket.close(linger=0)
            context.term()
            raise
        self.context, self.socket, self.pid = context, socket, os.getpid()
        return socket


state = ProcessState()


def _after_fork_in_child() -> None:
    # A lock that another thread of the parent (its heartbeat) held at the fork would stay
    # held in the child forever; the child's engine needs its own.
    state.lock = threading.Lock()
    state.heartbeat_lock = threading.Lock()
    state.bye_token = secrets.token_urlsafe(24)  # the child's engines are its own


os.register_at_fork(after_in_child=_after_fork_in_child)


def register() -> None:
    """The `vllm.general_plugins` entry point: install the hooks when an endpoint is set."""
    endpoint = os.environ.get(ENDPOINT_ENV, "").strip()
    if not endpoint:
        return
    state.endpoint = endpoint
    state.heartbeat_interval_s = _heartbeat_interval_s()
    atexit.unregister(_send_pending_byes_and_close)  # once, however often register() runs
    atexit.register(_send_pending_byes_and_close)
    with _guarded("register"):
        # Imported here, never at module import: the sidecar imports `exporter` without vLLM.
        core = importlib.import_module("vllm.v1.engine.core")
        engine_core = getattr(core, "EngineCore", None)
        engine_core_proc = getattr(core, "EngineCoreProc", None)
        missing = [
            f"{owner_name}.{name}"
            for owner, owner_name, name, make in (
                (engine_core, "EngineCore", "_initialize_kv_caches", _initialize_kv_caches_hook),
                (engine_core_proc, "EngineCoreProc", "_make_ready_response", _ready_hook),
                (engine_core_proc, "EngineCoreProc", "shutdown", _shutdown_hook),
            )
            if not _wrap(owner, name, make)
        ]
        if missing:
            log.warning(
                "kvcap plugin: vLLM has no %s; those hooks are off (vllm_http still works)",
                ", ".join(missing),
            )


def _heartbeat_interval_s() -> float:
    """KVCAP_HEARTBEAT_INTERVAL in seconds; a value that is not one warns once."""
    raw = os.environ.get(HEARTBEAT_INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_HEARTBEAT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if MIN_HEARTBEAT_INTERVAL_S <= value <= MAX_HEARTBEAT_INTERVAL_S:  # NaN is neither
        return value
    if HEARTBEAT_INTERVAL_ENV not in state.warned:
        state.warned.add(HEARTBEAT_INTERVAL_ENV)
        log.warning(
            "kvcap plugin: %s=%r is not a number of seconds from %g to %g; using %g",
            HEARTBEAT_INTERVAL_ENV,
            raw,
            MIN_HEARTBEAT_INTERVAL_S,
            MAX_HEARTBEAT_INTERVAL_S,
            DEFAULT_HEARTBEAT_INTERVAL_S,
        )
    return DEFAULT_HEARTBEAT_INTERVAL_S


def _wrap(owner: Any, name: str, make: Callable[[Any], Callable[..., Any]]) -> bool:
    original = getattr(owner, name, None)
    if not callable(original):
        return False
    if getattr(original, _ORIGINAL, None) is None:
        wrapper = functools.wraps(original)(make(original))
        setattr(wrapper, _ORIGINAL, original)
        setattr(owner, name, wrapper)
    return True


@contextlib.contextmanager
def _guarded(step: str) -> Iterator[None]:
    """Whatever the plugin's own code raises is logged once per step, never passed to vLLM."""
    try:
        yield
    except Exception as error:
        if step not in state.warned:
            state.warned.add(step)
            log.warning("kvcap plugin: %s failed (%r); stepping aside", step, error)


def _initialize_kv_caches_hook(original: Any) -> Callable[..., Any]:
    def _initialize_kv_caches(self: Any, *args: Any, **kwargs: Any) -> Any:
        kv_cache_config = original(self, *args, **kwargs)
        with _guarded("reading the KV cache config"):
            vllm_config = args[0] if args else kwargs.get("vllm_config", self.vllm_config)
            self._kvcap_num_blocks = kv_cache_config.num_blocks
            self._kvcap_bytes_per_block = _bytes_per_block(kv_cache_config)
            self._kvcap_groups = [
                _group_extra(group, vllm_config) for group in kv_cache_config.kv_cache_groups
            ]
        return kv_cache_config

    return _initialize_kv_caches


def _ready_hook(original: Any) -> Callable[..., Any]:
    def _make_ready_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        response = original(self, *args, **kwargs)
        extras = None
        with _guarded("collecting the ready extras"):  # without them the ready still goes
            extras = _extras(self, response)
        with _guarded("forwarding the ready response"):
            # Encoded exactly as vLLM encodes it for its frontend (process_input_sockets).
            ready = msgspec.msgpack.encode(response)
            frames = ready_v2_message(
                ready, state.heartbeat_interval_s, extras, bye_token=state.bye_token
            )
            engine = self._kvcap_engine = response.data_parallel_rank
            with state.heartbeat_lock:
                state.pending_byes[engine] = bye_message(
                    engine, response.instance_id, state.bye_token
                )
                state.heartbeats[engine] = (os.getpid(), frames)
            state.send(frames)
            state.start_heartbeats()
        return response

    return _make_ready_response


def _shutdown_hook(original: Any) -> Callable[..., Any]:
    def shutdown(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _guarded("sending the bye"):
            state.stop_heartbeat(getattr(self, "_kvcap_engine", -1))
        try:
            return original(self, *args, **kwargs)
        finally:
            # The process exits next: give the bye up to LINGER to leave.
            with _guarded("closing the handshake socket"):
                state.close()

    return shutdown


def _send_pending_byes_and_close() -> None:
    with _guarded("sending the bye at exit"):
        for engine in list(state.pending_byes):
            state.stop_heartbeat(engine)
        state.close()


def _group_extra(group: Any, vllm_config: Any) -> GroupExtra:
    spec = group.kv_cache_spec
    per_request: int | None = None
    with contextlib.suppress(Exception):  # optional: not every spec computes it
        per_request = _int_or_none(spec.max_memory_usage_bytes(vllm_config))
    return GroupExtra(
        spec_type=type(spec).__name__,
        num_layers=len(group.layer_names),
        block_size=int(spec.block_size),
        page_size_bytes=int(spec.page_size_bytes),
        max_memory_usage_bytes_per_request=per_request,
        sliding_window=_int_or_none(getattr(spec, "sliding_window", None)),
        attention_chunk_size=_int_or_none(getattr(spec, "attention_chunk_size", None)),
    )


def _bytes_per_block(kv_cache_config: Any) -> int | None:
    """One worker's bytes per block, or None when the layout is not one vLLM has used."""
    tensors = [t for t in kv_cache_config.kv_cache_tensors if not getattr(t, "host_resident", 0)]
    num_blocks = int(kv_cache_config.num_blocks)
    if not tensors or num_blocks <= 0:
        return None
    if hasattr(tensors[0], "layers") or getattr(tensors[0], "block_stride", None):
        # From 0.32 on (tensors name `layers`), and in the packed layout before, every
        # KVCacheTensor views one backing allocation of `size` bytes (groups overlay it).
        sizes = {int(tensor.size) for tensor in tensors}
        return sizes.pop() // num_blocks if len(sizes) == 1 else None
    # Before 0.32 (tensors name `shared_by`) each tensor is an allocation of its own,
    # shared by one layer of every group: a block costs one page of each.
    return sum(int(tensor.size) for tensor in tensors) // num_blocks


def _extras(engine: Any, response: Any) -> ReadyExtras:
    vllm_config = engine.vllm_config
    model_config = vllm_config.model_config
    served = getattr(model_config, "served_model_name", None)
    if isinstance(served, list | tuple):
        served = served[0] if served else None
    bytes_per_block = getattr(engine, "_kvcap_bytes_per_block", None)
    workers = getattr(response, "world_size", None)
    # The scheduler config is worker 0's; with one pipeline stage every worker matches it.
    same_on_every_worker = getattr(response, "pipeline_parallel_size", None) == 1
    return ReadyExtras(
        groups=list(getattr(engine, "_kvcap_groups", [])),
        bytes_per_block_per_worker=[bytes_per_block] * workers
        if bytes_per_block and isinstance(workers, int) and same_on_every_worker
        else [],
        devices=[
            d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()
        ],
        pid=os.getpid(),
        model_name=None if served is None else str(served),
        cache_dtype=_str_or_none(getattr(vllm_config.cache_config, "cache_dtype", None)),
        settings=_settings(vllm_config),
    )


def _settings(vllm_config: Any) -> dict[str, Any]:
    found = {
        name: getattr(getattr(vllm_config, section, None), attribute, ...)
        for name, (section, attribute) in _SETTINGS.items()
    }
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    if transfer is not None:
        found["kv_connector"] = getattr(transfer, "kv_connector", None)
        extra = getattr(transfer, "kv_connector_extra_config", None)
        if isinstance(extra, dict):
            found.update(
                {f"kv_connector_{key}": extra[key] for key in _CONNECTOR_EXTRA_KEYS if key in extra}
            )
    return {
        name: value
        for name, value in found.items()
        if value is None or isinstance(value, bool | int | float | str)
    }


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)
