"""Certificates made per test session, running servers and a small HTTP client for tests/web."""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import bcrypt
import pytest
import structlog

from exporter.web import Handler, Request, Response, WebConfig, WebConfigWatcher, WebServer
from tests.support.certificates import certificate, new_key, write_certificate, write_key


@pytest.fixture(autouse=True)
def _server_logs_kept_with_the_test() -> Iterator[None]:
    """The in-process servers' threads log (a refused TLS handshake, say) while pytest
    prints its dots: keep those events with the test, as capture_logs does, instead of
    structlog's default printer writing them between the dots. A test's own capture_logs
    nests inside this one."""
    with structlog.testing.capture_logs():
        yield


# Cost 4, bcrypt's lowest: each check takes about a millisecond. A fixed salt keeps the test
# ids that show the hash the same in every process (pytest-xdist compares them).
ALICE_PASSWORD = "wonderland"
ALICE_HASH = bcrypt.hashpw(ALICE_PASSWORD.encode(), b"$2b$04$" + b"kvcapkvcapkvcapkvcapku").decode()


@dataclass(frozen=True)
class Certs:
    folder: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    other_client_cert: Path
    other_client_key: Path
    encrypted_key: Path

    def client_context(
        self, *, client: str | None = None, maximum_version: ssl.TLSVersion | None = None
    ) -> ssl.SSLContext:
        """A client context trusting the test CA; `client` is "right" or "wrong" to send a cert."""
        context = ssl.create_default_context(cafile=self.ca)
        if client == "right":
            context.load_cert_chain(self.client_cert, self.client_key)
        elif client == "wrong":
            context.load_cert_chain(self.other_client_cert, self.other_client_key)
        if maximum_version is not None:
            context.maximum_version = maximum_version
        return context


@dataclass(frozen=True)
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    folder = tmp_path_factory.mktemp("certs")
    ca_key, other_ca_key = new_key(), new_key()
    ca = certificate("kvcap test CA", ca_key, None)
    other_ca = certificate("other test CA", other_ca_key, None)
    server_key, client_key, other_client_key = new_key(), new_key(), new_key()
    certs = Certs(
        folder=folder,
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server-key.pem",
        client_cert=folder / "client.pem",
        client_key=folder / "client-key.pem",
        other_ca=folder / "other-ca.pem",
        other_client_cert=folder / "other-client.pem",
        other_client_key=folder / "other-client-key.pem",
        encrypted_key=folder / "encrypted-key.pem",
    )
    write_certificate(certs.ca, ca)
    write_certificate(certs.other_ca, other_ca)
    write_certificate(
        certs.server_cert, certificate("kvcap", server_key, (ca, ca_key), server=True)
    )
    write_certificate(certs.client_cert, certificate("prometheus", client_key, (ca, ca_key)))
    write_certificate(
        certs.other_client_cert,
        certificate("intruder", other_client_key, (other_ca, other_ca_key)),
    )
    write_key(certs.server_key, server_key)
    write_key(certs.client_key, client_key)
    write_key(certs.other_client_key, other_client_key)
    write_key(certs.encrypted_key, server_key, password=b"secret")
    return certs


def tls_config(certs: Certs, **extra: str) -> str:
    """The YAML of a tls_server_config with the test server certificate and `extra` fields."""
    lines = [
        "tls_server_config:",
        f"  cert_file: {certs.server_cert}",
        f"  key_file: {certs.server_key}",
    ]
    lines.extend(f"  {name}: {value}" for name, value in extra.items())
    return "\n".join(lines) + "\n"


def served_config(path: Path) -> WebConfig:
    """The web config a server started with `path` serves: read, checked and its TLS files
    loaded, as WebServer.start() does (ConfigError where start() would raise it)."""
    return WebConfigWatcher(path).state.config


def echo(request: Request) -> Response:
    """A handler that answers with what it was asked, to check the Request it gets."""
    body = f"{request.method} {request.path}".encode()
    return Response(200, body, "text/plain; charset=utf-8", (("X-Test", "yes"),))


def fail(request: Request) -> Response:
    raise RuntimeError("handler bug")


ROUTES: Mapping[str, Handler] = {"/metrics": echo, "/fail": fail}


StartServer = Callable[..., WebServer]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Starts WebServers on 127.0.0.1:0 (with `config` as the web config file) and stops them."""
    servers: list[WebServer] = []

    def start(
        config: str | None = None,
        routes: Mapping[str, Handler] = ROUTES,
        listen_address: str = "127.0.0.1:0",
    ) -> WebServer:
        config_file = None
        if config is not None:
            config_file = tmp_path / "web-config.yml"
            config_file.write_text(config)
        server = WebServer(listen_address, routes, web_config_file=config_file)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def raw_connection(server: WebServer, timeout_s: float | None = 5.0) -> socket.socket:
    """A plain TCP connection to the server: bytes as a client sends them, no HTTP library."""
    port = urlsplit(server.url).port
    assert port is not None
    return socket.create_connection(("127.0.0.1", port), timeout=timeout_s)


def connect(
    url: str, context: ssl.SSLContext | None = None, timeout_s: float = 5.0
) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port
    if parts.scheme == "https":
        return http.client.HTTPSConnection(host, port, context=context, timeout=timeout_s)
    return http.client.HTTPConnection(host, port, timeout=timeout_s)


def fetch(
    connection: http.client.HTTPConnection,
    path: str = "/metrics",
    *,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
) -> Reply:
    connection.request(method, path, body=body, headers=dict(headers or {}))
    response = connection.getresponse()
    return Reply(response.status, response.headers, response.read())


def get(
    url: str,
    path: str = "/metrics",
    *,
    context: ssl.SSLContext | None = None,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
) -> Reply:
    """One request on a new connection."""
    connection = connect(url, context)
    try:
        return fetch(connection, path, method=method, headers=headers)
    finally:
        connection.close()
