"""From snapshot to scrape: the metric tables, the incremental renderer and the HTTP routes."""

from exporter.exposition.app import build_routes
from exporter.exposition.prefix_cache import PrefixCacheCollector, prefix_cache_families
from exporter.exposition.process import ProcessText
from exporter.exposition.render import (
    Body,
    ExpositionCache,
    Renderer,
    TextSource,
    VersionedCollector,
)
from exporter.exposition.tables import LAYOUT, Column, EngineRow, Placed, Table, engine_rows
from exporter.exposition.text import families_text, sample_value

__all__ = [
    "LAYOUT",
    "Body",
    "Column",
    "EngineRow",
    "ExpositionCache",
    "Placed",
    "PrefixCacheCollector",
    "ProcessText",
    "Renderer",
    "Table",
    "TextSource",
    "VersionedCollector",
    "build_routes",
    "engine_rows",
    "families_text",
    "prefix_cache_families",
    "sample_value",
]
