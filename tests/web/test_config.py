"""The web config file: schema errors name their field, TLS files must load, modes map right."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from exporter.errors import ConfigError
from exporter.web import TlsConfig, WebConfig, load_web_config
from exporter.web.config import build_ssl_context
from tests.web.conftest import ALICE_HASH, Certs, tls_config

CERT = "  cert_file: {server_cert}\n  key_file: {server_key}\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config: [\n", "web config: not valid YAML"),
        ("- a\n- b\n", "web config file: must be a mapping"),
        ("http_server_config: {}\n", "web config http_server_config: unknown field"),
        ("tls_server_config: 3\n", "web config tls_server_config: must be a mapping"),
        ("tls_server_config: {}\n", "web config tls_server_config.cert_file: required"),
        (
            "tls_server_config:\n  cert_file: {server_cert}\n",
            "web config tls_server_config.key_file: required",
        ),
        (
            "tls_server_config:\n  cert_file: 42\n  key_file: {server_key}\n",
            "web config tls_server_config.cert_file: must be a file path",
        ),
        (
            "tls_server_config:\n" + CERT + "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
            "web config tls_server_config.cipher_suites: unknown field",
        ),
        (
            "tls_server_config:\n" + CERT + "  min_version: TLS14\n",
            "web config tls_server_config.min_version: must be one of TLS10, TLS11, TLS12, TLS13",
        ),
        (
            "tls_server_config:\n" + CERT + "  min_version: 1.2\n",
            "web config tls_server_config.min_version: must be one of",
        ),
        (
            "tls_server_config:\n" + CERT + "  client_auth_type: RequireClientCertPlease\n",
            "web config tls_server_config.client_auth_type: must be one of NoClientCert,",
        ),
        (
            "tls_server_config:\n" + CERT + "  client_auth_type: RequireAndVerifyClientCert\n",
            "web config tls_server_config.client_ca_file: required with RequireAndVerifyClientCert",
        ),
        (
            "tls_server_config:\n" + CERT + "  client_auth_type: VerifyClientCertIfGiven\n",
            "web config tls_server_config.client_ca_file: required with VerifyClientCertIfGiven",
        ),
        (
            "tls_server_config:\n" + CERT + "  client_auth_type: RequireAnyClientCert\n",
            "web config tls_server_config.client_ca_file: required with RequireAnyClientCert",
        ),
        (
            "tls_server_config:\n" + CERT + "  client_ca_file: {ca}\n",
            "web config tls_server_config.client_auth_type: client_ca_file is set",
        ),
        (
            "tls_server_config:\n  cert_file: {folder}/missing.pem\n  key_file: {server_key}\n",
            "web config tls_server_config.cert_file: cannot read",
        ),
        (
            "tls_server_config:\n  cert_file: {server_key}\n  key_file: {server_key}\n",
            "web config tls_server_config.cert_file: no PEM certificate",
        ),
        (
            "tls_server_config:\n  cert_file: {server_cert}\n  key_file: {folder}/missing.pem\n",
            "web config tls_server_config.key_file: cannot read",
        ),
        (
            "tls_server_config:\n  cert_file: {server_cert}\n  key_file: {server_cert}\n",
            "web config tls_server_config.key_file: ",
        ),
        (
            "tls_server_config:\n  cert_file: {server_cert}\n  key_file: {client_key}\n",
            "web config tls_server_config.key_file: {client_key} does not match the certificate",
        ),
        (
            "tls_server_config:\n  cert_file: {server_cert}\n  key_file: {encrypted_key}\n",
            "web config tls_server_config.key_file: is encrypted",
        ),
        (
            "tls_server_config:\n"
            + CERT
            + "  client_ca_file: {server_key}\n  client_auth_type: RequireAndVerifyClientCert\n",
            "web config tls_server_config.client_ca_file: no PEM certificate",
        ),
        ("basic_auth_users: [alice]\n", "web config basic_auth_users: must be a mapping"),
        ("basic_auth_users:\n  alice: hunter2\n", "web config basic_auth_users.alice: must be a"),
        (
            "basic_auth_users:\n  alice: $2b$03$" + "a" * 53 + "\n",
            "web config basic_auth_users.alice: must be a bcrypt hash",
        ),
        ("basic_auth_users:\n  alice: 12\n", "web config basic_auth_users.alice: must be a"),
        ("basic_auth_users:\n  7: " + ALICE_HASH + "\n", "web config basic_auth_users: user names"),
        (
            "basic_auth_users:\n  'a:b': " + ALICE_HASH + "\n",
            "web config basic_auth_users.a:b: user names cannot contain ':'",
        ),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, certs: Certs, text: str, message: str) -> None:
    config_file = tmp_path / "web.yml"
    config_file.write_text(_fill(text, certs))
    with pytest.raises(ConfigError) as raised:
        load_web_config(config_file)
    assert str(raised.value).startswith(_fill(message, certs)), str(raised.value)


def _fill(template: str, certs: Certs) -> str:
    """Puts the test certificates' paths in for "{server_cert}" and the like."""
    for name, value in vars(certs).items():
        template = template.replace("{" + name + "}", str(value))
    return template


def test_plain_password_is_not_echoed(tmp_path: Path) -> None:
    config_file = tmp_path / "web.yml"
    config_file.write_text("basic_auth_users:\n  alice: hunter2\n")
    with pytest.raises(ConfigError) as raised:
        load_web_config(config_file)
    assert "hunter2" not in str(raised.value)


def test_unreadable_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"web config file .*missing\.yml: cannot read it"):
        load_web_config(tmp_path / "missing.yml")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "{}\n", "basic_auth_users:\n"])
def test_empty_config_is_plain_open_http(tmp_path: Path, text: str) -> None:
    config_file = tmp_path / "web.yml"
    config_file.write_text(text)
    assert load_web_config(config_file) == WebConfig()


def test_full_config_parses(tmp_path: Path, certs: Certs) -> None:
    config_file = tmp_path / "web.yml"
    config_file.write_text(
        tls_config(
            certs,
            client_ca_file=str(certs.ca),
            client_auth_type="RequireAndVerifyClientCert",
            min_version="TLS13",
        )
        + f"basic_auth_users:\n  alice: '{ALICE_HASH}'\n"
    )
    config = load_web_config(config_file)
    assert config.tls == TlsConfig(
        cert_file=certs.server_cert,
        key_file=certs.server_key,
        client_ca_file=certs.ca,
        client_auth_type="RequireAndVerifyClientCert",
        min_version="TLS13",
    )
    assert dict(config.basic_auth_users) == {"alice": ALICE_HASH}


def test_relative_paths_are_read_from_the_config_folder(certs: Certs) -> None:
    config_file = certs.folder / "web.yml"
    config_file.write_text(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server-key.pem\n"
    )
    config = load_web_config(config_file)
    assert config.tls is not None
    assert config.tls.cert_file == certs.server_cert


@pytest.mark.parametrize(
    ("client_auth_type", "verify_mode"),
    [
        ("NoClientCert", ssl.CERT_NONE),
        # Python cannot ask for a certificate without checking it; kvcap ignores client
        # identities, so not asking admits the same clients.
        ("RequestClientCert", ssl.CERT_NONE),
        # Python cannot accept an unverified certificate; verifying is the safe side.
        ("RequireAnyClientCert", ssl.CERT_REQUIRED),
        ("VerifyClientCertIfGiven", ssl.CERT_OPTIONAL),
        ("RequireAndVerifyClientCert", ssl.CERT_REQUIRED),
    ],
)
def test_client_auth_type_maps_to_verify_mode(
    certs: Certs, client_auth_type: str, verify_mode: ssl.VerifyMode
) -> None:
    tls = TlsConfig(
        cert_file=certs.server_cert,
        key_file=certs.server_key,
        client_ca_file=None if client_auth_type == "NoClientCert" else certs.ca,
        client_auth_type=client_auth_type,  # type: ignore[arg-type]
    )
    context = build_ssl_context(tls)
    assert context.verify_mode == verify_mode


@pytest.mark.parametrize(
    ("min_version", "expected"),
    [
        ("TLS10", ssl.TLSVersion.TLSv1),
        ("TLS11", ssl.TLSVersion.TLSv1_1),
        ("TLS12", ssl.TLSVersion.TLSv1_2),
        ("TLS13", ssl.TLSVersion.TLSv1_3),
    ],
)
def test_min_version(certs: Certs, min_version: str, expected: ssl.TLSVersion) -> None:
    tls = TlsConfig(certs.server_cert, certs.server_key, min_version=min_version)  # type: ignore[arg-type]
    assert build_ssl_context(tls).minimum_version == expected


def test_client_certificates_are_checked_against_the_client_ca_only(certs: Certs) -> None:
    tls = TlsConfig(
        certs.server_cert, certs.server_key, certs.ca, "RequireAndVerifyClientCert", "TLS12"
    )
    context = build_ssl_context(tls)
    # Exactly the configured CA: no system CAs, which would let public certificates in.
    assert context.cert_store_stats()["x509_ca"] == 1
