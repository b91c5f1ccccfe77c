"""Keeps the served web config current: re-reads the config file and its TLS files on change."""

from __future__ import annotations

import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog

from exporter.errors import ConfigError
from exporter.web.auth import BasicAuth
from exporter.web.config import TlsConfig, WebConfig, build_ssl_context, read_web_config_file
from exporter.web.counters import WebCounters

_log = structlog.get_logger("kvcap.web")

CHECK_INTERVAL_S: Final = 1.0

# (mtime, size, inode) of each watched file, None where it cannot be stat'ed. The inode
# catches an atomic rename, which is how cert-manager and Kubernetes secret volumes swap files.
_Signature = tuple[tuple[int, int, int] | None, ...]
# How strictly each client_auth_type checks client certificates, weakest first.
_CLIENT_AUTH_STRENGTH: Final = {
    "NoClientCert": 0,
    "RequestClientCert": 0,
    "VerifyClientCertIfGiven": 1,
    "RequireAnyClientCert": 2,
    "RequireAndVerifyClientCert": 2,
}


@dataclass(frozen=True, slots=True)
class ServingState:
    """What every connection is served with; replaced whole on a reload, never mutated."""

    config: WebConfig
    ssl_context: ssl.SSLContext | None
    auth: BasicAuth | None


def build_serving_state(config: WebConfig, previous: ServingState | None = None) -> ServingState:
    """The SSL context and authenticator for `config`; ConfigError when a TLS file is bad.

    The authenticator of `previous` is kept when the users and their hashes are the same:
    a new one would hash a dummy password (one bcrypt run) and forget every verified
    login, so each scraper would pay bcrypt again after any reload."""
    users = config.basic_auth_users
    auth: BasicAuth | None = None
    if users:
        same_users = previous is not None and dict(previous.config.basic_auth_users) == dict(users)
        kept = previous.auth if previous is not None and same_users else None
        auth = kept if kept is not None else BasicAuth(users)
    return ServingState(
        config=config,
        ssl_context=None if config.tls is None else build_ssl_context(config.tls),
        auth=auth,
    )


class WebConfigWatcher:
    """Holds the current ServingState, reloading it when the web config or its TLS files change.

    `maybe_reload` is called for each new connection and each request, from any thread,
    and looks at the files at most once per `check_interval_s` (a removed user is refused
    on open keep-alive connections too). `reload` (SIGHUP) looks now. A file that turns
    invalid keeps the last good state and is logged once; so is a change that would switch
    between HTTP and HTTPS, which would silently drop TLS or break every scraper, and needs
    a restart instead. A change that weakens access control (basic auth turned off,
    client certificates no longer required or verified, a lower TLS version) is refused the
    same way unless `allow_downgrade`: an emptied or half-written file must not open the
    exporter to everyone. A file that holds the same settings as the served ones (and TLS
    files that did not change) rebuilds nothing; the same users and hashes keep the
    authenticator and its cache of verified logins.
    """

    def __init__(
        self,
        path: Path | None,
        *,
        check_interval_s: float = CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        allow_downgrade: bool = False,
        counters: WebCounters | None = None,
    ) -> None:
        self._path = path
        self._check_interval_s = check_interval_s
        self._clock = clock
        self._allow_downgrade = allow_downgrade
        self._counters = counters or WebCounters()
        self._lock = threading.Lock()
        self._last_check = clock()
        self._watched: tuple[Path, ...] = ()
        self._signature: _Signature = ()
        self._failing = False  # the last look found a file it could not use
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
        # Whoever takes the lock looks; the others go on with the current state.
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._last_check = now
            self._reload_if_changed(self._path)
        except Exception:  # a request thread must survive anything a reload can throw
            _log.exception("web_config_reload_crashed", file=str(self._path))
        finally:
            self._lock.release()

    def reload(self) -> None:
        """Look at the files now (SIGHUP); like maybe_reload, never raises."""
        if self._path is None:
            _log.info("web_config_reload_skipped", reason="no --web.config.file")
            return
        with self._lock:
            self._last_check = self._clock()
            try:
                self._reload_if_changed(self._path, force=True)
            except Exception:
                _log.exception("web_config_reload_crashed", file=str(self._path))

    def _reload_if_changed(self, path: Path, *, force: bool = False) -> None:
        # Files are stat'ed before they are read, so a write racing with the read is seen
        # as a change on the next look instead of being lost.
        signature = _signature(self._watched)
        if signature == self._signature and not force:
            return
        watched: tuple[Path, ...] = (path,)
        signature = signature[:1]
        failing, self._failing = self._failing, True
        try:
            config = read_web_config_file(path)
            watched = _files_of(path, config)
            signature += _signature(watched[1:])
            same_tls_files = signature[1:] == self._signature[1:]
            if config == self._state.config and same_tls_files and not failing:
                # Nothing to rebuild (a SIGHUP with nothing changed, the file rewritten with
                # the same settings): a storm of signals costs a read and a parse each.
                self._watched, self._signature, self._failing = watched, signature, False
                _log.debug("web_config_unchanged", file=str(path))
                return
            if (config.tls is None) != (self._state.config.tls is None):
                raise ConfigError(
                    "web config tls_server_config: cannot be added or removed while running; "
                    "restart kvcap to switch between HTTP and HTTPS"
                )
            downgrade = _downgrade(self._state.config, config)
            if downgrade and not self._allow_downgrade:
                self._watched, self._signature = watched, signature
                self._counters.reload_failed("downgrade")
                _log.error(
                    "web_config_reload_refused",
                    file=str(path),
                    error=f"the new web config {downgrade}; the old one stays in force "
                    "(--web.config.allow-downgrade accepts such a change)",
                )
                return
            state = build_serving_state(config, self._state)
        except ConfigError as exc:
            # The new file's TLS paths are watched from now on, so fixing them triggers
            # the next try; until then nothing changes and nothing more is logged.
            self._watched, self._signature = watched, signature
            self._counters.reload_failed("invalid")
            _log.error("web_config_reload_failed", file=str(path), error=str(exc))
            return
        self._watched, self._signature, self._state = watched, signature, state
        self._failing = False
        _log.info(
            "web_config_reloaded",
            file=str(path),
            tls=config.tls is not None,
            basic_auth_users=len(config.basic_auth_users),
        )


def _downgrade(old: WebConfig, new: WebConfig) -> str | None:
    """How `new` lets in clients that `old` kept out, None when it does not."""
    if old.basic_auth_users and not new.basic_auth_users:
        return "turns basic auth off"
    if old.tls is not None and new.tls is not None:
        return _tls_downgrade(old.tls, new.tls)
    return None


def _tls_downgrade(old: TlsConfig, new: TlsConfig) -> str | None:
    if _CLIENT_AUTH_STRENGTH[new.client_auth_type] < _CLIENT_AUTH_STRENGTH[old.client_auth_type]:
        return f"weakens client_auth_type from {old.client_auth_type} to {new.client_auth_type}"
    if new.min_version < old.min_version:  # "TLS10" < "TLS12": the names sort by version
        return f"lowers min_version from {old.min_version} to {new.min_version}"
    return None


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
