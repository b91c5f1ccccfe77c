"""Fetch one HTTP document under a total deadline and a size cap; classify every failure."""

from __future__ import annotations

import http.client
import socket
import ssl
import time
import zlib
from typing import Final, Protocol
from urllib.parse import urljoin, urlsplit

from exporter.errors import CollectorError

# A redirect is followed only to the same scheme, host and port (Starlette answers
# /metrics with 307 to /metrics/ in some vLLM releases), and only this many times.
_MAX_REDIRECTS: Final = 3
_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
# What vLLM serves its endpoints as; anything else (an HTML login or error page from a
# proxy, say) is not parsed.
_CONTENT_TYPES: Final = ("text/plain", "application/openmetrics-text", "application/json")
_CHUNK_BYTES: Final = 256 * 1024


class FetchError(CollectorError):
    """A failed fetch; `reason` is the `kvcap_collector_errors_total` reason label."""


class Fetcher(Protocol):
    """The seam between the HTTP collector and the network (tests may swap it)."""

    def __call__(self, url: str, *, timeout_s: float, max_bytes: int) -> bytes | bytearray: ...


def fetch(url: str, *, timeout_s: float, max_bytes: int) -> bytes | bytearray:
    """GET `url`, accepting gzip; the whole fetch (connect, redirects, every byte of the
    body) must end within `timeout_s`, and the decoded body may not exceed `max_bytes`."""
    deadline = time.monotonic() + timeout_s
    origin = _origin(url)
    for _ in range(_MAX_REDIRECTS + 1):
        try:
            outcome = _get_once(url, deadline, max_bytes)
        except TimeoutError:
            raise FetchError("timeout", f"{url}: not answered within {timeout_s}s") from None
        except http.client.IncompleteRead as error:
            raise FetchError(
                "truncated", f"{url}: body ended after {len(error.partial)} bytes"
            ) from None
        except (ConnectionError, http.client.HTTPException, OSError) as error:
            raise FetchError(_network_reason(error), f"{url}: {error}") from None
        if not isinstance(outcome, str):
            return outcome
        target = urljoin(url, outcome)
        if _origin(target) != origin:
            raise FetchError("redirect", f"{url}: redirected to another host or port: {target}")
        url = target
    raise FetchError("redirect", f"{url}: more than {_MAX_REDIRECTS} redirects")


def _get_once(url: str, deadline: float, max_bytes: int) -> bytes | bytearray | str:
    """The body, or the Location of a redirect."""
    parts = urlsplit(url)
    connection = _connection(parts.scheme, parts.hostname or "", parts.port, _left(deadline))
    try:
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.request(
            "GET", path, headers={"Accept-Encoding": "gzip", "User-Agent": "kvcap-exporter"}
        )
        _set_timeout(connection, deadline)
        response = connection.getresponse()
        if response.status in _REDIRECTS:
            return response.headers.get("Location") or ""
        if response.status >= 400:
            # Two reasons only: http.client passes any status up to 999, and a label value
            # per hundred would be a reason no one declared (exporter/counted_reasons.py).
            reason = "http_4xx" if response.status < 500 else "http_5xx"
            raise FetchError(reason, f"HTTP {response.status} from {url}")
        _check_content_type(url, response.headers.get("Content-Type"))
        raw = _read_body(connection, response, deadline, max_bytes, url)
        encoding = (response.headers.get("Content-Encoding") or "").lower()
    finally:
        connection.close()
    if encoding == "gzip":
        return _gunzip(url, raw, max_bytes)
    return raw


def _connection(
    scheme: str, host: str, port: int | None, timeout_s: float
) -> http.client.HTTPConnection:
    if scheme == "https":
        return http.client.HTTPSConnection(
            host, port, timeout=timeout_s, context=ssl.create_default_context()
        )
    if scheme != "http":
        raise FetchError("network", f"unsupported URL scheme {scheme!r}")
    return http.client.HTTPConnection(host, port, timeout=timeout_s)


def _read_body(
    connection: http.client.HTTPConnection,
    response: http.client.HTTPResponse,
    deadline: float,
    max_bytes: int,
    url: str,
) -> bytearray:
    declared = response.headers.get("Content-Length")
    # Grown chunk by chunk: joining a 64-engine body (2.4 MiB) at the end was one call of
    # about 1 ms (the copy into fresh pages) in which no other thread, a scrape's
    # included, could run.
    raw = bytearray()
    while True:
        _set_timeout(connection, deadline)  # a server trickling bytes meets the same deadline
        chunk = response.read1(min(_CHUNK_BYTES, max_bytes + 1 - len(raw)))
        if not chunk:
            break
        raw += chunk
        if len(raw) > max_bytes:
            raise FetchError("body_too_large", f"{url}: body larger than {max_bytes} bytes")
    size = len(raw)
    # A server that hangs up early ends the body quietly.
    if declared is not None and declared.isascii() and declared.isdigit() and size < int(declared):
        raise FetchError("truncated", f"{url}: body ended after {size} of {declared} bytes")
    return raw


def _set_timeout(connection: http.client.HTTPConnection, deadline: float) -> None:
    if connection.sock is not None:
        connection.sock.settimeout(_left(deadline))


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _check_content_type(url: str, content_type: str | None) -> None:
    if content_type is None:  # not said: parsing decides
        return
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type not in _CONTENT_TYPES:
        raise FetchError("content_type", f"{url}: served as {media_type!r}, not a vLLM document")


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default = 443 if parts.scheme == "https" else 80
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def _gunzip(url: str, raw: bytearray, max_bytes: int) -> bytes:
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        body = decompressor.decompress(raw, max_bytes + 1)
    except zlib.error as error:
        raise FetchError("gzip_corrupt", f"{url}: {error}") from None
    if len(body) > max_bytes:
        raise FetchError(
            "body_too_large", f"{url}: decompressed body larger than {max_bytes} bytes"
        )
    if not decompressor.eof:
        raise FetchError("truncated", f"{url}: gzip stream ends early")
    return body


def _network_reason(error: object) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection_refused"
    if isinstance(error, TimeoutError | socket.timeout):
        return "timeout"
    if isinstance(error, socket.gaierror):
        return "dns"
    if isinstance(error, ConnectionResetError | http.client.RemoteDisconnected):
        return "connection_reset"
    return "network"
