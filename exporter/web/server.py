"""The exporter's HTTP server: binds, accepts, and runs each connection on its own thread."""

from __future__ import annotations

import contextlib
import errno
import select
import selectors
import socket
import socketserver
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from exporter.web.address import ListenAddress, resolve_listen_address, url_host
from exporter.web.connection import Connection, ConnectionHandler, overloaded_answer
from exporter.web.counters import WebCounters
from exporter.web.messages import Handler
from exporter.web.reload import WebConfigWatcher

_log = structlog.get_logger("kvcap.web")

DEFAULT_MAX_CONNECTIONS = 40  # node_exporter's --web.max-requests
# After a failed accept() (no file descriptors left, say), wait this long before the next
# one, doubling up to the maximum, as Go's net/http does; reset by the next success.
_ACCEPT_BACKOFF_FIRST_S = 0.005
_ACCEPT_BACKOFF_MAX_S = 1.0


class WebServer:
    """Serves `routes` (exact paths) on `listen_address` from start() until stop().

    Only GET and HEAD are served, so nothing on the HTTP side can change state. There is one
    accept thread and one daemon thread per connection, at most `max_connections` of them
    (0: no limit). At the limit, a new connection closes the open one that has waited
    longest without a request being served (an idle keep-alive connection, a client
    trickling its head); when every one is serving a request, the new one gets 503.

    `web_config_file` is an exporter-toolkit web config (TLS, basic auth); it is re-read
    when it or its TLS files change (looked at, at most once a second, on each new
    connection and each request) and on reload(); the new settings apply to new
    connections (TLS) and to every later request (basic auth). `counters` counts what is
    refused, for /metrics.
    """

    def __init__(
        self,
        listen_address: str,
        routes: Mapping[str, Handler],
        *,
        web_config_file: Path | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        allow_downgrade: bool = False,
        counters: WebCounters | None = None,
    ) -> None:
        self._listen_address = listen_address
        self._routes = dict(routes)
        self._web_config_file = web_config_file
        self._max_connections = max_connections
        self._allow_downgrade = allow_downgrade
        self.counters = counters or WebCounters()
        self._server: ThreadedServer | None = None
        self._accept_thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve on background threads.

        Raises ConfigError for a bad web config file or listen address, OSError when the
        address cannot be bound (for example, the port is taken).
        """
        if self._server is not None:
            raise RuntimeError("WebServer.start() was already called")
        watcher = WebConfigWatcher(
            self._web_config_file, allow_downgrade=self._allow_downgrade, counters=self.counters
        )
        address = resolve_listen_address(self._listen_address)
        server = ThreadedServer(
            address, watcher, self._routes, self.counters, self._max_connections
        )
        thread = threading.Thread(target=server.serve, name="kvcap-web-accept", daemon=True)
        thread.start()
        self._server, self._accept_thread = server, thread
        _log.info(
            "web_server_started",
            url=self.url,
            basic_auth=watcher.state.auth is not None,
            client_auth=(tls.client_auth_type if (tls := watcher.state.config.tls) else None),
        )

    def reload_web_config(self) -> None:
        """Re-read the web config file now (SIGHUP); a bad one keeps the current settings."""
        if self._server is not None:
            self._server.watcher.reload()

    @property
    def url(self) -> str:
        """The base URL of the bound socket, such as "https://127.0.0.1:9470"."""
        if self._server is None:
            raise RuntimeError("WebServer.url is known only after start()")
        scheme = "https" if self._server.watcher.state.ssl_context is not None else "http"
        sockaddr = self._server.server_address
        host = url_host(sockaddr, dual_stack=self._server.dual_stack)
        return f"{scheme}://{host}:{sockaddr[1]}"

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop accepting, cut open connections and wait for their threads, up to `timeout_s`."""
        server, accept_thread = self._server, self._accept_thread
        if server is None or accept_thread is None:
            return
        deadline = time.monotonic() + timeout_s
        server.stop_accepting()
        accept_thread.join(max(0.0, deadline - time.monotonic()))
        server.server_close()
        for thread in server.close_connections():
            thread.join(max(0.0, deadline - time.monotonic()))
        self._server = self._accept_thread = None
        _log.info("web_server_stopped", listen_address=self._listen_address)


class ThreadedServer(socketserver.TCPServer):
    """Accepts connections and hands each to its own daemon thread; tracks them for stop()."""

    allow_reuse_address = True  # a restart must not wait for the old socket's TIME_WAIT
    request_queue_size = 128

    def __init__(
        self,
        address: ListenAddress,
        watcher: WebConfigWatcher,
        routes: Mapping[str, Handler],
        counters: WebCounters,
        max_connections: int,
    ) -> None:
        self.address_family = address.family
        self.watcher = watcher
        self.routes = routes
        self.counters = counters
        self.dual_stack = address.dual_stack
        self._max_connections = max_connections
        self._lock = threading.Lock()
        self._closing = False
        self._connections: set[Connection] = set()
        self._threads: set[threading.Thread] = set()
        self._accept_backoff_s = 0.0
        # A socket pair wakes the accept loop on stop(), so it needs no polling interval.
        self._wake_reader, self._wake_writer = socket.socketpair()
        super().__init__(address.sockaddr, ConnectionHandler, bind_and_activate=False)
        try:
            self.server_bind()
            self.server_activate()
        except BaseException:
            self.server_close()
            raise

    def server_bind(self) -> None:
        if self.dual_stack:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def server_close(self) -> None:
        super().server_close()
        self._wake_reader.close()
        self._wake_writer.close()

    def serve(self) -> None:
        """The accept loop, until stop_accepting()."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            selector.register(self._wake_reader, selectors.EVENT_READ)
            while not self._closing:
                ready = {key.fileobj for key, _ in selector.select()}
                if self._wake_reader in ready or self._closing:
                    return
                try:
                    connection, client_address = self.socket.accept()
                except OSError as exc:
                    if not self._accept_failed(exc):
                        return
                    continue
                self._accept_succeeded()
                # At most one reload at a time; connections accepted after it use the new
                # TLS context.
                self.watcher.maybe_reload()
                if self._make_room():
                    self.process_request(connection, client_address)
                else:
                    self._turn_away(connection)

    def _accept_failed(self, exc: OSError) -> bool:
        """Back off before the next accept(); logged once per run of failures. False: stop."""
        if exc.errno == errno.ECONNABORTED:  # the client gave up already: nothing to fix
            return True
        if self._accept_backoff_s == 0.0:
            _log.error("web_accept_failing", error=str(exc), errno=exc.errno)
            self._accept_backoff_s = _ACCEPT_BACKOFF_FIRST_S
        else:
            self._accept_backoff_s = min(2 * self._accept_backoff_s, _ACCEPT_BACKOFF_MAX_S)
        self.counters.reject("accept_failed")
        woken, _, _ = select.select([self._wake_reader], [], [], self._accept_backoff_s)
        return not woken

    def _accept_succeeded(self) -> None:
        if self._accept_backoff_s:
            self._accept_backoff_s = 0.0
            _log.info("web_accept_recovered")

    def _make_room(self) -> bool:
        """True when one more connection fits, closing the longest-waiting one if need be."""
        if self._max_connections <= 0:
            return True
        with self._lock:
            if len(self._connections) < self._max_connections:
                return True
            waiting = [c for c in self._connections if c.phase != "busy"]
            if not waiting:
                return False
            oldest = min(waiting, key=lambda c: c.since)
            self._connections.discard(oldest)
            self.counters.set_connections(len(self._connections))
        self.counters.reject("evicted")
        with contextlib.suppress(OSError):  # gone already
            socket.socket.shutdown(oldest.sock, socket.SHUT_RDWR)
        return True

    def _turn_away(self, connection: socket.socket) -> None:
        self.counters.reject("over_capacity")
        try:
            if self.watcher.state.ssl_context is None:  # an HTTPS client cannot read plain text
                connection.setblocking(False)
                connection.send(overloaded_answer())
        except OSError:  # the answer did not fit the socket buffer, or the client left
            pass
        finally:
            connection.close()

    def stop_accepting(self) -> None:
        with self._lock:
            self._closing = True
        with contextlib.suppress(OSError):  # already closed by an earlier stop()
            self._wake_writer.send(b"\0")

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._serve_connection,
            args=(request, client_address),
            name="kvcap-web-connection",
            daemon=True,
        )
        with self._lock:
            self._threads.add(thread)
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had: drop this client, keep accepting
            _log.error("web_connection_dropped", client=str(client_address), error=str(exc))
            request.close()
            with self._lock:
                self._threads.discard(thread)

    def _serve_connection(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception as exc:  # a broken connection must end its thread quietly
            _log.debug("web_connection_failed", client=str(client_address), error=repr(exc))
        finally:
            request.close()  # a no-op once the TLS socket took over its file descriptor
            with self._lock:
                self._threads.discard(threading.current_thread())

    def track(self, sock: socket.socket) -> Connection | None:
        """Remember a live connection for stop() and the cap; None when the server is stopping."""
        with self._lock:
            if self._closing:
                return None
            connection = Connection(sock)
            self._connections.add(connection)
            self.counters.set_connections(len(self._connections))
            return connection

    def replace_socket(self, connection: Connection, sock: socket.socket) -> bool:
        """The TLS socket takes over from the plain one; False when stopping or evicted."""
        with self._lock:
            connection.sock = sock
            return not self._closing and connection in self._connections

    def untrack(self, connection: Connection) -> None:
        with self._lock:
            self._connections.discard(connection)
            self.counters.set_connections(len(self._connections))

    def close_connections(self) -> list[threading.Thread]:
        """Shut every live connection down, which wakes its thread; returns those threads."""
        with self._lock:
            self._closing = True
            connections, threads = list(self._connections), list(self._threads)
        for connection in connections:
            # socket.socket's own shutdown: SSLSocket's would also drop its TLS state under
            # the feet of the thread still using it. OSError: the client closed it already.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(connection.sock, socket.SHUT_RDWR)
        return threads
