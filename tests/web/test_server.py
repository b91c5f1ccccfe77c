"""The HTTP server over real sockets: routes, methods, errors, basic auth, keep-alive, stop()."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import structlog

from exporter.errors import ConfigError
from exporter.web import Request, Response, WebServer
from tests.web.conftest import (
    ALICE_HASH,
    ALICE_PASSWORD,
    StartServer,
    connect,
    echo,
    fetch,
    get,
    raw_connection,
)
from tests.web.test_auth import basic


def test_get_passes_the_request_to_the_route(start_server: StartServer) -> None:
    server = start_server()
    assert server.url.startswith("http://127.0.0.1:")
    reply = get(server.url, "/metrics?name[]=a&name[]=b&empty=")
    assert reply.status == 200
    assert reply.body == b"GET /metrics"  # the query string routes as its path
    assert reply.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert reply.headers["Content-Length"] == str(len(reply.body))
    assert reply.headers["X-Test"] == "yes"
    assert reply.headers["Date"].endswith(" GMT")


def test_a_body_larger_than_the_socket_buffers_arrives_whole(start_server: StartServer) -> None:
    # 8 MiB: more than loopback's largest send buffer, so the write goes out in parts.
    body = bytes(range(256)) * (32 * 1024)
    server = start_server(routes={"/big": lambda request: Response(200, body, "text/plain")})
    connection = connect(server.url)
    try:
        for _ in range(2):  # and the connection is usable after it
            reply = fetch(connection, "/big")
            assert reply.status == 200
            assert reply.body == body
    finally:
        connection.close()


def test_request_headers_are_case_insensitive(start_server: StartServer) -> None:
    seen: list[Request] = []

    def record(request: Request) -> Response:
        seen.append(request)
        return Response(200, b"", "text/plain")

    server = start_server(routes={"/": record})
    get(server.url, "/", headers={"X-Scrape-Timeout-Seconds": "10"})
    headers = seen[0].headers
    assert headers["x-scrape-timeout-seconds"] == "10"
    assert headers["X-SCRAPE-TIMEOUT-SECONDS"] == "10"
    assert headers.get("X-Scrape-Timeout-Seconds") == "10"
    assert "x-Scrape-timeout-seconds" in headers
    assert headers.get("Accept-Encoding-Missing") is None


def test_head_is_get_without_a_body(start_server: StartServer) -> None:
    server = start_server()
    reply = get(server.url, "/metrics", method="HEAD")
    assert reply.status == 200
    assert reply.body == b""
    assert reply.headers["Content-Length"] == str(len(b"HEAD /metrics"))


@pytest.mark.parametrize("path", ["/", "/metric", "/metrics/", "/METRICS", "/metrics%2F"])
def test_unknown_path_is_404(start_server: StartServer, path: str) -> None:
    server = start_server()
    reply = get(server.url, path)
    assert (reply.status, reply.body) == (404, b"404 page not found\n")


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "BREW"])
@pytest.mark.parametrize("path", ["/metrics", "/nowhere"])
def test_other_methods_are_405(start_server: StartServer, method: str, path: str) -> None:
    called: list[Request] = []

    def spy(request: Request) -> Response:
        called.append(request)
        return Response(200, b"", "text/plain")

    server = start_server(routes={"/metrics": spy})
    connection = connect(server.url)
    reply = fetch(connection, path, method=method, body=b"state=changed")
    assert reply.status == 405
    assert reply.headers["Allow"] == "GET, HEAD"
    assert called == []
    # The small body was read and dropped, so the connection still works.
    assert fetch(connection, "/metrics").status == 200
    connection.close()


def test_handler_exception_is_500_logged_once_and_the_server_goes_on(
    start_server: StartServer,
) -> None:
    server = start_server()
    connection = connect(server.url)
    with structlog.testing.capture_logs() as logs:
        reply = fetch(connection, "/fail")
    assert (reply.status, reply.body) == (500, b"Internal Server Error\n")
    failures = [entry for entry in logs if entry["event"] == "web_handler_failed"]
    assert len(failures) == 1
    assert failures[0]["path"] == "/fail"
    assert failures[0]["log_level"] == "error"
    assert fetch(connection, "/metrics").status == 200
    connection.close()
    assert get(server.url).status == 200


@pytest.mark.parametrize(
    "headers",
    [(("X-Bad", "a\r\nSet-Cookie: x=1"),), (("X-Bad", "caf\u00e9"),), (("X\nBad", "a"),)],
)
def test_response_header_injection_is_a_handler_bug(
    start_server: StartServer, headers: tuple[tuple[str, str], ...]
) -> None:
    server = start_server(routes={"/": lambda request: Response(200, b"", "text/plain", headers)})
    with structlog.testing.capture_logs():
        reply = get(server.url, "/")
    assert reply.status == 500
    assert "Set-Cookie" not in reply.headers


def test_keep_alive_serves_many_requests_on_one_connection(start_server: StartServer) -> None:
    body = bytes(range(256)) * 800  # about the size of a large /metrics page
    server = start_server(routes={"/metrics": lambda request: Response(200, body, "text/plain")})
    connection = connect(server.url)
    for _ in range(20):
        reply = fetch(connection)
        assert reply.body == body
        assert "Connection" not in reply.headers
    connection.close()


def test_http_1_0_client(start_server: StartServer) -> None:
    server = start_server()
    with raw_connection(server) as client:
        client.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Connection: close" in head
    assert body == b"GET /metrics"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"garbage\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/9.9\r\n\r\n", b"505"),
        (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", b"414"),
    ],
)
def test_malformed_requests_get_an_error_and_the_server_goes_on(
    start_server: StartServer, request_bytes: bytes, status: bytes
) -> None:
    server = start_server()
    with raw_connection(server) as client:
        client.sendall(request_bytes)
        assert client.recv(65536).split(b" ")[1] == status
    assert get(server.url).status == 200


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (basic("alice", ALICE_PASSWORD), 200),
        (basic("alice", "wrong"), 401),
        (basic("mallory", ALICE_PASSWORD), 401),
        (None, 401),
    ],
)
def test_basic_auth(start_server: StartServer, header: str | None, status: int) -> None:
    server = start_server(f"basic_auth_users:\n  alice: '{ALICE_HASH}'\n")
    headers = {} if header is None else {"Authorization": header}
    reply = get(server.url, "/metrics", headers=headers)
    assert reply.status == status
    if status == 401:
        assert reply.headers["WWW-Authenticate"] == 'Basic realm="kvcap"'
        assert reply.body == b"Unauthorized\n"


@pytest.mark.parametrize(("method", "path"), [("GET", "/nowhere"), ("POST", "/metrics")])
def test_basic_auth_comes_before_routes_and_methods(
    start_server: StartServer, method: str, path: str
) -> None:
    server = start_server(f"basic_auth_users:\n  alice: '{ALICE_HASH}'\n")
    assert get(server.url, path, method=method).status == 401


def test_stop_returns_quickly_with_a_keep_alive_client_connected(
    start_server: StartServer,
) -> None:
    server = start_server()
    idle = connect(server.url)
    assert fetch(idle).status == 200
    silent = raw_connection(server, None)  # connected, never asks anything
    port = silent.getpeername()[1]  # the server forgets its URL when it stops
    time.sleep(0.05)  # let the server thread pick the silent connection up
    threads_before = threading.active_count()
    start = time.monotonic()
    server.stop()
    assert time.monotonic() - start < 2.0
    assert threading.active_count() < threads_before
    with pytest.raises(ConnectionError):
        fetch(idle)
    assert silent.recv(1) == b""  # the server closed it
    silent.close()
    idle.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_stop_is_idempotent_and_start_only_once(start_server: StartServer) -> None:
    server = start_server()
    server.stop()
    server.stop()
    with pytest.raises(RuntimeError):
        server.url  # noqa: B018  # the property raises when not serving


def test_start_twice_is_a_bug(start_server: StartServer) -> None:
    server = start_server()
    with pytest.raises(RuntimeError):
        server.start()


def test_port_taken_is_oserror(start_server: StartServer) -> None:
    server = start_server()
    port = urlsplit(server.url).port
    with pytest.raises(OSError, match="in use"):
        WebServer(f"127.0.0.1:{port}", {}).start()


@pytest.mark.parametrize("address", ["9470", "localhost:http", "::1:9470"])
def test_bad_listen_address_is_config_error(address: str) -> None:
    with pytest.raises(ConfigError, match="listen address"):
        WebServer(address, {}).start()


def test_bad_web_config_file_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"web config file .*: cannot read it"):
        WebServer("127.0.0.1:0", {}, web_config_file=tmp_path / "missing.yml").start()


@pytest.mark.parametrize(
    ("address", "url_prefix"), [("[::1]:0", "http://[::1]:"), ("localhost:0", "http://127.0.0.1:")]
)
def test_other_listen_addresses(start_server: StartServer, address: str, url_prefix: str) -> None:
    if address.startswith("[") and not ipv6_loopback_works():
        # A machine without IPv6: resolving or binding fails ("cannot assign requested
        # address", "address family not supported"), which `serve` reports in one line.
        with pytest.raises((OSError, ConfigError), match=r"(?i)address|resolve"):
            start_server(listen_address=address)
        return
    server = start_server(listen_address=address)
    assert server.url.startswith(url_prefix)
    assert get(server.url).status == 200


def ipv6_loopback_works() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_all_interfaces_listen_address(start_server: StartServer) -> None:
    server = start_server(listen_address=":0")
    assert get(server.url).status == 200


def test_web_config_headers_are_sent_and_excluded_paths_skip_basic_auth(
    start_server: StartServer,
) -> None:
    config = (
        f"basic_auth_users:\n  alice: '{ALICE_HASH}'\n"
        "basic_auth_excluded_paths: [/healthz]\n"
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    )
    server = start_server(config, routes={"/metrics": echo, "/healthz": echo})
    # exporter-toolkit sends the configured headers on every response, refusals included.
    refused = get(server.url, "/metrics")
    assert refused.status == 401
    assert refused.headers["X-Frame-Options"] == "deny"
    excluded = get(server.url, "/healthz")
    assert excluded.status == 200
    assert excluded.headers["X-Frame-Options"] == "deny"
    # An excluded path is matched exactly, as exporter-toolkit does.
    assert get(server.url, "/healthz/").status == 401
