"""The web config file: schema errors name their field, TLS files must load, modes map right."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest

from exporter.errors import ConfigError
from exporter.web import GO_CIPHER_SUITES, TlsConfig, WebConfig, build_ssl_context, parse_web_config
from tests.support import cli_command
from tests.web.conftest import ALICE_HASH, Certs, get, served_config, tls_config

CERT = "  cert_file: {server_cert}\n  key_file: {server_key}\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config: [\n", "web config: not valid YAML"),
        ("- a\n- b\n", "web config file: must be a mapping"),
        ("http_server_config: []\n", "web config http_server_config: must be a mapping"),
        ("http_server_config:\n  http3: true\n", "web config http_server_config.http3: unknown"),
        ("http_server_config:\n  http2: maybe\n", "web config http_server_config.http2: must be"),
        (
            "http_server_config:\n  headers:\n    X-Powered-By: kvcap\n",
            "web config http_server_config.headers.X-Powered-By: unknown field",
        ),
        (
            "http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
            "web config http_server_config.headers.X-Frame-Options: must be one of deny,",
        ),
        (
            "http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n",
            "web config http_server_config.headers.X-Content-Type-Options: must be one of nosniff",
        ),
        (
            "tls_server_config:\n" + CERT + "  max_version: TLS14\n",
            "web config tls_server_config.max_version: must be one of TLS10, TLS11, TLS12, TLS13",
        ),
        (
            "tls_server_config:\n" + CERT + "  min_version: TLS13\n  max_version: TLS12\n",
            "web config tls_server_config.max_version: TLS12 is below min_version TLS13",
        ),
        (
            "tls_server_config:\n" + CERT + "  cipher_suites: [TLS_INVENTED_CIPHER]\n",
            "web config tls_server_config.cipher_suites: unknown cipher suite 'TLS_INVENTED",
        ),
        (
            "tls_server_config:\n" + CERT + "  cipher_suites: TLS_AES_128_GCM_SHA256\n",
            "web config tls_server_config.cipher_suites: must be a list",
        ),
        (
            "tls_server_config:\n" + CERT + "  curve_preferences: [CurveP999]\n",
            "web config tls_server_config.curve_preferences: unknown curve 'CurveP999'",
        ),
        (
            "tls_server_config:\n" + CERT + "  prefer_server_cipher_suites: yes please\n",
            "web config tls_server_config.prefer_server_cipher_suites: must be true or false",
        ),
        (
            "tls_server_config:\n" + CERT + "  client_allowed_sans: [a.example]\n",
            "web config tls_server_config.client_allowed_sans: needs client_auth_type",
        ),
        ("basic_auth_excluded_paths: [metrics]\n", "web config basic_auth_excluded_paths: must"),
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
        served_config(config_file)
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
        served_config(config_file)
    assert "hunter2" not in str(raised.value)


def test_unreadable_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"web config file .*missing\.yml: cannot read it"):
        served_config(tmp_path / "missing.yml")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "{}\n", "basic_auth_users:\n"])
def test_empty_config_is_plain_open_http(tmp_path: Path, text: str) -> None:
    config_file = tmp_path / "web.yml"
    config_file.write_text(text)
    assert served_config(config_file) == WebConfig()


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
    config = served_config(config_file)
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
    config = served_config(config_file)
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


WEB_CONFIGS = Path(__file__).parent.parent / "fixtures" / "web-config"


def documented(name: str, folder: Path, certs: Certs) -> Path:
    """A web config from exporter-toolkit's documentation, unchanged, beside the test
    certificate under the names it expects."""
    (folder / "server.crt").write_bytes(certs.server_cert.read_bytes())
    (folder / "server.key").write_bytes(certs.server_key.read_bytes())
    target = folder / name
    target.write_bytes((WEB_CONFIGS / name).read_bytes())
    return target


def test_the_documented_sample_loads_unchanged(tmp_path: Path, certs: Certs) -> None:
    config = served_config(documented("exporter-toolkit-web-config.yml", tmp_path, certs))
    assert config.tls is not None
    assert config.tls.cert_file == tmp_path / "server.crt"
    assert sorted(config.basic_auth_users) == ["alice", "bob"]
    assert config.basic_auth_excluded_paths == ("/-/healthy", "/-/ready")
    assert not config.auth_required("/-/ready")
    assert config.auth_required("/metrics")


def test_documented_headers_are_read_in_order(tmp_path: Path, certs: Certs) -> None:
    config = served_config(documented("exporter-toolkit-headers.yml", tmp_path, certs))
    assert config.response_headers == (
        ("X-Frame-Options", "deny"),
        ("Strict-Transport-Security", "max-age=31536000; includeSubDomains"),
        ("X-Content-Type-Options", "nosniff"),
        ("X-XSS-Protection", "1"),
        ("Content-Security-Policy", "default-src 'self' *.test.example.net"),
    )
    blank = parse_web_config(
        "http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: ''\n",
        base_dir=tmp_path,
    )
    assert blank.response_headers == ()
    assert blank.http2 is False


ALL_CIPHERS = list(GO_CIPHER_SUITES)
ALL_CURVES = ["CurveP256", "CurveP384", "CurveP521", "X25519", "X25519MLKEM768"]


def test_every_documented_cipher_and_curve_name_is_accepted(tmp_path: Path, certs: Certs) -> None:
    text = tls_config(
        certs,
        cipher_suites="[" + ", ".join(ALL_CIPHERS) + "]",
        curve_preferences="[" + ", ".join(ALL_CURVES) + "]",
        max_version="TLS13",
        prefer_server_cipher_suites="false",
    )
    config = parse_web_config(text, base_dir=tmp_path)
    assert config.tls is not None
    assert config.tls.cipher_suites == tuple(ALL_CIPHERS)
    assert config.tls.curve_preferences == tuple(ALL_CURVES)
    context = build_ssl_context(config.tls)
    assert not context.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    preferred = build_ssl_context(TlsConfig(certs.server_cert, certs.server_key))
    assert preferred.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    assert preferred.maximum_version == ssl.TLSVersion.TLSv1_3


@pytest.mark.process
def test_serve_runs_with_the_documented_sample_unchanged(tmp_path: Path, certs: Certs) -> None:
    """A real `kvcap-exporter serve` with exporter-toolkit's sample web config: HTTPS, basic
    auth asked for, its excluded paths not."""
    config = documented("exporter-toolkit-web-config.yml", tmp_path, certs)
    process = subprocess.Popen(
        cli_command("serve", "--web.listen-address", "127.0.0.1:0",
            "--web.config.file", str(config), "--no-collector.handshake", "--no-collector.nvml"),
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        lines: list[str] = []
        while not any("exporter_started" in line for line in lines):
            line = process.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        url = next(p.split("=", 1)[1] for p in lines[-1].split() if p.startswith("url="))
        assert url.startswith("https://")
        assert get(url, context=certs.client_context()).status == 401
        # Its basic_auth_excluded_paths are served without credentials (not kvcap's routes).
        assert get(url, "/-/healthy", context=certs.client_context()).status == 404
    finally:
        process.terminate()
        process.communicate(timeout=10)
