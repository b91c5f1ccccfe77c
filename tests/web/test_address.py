"""Listen addresses in exporter-toolkit's forms, and the URL shown for a bound socket."""

from __future__ import annotations

import re
import socket

import pytest

from exporter.errors import ConfigError
from exporter.web import resolve_listen_address, split_host_port, url_host


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        (":9470", "", 9470),
        ("0.0.0.0:9470", "0.0.0.0", 9470),
        ("127.0.0.1:0", "127.0.0.1", 0),
        ("[::1]:9470", "::1", 9470),
        ("[::]:65535", "::", 65535),
        ("localhost:9470", "localhost", 9470),
    ],
)
def test_split_host_port(text: str, host: str, port: int) -> None:
    assert split_host_port(text) == (host, port)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("9470", "missing ':port'"),
        ("localhost", "missing ':port'"),
        ("localhost:", "port must be a number"),
        ("localhost:http", "port must be a number"),
        ("localhost:65536", "port must be a number"),
        ("localhost:-1", "port must be a number"),
        ("localhost:\uff19\uff14\uff17\uff10", "port must be a number"),  # fullwidth digits
        ("::1:9470", "write IPv6 addresses in brackets"),
        ("[::1:9470", "write IPv6 addresses in brackets"),
        ("[]:9470", "empty IPv6 address"),
    ],
)
def test_bad_listen_address(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"listen address {text!r}: {problem}")):
        split_host_port(text)


def test_all_interfaces() -> None:
    address = resolve_listen_address(":9470")
    if socket.has_dualstack_ipv6():
        assert (address.family, address.sockaddr[:2], address.dual_stack) == (
            socket.AF_INET6,
            ("::", 9470),
            True,
        )
    else:
        assert (address.family, address.sockaddr) == (socket.AF_INET, ("0.0.0.0", 9470))


def test_host_name_prefers_ipv4_like_go() -> None:
    address = resolve_listen_address("localhost:9470")
    assert (address.family, address.sockaddr) == (socket.AF_INET, ("127.0.0.1", 9470))


def test_unresolvable_host() -> None:
    # A label over 63 characters fails in the IDNA encoding, before any DNS query.
    host = "x" * 64 + ".example"
    with pytest.raises(ConfigError, match=f"cannot resolve '{host}'"):
        resolve_listen_address(f"{host}:9470")


@pytest.mark.parametrize(
    ("sockaddr", "host"),
    [
        (("127.0.0.1", 9470), "127.0.0.1"),
        (("0.0.0.0", 9470), "127.0.0.1"),
        (("::", 9470, 0, 0), "[::1]"),
        (("::1", 9470, 0, 0), "[::1]"),
        (("fe80::1%eth0", 9470, 0, 2), "[fe80::1%25eth0]"),
    ],
)
def test_url_host(sockaddr: tuple[object, ...], host: str) -> None:
    assert url_host(sockaddr) == host


def test_url_host_of_a_dual_stack_wildcard_is_ipv4_loopback() -> None:
    assert url_host(("::", 9470, 0, 0), dual_stack=True) == "127.0.0.1"
