"""Where each engine publishes its KV events: flags, /kv_event_sources, the handshake.

vLLM's publisher binds when its endpoint has a wildcard host (`tcp://*:5557`), an IPv6
`::`, or is ipc:// or inproc://; any other tcp endpoint makes it connect instead, and a
connecting subscriber then receives nothing. So kvcap always connects, and a wildcard host
in what vLLM reports becomes the host kvcap reaches the engine at.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from exporter.errors import ConfigError
from exporter.state import KvEventsEndpoint

_WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]", "")
LOOPBACK = "127.0.0.1"


def connectable(endpoint: str, host: str = LOOPBACK) -> str:
    """The address a subscriber connects to for a publisher endpoint as vLLM spells it."""
    if not endpoint.startswith("tcp://"):
        return endpoint  # ipc:// paths name the same file on both sides (a shared volume)
    address = endpoint[len("tcp://") :]
    bound_host, _, port = address.rpartition(":")
    if bound_host in _WILDCARD_HOSTS:
        bound_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"tcp://{bound_host}:{port}"


def parse_endpoint_flag(value: str) -> KvEventsEndpoint:
    """`[ENGINE=]ENDPOINT[+REPLAY_ENDPOINT]`, e.g. `0=tcp://127.0.0.1:5557+tcp://127.0.0.1:5558`."""
    engine: str | None = None
    text = value.strip()
    head, sep, rest = text.partition("=")
    if sep and "://" not in head:
        engine, text = head.strip(), rest.strip()
        if not (engine.isascii() and engine.isdigit()):
            raise ConfigError(f"--kv-events.endpoint {value!r}: the engine must be a DP rank")
    endpoint, _, replay = text.partition("+")
    for part in (endpoint, replay):
        if part and not part.startswith(("tcp://", "ipc://", "inproc://")):
            raise ConfigError(f"--kv-events.endpoint {value!r}: {part!r} is not a ZMQ endpoint")
    if not endpoint:
        raise ConfigError(f"--kv-events.endpoint {value!r} names no endpoint")
    return KvEventsEndpoint(connectable(endpoint), connectable(replay) if replay else None, engine)


def endpoints_from_sources(
    kv_event_sources: Mapping[str, Any] | None, server_url: str
) -> dict[str, KvEventsEndpoint]:
    """vLLM's /kv_event_sources (`{"<dp rank>": KVEventsConfig}`, endpoints already offset
    per rank) as endpoints to connect to, wildcards replaced by the API server's host."""
    host = urlsplit(server_url).hostname or LOOPBACK
    found: dict[str, KvEventsEndpoint] = {}
    for rank, config in (kv_event_sources or {}).items():
        if not (isinstance(rank, str) and rank.isascii() and rank.isdigit()):
            continue
        endpoint = _publisher_endpoint(config)
        if endpoint is None:
            continue
        replay = config.get("replay_endpoint")
        found[rank] = KvEventsEndpoint(
            connectable(endpoint, host),
            connectable(replay, host) if isinstance(replay, str) and replay else None,
            rank,
        )
    return found


def _publisher_endpoint(config: object) -> str | None:
    """The PUB endpoint of one KVEventsConfig, when it publishes over ZMQ at all."""
    if not isinstance(config, Mapping) or config.get("publisher") != "zmq":
        return None
    if config.get("enable_kv_cache_events") is False:
        return None
    endpoint = config.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint.startswith(("tcp://", "ipc://")):
        return None
    return endpoint
