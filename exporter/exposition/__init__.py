"""From snapshot to scrape: the metric tables, the incremental renderer and the HTTP routes."""

from exporter.exposition.app import build_routes
from exporter.exposition.prefix_cache import PrefixCacheCollector
from exporter.exposition.render import Body, ExpositionCache
from exporter.exposition.tables import LAYOUT, Column, EngineRow, Placed, Table, engine_rows

__all__ = [
    "LAYOUT",
    "Body",
    "Column",
    "EngineRow",
    "ExpositionCache",
    "Placed",
    "PrefixCacheCollector",
    "Table",
    "build_routes",
    "engine_rows",
]
