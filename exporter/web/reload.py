"""Keeps the served web config current: re-reads the config file and its TLS files on change."""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog

from exporter.errors import ConfigError
from exporter.web.auth import BasicAuth
from exporter.web.config import WebConfig, build_ssl_context, read_web_config_file

_log = structlog.get_logger("kvcap.web")

CHECK_INTERVAL_S: Final = 1.0

# (mtime, size, inode) of each watched file, None where it cannot be stat'ed. The inode
# catches an atomic rename, which is how cert-manager and Kubernetes secret volumes swap files.
_Signature = tuple[tuple[int, int, int] | None, ...]


@dataclass(frozen=True, slots=True)
class ServingState:
    """What every connection is served with; replaced whole on a reload, never mutated."""

    config: WebConfig
    ssl_context: ssl.SSLContext | None
    auth: BasicAuth | None


def build_serving_state(config: WebConfig) -> ServingState:
    """The SSL context and authenticator for `config`; ConfigError when a TLS file is bad."""
    return ServingState(
        config=config,
        ssl_context=None if config.tls is None else build_ssl_context(config.tls),
        auth=BasicAuth(config.basic_auth_users) if config.basic_auth_users else None,
    )


class WebConfigWatcher:
    """Holds the current ServingState, reloading it when the web config or its TLS files change.

    `maybe_reload` is called by the accept loop for each new connection and looks at the
    files at most once per `check_interval_s`. A file that turns invalid keeps the last good
    state and is logged once; so is a change that would switch between HTTP and HTTPS, which
    would silently drop TLS or break every scraper, and needs a restart instead.
    """

    def __init__(
        self,
        path: Path | None,
        *,
        check_interval_s: float = CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = path
        self._check_interval_s = check_interval_s
        self._clock = clock
        self._last_check = clock()
        self._watched: tuple[Path, ...] = ()
        self._signature: _Signature = ()
        if path is None:
            self._state = ServingState(WebConfig(), None, None)
            return
        signature = _signature((path,))
        config = read_web_config_file(path)
        self._watched = _files_of(path, config)
        self._signature = signature + _signature(self._watched[1:])
        self._state = build_serving_state(config)

    @property
    def state(self) -> ServingState:
        """The state new connections and requests are served with."""
        return self._state

    def maybe_reload(self) -> None:
        """Reload if a watched file changed since the last look; never raises."""
        if self._path is None:
            return
        now = self._clock()
        if now - self._last_check < self._check_interval_s:
            return
        self._last_check = now
        try:
            self._reload_if_changed(self._path)
        except Exception:  # the accept loop must survive anything a reload can throw
            _log.exception("web_config_reload_crashed", file=str(self._path))

    def _reload_if_changed(self, path: Path) -> None:
        # Files are stat'ed before they are read, so a write racing with the read is seen
        # as a change on the next look instead of being lost.
        signature = _signature(self._watched)
        if signature == self._signature:
            return
        watched: tuple[Path, ...] = (path,)
        signature = signature[:1]
        try:
            config = read_web_config_file(path)
            watched = _files_of(path, config)
            signature += _signature(watched[1:])
            if (config.tls is None) != (self._state.config.tls is None):
                raise ConfigError(
                    "web config tls_server_config: cannot be added or removed while running; "
                    "restart kvcap to switch between HTTP and HTTPS"
                )
            state = build_serving_state(config)
        except ConfigError as exc:
            # The new file's TLS paths are watched from now on, so fixing them triggers
            # the next try; until then nothing changes and nothing more is logged.
            self._watched, self._signature = watched, signature
            _log.error("web_config_reload_failed", file=str(path), error=str(exc))
            return
        self._watched, self._signature, self._state = watched, signature, state
        _log.info(
            "web_config_reloaded",
            file=str(path),
            tls=config.tls is not None,
            basic_auth_users=len(config.basic_auth_users),
        )


def _files_of(path: Path, config: WebConfig) -> tuple[Path, ...]:
    return (path,) if config.tls is None else (path, *config.tls.files)


def _signature(files: tuple[Path, ...]) -> _Signature:
    stats: list[tuple[int, int, int] | None] = []
    for file in files:
        try:
            stat = os.stat(file)
        except OSError:
            stats.append(None)
        else:
            stats.append((stat.st_mtime_ns, stat.st_size, stat.st_ino))
    return tuple(stats)
