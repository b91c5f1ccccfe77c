"""Fixtures for the plugin tests: a fresh plugin state per test and a sidecar's PULL socket."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq

from exporter import vllm_plugin
from exporter.handshake_wire import ENDPOINT_ENV, HEARTBEAT_INTERVAL_ENV


@pytest.fixture(autouse=True)
def plugin_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[vllm_plugin.ProcessState]:
    """Each test gets its own socket, counters and warnings; the socket is closed after it.

    Heartbeats are an hour apart unless a test asks for them, so the other tests see only
    the messages they caused."""
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    monkeypatch.setenv(HEARTBEAT_INTERVAL_ENV, "3600")
    state = vllm_plugin.ProcessState()
    monkeypatch.setattr(vllm_plugin, "state", state)
    yield state
    state.close()


@dataclass
class Sidecar:
    """The sidecar's end of the handshake: a PULL socket bound at `endpoint`."""

    endpoint: str
    socket: zmq.Socket[bytes]

    def receive(self, timeout_ms: int = 5000) -> list[bytes] | None:
        if not self.socket.poll(timeout_ms):
            return None
        return self.socket.recv_multipart()


@pytest.fixture
def sidecar(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sidecar]:
    """A PULL socket on a short ipc:// path (they are limited to about 100 bytes)."""
    with tempfile.TemporaryDirectory(prefix="kvcap-", dir="/tmp") as folder:
        endpoint = f"ipc://{Path(folder) / 'handshake.sock'}"
        context = zmq.Context(io_threads=1)
        socket = context.socket(zmq.PULL)
        socket.bind(endpoint)
        monkeypatch.setenv(ENDPOINT_ENV, endpoint)
        try:
            yield Sidecar(endpoint, socket)
        finally:
            socket.close(linger=0)
            context.term()
