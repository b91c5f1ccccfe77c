"""The incremental renderer against prometheus_client: the same bytes for any snapshot.

The reference builds the families of the metric tables as prometheus_client
GaugeMetricFamily / CounterMetricFamily objects and renders them with its own
`generate_latest` (0.0.4 text and OpenMetrics). The renderer under test keeps bytes from
one snapshot to the next, so the property walks sequences of state changes through one
ExpositionCache and compares every step, plain and gzip.
"""

from __future__ import annotations

import gzip
import os
import resource
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client import exposition as text_format
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.openmetrics import exposition as openmetrics_format
from structlog.testing import capture_logs

from exporter.capacity import EngineCapacity, GroupCapacity
from exporter.exposition import (
    LAYOUT,
    Column,
    ExpositionCache,
    ProcessReader,
    Renderer,
    ScrapeTable,
    build_exposition,
    engine_rows,
    web_tables,
)
from exporter.exposition.render import stored_chunk
from exporter.prefix_cache import LIFETIME_BUCKETS_S
from exporter.state import (
    EngineReport,
    GpuProcessMemory,
    GpuReport,
    KvUsage,
    PoolView,
    ResidencyView,
    Snapshot,
    StateStore,
)
from exporter.web import REJECT_REASONS, RELOAD_ERROR_REASONS, WebCounters
from tests.exposition.test_families import rich_store
from tests.state.helpers import reports as gemma_reports

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def _family(column: Column[Any], labels: tuple[str, ...]) -> Metric:
    names = [*labels, *column.extra_labels]
    if column.kind == "counter":
        return CounterMetricFamily(column.name, column.help, labels=names)
    if column.kind == "histogram":
        return HistogramMetricFamily(column.name, column.help, labels=names)
    return GaugeMetricFamily(column.name, column.help, labels=names)


def _buckets(column: Column[Any], counts: Any) -> list[tuple[str, float]]:
    buckets, running = [], 0
    for bound, count in zip((*column.bounds, float("inf")), counts, strict=True):
        running += count
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
    return buckets


def reference_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Every family of the tables, built the plain prometheus_client way."""
    engines = engine_rows(snapshot)
    for placed in LAYOUT:
        table, column = placed.table, placed.column
        family = _family(column, table.labels)
        for row in placed.rows(snapshot, engines):
            labels = [*table.ids(row), *column.extra(row)]
            if column.observations is not None:
                counts, total = column.observations(row)
                family.add_metric(labels, _buckets(column, counts), total)  # type: ignore[attr-defined]
                continue
            value = column.value(row)
            if value is not None:
                family.add_metric(labels, value)  # type: ignore[attr-defined]
        yield family


class _Families:
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        return reference_families(self.snapshot)


class _ScrapeFamilies:
    """The per-scrape tables' families, built the plain prometheus_client way each time."""

    def __init__(self, tables: list[ScrapeTable[Any]]) -> None:
        self.tables = tables

    def collect(self) -> Iterator[Metric]:
        for scrape in self.tables:
            rows = scrape.rows()
            for column in scrape.table.columns:
                family = _family(column, scrape.table.labels)
                for row in rows:
                    value = column.value(row)
                    if value is not None:
                        labels = [*scrape.table.ids(row), *column.extra(row)]
                        family.add_metric(labels, value)  # type: ignore[attr-defined]
                yield family


def reference(snapshot: Snapshot, *, openmetrics: bool) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(snapshot))
    if openmetrics:
        body: bytes = openmetrics_format.generate_latest(registry)  # type: ignore[no-untyped-call]
        return body
    return text_format.generate_latest(registry)


def assert_same_as_prometheus_client(cache: ExpositionCache, snapshot: Snapshot) -> None:
    for openmetrics in (False, True):
        expected = reference(snapshot, openmetrics=openmetrics)
        accept = OPENMETRICS if openmetrics else None
        plain = cache.body(accept=accept)
        assert plain.content == expected
        zipped = cache.body(accept=accept, accept_encoding="gzip")
        assert zipped.gzipped
        assert gzip.decompress(zipped.content) == expected


# --- random states --------------------------------------------------------------------

SURROGATES: tuple[Literal["Cs"]] = ("Cs",)
label_text = st.text(st.characters(codec="utf-8", exclude_categories=SURROGATES), max_size=6) | (
    st.sampled_from(['a"b', "c\\d", "e\nf", "", "gemma", "ü"])
)
maybe_int = st.none() | st.integers(min_value=0, max_value=2**62)
number = st.integers(min_value=0, max_value=2**40) | st.floats(allow_nan=True)
groups = st.builds(
    GroupCapacity,
    kind=st.sampled_from(["full_attention", "sliding_window", "mamba"]),
    spec_type=label_text,
    num_layers=st.integers(0, 100),
    layer_names=st.just(()),
    block_size=st.integers(1, 4096),
    page_size_bytes=st.integers(0, 2**30),
    blocks_per_request=st.integers(0, 10**6),
    max_memory_usage_bytes_per_request=st.integers(0, 2**40),
    sliding_window=st.none() | st.integers(1, 10**6),
    attention_chunk_size=st.none() | st.integers(1, 10**6),
)
capacities = st.none() | st.builds(
    EngineCapacity,
    kv_cache_size_tokens=maybe_int,
    kv_cache_max_concurrency=st.none() | st.floats(allow_nan=False),
    num_gpu_blocks=maybe_int,
    block_size=st.none() | st.integers(1, 4096),
    max_model_len=maybe_int,
    cache_dtype=st.none() | label_text,
    groups=st.lists(groups, max_size=3).map(tuple),
    bytes_per_block_per_worker=st.lists(st.integers(0, 2**30), max_size=3).map(tuple),
    approximate=st.none() | st.booleans(),
)
reports = st.builds(
    EngineReport,
    engine=st.sampled_from(["0", "1", "2", "10", "x"]),
    model_name=label_text,
    instance_id=st.none() | label_text,
    vllm_version=st.none() | label_text,
    reported=capacities,
    derived=capacities,
    derivation_error=st.none() | label_text,
    usage=st.none() | st.builds(KvUsage, st.none() | st.floats(0, 1), st.none() | number),
    world_size=st.none() | st.integers(1, 4),
    local_rank=st.none() | st.integers(0, 3),
)
gpus = st.builds(
    GpuReport,
    index=st.sampled_from(["0", "1", "2", "3", "0/1"]),
    uuid=label_text,
    name=label_text,
    pci_bus_id=label_text,
    driver_version=label_text,
    memory_total_bytes=st.integers(0, 2**40),
    memory_used_bytes=st.integers(0, 2**40),
    memory_free_bytes=st.integers(0, 2**40),
    memory_reserved_bytes=st.none() | st.integers(0, 2**30),
    mig_mode=st.booleans(),
    processes=st.lists(
        st.builds(GpuProcessMemory, st.integers(1, 2**22), st.integers(0, 2**40)), max_size=2
    ).map(tuple),
)
BUCKETS = len(LIFETIME_BUCKETS_S) + 1  # and +Inf
pools = st.builds(
    PoolView,
    group=st.integers(0, 7),
    medium=st.sampled_from(["GPU", "CPU", 'od"d', "ü\n"]),
    resident_blocks=st.integers(0, 2**40),
    block_size=st.none() | st.integers(1, 4096),
    kind=st.none() | label_text,
    stored_total=st.integers(0, 2**62),
    removed_total=st.integers(0, 2**62),
    lifetime_counts=st.lists(st.integers(0, 2**40), min_size=BUCKETS, max_size=BUCKETS).map(tuple),
    lifetime_sum_s=st.floats(allow_nan=True),
)
residency_views = st.builds(
    ResidencyView,
    engine=label_text,
    pools=st.lists(pools, max_size=3).map(tuple),
    pool_blocks=st.none() | st.integers(0, 2**40),
    approximate=st.booleans(),
    approximate_reason=st.none() | label_text,
    cleared_total=st.integers(0, 2**40),
    events_received_total=st.integers(0, 2**62),
    dropped_total=st.dictionaries(label_text, st.integers(0, 2**40), max_size=3),
    gaps_total=st.integers(0, 2**40),
    up=st.booleans(),
)
residencies = st.lists(residency_views, max_size=3)
collector = st.sampled_from(["handshake", "vllm_http", "nvml"])
target = st.sampled_from(["ipc://x", "http://a", "local"])
changes = st.one_of(
    st.tuples(st.just("publish"), collector, target, st.lists(reports, max_size=4)),
    st.tuples(st.just("update"), collector, target, reports),
    st.tuples(st.just("remove"), collector, target, reports),
    st.tuples(st.just("fail"), collector, target, label_text),
    st.tuples(st.just("reject"), collector, target, label_text),
    st.tuples(st.just("gpus"), collector, target, st.lists(gpus, max_size=3)),
    st.tuples(st.just("residency"), st.just("kv_events"), st.just(""), residencies),
)


def apply(store: StateStore, change: tuple[Any, ...]) -> None:
    kind, name, where, what = change
    if kind == "publish":
        store.publish(name, where, what, duration_s=0.25)
    elif kind == "update":
        store.update_engine(name, where, what)
    elif kind == "remove":
        store.remove_engine(name, where, what.engine, what.instance_id)
    elif kind == "fail":
        store.fail(name, where, "timeout", what, stale=bool(len(what) % 2))
    elif kind == "reject":
        store.reject(name, where, "malformed_frame", what)
    elif kind == "residency":
        store.publish_residency(name, what)
    else:
        store.publish_gpus(name, where, what)


@given(st.lists(changes, min_size=1, max_size=8))
def test_every_state_renders_as_prometheus_client_renders_it(
    steps: list[tuple[Any, ...]],
) -> None:
    clock = iter(range(1_000_000, 2_000_000))
    store = StateStore(lambda: float(next(clock)), priority={"handshake": 0, "vllm_http": 1})
    cache = build_exposition(store.snapshot, process=False)
    with capture_logs():
        for change in steps:
            apply(store, change)
            assert_same_as_prometheus_client(cache, store.snapshot())


def test_a_real_deployment_renders_as_prometheus_client_renders_it() -> None:
    store = rich_store()
    cache = build_exposition(store.snapshot, process=False)
    assert_same_as_prometheus_client(cache, store.snapshot())
    # Polls later: new timestamps, the same capacity; then one engine fewer.
    polled = gemma_reports("gemma-3-27b-text-dp2-tp2")
    store.publish("vllm_http", "http://a", polled)
    assert_same_as_prometheus_client(cache, store.snapshot())
    store.publish("vllm_http", "http://a", polled[:1])
    assert_same_as_prometheus_client(cache, store.snapshot())


def test_process_metrics_follow_the_cached_part_in_both_formats() -> None:
    store = rich_store()
    cache = build_exposition(store.snapshot)
    expected = reference(store.snapshot(), openmetrics=False)
    body = cache.body(accept_encoding="gzip")
    text = gzip.decompress(body.content)
    assert text.startswith(expected)
    assert b"\nprocess_" in text[len(expected) - 1 :] or text[len(expected) :].startswith(
        b"# HELP process_"
    )
    om = gzip.decompress(cache.body(accept=OPENMETRICS, accept_encoding="gzip").content)
    assert om.startswith(reference(store.snapshot(), openmetrics=True).removesuffix(b"# EOF\n"))
    assert om.endswith(b"# EOF\n")
    assert om.count(b"# EOF") == 1


# --- the per-scrape families ----------------------------------------------------------

web_events = st.lists(
    st.one_of(
        st.tuples(st.just("reject"), st.sampled_from(REJECT_REASONS)),
        st.tuples(st.just("reload"), st.sampled_from(RELOAD_ERROR_REASONS)),
        st.tuples(st.just("connections"), st.integers(0, 100)),
    ),
    max_size=20,
)


def fake_proc(folder: Path, stat: list[int], max_fds: int, fds: int) -> ProcessCollector:
    """A /proc of one process with the given stat fields, limit and open files."""
    (folder / "stat").write_text("cpu  1 2 3\nbtime 1764590000\n")
    (folder / "42" / "fd").mkdir(parents=True, exist_ok=True)
    (folder / "42" / "stat").write_text("42 (py thon) S " + " ".join(map(str, stat)) + "\n")
    (folder / "42" / "limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units\n"
        f"Max open files            {max_fds}                 {max_fds}                 files\n"
    )
    for name in os.listdir(folder / "42" / "fd"):
        (folder / "42" / "fd" / name).unlink()
    for fd in range(fds):
        (folder / "42" / "fd" / str(fd)).touch()
    return ProcessCollector(pid=lambda: 42, proc=str(folder), registry=None)


@given(
    scrapes=st.integers(1, 3),
    events=web_events,
    stat=st.lists(st.integers(0, 2**50), min_size=22, max_size=22),
    max_fds=st.integers(1, 2**20),
    fds=st.integers(0, 5),
)
def test_the_per_scrape_families_render_as_prometheus_client_renders_them(
    tmp_path_factory: pytest.TempPathFactory,
    scrapes: int,
    events: list[tuple[str, Any]],
    stat: list[int],
    max_fds: int,
    fds: int,
) -> None:
    counters = WebCounters()
    proc = tmp_path_factory.mktemp("proc")
    process = fake_proc(proc, stat, max_fds, fds)
    store = StateStore()
    reader = ProcessReader(pid=lambda: 42, proc=str(proc))
    cache = build_exposition(store.snapshot, counters, proc=reader)
    registry = CollectorRegistry(auto_describe=False)
    for collector in (_Families(store.snapshot()), _ScrapeFamilies(web_tables(counters)), process):
        registry.register(collector)
    # Each scrape sees more counts.
    for number in range(scrapes):
        for kind, what in events[number::2]:
            if kind == "reject":
                counters.reject(what)
            elif kind == "reload":
                counters.reload_failed(what)
            else:
                counters.set_connections(what)
        expected = {
            False: text_format.generate_latest(registry),
            True: openmetrics_format.generate_latest(registry),  # type: ignore[no-untyped-call]
        }
        for openmetrics in (False, True):
            accept = OPENMETRICS if openmetrics else None
            assert cache.body(accept=accept).content == expected[openmetrics]
            zipped = cache.body(accept=accept, accept_encoding="gzip").content
            assert gzip.decompress(zipped) == expected[openmetrics]


def test_the_process_series_are_those_of_prometheus_client() -> None:
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)

    def names(text: str) -> list[str]:
        return [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]

    body = build_exposition(StateStore().snapshot).body().content.decode()
    ours = [name for name in names(body) if name.startswith("process_")]
    assert ours == names(text_format.generate_latest(registry).decode())
    unreadable = ProcessReader(proc="/no/such/proc")
    body = build_exposition(StateStore().snapshot, proc=unreadable).body().content.decode()
    assert "# TYPE process_" not in body


def test_this_process_is_read_from_the_real_proc() -> None:
    """The open descriptors are a count: one more opened, one more counted. On Linux 6.2+
    the count is the size of /proc/self/fd (no listing, whose own descriptor the fallback
    counts as prometheus_client does)."""
    reader = ProcessReader()
    (first,) = reader.rows()
    with Path(__file__).open("rb"):
        (second,) = reader.rows()
    assert first.open_fds is not None
    assert second.open_fds == first.open_fds + 1
    listed = len(os.listdir("/proc/self/fd"))
    counted_by_size = os.stat("/proc/self/fd").st_size > 0
    assert first.open_fds == (listed - 1 if counted_by_size else listed)
    assert first.max_fds == float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    assert first.resident_memory_bytes is not None
    assert first.resident_memory_bytes > 0


def test_a_snapshot_prepared_after_a_change_is_served_without_rendering_again() -> None:
    store = rich_store()
    cache = build_exposition(store.snapshot, process=False)
    store.subscribe(cache.prepare)
    store.publish("vllm_http", "http://a", gemma_reports("gemma-3-27b-text-dp2-tp2"))
    with patch.object(Renderer, "render", side_effect=AssertionError("rendered on the scrape")):
        assert_same_as_prometheus_client(cache, store.snapshot())


def test_once_gzip_is_asked_for_a_prepared_snapshot_is_served_without_zlib() -> None:
    """Each zlib call lets another thread (a poller) take the interpreter lock, which the
    scrape then waits for: after a scrape in gzip, `prepare` compresses the live part, and
    the per-scrape families go in stored blocks."""
    store = rich_store()
    cache = build_exposition(store.snapshot, WebCounters())
    store.subscribe(cache.prepare)
    for accept in (None, OPENMETRICS):
        cache.body(accept=accept, accept_encoding="gzip")
    store.publish("vllm_http", "http://a", gemma_reports("gemma-3-27b-text-dp2-tp2"))
    for accept in (None, OPENMETRICS):
        with (
            patch.object(zlib, "compressobj", side_effect=AssertionError("zlib on the scrape")),
            patch.object(zlib, "compress", side_effect=AssertionError("zlib on the scrape")),
        ):
            zipped = cache.body(accept=accept, accept_encoding="gzip").content
        plain = cache.body(accept=accept).content
        assert (
            gzip.decompress(zipped).split(b"\n# HELP process_")[0]
            == (plain.split(b"\n# HELP process_")[0])
        )


@pytest.mark.parametrize("size", [0, 1, 0xFFFF, 0x10000, 200_000])
def test_stored_blocks_inflate_to_their_bytes(size: int) -> None:
    data = os.urandom(size)
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    assert inflater.decompress(stored_chunk(data) + b"\x03\x00") == data
    assert inflater.eof


def test_a_render_that_fails_after_a_change_is_logged_once_and_left_to_the_scrape() -> None:
    store = rich_store()
    cache = build_exposition(store.snapshot, process=False)
    store.subscribe(cache.prepare)
    polled = gemma_reports("gemma-3-27b-text-dp2-tp2")
    with (
        patch.object(Renderer, "render", side_effect=ValueError("a bug")),
        capture_logs() as logs,
    ):
        store.publish("vllm_http", "http://a", polled)  # the collector goes on
        store.publish("vllm_http", "http://a", polled)
        with pytest.raises(ValueError, match="a bug"):
            cache.body()  # the scrape answers 500
    assert [e["event"] for e in logs if e["event"] == "render_failed"] == ["render_failed"]
    assert_same_as_prometheus_client(cache, store.snapshot())
