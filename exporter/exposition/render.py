"""Render /metrics bodies from snapshots, reusing the bytes of everything that did not change.

A poll replaces the snapshot, so almost every scrape sees a new one; rendering all of it
again would make the first scrape after each poll the slow one. Instead the families are
laid out kept part first (what changes only with an engine's capacity, identity or GPUs)
and live part last (usage, timestamps, staleness, GPU memory, the exporter's health). Each
engine's kept samples are bytes under a key of what they read; a new snapshot re-renders
only engines whose key changed, and the kept part, its gzip chunk and its CRC-32 stay
whole while no engine changed. The live part is rendered anew: a few hundred lines. That
render runs when the snapshot is made (`prepare`, on the collector's thread), so a scrape
only joins ready bytes. Gzip bodies are those chunks joined (raw deflate blocks that end on
a byte boundary, RFC 1951) in one gzip member; once a scrape has asked for gzip, `prepare`
compresses the live part too. The process_* series and the HTTP server's counters are
tables too, whose rows are read on each scrape (`ScrapeTable`), and go into the gzip body
as stored blocks: no zlib call on the scrape's thread.
Output is byte-identical to what prometheus_client renders for the same families
(tests/exposition/test_render.py).
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from exporter.exposition import tables
from exporter.exposition.columns import Column, ScrapeTable, Table
from exporter.exposition.tables import EngineRow, engine_rows
from exporter.exposition.text import (
    header,
    label_order,
    sample_name,
    sample_prefix,
    sample_value,
)
from exporter.state import Snapshot

_log = structlog.get_logger("kvcap.exposition")

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
_EOF = b"# EOF\n"
# Kept sections are compressed once, so they afford a good level; live ones are redone on
# every change of the state.
_KEPT_LEVEL = 6
_LIVE_LEVEL = 1
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # no name, mtime 0, OS unknown
_LAST_BLOCK = b"\x03\x00"  # an empty final block with fixed codes


def stored_chunk(data: bytes) -> bytes:
    """`data` as raw deflate stored blocks (RFC 1951 3.2.4: a header byte after a chunk
    that ends on a byte boundary, LEN, NLEN, the bytes), not compressed. For the few
    kilobytes read on each scrape: made without zlib, each of whose calls lets another
    thread take the interpreter lock, so a scrape during a poll waited for it again."""
    return b"".join(
        b"\x00" + struct.pack("<HH", len(part), len(part) ^ 0xFFFF) + part
        for part in (data[start : start + 0xFFFF] for start in range(0, len(data), 0xFFFF))
    )


def deflate_chunk(data: bytes, level: int) -> bytes:
    """Raw deflate blocks of `data`, ending on a byte boundary: chunks concatenate."""
    if not data:
        return b""
    compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)


@dataclass(frozen=True, slots=True)
class _Family:
    """A column bound to its table: labels in output order and both formats' headers."""

    column: Column[Any]
    table: Table[Any]
    labels: tuple[str, ...]
    order: tuple[int, ...]
    sample_name: str
    headers: tuple[bytes, bytes]  # (0.0.4 text, OpenMetrics)
    # A histogram's `le` values (+Inf last) and its bucket samples' label order.
    les: tuple[str, ...] = ()
    bucket_order: tuple[int, ...] = ()

    @classmethod
    def of(cls, table: Table[Any], column: Column[Any]) -> _Family:
        texts = tuple(
            header(column.name, column.help, column.kind, openmetrics=om) for om in (False, True)
        )
        labels = (*table.labels, *column.extra_labels)
        return cls(
            column,
            table,
            labels,
            label_order(labels),
            sample_name(column.name, column.kind),
            (texts[0], texts[1]),
            (*map(repr, column.bounds), "+Inf"),
            label_order((*labels, "le")),
        )

    def line(self, row: object) -> str:
        if self.column.observations is not None:
            return self.histogram_lines(row)
        value = self.column.value(row)
        if value is None:
            return ""
        return self.prefix(row) + sample_value(value) + "\n"

    def prefix(self, row: object) -> str:
        values = (*self.table.ids(row), *self.column.extra(row))
        return sample_prefix(self.sample_name, self.labels, values, self.order)

    def lines(self, rows: Iterable[object]) -> bytes:
        return "".join(self.line(row) for row in rows).encode()

    def histogram_lines(self, row: object) -> str:
        """`_bucket` lines (cumulative, as prometheus_client's HistogramMetricFamily writes
        them), then `_count` and `_sum`."""
        assert self.column.observations is not None
        counts, total_s = self.column.observations(row)
        values = (*self.table.ids(row), *self.column.extra(row))
        bucket, labels = self.sample_name + "_bucket", (*self.labels, "le")
        lines, running = [], 0
        for le, count in zip(self.les, counts, strict=True):
            running += count
            prefix = sample_prefix(bucket, labels, (*values, le), self.bucket_order)
            lines.append(f"{prefix}{sample_value(float(running))}\n")
        for suffix, value in (("_count", float(running)), ("_sum", total_s)):
            prefix = sample_prefix(self.sample_name + suffix, self.labels, values, self.order)
            lines.append(f"{prefix}{sample_value(value)}\n")
        return "".join(lines)


_FAMILIES = [_Family.of(placed.table, placed.column) for placed in tables.LAYOUT]
# The kept part: families of one engine whose bytes are kept per engine, and the few
# others (GPU identity, build) rendered anew and compared; then the live part.
_KEPT = [i for i, placed in enumerate(tables.LAYOUT) if not placed.column.live]
_LIVE = [i for i, placed in enumerate(tables.LAYOUT) if placed.column.live]
_PER_ENGINE = [i for i in _KEPT if tables.LAYOUT[i].per_engine is not None]
# Live families of the engine table (one row per engine): their label part is kept.
_LIVE_PER_ENGINE = [i for i in _LIVE if tables.LAYOUT[i].table is tables.ENGINE]


@dataclass(frozen=True, slots=True)
class _EngineBytes:
    """One engine's samples of each kept per-engine family, under the key they read."""

    key: tuple[object, ...]
    samples: tuple[bytes, ...]  # in the order of _PER_ENGINE
    prefixes: tuple[str, ...]  # `name{labels} ` in the order of _LIVE_PER_ENGINE


def _engine_bytes(row: EngineRow) -> _EngineBytes:
    samples = []
    for index in _PER_ENGINE:
        rows = tables.LAYOUT[index].per_engine
        assert rows is not None
        samples.append(_FAMILIES[index].lines(rows(row)))
    prefixes = tuple(_FAMILIES[index].prefix(row) for index in _LIVE_PER_ENGINE)
    return _EngineBytes(row.static_key, tuple(samples), prefixes)


def _live_engine_lines(
    position: int, index: int, rows: Sequence[EngineRow], engines: Sequence[_EngineBytes]
) -> bytes:
    value_of = _FAMILIES[index].column.value
    lines = []
    for row, found in zip(rows, engines, strict=True):
        value = value_of(row)
        if value is not None:
            lines.append(f"{found.prefixes[position]}{sample_value(value)}\n")
    return "".join(lines).encode()


class _Block:
    """Consecutive families of one snapshot: plain text and gzip chunks, per format."""

    def __init__(self, families: Sequence[_Family], samples: Sequence[bytes], level: int):
        self._parts = list(zip(families, samples, strict=True))
        self._level = level
        self._plain: dict[bool, bytes] = {}
        self._deflated: dict[bool, bytes] = {}
        self._lock = threading.Lock()

    def plain(self, openmetrics: bool) -> bytes:
        found = self._plain.get(openmetrics)
        if found is None:
            fmt = 1 if openmetrics else 0
            found = b"".join(p for f, samples in self._parts for p in (f.headers[fmt], samples))
            self._plain[openmetrics] = found
        return found

    def deflated(self, openmetrics: bool) -> bytes:
        """The gzip chunk: kept families' headers are compressed once for all."""
        found = self._deflated.get(openmetrics)
        if found is None:
            with self._lock:
                found = self._deflated.get(openmetrics) or deflate_chunk(
                    self.plain(openmetrics), self._level
                )
                self._deflated[openmetrics] = found
        return found

    def crc(self, openmetrics: bool, value: int = 0) -> int:
        return zlib.crc32(self.plain(openmetrics), value)


@dataclass(slots=True)
class _Kept:
    """What survives from one snapshot to the next: each engine's bytes, the kept block."""

    engines: dict[str, _EngineBytes] = field(default_factory=dict)
    engine_list: list[_EngineBytes] = field(default_factory=list)
    key: tuple[bytes, ...] = ()
    block: _Block | None = None


class Renderer:
    """Turns snapshots into blocks of family bytes, keeping what did not change."""

    def __init__(self) -> None:
        self._kept = _Kept()
        # Per residency family: engine -> (its record, its samples).
        self._records: dict[int, dict[str, tuple[object, bytes]]] = {}

    def render(self, snapshot: Snapshot) -> tuple[_Block, _Block]:
        """The kept block (often the last one, unchanged) and the live block."""
        rows = engine_rows(snapshot)
        engines = self._engines(rows)
        samples = self._kept_samples(snapshot, rows, engines)
        if self._kept.block is None or samples != self._kept.key:
            self._kept.key = samples
            self._kept.block = _Block([_FAMILIES[i] for i in _KEPT], samples, _KEPT_LEVEL)
        live = []
        for index in _LIVE:
            if index in _LIVE_PER_ENGINE:
                position = _LIVE_PER_ENGINE.index(index)
                live.append(_live_engine_lines(position, index, rows, engines))
            elif tables.LAYOUT[index].per_residency is not None:
                live.append(self._residency_lines(index, snapshot))
            else:
                family, placed = _FAMILIES[index], tables.LAYOUT[index]
                live.append(family.lines(placed.rows(snapshot, rows)))
        return self._kept.block, _Block([_FAMILIES[i] for i in _LIVE], live, _LIVE_LEVEL)

    def _residency_lines(self, index: int, snapshot: Snapshot) -> bytes:
        """One family's samples of every residency record, each record's bytes kept while
        the collector has not replaced the record (an idle engine costs a lookup)."""
        rows_of = tables.LAYOUT[index].per_residency
        assert rows_of is not None
        kept = self._records.get(index, {})
        found: dict[str, tuple[object, bytes]] = {}
        for record in snapshot.residency:
            last = kept.get(record.engine)
            if last is None or last[0] is not record:
                last = (record, _FAMILIES[index].lines(rows_of(record)))
            found[record.engine] = last
        self._records[index] = found
        return b"".join(samples for _, samples in found.values())

    def _kept_samples(
        self, snapshot: Snapshot, rows: Sequence[EngineRow], engines: list[_EngineBytes]
    ) -> tuple[bytes, ...]:
        # The same engines' bytes as last time (a poll that changed only live values):
        # their families' samples are the last ones.
        unchanged = self._kept.block is not None and engines == self._kept.engine_list
        self._kept.engine_list = engines
        samples: list[bytes] = []
        for index in _KEPT:
            if index in _PER_ENGINE:
                position = _PER_ENGINE.index(index)
                if unchanged:
                    samples.append(self._kept.key[len(samples)])
                else:
                    samples.append(b"".join(e.samples[position] for e in engines))
            else:
                family, placed = _FAMILIES[index], tables.LAYOUT[index]
                samples.append(family.lines(placed.rows(snapshot, rows)))
        return tuple(samples)

    def _engines(self, rows: Sequence[EngineRow]) -> list[_EngineBytes]:
        kept: dict[str, _EngineBytes] = {}
        for row in rows:
            found = self._kept.engines.get(row.view.engine)
            key = row.static_key
            kept[row.view.engine] = (
                found if found is not None and found.key == key else _engine_bytes(row)
            )
        self._kept.engines = kept
        return [kept[row.view.engine] for row in rows]


class _Rendered:
    """One snapshot's blocks, and the CRC-32 of its plain text per format."""

    def __init__(self, version: int, kept: _Block, live: _Block) -> None:
        self.version = version
        self.kept = kept
        self.live = live
        self._crcs: dict[bool, int] = {}

    def size(self, openmetrics: bool) -> int:
        return len(self.kept.plain(openmetrics)) + len(self.live.plain(openmetrics))

    def crc(self, openmetrics: bool, kept_crc: int) -> int:
        """CRC-32 of the plain text, continuing the kept block's."""
        found = self._crcs.get(openmetrics)
        if found is None:
            found = self.live.crc(openmetrics, kept_crc)
            self._crcs[openmetrics] = found
        return found


@dataclass(frozen=True, slots=True)
class Body:
    """One /metrics answer: its bytes (gzip-compressed where `gzipped`) and content type."""

    content: bytes
    content_type: str
    gzipped: bool


def wants_openmetrics(accept: str | None) -> bool:
    return bool(accept) and "application/openmetrics-text" in accept  # type: ignore[operator]


def wants_gzip(accept_encoding: str | None) -> bool:
    if not accept_encoding:
        return False
    return any(part.split(";")[0].strip() == "gzip" for part in accept_encoding.split(","))


class _PerScrape:
    """The families of the scrape tables, written on each scrape; a versioned table's
    bytes are kept while its version stands. A family without samples is left out, as
    prometheus_client's collectors leave out what they cannot read."""

    def __init__(self, tables: Sequence[ScrapeTable[Any]]) -> None:
        self._tables = [
            (scrape, [_Family.of(scrape.table, column) for column in scrape.table.columns])
            for scrape in tables
        ]
        # position -> (version, openmetrics) -> bytes
        self._kept: dict[int, tuple[int, dict[bool, bytes]]] = {}

    def text(self, openmetrics: bool) -> bytes:
        fmt = 1 if openmetrics else 0
        parts = []
        for position, (scrape, families) in enumerate(self._tables):
            # Read before the rows: a change meanwhile shows as a new version next time,
            # so kept bytes are never older than their version.
            version = scrape.version() if scrape.version is not None else None
            kept = self._kept.get(position)
            if version is not None and kept is not None and kept[0] == version:
                found = kept[1].get(openmetrics)
                if found is not None:
                    parts.append(found)
                    continue
            rows = scrape.rows()
            samples = [family.lines(rows) for family in families]
            text = b"".join(
                family.headers[fmt] + lines
                for family, lines in zip(families, samples, strict=True)
                if lines
            )
            if version is not None:
                texts = kept[1] if kept is not None and kept[0] == version else {}
                texts[openmetrics] = text
                self._kept[position] = (version, texts)
            parts.append(text)
        return b"".join(parts)


class ExpositionCache:
    """Serves the /metrics body of the current snapshot, rendering at most once per snapshot
    and only what changed since the last one."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        *,
        per_scrape: Sequence[ScrapeTable[Any]] = (),
    ) -> None:
        self._snapshot = snapshot
        self._lock = threading.Lock()
        self._renderer = Renderer()
        self._rendered: _Rendered | None = None
        self._render_failing = False
        # CRC-32 of the kept block's plain text, per format, while that block lasts.
        self._kept_crcs: tuple[_Block | None, dict[bool, int]] = (None, {})
        # Families read afresh on every scrape (the HTTP server's counters, process_*),
        # appended in this order.
        self._per_scrape = _PerScrape(per_scrape)
        # The formats (OpenMetrics or not) that scrapes have asked for in gzip.
        self._gzipped_formats: set[bool] = set()

    def body(self, *, accept: str | None = None, accept_encoding: str | None = None) -> Body:
        rendered = self._current()
        openmetrics = wants_openmetrics(accept)
        tail = self._per_scrape.text(openmetrics)
        if openmetrics:
            tail += _EOF
        content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        if not wants_gzip(accept_encoding):
            parts = (rendered.kept.plain(openmetrics), rendered.live.plain(openmetrics), tail)
            return Body(b"".join(parts), content_type, False)
        self._gzipped_formats.add(openmetrics)
        kept, live, rendered_crc = self._gzip_parts(rendered, openmetrics)
        crc = zlib.crc32(tail, rendered_crc)
        size = (rendered.size(openmetrics) + len(tail)) & 0xFFFFFFFF
        content = b"".join(
            (
                _GZIP_HEADER,
                kept,
                live,
                stored_chunk(tail),
                _LAST_BLOCK,
                struct.pack("<II", crc, size),
            )
        )
        return Body(content, content_type, True)

    def prepare(self) -> None:
        """Render the current snapshot now, if it is not yet: called by the state after each
        change, on the collector's thread, so the next scrape finds its bytes ready. A
        failure here is left to that scrape, which renders again and answers 500."""
        try:
            rendered = self._current()
            # The gzip chunk and CRC-32 of the formats scrapes asked for in gzip (every
            # Prometheus does): zlib on this thread, not on the scrape's.
            for openmetrics in tuple(self._gzipped_formats):
                self._gzip_parts(rendered, openmetrics)
        except Exception:
            if not self._render_failing:  # logged once per run of failures
                _log.exception("render_failed")
            self._render_failing = True
        else:
            self._render_failing = False

    def _gzip_parts(self, rendered: _Rendered, openmetrics: bool) -> tuple[bytes, bytes, int]:
        """The kept and live blocks' gzip chunks and the CRC-32 of their plain text, each
        made once per block and format (whichever of `prepare` and a scrape comes first)."""
        kept_crc = self._kept_crc(rendered.kept, openmetrics)
        return (
            rendered.kept.deflated(openmetrics),
            rendered.live.deflated(openmetrics),
            rendered.crc(openmetrics, kept_crc),
        )

    def _kept_crc(self, block: _Block, openmetrics: bool) -> int:
        """The kept block's CRC-32, computed once per block and format."""
        with self._lock:
            owner, crcs = self._kept_crcs
            if owner is not block:
                crcs = {}
                self._kept_crcs = (block, crcs)
            if openmetrics not in crcs:
                crcs[openmetrics] = block.crc(openmetrics)
            return crcs[openmetrics]

    def _current(self) -> _Rendered:
        snapshot = self._snapshot()
        rendered = self._rendered
        if rendered is not None and rendered.version == snapshot.version:
            return rendered
        with self._lock:
            rendered = self._rendered
            if rendered is None or rendered.version != snapshot.version:
                rendered = _Rendered(snapshot.version, *self._renderer.render(snapshot))
                self._rendered = rendered
        return rendered
