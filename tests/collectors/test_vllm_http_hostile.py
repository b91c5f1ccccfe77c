"""vllm_http against a hostile vLLM stand-in: each attack bounded and counted, engines go stale.

The stand-in is a real HTTP server on loopback; the poller is the real one with the real
fetch (http.client), so deadlines, redirects and content types are what the network gives.
"""

from __future__ import annotations

import contextlib
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import structlog

from exporter.collectors import FetchError, ServerPoller, VllmHttpSettings, fetch
from exporter.collectors.parsing import parse_vllm_serve_args
from exporter.demo.http_thread import ThreadedHttpServer
from exporter.state import StateStore
from tests.conftest import GOLDEN
from tests.support.http_server import http_serving

GEMMA = GOLDEN / "expositions" / "gemma-3-27b-text-dp2-tp2.vllm-0.33.txt"
Respond = Callable[[BaseHTTPRequestHandler], None]


class _QuietServer(ThreadedHttpServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A poller that hung up mid-request is what these tests do: nothing to print."""


@contextmanager
def stand_in(respond: Respond) -> Iterator[tuple[str, list[str]]]:
    """A vLLM stand-in answering every GET with `respond`; yields its URL and the paths asked."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            asked.append(self.path)
            with contextlib.suppress(OSError):  # the poller gave up and closed
                respond(self)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    with http_serving(Handler, _QuietServer) as url:
        yield url, asked


def answer(
    handler: BaseHTTPRequestHandler,
    body: bytes,
    status: int = 200,
    content_type: str = "text/plain; version=0.0.4",
    headers: tuple[tuple[str, str], ...] = (),
) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for name, value in headers:
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def metrics_only(body: bytes) -> Respond:
    def respond(handler: BaseHTTPRequestHandler) -> None:
        if handler.path == "/metrics":
            answer(handler, body)
        else:
            answer(handler, b"{}", 404, "application/json")

    return respond


def poller(url: str, store: StateStore, **settings: Any) -> ServerPoller:
    return ServerPoller(
        url, VllmHttpSettings(urls=(url,), **settings), fetch, store, threading.Event()
    )


def test_a_trickling_server_times_out_as_a_whole_and_the_engines_go_stale() -> None:
    trickle = threading.Event()

    def respond(handler: BaseHTTPRequestHandler) -> None:
        if not trickle.is_set():
            metrics_only(GEMMA.read_bytes())(handler)
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        for _ in range(40):  # a byte every 0.5 s: each read is quick, the whole is not
            handler.wfile.write(b"#")
            handler.wfile.flush()
            time.sleep(0.5)

    store = StateStore()
    with stand_in(respond) as (url, _):
        polls = poller(url, store, timeout_s=1.0, stale_after_s=0.5)
        polls.poll_once()
        assert len(store.snapshot().engines) == 2
        trickle.set()
        began = time.monotonic()
        polls.poll_once()
        took = time.monotonic() - began
    print(f"trickling server: poll gave up after {took:.2f} s")
    assert took < 2.0  # one fetch's deadline (1 s), not 40 bytes x 0.5 s
    snapshot = store.snapshot()
    assert snapshot.errors == {("vllm_http", "timeout"): 1}
    assert all(view.stale for view in snapshot.engines)


def test_a_redirect_to_another_port_is_not_followed() -> None:
    with stand_in(metrics_only(GEMMA.read_bytes())) as (elsewhere, elsewhere_asked):

        def respond(handler: BaseHTTPRequestHandler) -> None:
            answer(handler, b"", 302, headers=(("Location", f"{elsewhere}/metrics"),))

        with stand_in(respond) as (url, _):
            store = StateStore()
            poller(url, store, timeout_s=2.0).poll_once()
    assert store.snapshot().errors == {("vllm_http", "redirect"): 1}
    assert elsewhere_asked == []


def test_a_redirect_on_the_same_server_is_followed() -> None:
    body = GEMMA.read_bytes()

    def respond(handler: BaseHTTPRequestHandler) -> None:
        if handler.path == "/metrics":  # what Starlette's mount answers in some releases
            answer(handler, b"", 307, headers=(("Location", "/metrics/"),))
        elif handler.path == "/metrics/":
            answer(handler, body)
        else:
            answer(handler, b"{}", 404, "application/json")

    store = StateStore()
    with stand_in(respond) as (url, asked):
        poller(url, store, timeout_s=2.0).poll_once()
    assert len(store.snapshot().engines) == 2
    assert asked[:2] == ["/metrics", "/metrics/"]


def test_an_html_page_is_not_parsed() -> None:
    def respond(handler: BaseHTTPRequestHandler) -> None:
        answer(handler, GEMMA.read_bytes(), content_type="text/html; charset=utf-8")

    store = StateStore()
    with stand_in(respond) as (url, _):
        poller(url, store, timeout_s=2.0).poll_once()
    assert store.snapshot().errors == {("vllm_http", "content_type"): 1}
    assert store.snapshot().engines == ()


def test_a_31_mib_body_is_refused_at_the_8_mib_default_in_bounded_memory() -> None:
    body = b"# " + b"x" * (31 * 2**20) + b"\n"
    settings = VllmHttpSettings(urls=("x",))
    assert settings.max_body_bytes == 8 * 2**20
    with stand_in(metrics_only(body)) as (url, _):
        tracemalloc.start()
        try:
            with pytest.raises(FetchError) as refused:
                fetch(f"{url}/metrics", timeout_s=5.0, max_bytes=settings.max_body_bytes)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    print(f"31 MiB body: refused, {peak / 2**20:.1f} MiB allocated at the peak")
    assert refused.value.reason == "body_too_large"
    assert peak < 3 * settings.max_body_bytes


def engines_exposition(engines: int, model_name: str = "m", engine_label: str = "{}") -> bytes:
    family = "vllm:num_requests_running"
    lines = [
        f'{family}{{engine="{engine_label.format(i)}",model_name="{model_name}"}} 0'
        for i in range(engines)
    ]
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize(
    ("body", "settings", "reason"),
    [
        (engines_exposition(20_000), {}, "too_many_samples"),
        (engines_exposition(300), {}, "too_many_engines"),
        (engines_exposition(3), {"max_engines": 2}, "too_many_engines"),
        (engines_exposition(2, model_name="x" * 300), {}, "bad_label"),
        (engines_exposition(2, engine_label="gpu{}"), {}, "bad_label"),
        (engines_exposition(2, engine_label="1{}0000000"), {}, "bad_label"),
    ],
    ids=["20k-samples", "300-engines", "over-max-engines", "long-model-name", "word", "long"],
)
def test_engine_count_and_label_bounds(body: bytes, settings: dict[str, Any], reason: str) -> None:
    store = StateStore()
    with stand_in(metrics_only(body)) as (url, _):
        began = time.monotonic()
        poller(url, store, timeout_s=5.0, **settings).poll_once()
        took = time.monotonic() - began
    print(f"{reason}: refused in {took * 1e3:.0f} ms")
    assert store.snapshot().errors == {("vllm_http", reason): 1}
    assert store.snapshot().engines == ()


def test_the_data_parallel_size_bounds_the_engines() -> None:
    args = parse_vllm_serve_args("--model m --data-parallel-size 2")
    store = StateStore()
    with stand_in(metrics_only(engines_exposition(3))) as (url, _):
        poller(url, store, timeout_s=5.0, serve_args=args).poll_once()
    assert store.snapshot().errors == {("vllm_http", "too_many_engines"): 1}


def unequal_ranks(path: Path) -> bytes:
    """Gemma on two DP ranks whose block counts differ: the sum is odd, engine 1 is larger."""
    text = path.read_text()
    text = text.replace('num_gpu_blocks="134276"', 'num_gpu_blocks="134277"')
    engine1 = next(
        line for line in text.splitlines() if 'engine="1"' in line and "cache_config_info" in line
    )
    text = text.replace(
        engine1, engine1.replace('kv_cache_size_tokens="597576"', 'kv_cache_size_tokens="597592"')
    )
    return text.encode()


def test_unequal_dp_ranks_still_export_every_engine_with_approximate_blocks() -> None:
    store = StateStore()
    with stand_in(metrics_only(unequal_ranks(GEMMA))) as (url, _):
        polls = poller(url, store, timeout_s=5.0)
        with structlog.testing.capture_logs() as logs:
            polls.poll_once()
            polls.poll_once()
    snapshot = store.snapshot()
    assert snapshot.errors == {}
    views = {view.engine: view for view in snapshot.engines}
    assert set(views) == {"0", "1"}
    # vLLM's own per-engine figures are exported as reported.
    assert views["0"].capacity.kv_cache_size_tokens == 597576
    assert views["1"].capacity.kv_cache_size_tokens == 597592
    assert views["0"].usage is not None
    assert views["0"].usage.usage_ratio == 0.25
    blocks = {engine: view.capacity.num_gpu_blocks for engine, view in views.items()}
    assert sum(b for b in blocks.values() if b is not None) == 134277
    assert blocks["0"] is not None
    assert blocks["1"] is not None
    assert blocks["0"] < blocks["1"]
    assert all(view.approximate for view in views.values())
    assert all("approximate" in (view.derivation_error or "") for view in views.values())
    assert [e["event"] for e in logs if e["event"] == "blocks_approximate"] == [
        "blocks_approximate"
    ]
