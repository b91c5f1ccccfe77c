"""A stand-in HTTP server served from a thread, that stops at once when asked."""

from __future__ import annotations

import selectors
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ThreadedHttpServer(ThreadingHTTPServer):
    """`ThreadingHTTPServer` with its own thread and a stop that wakes it.

    `socketserver`'s `shutdown()` waits for `serve_forever` to look at its flag, which it does
    every `poll_interval` (0.5 s): half a second per stop, for nothing. Here a byte on a socket
    pair wakes the serving loop, so a stop takes as long as the requests in hand.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self, name: str = "stand-in-http") -> str:
        """Serve from a daemon thread; returns the base URL."""
        self._thread = threading.Thread(target=self._serve, daemon=True, name=name)
        self._thread.start()
        return self.url

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            selector.register(self._wake_reader, selectors.EVENT_READ)
            while True:
                ready = {key.fileobj for key, _ in selector.select()}
                if self._wake_reader in ready:
                    return
                self.handle_request()  # the listening socket is ready: it does not wait

    def stop(self) -> None:
        """Stop serving and close the listening socket; requests in hand finish on their own."""
        if self._thread is not None:
            self._wake_writer.send(b"\0")
            self._thread.join()
            self._thread = None
        self.server_close()

    def server_close(self) -> None:
        super().server_close()
        self._wake_reader.close()
        self._wake_writer.close()
