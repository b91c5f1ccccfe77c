"""Reloading the web config file (and its TLS files) while serving, without a restart."""

from __future__ import annotations

import shutil
import socket
import ssl
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import bcrypt
import pytest
import structlog

from exporter.errors import ConfigError
from exporter.web import CHECK_INTERVAL_S, WebConfigWatcher, WebServer
from tests.web.conftest import (
    ALICE_HASH,
    ALICE_PASSWORD,
    Certs,
    StartServer,
    connect,
    fetch,
    get,
    tls_config,
)
from tests.web.test_auth import basic

AUTH = f"basic_auth_users:\n  alice: '{ALICE_HASH}'\n"


def eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Polls `condition` until it holds; reloads are looked for at most once a second."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def logged_after_a_connection(
    logs: list[MutableMapping[str, Any]], event: str, connect: Callable[[], object]
) -> Callable[[], bool]:
    """A condition for eventually(): the server looks at its files when a client connects."""

    def condition() -> bool:
        connect()
        return any(entry["event"] == event for entry in logs)

    return condition


def config_file_of(server: WebServer) -> Path:
    path = server._web_config_file
    assert path is not None
    return path


def test_adding_basic_auth_applies_to_new_connections(
    start_server: StartServer, certs: Certs
) -> None:
    server = start_server(tls_config(certs))
    context = certs.client_context()
    assert get(server.url, context=context).status == 200
    config_file_of(server).write_text(tls_config(certs) + AUTH)
    assert eventually(lambda: get(server.url, context=context).status == 401)
    authorized = {"Authorization": basic("alice", ALICE_PASSWORD)}
    assert get(server.url, context=context, headers=authorized).status == 200


def test_invalid_file_keeps_the_last_good_config_and_logs_once(start_server: StartServer) -> None:
    server = start_server(AUTH)
    config_file = config_file_of(server)
    authorized = {"Authorization": basic("alice", ALICE_PASSWORD)}
    with structlog.testing.capture_logs() as logs:
        config_file.write_text("basic_auth_users:\n  alice: not-a-hash\n")
        failed = logged_after_a_connection(
            logs, "web_config_reload_failed", lambda: get(server.url)
        )
        assert eventually(failed)
        assert get(server.url).status == 401
        assert get(server.url, headers=authorized).status == 200
        time.sleep(CHECK_INTERVAL_S)  # the next look sees no change, so logs nothing
        assert get(server.url).status == 401
    failures = [e for e in logs if e["event"] == "web_config_reload_failed"]
    assert len(failures) == 1
    assert "basic_auth_users.alice" in failures[0]["error"]
    assert failures[0]["log_level"] == "error"
    # A fixed file is picked up again.
    config_file.write_text(AUTH.replace("alice", "bob"))
    bob = {"Authorization": basic("bob", ALICE_PASSWORD)}
    assert eventually(lambda: get(server.url, headers=bob).status == 200)
    assert get(server.url, headers=authorized).status == 401


def test_tls_cannot_be_dropped_by_a_reload(start_server: StartServer, certs: Certs) -> None:
    server = start_server(tls_config(certs))
    with structlog.testing.capture_logs() as logs:
        config_file_of(server).write_text(AUTH)
        context = certs.client_context()
        failed = logged_after_a_connection(
            logs, "web_config_reload_failed", lambda: get(server.url, context=context)
        )
        assert eventually(failed)
    assert "restart kvcap" in logs[-1]["error"]
    assert server.url.startswith("https://")
    assert get(server.url, context=certs.client_context()).status == 200


def test_rotated_certificate_is_served_to_new_connections(
    start_server: StartServer, certs: Certs, tmp_path: Path
) -> None:
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(certs.server_cert, cert_file)
    shutil.copy(certs.server_key, key_file)
    server = start_server(f"tls_server_config:\n  cert_file: {cert_file}\n  key_file: {key_file}\n")
    host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
    assert host is not None
    assert port is not None

    def served_certificate() -> bytes:
        # No verification: the point is which certificate the server presents.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        with (
            socket.create_connection((host, port), timeout=5) as raw,
            context.wrap_socket(raw) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der

    assert served_certificate() == ssl.PEM_cert_to_DER_cert(certs.server_cert.read_text())
    # How cert-manager rotates: new files moved into place.
    shutil.copy(certs.client_cert, tmp_path / "new.crt")
    shutil.copy(certs.client_key, tmp_path / "new.key")
    (tmp_path / "new.key").replace(key_file)
    (tmp_path / "new.crt").replace(cert_file)
    new = ssl.PEM_cert_to_DER_cert(certs.client_cert.read_text())
    assert eventually(lambda: served_certificate() == new)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_watcher_looks_at_most_once_per_interval(tmp_path: Path) -> None:
    config_file = tmp_path / "web.yml"
    config_file.write_text("")
    clock = FakeClock()
    watcher = WebConfigWatcher(config_file, clock=clock)
    assert watcher.state.auth is None
    config_file.write_text(AUTH)
    clock.now += CHECK_INTERVAL_S / 2
    watcher.maybe_reload()
    assert watcher.state.auth is None
    clock.now += CHECK_INTERVAL_S / 2
    with structlog.testing.capture_logs() as logs:
        watcher.maybe_reload()
    assert watcher.state.auth is not None
    assert [e["event"] for e in logs] == ["web_config_reloaded"]


def test_watcher_retries_when_a_missing_tls_file_appears(certs: Certs, tmp_path: Path) -> None:
    config_file = tmp_path / "web.yml"
    config_file.write_text(tls_config(certs))
    clock = FakeClock()
    watcher = WebConfigWatcher(config_file, clock=clock)
    first_context = watcher.state.ssl_context
    cert_file = tmp_path / "later.pem"
    config_file.write_text(
        f"tls_server_config:\n  cert_file: {cert_file}\n  key_file: {certs.server_key}\n"
    )
    with structlog.testing.capture_logs() as logs:
        clock.now += CHECK_INTERVAL_S
        watcher.maybe_reload()
        clock.now += CHECK_INTERVAL_S
        watcher.maybe_reload()
        assert [e["event"] for e in logs] == ["web_config_reload_failed"]
        assert watcher.state.ssl_context is first_context
        shutil.copy(certs.server_cert, cert_file)
        clock.now += CHECK_INTERVAL_S
        watcher.maybe_reload()
    assert logs[-1]["event"] == "web_config_reloaded"
    assert watcher.state.ssl_context is not first_context


def test_watcher_without_a_file_serves_plain_open_http() -> None:
    watcher = WebConfigWatcher(None)
    watcher.maybe_reload()
    assert (watcher.state.ssl_context, watcher.state.auth) == (None, None)


@pytest.mark.parametrize("text", ["tls_server_config: [", "basic_auth_users: 1\n"])
def test_watcher_start_with_a_bad_file_raises(tmp_path: Path, text: str) -> None:
    config_file = tmp_path / "web.yml"
    config_file.write_text(text)
    with pytest.raises(ConfigError):
        WebConfigWatcher(config_file)


def test_a_removed_user_is_refused_on_an_open_keep_alive_connection(
    start_server: StartServer,
) -> None:
    server = start_server(AUTH)
    authorized = {"Authorization": basic("alice", ALICE_PASSWORD)}
    connection = connect(server.url)
    assert fetch(connection, headers=authorized).status == 200
    config_file_of(server).write_text(AUTH.replace("alice", "bob"))
    # The same connection, no new one: the file is looked at per request, once a second.
    assert eventually(lambda: fetch(connection, headers=authorized).status == 401)
    connection.close()


@pytest.mark.parametrize(
    ("new_text", "reason_part"),
    [("", "basic auth off"), ("# nothing left\n", "basic auth off")],
)
def test_a_reload_that_turns_auth_off_is_refused_and_counted(
    start_server: StartServer, new_text: str, reason_part: str
) -> None:
    server = start_server(AUTH)
    with structlog.testing.capture_logs() as logs:
        config_file_of(server).write_text(new_text)
        refused = logged_after_a_connection(
            logs, "web_config_reload_refused", lambda: get(server.url)
        )
        assert eventually(refused)
    assert (
        reason_part in next(e for e in logs if e["event"] == "web_config_reload_refused")["error"]
    )
    assert get(server.url).status == 401
    assert server.counters.reload_errors() == {"invalid": 0, "downgrade": 1}


def test_allow_downgrade_accepts_turning_auth_off(tmp_path: Path) -> None:
    config_file = tmp_path / "web.yml"
    config_file.write_text(AUTH)
    clock = FakeClock()
    watcher = WebConfigWatcher(config_file, clock=clock, allow_downgrade=True)
    config_file.write_text("")
    clock.now += CHECK_INTERVAL_S
    watcher.maybe_reload()
    assert watcher.state.auth is None


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (
            {"client_auth_type": "RequireAndVerifyClientCert"},
            {"client_auth_type": "VerifyClientCertIfGiven"},
        ),
        ({"min_version": "TLS13"}, {"min_version": "TLS12"}),
    ],
)
def test_a_reload_that_weakens_tls_is_refused(
    certs: Certs, tmp_path: Path, before: dict[str, str], after: dict[str, str]
) -> None:
    config_file = tmp_path / "web.yml"
    ca = {"client_ca_file": str(certs.ca)}
    config_file.write_text(
        tls_config(certs, **({**ca, **before} if "client_auth_type" in before else before))
    )
    clock = FakeClock()
    watcher = WebConfigWatcher(config_file, clock=clock)
    first = watcher.state
    config_file.write_text(
        tls_config(certs, **({**ca, **after} if "client_auth_type" in after else after))
    )
    clock.now += CHECK_INTERVAL_S
    with structlog.testing.capture_logs() as logs:
        watcher.maybe_reload()
    assert watcher.state is first
    assert [e["event"] for e in logs] == ["web_config_reload_refused"]


def test_reload_now_reads_the_file_without_waiting_for_the_interval(tmp_path: Path) -> None:
    config_file = tmp_path / "web.yml"
    config_file.write_text("")
    watcher = WebConfigWatcher(config_file, clock=FakeClock())
    config_file.write_text(AUTH)
    watcher.reload()
    assert watcher.state.auth is not None


def test_a_reload_with_the_same_users_keeps_the_bcrypt_cache(
    start_server: StartServer, certs: Certs
) -> None:
    server = start_server(AUTH)
    authorized = {"Authorization": basic("alice", ALICE_PASSWORD)}
    assert get(server.url, headers=authorized).status == 200
    auth = server._server.watcher.state.auth if server._server else None
    assert auth is not None
    assert auth.bcrypt_checks == 1
    config_file = config_file_of(server)
    with structlog.testing.capture_logs() as logs:
        for _ in range(20):  # as many SIGHUPs, the file unchanged
            server.reload_web_config()
        # Another header, a comment: the same users and hashes, so the same authenticator.
        config_file.write_text(
            "# rewritten\n" + AUTH + "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
        )
        server.reload_web_config()
        for _ in range(5):
            assert get(server.url, headers=authorized).status == 200
    state = server._server.watcher.state if server._server else None
    assert state is not None
    assert state.auth is auth
    assert auth.bcrypt_checks == 1  # the first login only
    assert state.config.response_headers == (("X-Frame-Options", "deny"),)
    assert [e["event"] for e in logs if e["log_level"] != "debug"] == ["web_config_reloaded"]


def test_a_reload_with_a_changed_hash_drops_the_bcrypt_cache(start_server: StartServer) -> None:
    server = start_server(AUTH)
    authorized = {"Authorization": basic("alice", ALICE_PASSWORD)}
    assert get(server.url, headers=authorized).status == 200
    first = server._server.watcher.state.auth if server._server else None
    other = bcrypt.hashpw(b"looking-glass", bcrypt.gensalt(rounds=4)).decode()
    config_file_of(server).write_text(f"basic_auth_users:\n  alice: '{other}'\n")
    server.reload_web_config()
    assert get(server.url, headers=authorized).status == 401
    state = server._server.watcher.state if server._server else None
    assert state is not None
    assert state.auth is not first


def test_a_file_rewritten_with_the_same_settings_rebuilds_nothing(tmp_path: Path) -> None:
    config_file = tmp_path / "web.yml"
    config_file.write_text(AUTH)
    clock = FakeClock()
    watcher = WebConfigWatcher(config_file, clock=clock)
    first = watcher.state
    config_file.write_text("# the same users, said again\n" + AUTH)
    clock.now += CHECK_INTERVAL_S
    with structlog.testing.capture_logs() as logs:
        watcher.maybe_reload()
        watcher.reload()
    assert watcher.state is first
    assert [e["event"] for e in logs] == ["web_config_unchanged", "web_config_unchanged"]
