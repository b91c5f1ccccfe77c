"""The handshake source when its peers restart, it restarts, or its socket directory is bad.

The engine side is the real plugin code (exporter.vllm_plugin.ProcessState: one PUSH
socket per engine process, NOBLOCK sends); one ProcessState is one engine process.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from exporter.collectors import HandshakeCollector, HandshakeSettings
from exporter.errors import ConfigError
from exporter.handshake_wire import bye_message, ready_message
from exporter.state import Snapshot, StateStore
from exporter.vllm_plugin import ProcessState
from tests.conftest import GOLDEN
from tests.faults.harness import SLACK_S
from tests.support import cli_command, wait_timed

READY = GOLDEN / "handshake" / "llama-3.1-8b-dp2-tp1.engine0.msgpack"
# The handshake carries no polling: a ready message is in the state within milliseconds
# (benchmarks/handshake.py measures how many); this bound is a tenth of the default poll
# interval (5 s), with room for 2 busy cores.
HANDSHAKE_DEADLINE_S = 0.5
# ZMQ retries a lost connection every 100 ms (ZMQ_RECONNECT_IVL); measured from the send,
# the first message after a sidecar restart arrives in about 185 ms.
RECONNECT_S = 0.2


def ready(rank: int, instance_id: str, num_gpu_blocks: int = 27904) -> list[bytes]:
    """vLLM's own ready bytes for `rank`, re-encoded the way vLLM encodes them."""
    fields = msgspec.msgpack.decode(READY.read_bytes())
    fields.update(data_parallel_rank=rank, instance_id=instance_id, num_gpu_blocks=num_gpu_blocks)
    return ready_message(msgspec.msgpack.encode(fields))


def engines(snapshot: Snapshot) -> dict[str, tuple[str | None, int | None]]:
    return {v.engine: (v.instance_id, v.capacity.num_gpu_blocks) for v in snapshot.engines}


class Sidecar:
    """A HandshakeCollector and its store, started on `endpoint`."""

    def __init__(self, endpoint: str) -> None:
        self.store = StateStore()
        self.source = HandshakeCollector(HandshakeSettings(endpoint=endpoint))
        self.source.start(self.store)

    def stop(self) -> None:
        self.source.stop(2.0)

    def wait_for(
        self, expected: dict[str, tuple[str | None, int | None]], timeout_s: float
    ) -> float:
        _, elapsed = wait_timed(
            lambda: engines(self.store.snapshot()) == expected, timeout_s, f"engines {expected}"
        )
        return elapsed


@pytest.fixture
def endpoint(tmp_path: Path) -> str:
    return f"ipc://{tmp_path}/kvcap/handshake.sock"


@pytest.fixture
def sidecar(endpoint: str) -> Iterator[Sidecar]:
    running = Sidecar(endpoint)
    yield running
    running.stop()


def engine_process(endpoint: str) -> ProcessState:
    return ProcessState(endpoint=endpoint)


def test_an_engine_restart_replaces_its_old_instance_within_50_ms(
    sidecar: Sidecar, endpoint: str
) -> None:
    first = engine_process(endpoint)
    first.send(ready(0, "1"))
    sidecar.wait_for({"0": ("1", 27904)}, 2.0)
    # The engine process dies without a bye (killed): its socket is gone with it.
    first.close()
    # vLLM starts the engine again, in a new process with a new socket and instance id.
    second = engine_process(endpoint)
    try:
        sent = time.monotonic()
        second.send(ready(0, "2", num_gpu_blocks=30000))
        sidecar.wait_for({"0": ("2", 30000)}, 2.0)
        elapsed = time.monotonic() - sent
        # A late bye of the dead instance changes nothing.
        second.send(bye_message(0, "1"))
        second.send(ready(1, "2"))
        sidecar.wait_for({"0": ("2", 30000), "1": ("2", 27904)}, 2.0)
    finally:
        second.close()
    assert elapsed < HANDSHAKE_DEADLINE_S, f"{elapsed * 1000:.1f} ms"
    assert sidecar.store.snapshot().errors == {}
    assert second.sent == 3
    assert second.dropped == 0


def test_a_restarted_sidecar_on_the_same_ipc_path_gets_the_next_message(endpoint: str) -> None:
    """The engines keep running with their connected PUSH socket; ZMQ reconnects it."""
    engine = engine_process(endpoint)
    first = Sidecar(endpoint)
    try:
        engine.send(ready(0, "1"))
        first.wait_for({"0": ("1", 27904)}, 2.0)
    finally:
        first.stop()
    # The sidecar's socket file is gone or stale now; a new sidecar binds the same path.
    second = Sidecar(endpoint)
    try:
        engine.send(ready(1, "1"))
        elapsed = second.wait_for({"1": ("1", 27904)}, RECONNECT_S + SLACK_S)
    finally:
        engine.close()
        second.stop()
    assert elapsed < RECONNECT_S + SLACK_S
    assert engine.dropped == 0


def test_messages_sent_while_the_sidecar_is_down_arrive_when_it_is_back(endpoint: str) -> None:
    """An engine that starts while the sidecar restarts: its ready waits in the PUSH queue."""
    engine = engine_process(endpoint)
    engine.send(ready(0, "1"))  # nobody is listening yet
    sidecar = Sidecar(endpoint)
    try:
        elapsed = sidecar.wait_for({"0": ("1", 27904)}, RECONNECT_S + SLACK_S)
    finally:
        engine.close()
        sidecar.stop()
    assert elapsed < RECONNECT_S + SLACK_S


# --- the socket's directory ----------------------------------------------------------------


def test_a_missing_socket_directory_is_created_private(tmp_path: Path) -> None:
    directory = tmp_path / "run" / "kvcap"
    endpoint = f"ipc://{directory}/handshake.sock"
    sidecar = Sidecar(endpoint)
    engine = engine_process(endpoint)
    try:
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert (directory / "handshake.sock").is_socket()
        engine.send(ready(0, "1"))
        sidecar.wait_for({"0": ("1", 27904)}, 2.0)
    finally:
        engine.close()
        sidecar.stop()


@pytest.fixture
def read_only_directory() -> Iterator[Path]:
    """A directory where nothing can be created. Root ignores mode bits, so for root it is
    /sys, whose filesystem refuses new entries to everyone."""
    if os.geteuid() == 0:
        yield Path("/sys")
        return
    with tempfile.TemporaryDirectory(prefix="kvcap-ro-") as name:
        directory = Path(name)
        directory.chmod(0o555)
        try:
            yield directory
        finally:
            directory.chmod(0o755)


def test_a_read_only_socket_directory_is_a_config_error(read_only_directory: Path) -> None:
    endpoint = f"ipc://{read_only_directory}/handshake.sock"
    source = HandshakeCollector(HandshakeSettings(endpoint=endpoint))
    try:
        with pytest.raises(ConfigError, match=r"--handshake\.listen"):
            source.start(StateStore())
    finally:
        source.stop(1.0)


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *cli_command("serve"),
            *("--web.listen-address", "127.0.0.1:0", "--no-collector.nvml", *args),
        ],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


@pytest.mark.process
def test_serve_with_a_read_only_socket_directory_exits_with_one_line(
    read_only_directory: Path,
) -> None:
    run = serve("--handshake.listen", f"ipc://{read_only_directory}/handshake.sock")
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert "kvcap-exporter: error: --handshake.listen" in run.stderr


@pytest.mark.parametrize("where", ["under-read-only", "under-a-file"])
def test_a_socket_directory_that_cannot_be_created_is_a_config_error(
    where: str, read_only_directory: Path, tmp_path: Path
) -> None:
    if where == "under-a-file":
        (tmp_path / "file").write_text("")
        directory = tmp_path / "file" / "kvcap"
    else:
        directory = read_only_directory / "kvcap-test-missing"
    source = HandshakeCollector(HandshakeSettings(endpoint=f"ipc://{directory}/handshake.sock"))
    try:
        with pytest.raises(ConfigError, match=r"--handshake\.listen"):
            source.start(StateStore())
    finally:
        source.stop(1.0)
