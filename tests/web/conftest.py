"""Certificates made per test session, running servers and a small HTTP client for tests/web."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import ssl
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from exporter.web import Handler, Request, Response, WebConfig, WebConfigWatcher, WebServer

# Cost 4, bcrypt's lowest: each check takes about a millisecond.
ALICE_PASSWORD = "wonderland"
ALICE_HASH = bcrypt.hashpw(ALICE_PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()


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


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> None:
    encryption: serialization.KeySerializationEncryption = (
        serialization.NoEncryption()
        if password is None
        else serialization.BestAvailableEncryption(password)
    )
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )


def _certificate(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if issuer is None else issuer[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is None:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer[1].public_key()), False
        )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    elif issuer is not None:  # a client: one DNS name, for client_allowed_sans
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(f"{name}.kvcap.test")]), critical=False
        )
    signer = key if issuer is None else issuer[1]
    return builder.sign(signer, hashes.SHA256())


def _write_certificate(path: Path, certificate: x509.Certificate) -> None:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    folder = tmp_path_factory.mktemp("certs")
    ca_key, other_ca_key = _key(), _key()
    ca = _certificate("kvcap test CA", ca_key, None)
    other_ca = _certificate("other test CA", other_ca_key, None)
    server_key, client_key, other_client_key = _key(), _key(), _key()
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
    _write_certificate(certs.ca, ca)
    _write_certificate(certs.other_ca, other_ca)
    _write_certificate(
        certs.server_cert, _certificate("kvcap", server_key, (ca, ca_key), server=True)
    )
    _write_certificate(certs.client_cert, _certificate("prometheus", client_key, (ca, ca_key)))
    _write_certificate(
        certs.other_client_cert,
        _certificate("intruder", other_client_key, (other_ca, other_ca_key)),
    )
    _write_key(certs.server_key, server_key)
    _write_key(certs.client_key, client_key)
    _write_key(certs.other_client_key, other_client_key)
    _write_key(certs.encrypted_key, server_key, password=b"secret")
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
