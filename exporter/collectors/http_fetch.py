"""Fetch one HTTP document with a timeout and a size cap; classify every failure."""

from __future__ import annotations

import http.client
import socket
import urllib.error
import urllib.request
import zlib
from typing import Protocol


class FetchError(Exception):
    """A failed fetch; `reason` is the `kvcap_collector_errors_total` reason label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Fetcher(Protocol):
    """The seam between the HTTP collector and the network (tests may swap it)."""

    def __call__(self, url: str, *, timeout_s: float, max_bytes: int) -> bytes: ...


def fetch(url: str, *, timeout_s: float, max_bytes: int) -> bytes:
    """GET `url`, accepting gzip; the decoded body may not exceed `max_bytes`."""
    request = urllib.request.Request(
        url, headers={"Accept-Encoding": "gzip", "User-Agent": "kvcap-exporter"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw: bytes = response.read(max_bytes + 1)
            encoding = (response.headers.get("Content-Encoding") or "").lower()
            declared = response.headers.get("Content-Length")
    except urllib.error.HTTPError as error:
        raise FetchError(f"http_{error.code // 100}xx", f"HTTP {error.code} from {url}") from None
    except urllib.error.URLError as error:
        raise FetchError(_network_reason(error.reason), f"{url}: {error.reason}") from None
    except http.client.IncompleteRead as error:
        raise FetchError(
            "truncated", f"{url}: body ended after {len(error.partial)} bytes"
        ) from None
    except TimeoutError:
        raise FetchError("timeout", f"{url}: no answer within {timeout_s}s") from None
    except (ConnectionError, http.client.HTTPException, OSError) as error:
        raise FetchError(_network_reason(error), f"{url}: {error}") from None
    if len(raw) > max_bytes:
        raise FetchError("body_too_large", f"{url}: body larger than {max_bytes} bytes")
    # read(n) returns a short body quietly when the server hangs up early.
    if (
        declared is not None
        and declared.isascii()
        and declared.isdigit()
        and len(raw) < int(declared)
    ):
        raise FetchError("truncated", f"{url}: body ended after {len(raw)} of {declared} bytes")
    if encoding == "gzip":
        return _gunzip(url, raw, max_bytes)
    return raw


def _gunzip(url: str, raw: bytes, max_bytes: int) -> bytes:
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
