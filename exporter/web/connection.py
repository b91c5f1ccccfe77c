"""One HTTP/1.1 connection: the TLS handshake, then GET/HEAD requests until it closes."""

from __future__ import annotations

import email.utils
import http
import socket
import ssl
import time
from collections.abc import Iterable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs

import structlog

from exporter.web.messages import Request, Response

if TYPE_CHECKING:
    from exporter.web.server import ThreadedServer

_log = structlog.get_logger("kvcap.web")

# Longer than the usual scrape intervals (15-60 s), so Prometheus keeps one connection
# between scrapes instead of paying a TCP (and TLS) handshake each time.
IDLE_TIMEOUT_S: Final = 120.0
HANDSHAKE_TIMEOUT_S: Final = 10.0
# A small request body (no route takes one) is read and dropped to keep the connection
# usable; a larger one ends the connection after the answer.
_MAX_DISCARDED_BODY_BYTES: Final = 64 * 1024
_MAX_REQUEST_LINE_BYTES: Final = 65536
_ALLOWED_METHODS: Final = ("GET", "HEAD")
_REASONS: Final = {status.value: status.phrase for status in http.HTTPStatus}
_TEXT: Final = "text/plain; charset=utf-8"

_UNAUTHORIZED: Final = Response(
    401, b"Unauthorized\n", _TEXT, (("WWW-Authenticate", 'Basic realm="kvcap"'),)
)
_METHOD_NOT_ALLOWED: Final = Response(
    405, b"Method Not Allowed\n", _TEXT, (("Allow", ", ".join(_ALLOWED_METHODS)),)
)
_NOT_FOUND: Final = Response(404, b"404 page not found\n", _TEXT)
_INTERNAL_ERROR: Final = Response(500, b"Internal Server Error\n", _TEXT)


class ConnectionHandler(BaseHTTPRequestHandler):
    """Serves the requests of one connection, keep-alive, after an optional TLS handshake.

    The handshake runs on the connection's own thread with a timeout, so a slow or refused
    client holds up only itself. Basic auth is checked before the method and the route, as
    exporter-toolkit wraps the whole mux, so an unauthenticated client learns nothing about
    which paths exist.
    """

    server: ThreadedServer
    protocol_version = "HTTP/1.1"
    # Not http.server's HTTP/0.9, whose error answers have no status line; no scraper
    # speaks 0.9, and an unreadable request line should still get a readable "400".
    default_request_version = "HTTP/1.0"
    timeout = IDLE_TIMEOUT_S
    disable_nagle_algorithm = True  # the response is complete when written: send it now
    _usable = False

    def setup(self) -> None:
        raw: socket.socket = self.request
        if not self.server.track(raw):
            return
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # before the TLS handshake
        context = self.server.watcher.state.ssl_context
        if context is not None:
            tls = self._handshake(raw, context)
            if tls is None:
                return
            self.request = tls
        self._usable = True
        super().setup()

    def _handshake(self, raw: socket.socket, context: ssl.SSLContext) -> ssl.SSLSocket | None:
        raw.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            tls = context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError):  # the client is gone already; wrap_socket closed it
            self.server.untrack(raw)
            return None
        if not self.server.track(tls, replaces=raw):
            tls.close()
            return None
        try:
            tls.do_handshake()
        except (OSError, ValueError) as exc:  # ssl.SSLError and timeouts are OSErrors
            _log.debug("tls_handshake_failed", client=self.client_address[0], error=str(exc))
            self.server.untrack(tls)
            tls.close()
            return None
        return tls

    def handle(self) -> None:
        if self._usable:
            super().handle()

    def finish(self) -> None:
        if not self._usable:
            return
        try:
            super().finish()
        finally:
            self.server.untrack(self.request)
            self.request.close()

    def handle_one_request(self) -> None:
        # http.server's version, without its do_<METHOD> dispatch (which answers 501) and
        # with the response head and body written in one sendall.
        try:
            self.raw_requestline = self.rfile.readline(_MAX_REQUEST_LINE_BYTES + 1)
        except OSError:  # idle timeout, reset, or a TLS error from the client
            self.close_connection = True
            return
        if not self.raw_requestline:
            self.close_connection = True
            return
        if len(self.raw_requestline) > _MAX_REQUEST_LINE_BYTES:
            self.requestline = self.request_version = self.command = ""
            self.send_error(http.HTTPStatus.REQUEST_URI_TOO_LONG)
            return
        if not self.parse_request():  # it has answered 400/414/431/505 already
            return
        self._discard_body()
        response = self._respond()
        self._send(response, with_body=self.command != "HEAD")

    def _respond(self) -> Response:
        auth = self.server.watcher.state.auth
        if auth is not None and not auth.check(self.headers.get("Authorization")):
            return _UNAUTHORIZED
        if self.command not in _ALLOWED_METHODS:
            return _METHOD_NOT_ALLOWED
        path, _, query = self.path.partition("?")
        handler = self.server.routes.get(path)
        if handler is None:
            return _NOT_FOUND
        request = Request(
            method=self.command,
            path=path,
            query=parse_qs(query, keep_blank_values=True) if query else {},
            headers=_Headers(self.headers.items()),
        )
        try:
            response = handler(request)
            _check_headers((("Content-Type", response.content_type), *response.headers))
        except Exception:
            _log.exception("web_handler_failed", method=self.command, path=path)
            return _INTERNAL_ERROR
        return response

    def _send(self, response: Response, *, with_body: bool) -> None:
        lines = [
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, '')}",
            f"Date: {_DATE.now()}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
        ]
        lines.extend(f"{name}: {value}" for name, value in response.headers)
        if self.close_connection:
            lines.append("Connection: close")
        elif self.request_version == "HTTP/1.0":  # 1.0 clients close unless told otherwise
            lines.append("Connection: keep-alive")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
        self.connection.sendall(head + response.body if with_body else head)

    def _discard_body(self) -> None:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            return
        length = self.headers.get("Content-Length")
        if length is None:
            return
        try:
            size = int(length)
        except ValueError:
            size = -1
        if 0 <= size <= _MAX_DISCARDED_BODY_BYTES:
            self.rfile.read(size)
        else:
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        # http.server writes one stderr line per request; kvcap logs state changes only.
        pass


class _Headers(Mapping[str, str]):
    """Request headers under lower-case names, looked up case-insensitively."""

    __slots__ = ("_by_name",)

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self._by_name = {name.lower(): value for name, value in pairs}

    def __getitem__(self, name: str) -> str:
        return self._by_name[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def __repr__(self) -> str:
        return f"_Headers({self._by_name!r})"


class _DateHeader:
    """The HTTP Date value, formatted once per second rather than once per response."""

    __slots__ = ("_cached",)

    def __init__(self) -> None:
        self._cached = (0, "")

    def now(self) -> str:
        second = int(time.time())
        cached_second, text = self._cached
        if cached_second != second:
            text = email.utils.formatdate(second, usegmt=True)
            self._cached = (second, text)
        return text


_DATE: Final = _DateHeader()


def _check_headers(headers: Iterable[tuple[str, str]]) -> None:
    # A line break in a handler's header would let it forge headers or a second response;
    # non-ASCII text has no agreed encoding in HTTP/1.1 headers.
    for name, value in headers:
        text = name + value
        if "\n" in text or "\r" in text or not text.isascii():
            raise ValueError(f"response header {name!r} has a line break or non-ASCII text")
