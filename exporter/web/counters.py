"""Counters of what the HTTP side refused: rejected requests and refused web config reloads."""

from __future__ import annotations

import threading

# Every reason a request or connection is refused, so each series exists from the start.
REJECT_REASONS = (
    "head_too_large",
    "head_timeout",
    "malformed",
    "bad_version",
    "missing_host",
    "bad_content_length",
    "transfer_encoding",
    "body_timeout",
    "first_byte_timeout",
    "over_capacity",
    "evicted",
    "unauthorized",
    "auth_busy",
    "accept_failed",
)
RELOAD_ERROR_REASONS = ("invalid", "downgrade")


class WebCounters:
    """Thread-safe counts, read per scrape (their families: exposition/per_scrape.py).

    `version` changes whenever a count does, so a scrape can reuse the text of the last
    one while nothing was refused and no connection came or went.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rejected = dict.fromkeys(REJECT_REASONS, 0)
        self._reload_errors = dict.fromkeys(RELOAD_ERROR_REASONS, 0)
        self._connections = 0
        self.version = 0

    def reject(self, reason: str) -> None:
        with self._lock:
            self._rejected[reason] = self._rejected.get(reason, 0) + 1
            self.version += 1

    def reload_failed(self, reason: str) -> None:
        with self._lock:
            self._reload_errors[reason] = self._reload_errors.get(reason, 0) + 1
            self.version += 1

    def set_connections(self, count: int) -> None:
        with self._lock:
            if count != self._connections:
                self._connections = count
                self.version += 1

    def rejected(self) -> dict[str, int]:
        with self._lock:
            return dict(self._rejected)

    def reload_errors(self) -> dict[str, int]:
        with self._lock:
            return dict(self._reload_errors)

    def connections(self) -> int:
        return self._connections
