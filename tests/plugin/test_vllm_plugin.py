"""exporter/vllm_plugin.py against STAND-INS for vLLM 0.33 (tests/plugin/standins.py).

No vLLM is installed here: the stand-ins have vLLM 0.33.0's module path, class and method
names and signatures, and are put into sys.modules per test with monkeypatch; each test
builds new classes, so the plugin's class patches never outlive it. The ready responses are
the golden bytes vLLM's encoder produced (tests/fixtures/golden/handshake).
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from exporter import vllm_plugin
from exporter.handshake_wire import (
    BYE_TOPIC,
    ENDPOINT_ENV,
    READY_V2_TOPIC,
    GroupExtra,
    ReadyExtras,
    decode_bye,
    decode_heartbeat,
    decode_ready,
)
from tests.plugin import standins
from tests.plugin.conftest import Sidecar

LLAMA = "llama-3.1-8b-dp2-tp1"
GEMMA = "gemma-3-27b-text-dp2-tp2"


def sent_extras(frame: bytes) -> ReadyExtras:
    """Everything the plugin put in the extras frame (the sidecar decodes less)."""
    return msgspec.msgpack.decode(frame, type=ReadyExtras)


def plugin_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kvcap.plugin"]


def installed(monkeypatch: pytest.MonkeyPatch, deployment: str = LLAMA, **options: Any) -> Any:
    module = standins.engine_core_module(deployment, **options)
    standins.install(monkeypatch, module)
    return module


def test_register_without_the_endpoint_patches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    core = installed(monkeypatch)
    before = {
        name: getattr(core.EngineCoreProc, name)
        for name in ("_initialize_kv_caches", "_make_ready_response", "shutdown")
    }
    vllm_plugin.register()
    assert before == {name: getattr(core.EngineCoreProc, name) for name in before}
    assert "shutdown" not in vars(core.EngineCoreProc)


@pytest.mark.process
def test_importing_the_plugin_loads_neither_vllm_nor_zmq() -> None:
    env = {k: v for k, v in os.environ.items() if k != ENDPOINT_ENV}
    code = (
        "import sys, exporter.vllm_plugin as p; p.register(); "
        "print(sorted(m for m in ('vllm', 'zmq') if m in sys.modules))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert run.stdout.strip() == "[]"


@pytest.mark.parametrize("deployment", standins.DEPLOYMENTS)
def test_ready_response_reaches_the_sidecar_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch, sidecar: Sidecar, deployment: str
) -> None:
    core = installed(monkeypatch, deployment)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    vllm_plugin.register()
    engine = standins.engine(core, deployment)

    response = engine._make_ready_response()

    assert response is engine.calls.ready_responses[-1]  # vLLM's own object, untouched
    frames = sidecar.receive()
    assert frames is not None
    topic, ready, heartbeat, extras_frame = frames
    assert topic == READY_V2_TOPIC
    assert ready == msgspec.msgpack.encode(response) == standins.ready_bytes(deployment)
    assert decode_heartbeat(heartbeat).interval_s == 3600
    assert decode_ready(ready).data_parallel_rank == 0
    extras = sent_extras(extras_frame)
    want = standins.golden(deployment)
    engine0 = want["engines"][0]
    window = standins.SLIDING_WINDOWS.get(want["model"])
    assert extras.groups == [
        GroupExtra(**group, sliding_window=window if "Sliding" in group["spec_type"] else None)
        for group in engine0["groups"]
    ]
    workers = want["settings"]["tensor_parallel_size"]
    assert extras.bytes_per_block_per_worker == [engine0["bytes_per_block_per_worker"]] * workers
    assert extras.devices == ["2", "3"]
    assert extras.pid == os.getpid()
    assert extras.model_name == want["served_model_name"]
    assert extras.cache_dtype == "auto"
    assert extras.settings == {
        "tensor_parallel_size": workers,
        "pipeline_parallel_size": 1,
        "max_model_len": engine0["max_model_len"],
        "block_size": engine0["block_size"],
        "kv_cache_dtype": "auto",
        "max_num_batched_tokens": engine0["max_num_batched_tokens"],
        "enable_prefix_caching": True,
        "num_gpu_blocks_override": None,
    }
    assert engine._kvcap_num_blocks == engine0["num_gpu_blocks"]
    assert vllm_plugin.state.sent == 1


def test_served_model_name_list_and_unset_devices(
    monkeypatch: pytest.MonkeyPatch, sidecar: Sidecar
) -> None:
    core = installed(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    vllm_plugin.register()
    engine = standins.engine(core, LLAMA)
    engine.vllm_config.model_config.served_model_name = ["llama", "llama-alias"]
    engine._make_ready_response()
    frames = sidecar.receive()
    assert frames is not None
    extras = sent_extras(frames[3])
    assert (extras.model_name, extras.devices) == ("llama", [])


def test_shutdown_sends_the_bye_once(monkeypatch: pytest.MonkeyPatch, sidecar: Sidecar) -> None:
    core = installed(monkeypatch)
    vllm_plugin.register()
    engine = standins.engine(core, LLAMA, engine_index=1)
    response = engine._make_ready_response()
    assert sidecar.receive() is not None

    engine.shutdown()
    engine.shutdown()
    vllm_plugin._send_pending_byes_and_close()  # the atexit hook owes nothing any more

    frames = sidecar.receive()
    assert frames is not None
    assert frames[0] == BYE_TOPIC
    bye = decode_bye(frames[1])
    assert (bye.engine_index, bye.instance_id) == (1, response.instance_id)
    assert sidecar.receive(timeout_ms=300) is None
    assert engine.calls.shutdowns == 2  # vLLM's shutdown ran every time


def test_the_atexit_hook_sends_a_bye_that_shutdown_did_not(
    monkeypatch: pytest.MonkeyPatch, sidecar: Sidecar
) -> None:
    core = installed(monkeypatch)
    vllm_plugin.register()
    standins.engine(core, LLAMA)._make_ready_response()
    assert sidecar.receive() is not None
    vllm_plugin._send_pending_byes_and_close()
    frames = sidecar.receive()
    assert frames is not None
    assert decode_bye(frames[1]).engine_index == 0


def run_an_engine(core: Any, engine_index: int) -> None:
    engine = standins.engine(core, LLAMA, engine_index=engine_index)
    engine._make_ready_response()
    engine.shutdown()


@pytest.mark.process
@pytest.mark.parametrize("parent_socket_open", [False, True])
def test_an_engine_process_forked_after_register_is_hooked(
    monkeypatch: pytest.MonkeyPatch, sidecar: Sidecar, parent_socket_open: bool
) -> None:
    """vLLM's default: register() runs in the frontend, the engine runs in a forked child.

    With `parent_socket_open` the child inherits an open socket; it must open its own.
    """
    core = installed(monkeypatch)
    vllm_plugin.register()
    if parent_socket_open:
        standins.engine(core, LLAMA, engine_index=0)._make_ready_response()
        assert sidecar.receive() is not None
    child = multiprocessing.get_context("fork").Process(target=run_an_engine, args=(core, 1))
    child.start()
    child.join(10)
    assert child.exitcode == 0
    ready, bye = sidecar.receive(), sidecar.receive()
    assert ready is not None
    assert bye is not None
    assert decode_ready(ready[1]).data_parallel_rank == 1
    assert decode_bye(bye[1]).engine_index == 1
    assert (vllm_plugin.state.socket is not None) == parent_socket_open


def test_register_twice_does_not_wrap_twice(
    monkeypatch: pytest.MonkeyPatch, sidecar: Sidecar
) -> None:
    core = installed(monkeypatch)
    originals = {
        "_initialize_kv_caches": core.EngineCore._initialize_kv_caches,
        "_make_ready_response": core.EngineCoreProc._make_ready_response,
        "shutdown": core.EngineCore.shutdown,
    }
    vllm_plugin.register()
    vllm_plugin.register()
    for name, original in originals.items():
        wrapper = getattr(core.EngineCoreProc, name)
        assert wrapper.__kvcap_original__ is original
    standins.engine(core, LLAMA)._make_ready_response()
    assert sidecar.receive() is not None
    assert sidecar.receive(timeout_ms=300) is None
    assert vllm_plugin.state.sent == 1


@pytest.mark.parametrize(
    ("without", "missing"),
    [
        (("EngineCoreProc",), "EngineCoreProc._make_ready_response, EngineCoreProc.shutdown"),
        (("EngineCore._initialize_kv_caches",), "EngineCore._initialize_kv_caches"),
    ],
)
def test_a_missing_hook_point_warns_once_and_the_rest_still_works(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    sidecar: Sidecar,
    without: tuple[str, ...],
    missing: str,
) -> None:
    core = installed(monkeypatch, without=without)
    vllm_plugin.register()
    assert plugin_warnings(caplog) == [
        f"kvcap plugin: vLLM has no {missing}; those hooks are off (vllm_http still works)"
    ]
    if "EngineCoreProc" in without:
        engine = core.EngineCore(standins.vllm_config(LLAMA))
        assert engine._kvcap_groups[0].spec_type == "FullAttentionSpec"
        assert sidecar.receive(timeout_ms=100) is None
    else:
        standins.engine(core, LLAMA)._make_ready_response()
        frames = sidecar.receive()
        assert frames is not None
        assert sent_extras(frames[3]).groups == []
        assert decode_ready(frames[1]).num_gpu_blocks == 27904


def test_no_vllm_at_all_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    monkeypatch.setenv(ENDPOINT_ENV, "ipc:///tmp/kvcap-test-unused.sock")
    vllm_plugin.register()
    vllm_plugin.register()
    [warning] = plugin_warnings(caplog)
    assert warning.startswith("kvcap plugin: register failed (ModuleNotFoundError(")


def test_a_failing_hook_body_returns_vllms_value_and_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, sidecar: Sidecar
) -> None:
    core = installed(monkeypatch, broken_specs=True)
    vllm_plugin.register()
    engines = [standins.engine(core, LLAMA, engine_index=i) for i in (0, 1)]

    for engine in engines:  # KV init ran inside the constructor, through the hook
        [config] = engine.calls.kv_cache_configs
        assert not hasattr(engine, "_kvcap_groups")
        assert config.kv_cache_groups[0].kv_cache_spec.block_size == 16
    [warning] = plugin_warnings(caplog)
    assert warning.startswith("kvcap plugin: reading the KV cache config failed (AttributeError(")

    response = engines[0]._make_ready_response()
    assert response is engines[0].calls.ready_responses[-1]
    frames = sidecar.receive()
    assert frames is not None
    assert sent_extras(frames[3]).groups == []  # the ready still goes, without the groups


def test_a_failing_extras_collection_still_sends_the_ready(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, sidecar: Sidecar
) -> None:
    core = installed(monkeypatch)
    vllm_plugin.register()
    engine = standins.engine(core, LLAMA)
    del engine.vllm_config.model_config
    response = engine._make_ready_response()
    assert response is engine.calls.ready_responses[-1]
    frames = sidecar.receive()
    assert frames is not None
    assert frames[:2] == [READY_V2_TOPIC, standins.ready_bytes(LLAMA)]
    assert len(frames) == 3
    assert len(plugin_warnings(caplog)) == 1


def test_an_unusable_endpoint_warns_once_and_vllm_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    core = installed(monkeypatch)
    monkeypatch.setenv(ENDPOINT_ENV, "not-a-zmq-endpoint")
    vllm_plugin.register()
    engine = standins.engine(core, LLAMA)
    assert engine._make_ready_response() is engine.calls.ready_responses[-1]
    engine.shutdown()
    assert engine.calls.shutdowns == 1
    assert vllm_plugin.state.dropped == 2  # the ready and the bye
    [warning] = plugin_warnings(caplog)
    assert warning.startswith("kvcap plugin: forwarding the ready response failed (ZMQError(")


def closed_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def median_ms(call: Callable[[], object], times: int = 20) -> tuple[float, float]:
    """(median, max) in milliseconds."""
    samples = []
    for _ in range(times):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), max(samples)


@pytest.mark.parametrize(
    "endpoint",
    [
        pytest.param(lambda: f"tcp://127.0.0.1:{closed_tcp_port()}", id="tcp-closed-port"),
        pytest.param(lambda: "ipc:///nonexistent-kvcap-dir/x.sock", id="ipc-missing-dir"),
        pytest.param(lambda: "ipc:///tmp/kvcap-nobody-bound-here.sock", id="ipc-nobody-bound"),
    ],
)
def test_a_dead_sidecar_costs_the_hooked_call_under_5ms(
    monkeypatch: pytest.MonkeyPatch, endpoint: Callable[[], str]
) -> None:
    core = installed(monkeypatch)
    engine = standins.engine(core, LLAMA)
    unwrapped, _ = median_ms(engine._make_ready_response)

    monkeypatch.setenv(ENDPOINT_ENV, endpoint())
    vllm_plugin.register()
    engine = standins.engine(core, LLAMA)
    wrapped, worst = median_ms(engine._make_ready_response)

    assert wrapped - unwrapped < 5, (unwrapped, wrapped)
    assert worst < 50, worst  # the first call also opens the socket
    # 16 queued for a sidecar that may still come up; the rest dropped at once, never waited.
    assert (vllm_plugin.state.sent, vllm_plugin.state.dropped) == (16, 4)
    start = time.perf_counter()
    engine.shutdown()  # the bye is dropped too; closing waits at most LINGER (200 ms)
    assert time.perf_counter() - start < 0.5


@dataclass
class SharedByTensor:
    """vLLM 0.27-0.31's KVCacheTensor: its own allocation, shared by one layer of each group."""

    size: int
    shared_by: list[str]
    offset: int = 0
    block_stride: int = 0


def test_bytes_per_block_of_every_kv_cache_tensor_layout() -> None:
    def per_block(tensors: list[Any], num_blocks: int) -> int | None:
        return vllm_plugin._bytes_per_block(standins.KVCacheConfig(num_blocks, tensors, []))

    # 0.32+: every tensor views one allocation of `size` bytes, whatever the groups.
    overlay = [
        standins.KVCacheTensor(size=4096, layers=[f"l{i}"], layer_stride=0, block_stride=0)
        for i in range(3)
    ]
    assert per_block(overlay, 8) == 512
    # Before 0.32, unpacked: one allocation per tensor (live 0.27.0, tiny Llama: 2 x 512 MiB).
    separate = [SharedByTensor(size=1 << 29, shared_by=[f"layers.{i}"]) for i in range(2)]
    assert per_block(separate, 16384) == 65536
    # Before 0.32, packed: tensors alias one block slab of `block_stride` bytes per block.
    packed = [SharedByTensor(8192, ["a"], offset=o, block_stride=1024) for o in (0, 512)]
    assert per_block(packed, 8) == 1024
