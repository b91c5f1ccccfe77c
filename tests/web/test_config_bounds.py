"""Hostile web config files: headers that cannot be sent, files that are no file, bombs."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.errors import ConfigError
from exporter.web import WebConfigWatcher, parse_web_config, read_web_config_file
from exporter.web.config import (
    MAX_HEADER_VALUE_BYTES,
    MAX_HEADERS_BYTES,
    MAX_TLS_FILE_BYTES,
    MAX_WEB_CONFIG_BYTES,
)
from tests.support.fifo import refusal_of_a_fifo
from tests.web.conftest import Certs, StartServer, get, served_config, tls_config

CSP = "http_server_config:\n  headers:\n    Content-Security-Policy: {}\n"


def refusal(text: str) -> str:
    with pytest.raises(ConfigError) as refused:
        parse_web_config(text, base_dir=Path("."))
    return str(refused.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('"café"', "character 4 is '\\xe9'"),
        ('"a\\0b"', "character 2 is '\\x00'"),
        ('"a\\rSet-Cookie: x=1"', "character 2 is '\\r'"),
        ('"a\\nSet-Cookie: x=1"', "character 2 is '\\n'"),
        ('"a\\x7fb"', "character 2 is '\\x7f'"),
        ('"a\\u2028b"', "character 2 is '\\u2028'"),
        ("a" * (MAX_HEADER_VALUE_BYTES + 1), f"at most {MAX_HEADER_VALUE_BYTES}"),
        ("a" * 1024 * 1024, f"at most {MAX_HEADER_VALUE_BYTES}"),
        ("[a, b]", "must be one line of text"),
        ("{a: b}", "must be one line of text"),
    ],
    ids=["non-ascii", "nul", "cr", "lf", "del", "line-separator", "cap+1", "1MiB", "list", "map"],
)
def test_a_header_value_that_cannot_be_sent_is_refused_in_one_line(
    value: str, message: str
) -> None:
    error = refusal(CSP.format(value))
    assert error.startswith("web config http_server_config.headers.Content-Security-Policy: ")
    assert message in error
    assert "\n" not in error
    assert "\r" not in error
    assert len(error) < 200


def test_visible_ascii_spaces_and_tabs_are_sent_as_written() -> None:
    value = "default-src 'self';\timg-src *; " + "a" * (MAX_HEADER_VALUE_BYTES - 32)
    config = parse_web_config(CSP.format(f'"{value}"'), base_dir=Path("."))
    assert config.response_headers == (("Content-Security-Policy", value),)


def test_the_headers_together_are_capped() -> None:
    value = "a" * MAX_HEADER_VALUE_BYTES
    text = (
        "http_server_config:\n  headers:\n"
        f"    Content-Security-Policy: {value}\n"
        f"    X-XSS-Protection: {value}\n"
    )
    assert f"at most {MAX_HEADERS_BYTES}" in refusal(text)


def billion_laughs(levels: int) -> str:
    """A YAML flow sequence that names its nested anchors inline: 10**levels strings
    when rendered as text, a few hundred bytes as YAML."""
    text = "&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"
    for level in range(1, levels):
        text = f"&a{level} [{text}" + f", *a{level - 1}" * 9 + "]"
    return text


def test_an_alias_bomb_as_a_header_value_is_refused_without_expanding_it() -> None:
    bomb = billion_laughs(10)
    assert len(bomb) < 1000
    error = refusal(CSP.format(bomb))
    # The web config is read as every file kvcap did not choose: aliases are refused.
    assert error.startswith("web config: YAML aliases (*name) are not read"), error


@pytest.mark.parametrize(
    "key",
    ["? " + "x" * 100_000 + "\n", '"a\\nb"', "? !!binary aGVsbG8=\n"],
    ids=["100k-char-key", "newline-key", "bytes-key"],
)
def test_an_unknown_key_is_shown_short_on_one_line(key: str) -> None:
    error = refusal(f"{key}: 1\n")  # "? KEY": YAML's explicit key, of any length
    assert "unknown field" in error
    assert "\n" not in error
    assert len(error) < 250


def test_a_huge_user_name_is_shown_short() -> None:
    error = refusal(f"basic_auth_users:\n  ? {'u' * 100_000}\n  : hunter2\n")
    assert error.startswith("web config basic_auth_users.uuu")
    assert len(error) < 200


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    error = refusal_of_a_fifo(tmp_path / "web.yml", read_web_config_file, timeout_s=10)
    assert isinstance(error, ConfigError)
    assert "not a regular file" in str(error)


def test_a_device_and_an_oversized_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        read_web_config_file("/dev/zero")
    big = tmp_path / "web.yml"
    with big.open("wb") as file:  # sparse: 1 GiB that costs nothing on disk
        file.truncate(1024**3)
    with pytest.raises(ConfigError, match=f"larger than {MAX_WEB_CONFIG_BYTES // 2**20} MiB"):
        read_web_config_file(big)


def test_a_reload_with_a_non_ascii_header_keeps_the_old_config_and_every_answer(
    start_server: StartServer,
) -> None:
    server = start_server("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    path = server._web_config_file
    assert path is not None
    path.write_text(CSP.format('"café"'), encoding="utf-8")
    server.reload_web_config()
    assert server.counters.reload_errors() == {"invalid": 1, "downgrade": 0}
    for endpoint in ("/healthz", "/metrics"):
        reply = get(server.url + endpoint)
        assert reply.status == 200
        assert reply.body
        assert reply.headers["X-Frame-Options"] == "deny"
        assert reply.headers["Content-Security-Policy"] is None


def test_a_watcher_refuses_to_start_with_a_bad_header(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text(CSP.format('"a\\0b"'))
    with pytest.raises(ConfigError, match="character 2 is '\\\\x00'"):
        WebConfigWatcher(path)


@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_any_header_value_is_refused_or_sendable_on_every_response(value: str) -> None:
    # json.dumps writes every character as a YAML double-quoted scalar can read it back.
    text = CSP.format(json.dumps(value))
    try:
        config = parse_web_config(text, base_dir=Path("."))
    except ConfigError as refused:
        problem = str(refused)
    else:
        problem = ""
    assert "\n" not in problem
    if problem:
        return
    for name, sent in config.response_headers:
        assert f"{name}: {sent}\r\n".encode("ascii").count(b"\r\n") == 1
        assert "\0" not in sent
        assert len(sent) <= MAX_HEADER_VALUE_BYTES


TLS_FIELDS = ("cert_file", "key_file", "client_ca_file")


def tls_config_with(certs: Certs, field: str, path: Path) -> str:
    """The test server's TLS config (client certificates required) with `field` at `path`."""
    files = {"cert_file": certs.server_cert, "key_file": certs.server_key}
    files["client_ca_file"] = certs.ca
    files[field] = path
    lines = ["tls_server_config:", "  client_auth_type: RequireAndVerifyClientCert"]
    lines.extend(f"  {name}: {value}" for name, value in files.items())
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("field", TLS_FIELDS)
def test_a_tls_file_that_is_a_fifo_is_refused_at_once(
    tmp_path: Path, certs: Certs, field: str
) -> None:
    """OpenSSL opened the path as it was given: a FIFO there hung start-up (and a reload)
    until a writer came."""
    config = tmp_path / "web.yml"
    fifo = tmp_path / f"{field}.pem"
    config.write_text(tls_config_with(certs, field, fifo))
    error = refusal_of_a_fifo(fifo, lambda _: served_config(config), timeout_s=10)
    assert isinstance(error, ConfigError)
    assert str(error).startswith(f"web config tls_server_config.{field}: cannot read {fifo}")
    assert "not a regular file" in str(error)


@pytest.mark.parametrize("field", TLS_FIELDS)
def test_a_tls_file_that_is_a_device_or_too_large_is_refused(
    tmp_path: Path, certs: Certs, field: str
) -> None:
    config = tmp_path / "web.yml"
    config.write_text(tls_config_with(certs, field, Path("/dev/zero")))
    with pytest.raises(ConfigError, match=f"tls_server_config.{field}: .*not a regular file"):
        served_config(config)
    big = tmp_path / "big.pem"
    with big.open("wb") as file:  # sparse: 1 GiB that costs nothing on disk
        file.truncate(1024**3)
    config.write_text(tls_config_with(certs, field, big))
    limit = f"larger than {MAX_TLS_FILE_BYTES // 2**20} MiB"
    with pytest.raises(ConfigError, match=f"tls_server_config.{field}: .*{limit}"):
        served_config(config)


def test_a_reload_onto_a_fifo_certificate_keeps_serving_tls(
    start_server: StartServer, certs: Certs, tmp_path: Path
) -> None:
    server = start_server(tls_config(certs))
    path = server._web_config_file
    assert path is not None
    fifo = tmp_path / "swapped.pem"
    os.mkfifo(fifo)
    path.write_text(tls_config(certs).replace(str(certs.server_cert), str(fifo)))
    reloading = threading.Thread(target=server.reload_web_config, daemon=True)
    reloading.start()
    reloading.join(10)
    assert not reloading.is_alive(), "the reload waited for a writer of the FIFO"
    assert server.counters.reload_errors() == {"invalid": 1, "downgrade": 0}
    reply = get(server.url, context=certs.client_context())
    assert reply.status == 200
