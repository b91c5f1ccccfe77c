"""Collector `vllm_http`: poll stock vLLM API servers (/metrics, /v1/models, /version,
/kv_event_sources for the kv_events collector), any vLLM from 0.10 to 0.33, no plugin needed."""

from __future__ import annotations

import argparse
import os
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from exporter.bounded_files import FileRefused
from exporter.collectors.http_fetch import Fetcher, FetchError, fetch
from exporter.collectors.kv_events_endpoints import endpoints_from_sources
from exporter.collectors.parsing import MalformedExposition, VllmServeArgs
from exporter.collectors.registry import (
    DEFAULT_MAX_ENGINES,
    CollectorSpec,
    register_collector,
)
from exporter.collectors.vllm_http_reports import (
    Deriver,
    ServerDocuments,
    cached_deriver,
    read_server,
    served_model,
    settings_refused,
    unreadable_config_deriver,
)
from exporter.collectors.vllm_http_settings import (
    VllmHttpSettings,
    add_arguments,
    settings_from_args,
)
from exporter.collectors.vllm_processes import (
    CommandLines,
    discover_hf_environ,
    discover_serve_args,
)
from exporter.errors import ConfigError
from exporter.hf_cache import find_snapshot, looks_like_repo_id
from exporter.json_documents import NotJson, read_json
from exporter.model_config import (
    FileVersion,
    file_version,
    load_model_config,
    model_config_file,
)
from exporter.state import StateSink

log = structlog.get_logger("kvcap.vllm_http")

NAME = "vllm_http"
# The log event of each kind of warning a read gives; any other is "capacity_not_derived".
_WARNING_EVENTS = {
    "blocks_approximate": "blocks_approximate",
    "version_unknown": "vllm_version_unknown",
}


class VllmHttpCollector:
    """One poller thread per API server URL."""

    name = NAME

    def __init__(self, settings: VllmHttpSettings, fetcher: Fetcher = fetch) -> None:
        self.settings = settings
        self.fetcher = fetcher
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, sink: StateSink) -> None:
        for url in self.settings.urls:
            sink.register_target(NAME, url)
            poller = ServerPoller(url.rstrip("/"), self.settings, self.fetcher, sink, self._stop)
            thread = threading.Thread(target=poller.run, name=f"vllm-http {url}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))


@dataclass(frozen=True, slots=True)
class ModelConfigRead:
    """One read of a model's config.json (`path`: it, or its model directory), kept until
    the file's version changes."""

    path: Path
    version: FileVersion | None
    derive: Deriver
    config: Mapping[str, Any] | None = None  # None when it could not be read


class ServerPoller:
    """Polls one API server every poll interval, whether the last poll failed or not.

    No backoff: a sidecar polls one engine on its own pod, a refused connection costs
    nothing, and Prometheus scrapes failing targets at their normal interval too; a backoff
    would only delay seeing a restarted vLLM.
    """

    def __init__(
        self,
        url: str,
        settings: VllmHttpSettings,
        fetcher: Fetcher,
        sink: StateSink,
        stop: threading.Event,
    ) -> None:
        self.url = url
        self.settings = settings
        self.fetcher = fetcher
        self.sink = sink
        self.stop = stop
        self.last_success = time.monotonic()
        self.forgotten = False  # its engines were dropped after --vllm.forget-after
        self._model_config: ModelConfigRead | None = None
        self._problems = ProblemsLogged(url)
        self._version: Mapping[str, Any] | None = None  # the last /version that answered
        self._command_lines = CommandLines()  # of the vLLM processes in /proc

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll_once()
            if self.stop.wait(self.settings.poll_interval_s):
                return

    def poll_once(self) -> None:
        began = time.monotonic()
        self._problems.new_poll()
        try:
            documents = self.fetch_documents()
            args = self.serve_args()
            reading = read_server(
                documents,
                args,
                self.deriver(documents, args),
                self.settings.platform,
                max_engines=self.max_engines(args),
            )
        except FetchError as error:
            self._failed(error.reason, str(error), began)
            return
        except MalformedExposition as error:
            self._failed(error.reason, str(error), began)
            return
        except Exception as error:
            log.exception("collector_internal_error", target=self.url)
            self._failed("internal_error", f"{type(error).__name__}: {error}", began)
            return
        for reason, message in reading.warnings:
            self._problems.warn(
                _WARNING_EVENTS.get(reason, "capacity_not_derived"), message, reason=reason
            )
        self._problems.forget_gone()
        self.last_success = time.monotonic()
        self.forgotten = False
        endpoints = endpoints_from_sources(documents.kv_event_sources, self.url)
        reports = [replace(r, kv_events=endpoints.get(r.engine)) for r in reading.reports]
        self.sink.publish(NAME, self.url, reports, duration_s=time.monotonic() - began)

    def _failed(self, reason: str, message: str, began: float) -> None:
        silent_s = time.monotonic() - self.last_success
        self.sink.fail(
            NAME,
            self.url,
            reason,
            message,
            duration_s=time.monotonic() - began,
            stale=silent_s > self.settings.stale_after_s,
        )
        if silent_s > self.settings.forget_after_s and not self.forgotten:
            # The server is gone: its engines leave /metrics (the state logs each one),
            # so `sum by` stops counting them. The next good read brings them back.
            self.forgotten = True
            self.sink.forget(NAME, self.url)

    def fetch_documents(self) -> ServerDocuments:
        limit, timeout = self.settings.max_body_bytes, self.settings.timeout_s
        body = self.fetcher(f"{self.url}/metrics", timeout_s=timeout, max_bytes=limit)
        try:
            metrics = body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise FetchError("malformed_exposition", f"/metrics is not UTF-8: {error}") from None
        return ServerDocuments(
            metrics=metrics,
            models=self._json("/v1/models"),
            version=self._release(),
            kv_event_sources=self._json("/kv_event_sources"),
        )

    def _release(self) -> Mapping[str, Any] | None:
        """/version, asked on every poll until it answers; then the last answer, should a
        later request fail (the release of a running server does not change)."""
        document = self._json("/version")
        if document is not None and isinstance(document.get("version"), str):
            if self._version is None or self._version.get("version") != document["version"]:
                log.info("vllm_version_read", target=self.url, version=document["version"])
            self._version = document
        return self._version

    def _json(self, path: str) -> Mapping[str, Any] | None:
        """An optional JSON endpoint: older vLLM lacks some; a failure is not fatal."""
        try:
            body = self.fetcher(
                f"{self.url}{path}",
                timeout_s=self.settings.timeout_s,
                max_bytes=min(self.settings.max_body_bytes, 2**20),
            )
            document = read_json(body)
        except (FetchError, NotJson):
            return None
        return document if isinstance(document, Mapping) else None

    def serve_args(self) -> VllmServeArgs | None:
        if self.settings.serve_args is not None:
            return self.settings.serve_args
        found = discover_serve_args(port=_url_port(self.url), command_lines=self._command_lines)
        for refusal in self._command_lines.refused:
            # Once per version of the file: the engines are reported, not derived. The
            # rejection is the one log line; each engine's derivation error says it again.
            self.sink.reject(NAME, self.url, refusal.reason, str(refusal))
            self._problems.logged_elsewhere(settings_refused(str(refusal)))
        self._command_lines.refused.clear()
        return found

    def max_engines(self, args: VllmServeArgs | None) -> int:
        """--vllm.max-engines, else the --data-parallel-size of --vllm.args, else 256.

        Not the size of a command line found in /proc: that may be another process's. The
        256 is past any real deployment, far below what a hostile body holds.
        """
        if self.settings.max_engines is not None:
            return self.settings.max_engines
        explicit = self.settings.serve_args
        size = explicit.data_parallel_size if explicit is not None else None
        return size if size else DEFAULT_MAX_ENGINES

    def deriver(self, documents: ServerDocuments, args: VllmServeArgs | None) -> Deriver | None:
        """The capacity model for the served model: --model.config, else /v1/models `root`
        when it is a local directory this container can read (a shared volume).

        config.json is re-read whenever its version (os.stat) changes, so a model replaced
        in place is derived from its new config, and one that turns unreadable stops being
        derived; an unchanged one keeps its deriver and the derivations it has cached."""
        path = self.settings.model_config
        if path is None:
            root = served_model(documents.models).get("root")
            if (
                isinstance(root, str)
                and root.startswith("/")
                and Path(root, "config.json").is_file()
            ):
                path = Path(root)
        if path is None:
            found = self._hf_cache_model(documents, args)
            if isinstance(found, _NotFound):
                return unreadable_config_deriver(found.message)
            path = found
        if path is None:
            return None
        version = file_version(model_config_file(path))
        read = self._model_config
        if read is None or read.path != path or read.version != version:
            read = self._model_config = self._read_model_config(path, version, replacing=read)
        return read.derive

    def _hf_cache_model(
        self, documents: ServerDocuments, args: VllmServeArgs | None
    ) -> Path | _NotFound | None:
        """A Hugging Face model id (the served model, else /v1/models root) found in the HF
        cache vLLM uses: HF_HUB_CACHE / HF_HOME of the vLLM process where its environment
        can be read (a shared process namespace, the same user), then this container's.
        None when it names no id; an id not found is said once, with where it looked, and
        derives nothing (each engine's derivation_error says so too). `args`: this poll's
        serve_args(), not discovered again."""
        names = [args.model if args else None, served_model(documents.models).get("root")]
        vllm_environ = discover_hf_environ(port=_url_port(self.url))
        environs = [vllm_environ, os.environ] if vllm_environ else [os.environ]
        failures: list[str] = []
        for name in names:
            if not (
                isinstance(name, str) and not name.startswith("/") and looks_like_repo_id(name)
            ):
                continue
            for environ in environs:
                try:
                    return find_snapshot(name, args.revision if args else None, environ)
                except ConfigError as error:
                    if str(error) not in failures:
                        failures.append(str(error))
        if not failures:
            return None
        message = "; ".join(failures)
        self._problems.warn("model_config_not_found", message)
        return _NotFound(message)

    def _read_model_config(
        self, path: Path, version: FileVersion | None, replacing: ModelConfigRead | None
    ) -> ModelConfigRead:
        # `version` was taken before the read: a write that lands during the read changes
        # the version again, so the next poll reads the file once more.
        try:
            config = load_model_config(path)
        except FileRefused as error:  # read once per version of the file: counted once
            self.sink.reject(NAME, self.url, error.reason, str(error))
            self._problems.logged_elsewhere(str(error))  # the rejection is its log line
            return ModelConfigRead(path, version, unreadable_config_deriver(str(error)))
        except ConfigError as error:
            self._problems.warn("model_config_unreadable", str(error), path=str(path))
            return ModelConfigRead(path, version, unreadable_config_deriver(str(error)))
        if replacing is not None and replacing.path == path and replacing.config == config:
            # Touched, not changed (or a file system whose inodes and times move on their
            # own): the cached derivations stay, and there is nothing to log.
            return replace(replacing, version=version)
        if replacing is not None:
            log.info("model_config_read", target=self.url, path=str(path))
        return ModelConfigRead(path, version, cached_deriver(config), config)


class ProblemsLogged:
    """The problems of one server's polls, each logged the first time a poll sees it, not
    on every poll that still sees it; one that goes away and comes back is logged again.

    Every problem a poll sees passes through `warn`, so the poll's problems are gathered in
    one place; after a good poll, those it did not see are forgotten (messages carry figures,
    so the book would grow over restarts)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._logged: set[str] = set()  # logged and not gone since
        self._seen: set[str] = set()  # by the poll under way

    def new_poll(self) -> None:
        self._seen = set()

    def warn(self, event: str, message: str, **fields: str) -> None:
        self._seen.add(message)
        if message not in self._logged:
            self._logged.add(message)
            log.warning(event, target=self.target, error=message, **fields)

    def logged_elsewhere(self, message: str) -> None:
        """A problem whose log line is another's (a rejection the state logs): the warnings
        of this poll that repeat it are not logged again."""
        self._logged.add(message)

    def forget_gone(self) -> None:
        """After a good poll: the problems it did not see are gone."""
        self._logged &= self._seen


@dataclass(frozen=True)
class _NotFound:
    """A Hugging Face id the cache does not have: `message` says where kvcap looked."""

    message: str


def _url_port(url: str) -> int | None:
    """The port a server URL names, its scheme's default where it names none."""
    parts = urllib.parse.urlsplit(url)
    try:
        return parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # a port out of range: --vllm.url was checked, so not expected
        return None


def _build(args: argparse.Namespace) -> VllmHttpCollector | None:
    settings = settings_from_args(args)
    return VllmHttpCollector(settings) if settings is not None else None


register_collector(
    CollectorSpec(
        name=NAME,
        help="poll vLLM API servers' /metrics, /v1/models, /version and /kv_event_sources",
        default_enabled=True,
        add_arguments=add_arguments,
        build=_build,
        priority=10,
    )
)
