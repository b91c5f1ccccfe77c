"""From snapshot to scrape: the metric tables, the incremental renderer and the HTTP routes."""

from exporter.exposition.app import build_routes
from exporter.exposition.columns import Column, Table
from exporter.exposition.process import ProcessText
from exporter.exposition.render import (
    Body,
    ExpositionCache,
    Renderer,
    TextSource,
    VersionedCollector,
)
from exporter.exposition.tables import LAYOUT, EngineRow, Placed, engine_rows
from exporter.exposition.text import families_text, sample_value

__all__ = [
    "LAYOUT",
    "Body",
    "Column",
    "EngineRow",
    "ExpositionCache",
    "Placed",
    "ProcessText",
    "Renderer",
    "Table",
    "TextSource",
    "VersionedCollector",
    "build_routes",
    "engine_rows",
    "families_text",
    "sample_value",
]
