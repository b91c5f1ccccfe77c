"""Listen addresses as exporter-toolkit writes them: ":9470", "127.0.0.1:0", "[::1]:9470"."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from exporter.errors import ConfigError

_MAX_PORT = 65535


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """Where to bind: a socket family and address; `dual_stack` takes IPv4 on an IPv6 socket."""

    family: socket.AddressFamily
    sockaddr: tuple[Any, ...]
    dual_stack: bool = False


def resolve_listen_address(text: str) -> ListenAddress:
    """Resolve a host:port listen address; an empty host means every interface, as in Go."""
    host, port = split_host_port(text)
    if host == "":
        if socket.has_dualstack_ipv6():
            return ListenAddress(socket.AF_INET6, ("::", port), dual_stack=True)
        return ListenAddress(socket.AF_INET, ("0.0.0.0", port))
    try:
        candidates = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE | socket.AI_NUMERICSERV
        )
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(f"listen address {text!r}: cannot resolve {host!r}: {exc}") from exc
    usable = [c for c in candidates if c[0] in (socket.AF_INET, socket.AF_INET6)]
    if not usable:
        raise ConfigError(f"listen address {text!r}: {host!r} has no IPv4 or IPv6 address")
    # Go's net.Listen binds a host name to its first IPv4 address when it has one.
    family, _, _, _, sockaddr = next((c for c in usable if c[0] == socket.AF_INET), usable[0])
    return ListenAddress(family, sockaddr)


def split_host_port(text: str) -> tuple[str, int]:
    """Split "host:port" (IPv6 hosts in brackets) into the host and a port number."""
    host, colon, port_text = text.rpartition(":")
    if not colon:
        raise ConfigError(f"listen address {text!r}: missing ':port'")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host:
            raise ConfigError(f"listen address {text!r}: empty IPv6 address in brackets")
    elif "[" in host or "]" in host or ":" in host:
        raise ConfigError(f"listen address {text!r}: write IPv6 addresses in brackets: [::1]:9470")
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > _MAX_PORT:
        raise ConfigError(f"listen address {text!r}: port must be a number from 0 to {_MAX_PORT}")
    return host, int(port_text)


def url_host(sockaddr: tuple[Any, ...], *, dual_stack: bool = False) -> str:
    """The host part of a URL that reaches a bound socket; a wildcard shows as loopback."""
    host = str(sockaddr[0])
    # A dual-stack socket takes IPv4 even where IPv6 is switched off on the loopback.
    if host in ("", "0.0.0.0") or (host == "::" and dual_stack):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    if ":" in host:
        return "[" + host.replace("%", "%25") + "]"  # a zone id's '%' is escaped in URLs
    return host
