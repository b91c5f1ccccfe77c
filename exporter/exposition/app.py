"""The exporter's HTTP routes: /metrics, /healthz, /readyz, /engines and a landing page.

Every route only reads the current snapshot; nothing here can change state.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import msgspec

from exporter import __version__
from exporter.exposition.render import ExpositionCache
from exporter.exposition.residency import residency_document
from exporter.state import EngineView, ResidencyView, Snapshot
from exporter.web import Handler, Request, Response

_JSON = "application/json"


def build_routes(
    snapshot: Callable[[], Snapshot],
    cache: ExpositionCache,
    active_flags: Sequence[tuple[str, str]] = (),
) -> dict[str, Handler]:
    def metrics(request: Request) -> Response:
        body = cache.body(
            accept=request.headers.get("accept"),
            accept_encoding=request.headers.get("accept-encoding"),
        )
        headers = [("Vary", "Accept, Accept-Encoding")]
        if body.gzipped:
            headers.append(("Content-Encoding", "gzip"))
        return Response(200, body.content, body.content_type, tuple(headers))

    def healthz(request: Request) -> Response:
        return Response(200, b"ok\n", "text/plain; charset=utf-8")

    def readyz(request: Request) -> Response:
        current = snapshot()
        if current.ready:
            return Response(200, b"ready\n", "text/plain; charset=utf-8")
        waiting = [f"{s.collector} {s.target}" for s in current.collectors if not s.has_reported]
        text = "not ready: waiting for " + ", ".join(waiting) + "\n"
        return Response(503, text.encode(), "text/plain; charset=utf-8")

    def engines(request: Request) -> Response:
        return Response(200, msgspec.json.encode(engines_document(snapshot())), _JSON)

    def landing(request: Request) -> Response:
        page = landing_page(snapshot(), active_flags)
        return Response(200, page.encode(), "text/html; charset=utf-8")

    return {
        "/metrics": metrics,
        "/healthz": healthz,
        "/readyz": readyz,
        "/engines": engines,
        "/": landing,
    }


def engine_document(view: EngineView, residency: ResidencyView | None = None) -> dict[str, Any]:
    document = asdict(view)
    document["approximate"] = view.approximate
    document["used_tokens"] = view.used_tokens
    document["prefix_cache"] = residency_document(residency) if residency else None
    return document


def engines_document(current: Snapshot) -> dict[str, Any]:
    residency = current.residency
    by_engine = {r.engine: r for r in residency}
    known = {view.engine for view in current.engines}
    return {
        "version": __version__,
        "ready": current.ready,
        "engines": [engine_document(view, by_engine.get(view.engine)) for view in current.engines],
        # Engines only the kv_events collector knows (an endpoint given by flag).
        "prefix_cache_only": [
            {"engine": r.engine, "prefix_cache": residency_document(r)}
            for r in residency
            if r.engine not in known
        ],
        "collectors": [asdict(status) for status in current.collectors],
    }


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _concurrency(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def landing_page(current: Snapshot, active_flags: Sequence[tuple[str, str]] = ()) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(v.engine)}</td><td>{html.escape(v.model_name)}</td>"
        f"<td>{_or_dash(v.capacity.kv_cache_size_tokens)}</td>"
        f"<td>{_concurrency(v.capacity.kv_cache_max_concurrency)}</td>"
        f"<td>{html.escape(v.capacity_source or '-')}</td>"
        f"<td>{'stale' if v.stale else 'fresh'}</td></tr>"
        for v in current.engines
    )
    return (
        "<!doctype html><html><head><title>kvcap exporter</title></head><body>"
        f"<h1>kvcap exporter {html.escape(__version__)}</h1>"
        "<p>Group-aware vLLM KV cache capacity, per engine.</p><ul>"
        '<li><a href="/metrics">/metrics</a></li>'
        '<li><a href="/engines">/engines</a> (JSON)</li>'
        '<li><a href="/healthz">/healthz</a></li><li><a href="/readyz">/readyz</a></li></ul>'
        "<table border=1><tr><th>engine</th><th>model</th><th>capacity tokens</th>"
        f"<th>max concurrency</th><th>capacity</th><th>state</th></tr>{rows}</table>"
        f"{_flags_table(active_flags)}</body></html>"
    )


def _flags_table(active_flags: Sequence[tuple[str, str]]) -> str:
    """The flags this exporter runs with (command line, KVCAP_* twin or default)."""
    if not active_flags:
        return ""
    rows = "".join(
        f"<tr><td><code>{html.escape(flag)}</code></td><td><code>{html.escape(value)}</code>"
        "</td></tr>"
        for flag, value in active_flags
    )
    return f"<h2>Flags</h2><table border=1><tr><th>flag</th><th>value</th></tr>{rows}</table>"
