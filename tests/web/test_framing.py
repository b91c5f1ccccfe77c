"""Strict request framing over real sockets: what could smuggle a request gets 400 and a close."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time

import pytest

import exporter.web.connection as connection_module
from exporter.web import MAX_HEAD_BYTES, BadHead, Response, WebServer, parse_head
from tests.web.conftest import StartServer, raw_connection

SMUGGLED = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


def exchange(server: WebServer, data: bytes, timeout_s: float = 5.0) -> bytes:
    """Sends `data`, then reads until the server closes the connection."""
    with raw_connection(server, timeout_s) as client:
        client.sendall(data)
        with contextlib.suppress(OSError):  # the server may have closed it already
            client.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    return answer


def statuses(answer: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 ([0-9]{3}) ", answer)


@pytest.mark.parametrize(
    ("head", "reason"),
    [
        (
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 40\r\n",
            "bad_content_length",
        ),
        (
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n",
            "bad_content_length",
        ),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1_0\r\n", "bad_content_length"),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: +10\r\n", "bad_content_length"),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n", "bad_content_length"),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length : 5\r\n", "malformed"),
        (
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n",
            "transfer_encoding",
        ),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n", "malformed"),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nno colon here\r\n", "malformed"),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\n folded: line\r\n", "malformed"),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\nX-B: b\r\n", "malformed"),
        (b"GET /metrics HTTP/1.1000\r\nHost: x\r\n", "bad_version"),
        (b"GET /metrics HTTP/1.1\r\n", "missing_host"),
        (b"GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n", "missing_host"),
        (b"GET  /metrics HTTP/1.1\r\nHost: x\r\n", "malformed"),
        (b"GET http://x/metrics HTTP/1.1\r\nHost: x\r\n", "malformed"),
        (b"GET /met\x00rics HTTP/1.1\r\nHost: x\r\n", "malformed"),
    ],
)
def test_ambiguous_framing_is_400_and_nothing_after_it_is_answered(
    start_server: StartServer, head: bytes, reason: str
) -> None:
    server = start_server()
    answer = exchange(server, head + b"\r\n" + b"hello" + SMUGGLED)
    assert statuses(answer) == [b"400"]
    assert b"Connection: close" in answer
    assert server.counters.rejected()[reason] == 1
    with pytest.raises(BadHead) as refused:
        parse_head(head + b"\r\n")
    assert (refused.value.status, refused.value.reason) == (400, reason)


def test_a_well_formed_pipeline_is_answered_in_order(start_server: StartServer) -> None:
    server = start_server()
    answer = exchange(
        server,
        SMUGGLED + b"GET /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc" + SMUGGLED,
    )
    assert statuses(answer) == [b"200", b"404", b"200"]


@pytest.mark.parametrize(
    ("extra", "status"),
    [(b"X-Pad: " + b"a" * MAX_HEAD_BYTES + b"\r\n", b"431"), (b"", b"414")],
)
def test_a_head_over_the_budget_is_refused_after_reading_the_budget(
    start_server: StartServer, extra: bytes, status: bytes
) -> None:
    server = start_server()
    target = b"/" if extra else b"/" + b"a" * MAX_HEAD_BYTES
    head = b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n"
    with raw_connection(server) as client:
        # 1.3 MB, more than the server reads; OSError: it answered and closed before the end.
        with contextlib.suppress(OSError):
            client.sendall(head * 20)
        assert statuses(client.recv(65536)) == [status]
    assert server.counters.rejected()["head_too_large"] == 1


def test_more_than_100_header_lines_is_431() -> None:
    head = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 100 + b"\r\n"
    with pytest.raises(BadHead) as refused:
        parse_head(head)
    assert refused.value.status == 431


def test_a_trickled_head_is_cut_at_its_deadline(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection_module, "HEAD_DEADLINE_S", 0.3)
    server = start_server()
    with raw_connection(server) as client:
        client.sendall(b"GET /metrics HTTP/1.1\r\n")
        time.sleep(0.15)
        client.sendall(b"Host: x\r\n")  # a byte now and then does not extend the deadline
        answer = client.recv(65536)
    assert statuses(answer) == [b"408"]
    assert server.counters.rejected()["head_timeout"] == 1


def test_a_silent_new_connection_is_closed_after_the_first_byte_timeout(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection_module, "FIRST_BYTE_TIMEOUT_S", 0.2)
    server = start_server()
    with raw_connection(server) as client:
        assert client.recv(1) == b""
    assert server.counters.rejected()["first_byte_timeout"] == 1


def test_over_the_cap_with_every_connection_busy_is_503(start_server: StartServer) -> None:
    release = threading.Event()

    def slow(request: object) -> Response:
        release.wait(5)
        return Response(200, b"done", "text/plain")

    server = WebServer("127.0.0.1:0", {"/slow": slow}, max_connections=2)
    server.start()
    try:
        busy = [raw_connection(server) for _ in range(2)]
        for sock in busy:
            sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)
        # Nothing sent: the answer comes without waiting for a request (unread request
        # bytes would turn the server's close into a reset that can swallow it).
        with raw_connection(server) as client:
            assert statuses(client.recv(65536)) == [b"503"]
        assert server.counters.rejected()["over_capacity"] == 1
        release.set()
        for sock in busy:
            assert statuses(sock.recv(65536)) == [b"200"]
            sock.close()
    finally:
        release.set()
        server.stop()
