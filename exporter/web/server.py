"""The exporter's HTTP server: binds, accepts, and runs each connection on its own thread."""

from __future__ import annotations

import contextlib
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
from exporter.web.connection import ConnectionHandler
from exporter.web.messages import Handler
from exporter.web.reload import WebConfigWatcher

_log = structlog.get_logger("kvcap.web")


class WebServer:
    """Serves `routes` (exact paths) on `listen_address` from start() until stop().

    Only GET and HEAD are served, so nothing on the HTTP side can change state. There is one
    accept thread and one daemon thread per connection.

    `web_config_file` is an exporter-toolkit web config (TLS, basic auth); it is re-read
    when it or its TLS files change, and the new settings apply to new connections (TLS)
    and to every later request (basic auth).
    """

    def __init__(
        self,
        listen_address: str,
        routes: Mapping[str, Handler],
        *,
        web_config_file: Path | None = None,
    ) -> None:
        self._listen_address = listen_address
        self._routes = dict(routes)
        self._web_config_file = web_config_file
        self._server: ThreadedServer | None = None
        self._accept_thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve on background threads.

        Raises ConfigError for a bad web config file or listen address, OSError when the
        address cannot be bound (for example, the port is taken).
        """
        if self._server is not None:
            raise RuntimeError("WebServer.start() was already called")
        watcher = WebConfigWatcher(self._web_config_file)
        address = resolve_listen_address(self._listen_address)
        server = ThreadedServer(address, watcher, self._routes)
        thread = threading.Thread(target=server.serve, name="kvcap-web-accept", daemon=True)
        thread.start()
        self._server, self._accept_thread = server, thread
        _log.info(
            "web_server_started",
            url=self.url,
            basic_auth=watcher.state.auth is not None,
            client_auth=(tls.client_auth_type if (tls := watcher.state.config.tls) else None),
        )

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
        self, address: ListenAddress, watcher: WebConfigWatcher, routes: Mapping[str, Handler]
    ) -> None:
        self.address_family = address.family
        self.watcher = watcher
        self.routes = routes
        self.dual_stack = address.dual_stack
        self._lock = threading.Lock()
        self._closing = False
        self._connections: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
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
                except OSError:  # the client gave up already, or no file descriptors are left
                    continue
                # On the accept thread, so at most one reload runs and connections accepted
                # after it use the new TLS context.
                self.watcher.maybe_reload()
                self.process_request(connection, client_address)

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
                self._connections.discard(request)
                self._threads.discard(threading.current_thread())

    def track(self, connection: socket.socket, replaces: socket.socket | None = None) -> bool:
        """Remember a live connection for stop(); False when the server is stopping."""
        with self._lock:
            if replaces is not None:
                self._connections.discard(replaces)
            if self._closing:
                return False
            self._connections.add(connection)
            return True

    def untrack(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)

    def close_connections(self) -> list[threading.Thread]:
        """Shut every live connection down, which wakes its thread; returns those threads."""
        with self._lock:
            self._closing = True
            connections, threads = list(self._connections), list(self._threads)
        for connection in connections:
            # socket.socket's own shutdown: SSLSocket's would also drop its TLS state under
            # the feet of the thread still using it. OSError: the client closed it already.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(connection, socket.SHUT_RDWR)
        return threads
