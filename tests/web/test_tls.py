"""HTTPS and mutual TLS against real clients; refused handshakes never stop other clients."""

from __future__ import annotations

import socket
import ssl
import time
import warnings
from urllib.parse import urlsplit

import pytest

from tests.web.conftest import Certs, StartServer, connect, fetch, get, raw_connection, tls_config

# What a refused TLS client sees depends on the TLS version and on timing: an alert during
# the handshake, or (TLS 1.3 checks client certificates after the client's side is done)
# an alert, a reset or a closed connection at the first read.
REFUSED = (OSError, ssl.SSLError, ConnectionError)


def test_https_with_the_ca(start_server: StartServer, certs: Certs) -> None:
    server = start_server(tls_config(certs))
    assert server.url.startswith("https://127.0.0.1:")
    assert get(server.url, context=certs.client_context()).status == 200
    localhost = server.url.replace("127.0.0.1", "localhost")
    assert get(localhost, context=certs.client_context()).status == 200


def test_keep_alive_over_tls(start_server: StartServer, certs: Certs) -> None:
    server = start_server(tls_config(certs))
    connection = connect(server.url, certs.client_context())
    for _ in range(5):
        assert fetch(connection).status == 200
    connection.close()


def test_client_that_does_not_trust_the_ca_is_refused(
    start_server: StartServer, certs: Certs
) -> None:
    server = start_server(tls_config(certs))
    with pytest.raises(ssl.SSLCertVerificationError):
        get(server.url, context=ssl.create_default_context(cafile=certs.other_ca))


def test_plain_http_to_https_server_fails_alone(start_server: StartServer, certs: Certs) -> None:
    server = start_server(tls_config(certs))
    with pytest.raises(REFUSED):
        get(server.url.replace("https://", "http://"))
    assert get(server.url, context=certs.client_context()).status == 200


@pytest.mark.parametrize(
    ("client_auth_type", "client", "allowed"),
    [
        ("RequireAndVerifyClientCert", None, False),
        ("RequireAndVerifyClientCert", "wrong", False),
        ("RequireAndVerifyClientCert", "right", True),
        ("VerifyClientCertIfGiven", None, True),
        ("VerifyClientCertIfGiven", "wrong", False),
        ("VerifyClientCertIfGiven", "right", True),
        ("RequireAnyClientCert", None, False),
        ("RequireAnyClientCert", "right", True),
        ("RequestClientCert", None, True),
        ("RequestClientCert", "wrong", True),
    ],
)
def test_client_certificates(
    start_server: StartServer,
    certs: Certs,
    client_auth_type: str,
    client: str | None,
    allowed: bool,
) -> None:
    server = start_server(
        tls_config(certs, client_ca_file=str(certs.ca), client_auth_type=client_auth_type)
    )
    context = certs.client_context(client=client)
    if allowed:
        assert get(server.url, context=context).status == 200
    else:
        with pytest.raises(REFUSED):
            get(server.url, context=context)
        # The refused handshake cost the server nothing but that connection.
        assert get(server.url, context=certs.client_context(client="right")).status == 200


def test_min_version_tls13_refuses_a_tls12_only_client(
    start_server: StartServer, certs: Certs
) -> None:
    server = start_server(tls_config(certs, min_version="TLS13"))
    tls12_only = certs.client_context(maximum_version=ssl.TLSVersion.TLSv1_2)
    with pytest.raises(ssl.SSLError):
        get(server.url, context=tls12_only)
    assert get(server.url, context=certs.client_context()).status == 200


def test_default_min_version_refuses_tls11(start_server: StartServer, certs: Certs) -> None:
    server = start_server(tls_config(certs))
    context = certs.client_context()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.1 is, on purpose here
        context.minimum_version = ssl.TLSVersion.TLSv1_1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(ssl.SSLError):
        get(server.url, context=context)


def test_silent_client_does_not_block_others(start_server: StartServer, certs: Certs) -> None:
    server = start_server(tls_config(certs))
    # Connected but never starting the handshake: only its own thread waits on it.
    silent = [raw_connection(server, None) for _ in range(3)]
    start = time.monotonic()
    assert get(server.url, context=certs.client_context()).status == 200
    assert time.monotonic() - start < 1.0
    for connection in silent:
        connection.close()


def test_stop_with_a_tls_client_mid_handshake(start_server: StartServer, certs: Certs) -> None:
    server = start_server(tls_config(certs))
    silent = raw_connection(server, None)
    idle = connect(server.url, certs.client_context())
    assert fetch(idle).status == 200
    time.sleep(0.05)  # let the server thread start the handshake
    start = time.monotonic()
    server.stop()
    assert time.monotonic() - start < 2.0
    assert silent.recv(1) == b""
    silent.close()
    idle.close()


# --- exporter-toolkit parity: versions, ciphers, curves, allowed SANs ----------------------


def negotiated(url: str, context: ssl.SSLContext) -> tuple[str | None, str | None]:
    """(TLS version, cipher) of one real handshake with the server."""
    parts = urlsplit(url)
    with (
        socket.create_connection((parts.hostname or "", parts.port or 0), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        cipher = tls.cipher()
        return tls.version(), None if cipher is None else cipher[0]


def test_max_version_tls12_negotiates_tls12(start_server: StartServer, certs: Certs) -> None:
    server = start_server(tls_config(certs, max_version="TLS12"))
    assert negotiated(server.url, certs.client_context())[0] == "TLSv1.2"
    tls13_only = certs.client_context()
    tls13_only.minimum_version = ssl.TLSVersion.TLSv1_3
    with pytest.raises(ssl.SSLError):
        get(server.url, context=tls13_only)


def test_cipher_suites_are_the_only_ones_offered(start_server: StartServer, certs: Certs) -> None:
    server = start_server(
        tls_config(
            certs,
            max_version="TLS12",
            cipher_suites="[TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]",
        )
    )
    assert negotiated(server.url, certs.client_context())[1] == "ECDHE-ECDSA-AES256-GCM-SHA384"
    other = certs.client_context(maximum_version=ssl.TLSVersion.TLSv1_2)
    other.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256")
    with pytest.raises(ssl.SSLError):
        get(server.url, context=other)


def test_server_cipher_preference_follows_the_list(start_server: StartServer, certs: Certs) -> None:
    listed = "[TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]"
    client = certs.client_context(maximum_version=ssl.TLSVersion.TLSv1_2)
    client.set_ciphers("ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-AES128-GCM-SHA256")
    server = start_server(tls_config(certs, max_version="TLS12", cipher_suites=listed))
    assert negotiated(server.url, client)[1] == "ECDHE-ECDSA-AES128-GCM-SHA256"


def test_a_single_curve_is_enforced(start_server: StartServer, certs: Certs) -> None:
    server = start_server(tls_config(certs, curve_preferences="[CurveP384]"))
    p256_only = certs.client_context()
    p256_only.set_ecdh_curve("prime256v1")
    with pytest.raises(ssl.SSLError):
        get(server.url, context=p256_only)
    p384 = certs.client_context()
    p384.set_ecdh_curve("secp384r1")
    assert get(server.url, context=p384).status == 200


@pytest.mark.parametrize(
    ("allowed", "admitted"),
    [("[prometheus.kvcap.test]", True), ("[grafana.kvcap.test, 10.0.0.1]", False)],
)
def test_client_allowed_sans(
    start_server: StartServer, certs: Certs, allowed: str, admitted: bool
) -> None:
    server = start_server(
        tls_config(
            certs,
            client_auth_type="RequireAndVerifyClientCert",
            client_ca_file=str(certs.ca),
            client_allowed_sans=allowed,
        )
    )
    context = certs.client_context(client="right")
    if admitted:
        assert get(server.url, context=context).status == 200
    else:
        with pytest.raises(REFUSED):
            get(server.url, context=context)
