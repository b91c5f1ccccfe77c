"""One HTTP/1.1 connection: the TLS handshake, then GET/HEAD requests until it closes."""

from __future__ import annotations

import contextlib
import email.utils
import http
import socket
import socketserver
import ssl
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Final, Protocol, cast

import structlog

from exporter.web.counters import WebCounters
from exporter.web.head import BadHead, HeadReader, HeadTimeout, RequestHead, parse_head
from exporter.web.messages import Handler, Request, Response
from exporter.web.reload import WebConfigWatcher

_log = structlog.get_logger("kvcap.web")

# Longer than a 60 s scrape interval, so Prometheus keeps one connection between scrapes
# instead of paying a TCP (and TLS) handshake each time; idle ones are also the first to be
# closed when the server is at --web.max-requests.
IDLE_TIMEOUT_S: Final = 65.0
# A new connection must start its request this soon, and every head (and the small body a
# client may send) must be complete this long after its first byte: a slowloris client
# that trickles a byte at a time holds a connection for at most this.
FIRST_BYTE_TIMEOUT_S: Final = 10.0
HEAD_DEADLINE_S: Final = 10.0
HANDSHAKE_TIMEOUT_S: Final = 10.0
# A small request body (no route takes one) is read and dropped to keep the connection
# usable; a larger one ends the connection after the answer.
_MAX_DISCARDED_BODY_BYTES: Final = 64 * 1024
_ALLOWED_METHODS: Final = ("GET", "HEAD")
_REASONS: Final = {status.value: status.phrase for status in http.HTTPStatus}
_TEXT: Final = "text/plain; charset=utf-8"

_UNAUTHORIZED: Final = Response(
    401, b"Unauthorized\n", _TEXT, (("WWW-Authenticate", 'Basic realm="kvcap"'),)
)
_AUTH_BUSY: Final = Response(
    503, b"Too many login attempts; retry\n", _TEXT, (("Retry-After", "1"),)
)
_METHOD_NOT_ALLOWED: Final = Response(
    405, b"Method Not Allowed\n", _TEXT, (("Allow", ", ".join(_ALLOWED_METHODS)),)
)
_NOT_FOUND: Final = Response(404, b"404 page not found\n", _TEXT)
_INTERNAL_ERROR: Final = Response(500, b"Internal Server Error\n", _TEXT)
_REQUEST_TIMEOUT: Final = Response(408, b"Request Timeout\n", _TEXT)


def error_response(status: int) -> Response:
    """A plain-text answer with the status' phrase as body."""
    return Response(status, f"{_REASONS.get(status, 'Error')}\n".encode(), _TEXT)


class Connection:
    """A tracked connection: its socket, and whether a request on it is being served."""

    __slots__ = ("phase", "since", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.phase = "waiting"
        self.since = time.monotonic()

    def idle(self) -> None:
        """Waiting for the next request."""
        self.phase, self.since = "waiting", time.monotonic()

    def reading(self) -> None:
        """A request's first bytes came in; its head is being read."""
        self.phase = "reading"

    def busy(self) -> None:
        """The head is in: the request is being served and must not be cut."""
        self.phase = "busy"


class ConnectionServer(Protocol):
    """What a connection's handler uses of the server that accepted it (server.py's)."""

    watcher: WebConfigWatcher
    routes: Mapping[str, Handler]
    counters: WebCounters

    def track(self, sock: socket.socket) -> Connection | None: ...

    def replace_socket(self, connection: Connection, sock: socket.socket) -> bool: ...

    def untrack(self, connection: Connection) -> None: ...


class ConnectionHandler(socketserver.BaseRequestHandler):
    """Serves the requests of one connection, keep-alive, after an optional TLS handshake.

    The handshake runs on the connection's own thread with a timeout, so a slow or refused
    client holds up only itself. Each head is read whole, within its byte budget and
    deadline, before it is parsed; then basic auth is checked before the method and the
    route, as exporter-toolkit wraps the whole mux, so an unauthenticated client learns
    nothing about which paths exist. A head that is not strictly well-formed is answered
    with 400 (or 408, 414, 431, 505) and the connection is closed, so nothing a client sends
    after it can be read as a second request.
    """

    @property
    def owner(self) -> ConnectionServer:
        # socketserver hands the handler its server as a BaseServer.
        return cast(ConnectionServer, self.server)

    def setup(self) -> None:
        self._connection: Connection | None = self.owner.track(self.request)

    def handle(self) -> None:
        connection = self._connection
        if connection is None:
            return
        raw: socket.socket = self.request
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # before the TLS handshake
        context = self.owner.watcher.state.ssl_context
        if context is not None and self._handshake(connection, raw, context) is None:
            return
        reader = HeadReader(self.request, connection.reading)
        wait_s = FIRST_BYTE_TIMEOUT_S
        while self._serve_one(connection, reader, wait_s):
            wait_s = IDLE_TIMEOUT_S

    def finish(self) -> None:
        if self._connection is not None:
            self.owner.untrack(self._connection)
        self.request.close()

    def _handshake(
        self, connection: Connection, raw: socket.socket, context: ssl.SSLContext
    ) -> ssl.SSLSocket | None:
        raw.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            tls = context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError):  # the client is gone already; wrap_socket closed it
            return None
        self.request = tls  # the TLS socket owns the file descriptor now; finish() closes it
        if not self.owner.replace_socket(connection, tls):
            return None
        try:
            tls.do_handshake()
        except (OSError, ValueError) as exc:  # ssl.SSLError and timeouts are OSErrors
            _log.debug("tls_handshake_failed", client=self.client_address[0], error=str(exc))
            return None
        return tls

    def _serve_one(self, connection: Connection, reader: HeadReader, wait_s: float) -> bool:
        """Read, check and answer one request; False when the connection is to close."""
        head = self._next_head(connection, reader, wait_s)
        if head is None:
            return False
        keep_alive = head.keep_alive
        if head.content_length > _MAX_DISCARDED_BODY_BYTES:
            keep_alive = False
        elif head.content_length and not reader.discard_body(head.content_length, HEAD_DEADLINE_S):
            return self._refuse(_REQUEST_TIMEOUT, "body_timeout")
        response = self._respond(head)
        self._send(head, response, keep_alive=keep_alive)
        return keep_alive

    def _next_head(
        self, connection: Connection, reader: HeadReader, wait_s: float
    ) -> RequestHead | None:
        """The next well-formed head; None (after answering a bad one) to close."""
        connection.idle()
        try:
            raw_head = reader.read_head(wait_s, HEAD_DEADLINE_S)
            if raw_head is None:
                if wait_s == FIRST_BYTE_TIMEOUT_S:
                    self.owner.counters.reject("first_byte_timeout")
                return None
            connection.busy()
            return parse_head(raw_head)
        except BadHead as bad:
            self._refuse(error_response(bad.status), bad.reason)
        except HeadTimeout:
            self._refuse(_REQUEST_TIMEOUT, "head_timeout")
        except OSError:  # reset, shut down by stop() or an eviction, or a TLS error
            pass
        return None

    def _refuse(self, response: Response, reason: str) -> bool:
        self.owner.counters.reject(reason)
        with contextlib.suppress(OSError):  # the client is gone already
            configured = self.owner.watcher.state.config.response_headers
            self._write(_head_bytes(response, ("Connection: close",), configured), response.body)
        return False

    def _respond(self, head: RequestHead) -> Response:
        self.owner.watcher.maybe_reload()
        state = self.owner.watcher.state
        path = head.target.partition("?")[0]
        auth = state.auth
        if auth is not None and state.config.auth_required(path):
            verdict = auth.verdict(head.header("authorization"), str(self.client_address[0]))
            if verdict != "ok":
                self.owner.counters.reject("unauthorized" if verdict != "busy" else "auth_busy")
                return _UNAUTHORIZED if verdict != "busy" else _AUTH_BUSY
        if head.method not in _ALLOWED_METHODS:
            return _METHOD_NOT_ALLOWED
        handler = self.owner.routes.get(path)
        if handler is None:
            return _NOT_FOUND
        request = Request(method=head.method, path=path, headers=_Headers(head.headers))
        try:
            response = handler(request)
            _check_headers((("Content-Type", response.content_type), *response.headers))
        except Exception:
            _log.exception("web_handler_failed", method=head.method, path=path)
            return _INTERNAL_ERROR
        return response

    def _send(self, head: RequestHead, response: Response, *, keep_alive: bool) -> None:
        extra: tuple[str, ...] = ()
        if not keep_alive:
            extra = ("Connection: close",)
        elif head.version == "HTTP/1.0":  # 1.0 clients close unless told otherwise
            extra = ("Connection: keep-alive",)
        data = _head_bytes(response, extra, self.owner.watcher.state.config.response_headers)
        with contextlib.suppress(OSError):  # the client is gone already
            self._write(data, response.body if head.method != "HEAD" else b"")

    def _write(self, head: bytes, body: bytes) -> None:
        """Head and body in one write where the socket can gather them (plain TCP: the
        body, a third of a megabyte for a large /metrics, is not copied behind the head)."""
        sock = self.request
        sock.settimeout(HEAD_DEADLINE_S)
        if isinstance(sock, ssl.SSLSocket) or not body:
            sock.sendall(head + body)
            return
        parts = [memoryview(head), memoryview(body)]
        while parts:
            sent = sock.sendmsg(parts)
            while parts and sent >= len(parts[0]):
                sent -= len(parts[0])
                parts.pop(0)
            if parts:
                parts[0] = parts[0][sent:]


def _head_bytes(
    response: Response,
    extra: tuple[str, ...],
    configured: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """The status line and headers; `configured` are the web config's http_server_config
    headers, sent on every response as exporter-toolkit does."""
    lines = [
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, '')}",
        f"Date: {_DATE.now()}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
    ]
    lines.extend(f"{name}: {value}" for name, value in response.headers)
    lines.extend(f"{name}: {value}" for name, value in configured)
    lines.extend(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


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


def overloaded_answer() -> bytes:
    """The 503 sent, without waiting, to a connection over --web.max-requests."""
    response = Response(503, b"Service Unavailable: too many connections\n", _TEXT)
    return _head_bytes(response, ("Connection: close", "Retry-After: 1")) + response.body
