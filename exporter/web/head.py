"""HTTP/1.1 request heads: read under a byte budget and a deadline, then parsed strictly.

Parsing is a pure function of the head's bytes (`parse_head`); reading (`HeadReader`) is the
thin socket part. Nothing is parsed, and no credential is looked at, before the whole head
is in and within its budget, so an oversized or trickled head costs at most the budget.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

MAX_HEAD_BYTES: Final = 64 * 1024
MAX_HEADER_LINES: Final = 100
_END: Final = b"\r\n\r\n"
_RECV_BYTES: Final = 16 * 1024
# RFC 9110 token characters, for methods and header names.
_TOKEN: Final = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_REQUEST_LINE: Final = re.compile(rb"(" + _TOKEN + rb") (/[!-~]*) (HTTP/[0-9]+\.[0-9]+)")
_HEADER_LINE: Final = re.compile(rb"(" + _TOKEN + rb"):[ \t]*([\t\x20-\x7e\x80-\xff]*?)[ \t]*")
_SUPPORTED_VERSIONS: Final = ("HTTP/1.0", "HTTP/1.1")
_ANY_ONE_DIGIT_VERSION: Final = re.compile(rb"HTTP/[0-9]\.[0-9]")
_CONTENT_LENGTH: Final = re.compile(rb"[0-9]{1,15}")


class BadHead(Exception):
    """A head refused before anything was served: the HTTP status to answer and a short reason.

    `reason` is the `reason` label of kvcap_web_requests_rejected_total.
    """

    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RequestHead:
    """A well-formed request head; header names are lower-case, values as sent (latin-1)."""

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]
    content_length: int
    keep_alive: bool

    def header(self, name: str) -> str | None:
        """The value of the header `name` (lower-case), None when absent."""
        for header_name, value in self.headers:
            if header_name == name:
                return value
        return None


def parse_head(head: bytes) -> RequestHead:
    """Parse a request head, request line to the blank line; BadHead for anything not strict.

    Refused with 400: anything but `METHOD SP /target SP HTTP/x.y` CRLF, header lines that
    are not `name: value` (a space before the colon, NUL or other control bytes, folded
    lines), more than one or a non-decimal `Content-Length`, any `Transfer-Encoding` (no
    route takes a body, and chunked bodies are where request smuggling lives), an HTTP/1.1
    request without exactly one `Host`. 505 for HTTP versions other than 1.0 and 1.1.
    """
    if len(head) > MAX_HEAD_BYTES + len(_END):
        raise BadHead(431, "head_too_large", "request head over the byte budget")
    if not head.endswith(_END):
        raise BadHead(400, "malformed", "request head does not end with CRLF CRLF")
    lines = head[: -len(_END)].split(b"\r\n")
    if len(lines) - 1 > MAX_HEADER_LINES:
        raise BadHead(431, "head_too_large", f"more than {MAX_HEADER_LINES} header lines")
    method, target, version = _request_line(lines[0])
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        match = _HEADER_LINE.fullmatch(line)
        if match is None:
            raise BadHead(400, "malformed", "a header line is not 'name: value'")
        headers.append((match[1].decode("ascii").lower(), match[2].decode("latin-1")))
    return RequestHead(
        method=method,
        target=target,
        version=version,
        headers=tuple(headers),
        content_length=_content_length(headers),
        keep_alive=_keep_alive(version, headers),
    )


def _request_line(line: bytes) -> tuple[str, str, str]:
    match = _REQUEST_LINE.fullmatch(line)
    if match is None:
        raise BadHead(400, "malformed", "the request line is not 'METHOD /target HTTP/x.y'")
    version = match[3].decode("ascii")
    if version not in _SUPPORTED_VERSIONS:
        if _ANY_ONE_DIGIT_VERSION.fullmatch(match[3]):
            raise BadHead(505, "bad_version", f"HTTP version {version} is not served")
        raise BadHead(400, "bad_version", "the HTTP version is not HTTP/<digit>.<digit>")
    return match[1].decode("ascii"), match[2].decode("ascii"), version


def _content_length(headers: list[tuple[str, str]]) -> int:
    if any(name == "transfer-encoding" for name, _ in headers):
        raise BadHead(400, "transfer_encoding", "Transfer-Encoding is not accepted")
    hosts = [value for name, value in headers if name == "host"]
    if len(hosts) > 1:
        raise BadHead(400, "missing_host", "more than one Host header")
    lengths = [value for name, value in headers if name == "content-length"]
    if len(lengths) > 1:
        raise BadHead(400, "bad_content_length", "more than one Content-Length header")
    if not lengths:
        return 0
    if not _CONTENT_LENGTH.fullmatch(lengths[0].encode("latin-1")):
        raise BadHead(400, "bad_content_length", "Content-Length is not a decimal number")
    return int(lengths[0])


def _keep_alive(version: str, headers: list[tuple[str, str]]) -> bool:
    if version == "HTTP/1.1" and not any(name == "host" for name, _ in headers):
        raise BadHead(400, "missing_host", "an HTTP/1.1 request without Host")
    tokens = {
        token.strip().lower()
        for name, value in headers
        if name == "connection"
        for token in value.split(",")
    }
    if version == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens


class HeadTimeout(Exception):
    """The head was started but not finished before its deadline."""


class HeadReader:
    """Reads request heads and bodies off one connection, keeping what a client pipelined.

    `on_first_byte` is called when a request's first bytes arrive, so the server can tell
    connections that sit idle between requests from those in the middle of one.
    """

    def __init__(self, sock: socket.socket, on_first_byte: Callable[[], None]) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self._on_first_byte = on_first_byte

    def read_head(self, wait_s: float, head_deadline_s: float) -> bytes | None:
        """The next head, up to and including its blank line.

        None when the peer closes or sends nothing for `wait_s`; HeadTimeout when the head
        is not complete `head_deadline_s` after its first byte; BadHead (431) when it is
        over MAX_HEAD_BYTES. OSError when the connection breaks.
        """
        try:
            if not self._buffer and not self._receive(wait_s):
                return None
            self._on_first_byte()
            return self._rest_of_head(head_deadline_s)
        except _Closed:
            return None

    def _rest_of_head(self, head_deadline_s: float) -> bytes:
        deadline = time.monotonic() + head_deadline_s
        searched = 0
        while True:
            end = self._buffer.find(_END, max(0, searched - len(_END) + 1))
            if end >= 0:
                head = bytes(self._buffer[: end + len(_END)])
                del self._buffer[: end + len(_END)]
                return head
            searched = len(self._buffer)
            if searched > MAX_HEAD_BYTES:
                status = 431 if b"\r\n" in self._buffer else 414
                raise BadHead(status, "head_too_large", "request head over the byte budget")
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._receive(remaining):
                raise HeadTimeout

    def discard_body(self, size: int, deadline_s: float) -> bool:
        """Read and drop `size` body bytes; False when they do not all come within deadline_s."""
        deadline = time.monotonic() + deadline_s
        while len(self._buffer) < size:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0 or not self._receive(remaining, size - len(self._buffer)):
                    return False
            except _Closed:
                return False
        del self._buffer[:size]
        return True

    def _receive(self, timeout_s: float, most: int = _RECV_BYTES) -> bool:
        # Never more than the budget allows: the buffer holds at most one head's worth.
        most = max(1, min(most, _RECV_BYTES, MAX_HEAD_BYTES + len(_END) - len(self._buffer)))
        self._sock.settimeout(timeout_s)
        try:
            chunk = self._sock.recv(most)
        except TimeoutError:
            return False
        if not chunk:
            raise _Closed
        self._buffer += chunk
        return True


class _Closed(Exception):
    """The peer closed its side."""
